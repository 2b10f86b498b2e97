"""memory/front_matter.py writes exactly the text yaml.dump writes, and does it itself
for the records Steward writes every message."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

import memory.front_matter as front_matter
from memory.episodes import Episode, ToolRecord

OPTIONS = {
    "Dumper": getattr(yaml, "CSafeDumper", yaml.SafeDumper),
    "sort_keys": False,
    "allow_unicode": True,
    "width": 100,
}

#: Pieces that decide a scalar's style: indicators, words the resolver reads as
#: something else, quotes, spaces, non-ASCII and non-printable characters.
PIECES = [
    "a", "word", "deploy api", "x", "yes", "No", "on", "OFF", "true", "False", "null",
    "Null", "~", "0", "1", "-1", "+2", "0x1F", "0o17", "1_000", "1e3", "1.5", ".5", "-.inf",
    ".NaN", "2026-12-03", "2026-12-03T10:00:00+00:00", "12:30:00", "<<", "=", "---", "...",
    "- ", "-", ": ", ":", " #", "#", "?", "? ", "'", '"', ",", "[", "]", "{", "}", "&", "*",
    "!", "|", ">", "%", "@", "`", ".", "/", "\\", " ", "  ", "\t", "\n", "é", "日本",
    "\x7f", "\x85", "\u2028", "\ufeff", "\x00", "😀",
]  # fmt: skip


def _string(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.1:
        return ""
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 4)))
    if roll < 0.35:  # around the width, where libyaml starts folding
        filler = rng.choice(["a", "a b ", "word ", "x'y "])
        text += filler * (rng.randint(70, 110) // len(filler))
    return text


def _scalar(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.55:
        return _string(rng)
    if roll < 0.65:
        return rng.choice([0, 1, -7, 2**70, True, False, None])
    if roll < 0.75:
        return rng.choice(
            [0.0, -0.0, 0.1, 1.5, 3.0, 1e20, 1e-7, 123456.789, math.inf, -math.inf, math.nan]
        )
    if roll < 0.85:
        return rng.choice([[], {}])
    if roll < 0.9:
        return datetime(2026, 12, 3, 10, rng.randint(0, 59), tzinfo=UTC)
    return rng.choice(["shell", "success", "openai/gpt-4o-mini", "U042"])


def _key(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.8:
        return rng.choice(["id", "name", "ok", "error", "tools", "recent", "role", "content"])
    if roll < 0.95:
        return _string(rng) or "k"
    return rng.choice([1, None, True])


def _value(rng: random.Random, depth: int, shared: list[Any]) -> Any:
    roll = rng.random()
    if depth >= 3 or roll < 0.5:
        return _scalar(rng)
    if roll < 0.55 and shared:
        return rng.choice(shared)  # the same object twice: yaml.dump writes an alias
    if roll < 0.75:
        value: Any = [_value(rng, depth + 1, shared) for _ in range(rng.randint(1, 4))]
    elif roll < 0.97:
        value = {_key(rng): _value(rng, depth + 1, shared) for _ in range(rng.randint(1, 4))}
    else:
        value = (1, 2)  # no safe representation: both must fail alike
    if rng.random() < 0.2:
        shared.append(value)
    return value


def _both(data: Any) -> tuple[str, str]:
    def run(dump: Any) -> str:
        try:
            return str(dump(data))
        except Exception as exc:  # the same error class is the same behaviour
            return f"raised {type(exc).__name__}"

    return run(front_matter.dump), run(lambda d: yaml.dump(d, **OPTIONS))


def test_generated_documents_are_written_as_yaml_dump_writes_them() -> None:
    rng = random.Random(26)
    written_here = 0
    for _ in range(4000):
        shared: list[Any] = []
        doc = {_key(rng): _value(rng, 0, shared) for _ in range(rng.randint(0, 6))}
        ours, theirs = _both(doc)
        assert ours == theirs, repr(doc)
        written_here += not theirs.startswith("raised")
    assert written_here > 3000


def test_strings_near_the_width_and_every_piece_alone_match_yaml_dump() -> None:
    for piece in PIECES:
        for indent_key in ("k", "a_longer_key_name"):
            for extra in range(60, 110, 3):
                text = piece + "a b" * (extra // 3)
                ours, theirs = _both({indent_key: text, "list": [text, {"n": text}]})
                assert ours == theirs, repr(text)
            ours, theirs = _both({indent_key: piece, piece or "e": [piece]})
            assert ours == theirs, repr(piece)


def test_lines_ending_at_the_width_and_just_past_it_match_yaml_dump() -> None:
    """libyaml folds at a space only once a line passes the width (100)."""
    for key in ("k", "request"):
        for end in range(94, 107):
            for filler in ("ab ", "a'b ", "a: b "):  # plain, plain with a quote, quoted
                start = len(key) + 2
                text = (filler * 40)[: end - start].strip() or "x"
                ours, theirs = _both({key: text, "tools": [{"name": text}]})
                assert ours == theirs, (key, end, filler)


def _episode(i: int) -> Episode:
    failed = i % 3 == 0
    tools = [ToolRecord(name="shell", ok=True, args={"command": f"ls -la dir{i}"})]
    if failed:
        tools.append(
            ToolRecord(
                name="read_file",
                ok=False,
                error=f"FileNotFoundError: No such file: report-{i}.csv",
                signature="read_file:FileNotFoundError",
            )
        )
    return Episode(
        id=f"20261203-1010{i:02d}-abc{i:03d}",
        started=datetime(2026, 12, 3, 10, 10, i % 60, tzinfo=UTC),
        channel="slack",
        conversation=f"C{i:03d}",
        user="U042",
        request=f"deploy api {i} to staging, then tell #ops: it's done",
        outcome="failure" if failed else "success",
        reply="It's deployed.\nTwo lines, and a long one " + "x " * 80,
        model="openai/gpt-4o-mini",
        steps=2,
        error="FileNotFoundError: No such file" if failed else "",
        scope="person:slack:U042",
    )


def test_episodes_and_transcripts_are_written_without_yaml_dump(monkeypatch: Any) -> None:
    """The records every message writes take the fast path, and read back equal."""
    docs: list[dict[str, Any]] = [_episode(i).front_matter() for i in range(12)]
    docs.append(
        {
            "key": "slack:C042",
            "updated": "2026-12-03T10:10:00+00:00",
            "summarized": 0,
            "summary": "",
            "recent": [
                {"role": "user", "content": "deploy api to staging"},
                {"role": "assistant", "content": "Done: api 1.4.2 is on staging."},
            ],
            "parts": 0,
        }
    )
    expected = [yaml.dump(doc, **OPTIONS) for doc in docs]

    def refuse(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("yaml.dump was called")

    monkeypatch.setattr(front_matter.yaml, "dump", refuse)
    for doc, text in zip(docs, expected, strict=True):
        if "tools" in doc:  # the episode's multi-line reply is in its body, not here
            assert all("\n" not in str(v) for v in doc.values() if isinstance(v, str))
        assert front_matter.dump(doc) == text
        assert yaml.load(text, Loader=yaml.SafeLoader) == doc


def test_an_entry_it_cannot_write_goes_to_yaml_dump_alone() -> None:
    doc = {
        "id": "e1",
        "reply": "two\nlines",
        "when": datetime(2026, 12, 3, tzinfo=UTC),
        "tools": [{"name": "shell", "output": "é" * 3}],
        "steps": 3,
    }
    ours, theirs = _both(doc)
    assert ours == theirs
    assert ours.startswith("id: e1\nreply: 'two\n\n  lines'\n")


@pytest.mark.parametrize("doc", [{}, {"a": (1, 2)}, {"a": {1, 2}}])
def test_what_yaml_dump_refuses_or_writes_inline_is_left_to_it(doc: dict[str, Any]) -> None:
    ours, theirs = _both(doc)
    assert ours == theirs
