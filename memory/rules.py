"""Rules on disk: <data dir>/rules/<id>.md, front matter + the rule text.

This is the read side that `steward rules` and `/rules` need from day one; the
learner that writes, scores, promotes and retires rules arrives with its issue.
A malformed file is reported by path and skipped, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from memory.store import parse

log = structlog.get_logger("steward.rules")

STATUSES = ("candidate", "active", "retired")


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    status: str
    confidence: float
    text: str
    path: Path


class RuleStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "rules"

    def load(self) -> tuple[list[Rule], list[str]]:
        """All readable rules, plus one problem line per file that could not be read."""
        rules: list[Rule] = []
        problems: list[str] = []
        if not self.root.is_dir():
            return rules, problems
        for path in sorted(self.root.glob("*.md")):
            try:
                meta, body = parse(path.read_text(encoding="utf-8"), path)
                status = str(meta.get("status", "candidate"))
                if status not in STATUSES:
                    raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
                rules.append(
                    Rule(
                        id=str(meta.get("id", path.stem)),
                        status=status,
                        confidence=float(meta.get("confidence", 0.0)),
                        text=body.strip(),
                        path=path,
                    )
                )
            except (OSError, ValueError, TypeError) as exc:
                log.warning("rules.malformed", path=str(path), error=str(exc))
                problems.append(f"{path}: {exc}")
        return rules, problems

    def render_list(self, status: str | None = None) -> str:
        if status is not None and status not in STATUSES:
            return f"Unknown status {status!r}: use one of {', '.join(STATUSES)}."
        rules, problems = self.load()
        shown = [r for r in rules if status is None or r.status == status]
        if not shown:
            what = f"{status} rules" if status else "rules"
            lines = [f"No {what} yet. Steward drafts rules from repeated failures."]
        else:
            lines = [f"{r.id} [{r.status} {r.confidence:.2f}] {_first(r.text)}" for r in shown]
        lines += [f"skipped (malformed): {p}" for p in problems]
        return "\n".join(lines)


def _first(text: str, limit: int = 80) -> str:
    return text.splitlines()[0][:limit] if text else ""
