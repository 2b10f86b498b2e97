"""Turning a query into SQL, and fusing ranked lists: pure functions, no I/O.

A person's words become quoted FTS5 terms (no operator can be injected), the filters
become one WHERE clause applied to both the keyword and the vector list, and the two
lists are fused by Reciprocal Rank Fusion.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

RRF_K = 60
_STOP_TERMS = frozenset(
    "a an and are as at be by for from in is it of on or the to was were with".split()
)
_TERM = re.compile(r"\w+")


def fts_terms(text: str) -> list[str]:
    """A person's words as quoted FTS5 terms (phrases for snake_case words).

    Quoting makes every operator (AND, NEAR, *, -, column:) a plain word, and the
    \\w+ split leaves no quote to escape. Very common words and single characters
    are dropped unless they are all there is.
    """
    terms = list(dict.fromkeys(t.lower() for t in _TERM.findall(text)))
    useful = [t for t in terms if t not in _STOP_TERMS and len(t) > 1] or terms
    return [f'"{t}"' for t in useful[:32]]


def fts_query(text: str) -> str | None:
    """The OR of fts_terms(text); None when nothing searchable is left."""
    terms = fts_terms(text)
    return " OR ".join(terms) if terms else None


def _as_tuple(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _since(value: datetime | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    return float(value)


def where_clause(
    *,
    kinds: str | Sequence[str] | None,
    outcome: str | Sequence[str] | None,
    user: str | Sequence[str] | None,
    conversation: str | Sequence[str] | None,
    channel: str | Sequence[str] | None,
    scopes: str | Sequence[str] | None,
    statuses: str | Sequence[str] | None,
    since: datetime | float | None,
    signature: str | None,
    alias: str = "docs",
) -> tuple[str, list[Any]]:
    """SQL conditions on `docs` for the filters given (an empty tuple matches nothing)."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("kind", kinds),
        ("outcome", outcome),
        ("user", user),
        ("conversation", conversation),
        ("channel", channel),
        ("scope", scopes),
        ("status", statuses),
    ):
        values = _as_tuple(value)
        if values is None:
            continue
        if not values:
            clauses.append("0")
            continue
        clauses.append(f"{alias}.{column} IN ({','.join('?' * len(values))})")
        params.extend(values)
    after = _since(since)
    if after is not None:
        clauses.append(f"{alias}.ts >= ?")
        params.append(after)
    if signature:
        clauses.append(f"{alias}.id IN (SELECT doc FROM signatures WHERE sig = ?)")
        params.append(signature)
    return " AND ".join(clauses), params


def rrf(lists: Iterable[list[int]]) -> dict[int, float]:
    """Reciprocal Rank Fusion: each list adds 1 / (RRF_K + rank) to a document's score.

    Only positions count, so a bm25 score and a cosine similarity never have to be
    put on one scale."""
    scores: dict[int, float] = {}
    for ranked in lists:
        for rank, doc in enumerate(ranked, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (RRF_K + rank)
    return scores
