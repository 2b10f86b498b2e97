"""Splitting never breaks a code fence and never exceeds the limit; each dialect
converter renders the same Markdown the way its platform expects."""

from __future__ import annotations

import random

import pytest

from core.formatting import FENCE_RE, split_message, to_discord, to_plain, to_slack


def fences_balanced(piece: str) -> bool:
    return sum(1 for line in piece.split("\n") if FENCE_RE.match(line)) % 2 == 0


def content_lines(text: str) -> list[str]:
    return [ln for ln in text.split("\n") if ln.strip() and not FENCE_RE.match(ln)]


def test_short_text_is_one_piece() -> None:
    assert split_message("hello", 10) == ["hello"]


def test_splits_on_paragraphs() -> None:
    text = "first paragraph here\n\nsecond paragraph here\n\nthird"
    assert split_message(text, 25) == ["first paragraph here", "second paragraph here", "third"]


def test_code_block_kept_whole_when_it_fits() -> None:
    code = "```python\nprint('a')\nprint('b')\n```"
    text = "intro text\n\n" + code + "\n\nafter"
    pieces = split_message(text, len(code) + 2)
    assert code in pieces
    assert all(fences_balanced(p) for p in pieces)


def test_oversized_code_block_is_closed_and_reopened() -> None:
    code = "```sh\n" + "\n".join(f"echo line {i}" for i in range(60)) + "\n```"
    pieces = split_message(code, 200)
    assert len(pieces) > 1
    assert all(len(p) <= 200 and fences_balanced(p) for p in pieces)
    assert all(p.startswith("```sh\n") and p.endswith("\n```") for p in pieces)
    assert content_lines("\n".join(pieces)) == content_lines(code)


def test_very_long_line_is_cut() -> None:
    pieces = split_message("word " * 1000, 100)
    assert all(len(p) <= 100 for p in pieces)
    assert " ".join(" ".join(pieces).split()) == " ".join(("word " * 1000).split())


@pytest.mark.parametrize("seed", range(40))
def test_random_documents(seed: int) -> None:
    rng = random.Random(seed)
    blocks = []
    for _ in range(rng.randint(1, 25)):
        if rng.random() < 0.3:
            lines = [f"x = {rng.random()}" * rng.randint(1, 3) for _ in range(rng.randint(1, 40))]
            blocks.append("```py\n" + "\n".join(lines) + "\n```")
        else:
            blocks.append(" ".join(f"w{rng.randint(0, 99)}" for _ in range(rng.randint(1, 120))))
    text = "\n\n".join(blocks)
    limit = rng.choice([120, 300, 2000])
    pieces = split_message(text, limit)
    assert all(len(p) <= limit for p in pieces), [len(p) for p in pieces]
    assert all(fences_balanced(p) for p in pieces)
    assert (
        " ".join(content_lines("\n".join(pieces))).split() == " ".join(content_lines(text)).split()
    )


SAMPLE = (
    "# Report\n\n**Bold** and *italic* and ~~gone~~, see [docs](https://example.com/a).\n"
    "- one\n- two\n\nUse `a < b` and:\n\n```\nif a < b: **x**\n```\n<script> & @everyone"
)


def test_slack_mrkdwn() -> None:
    out = to_slack(SAMPLE)
    assert out.startswith("*Report*")
    assert "*Bold* and _italic_ and ~gone~" in out
    assert "<https://example.com/a|docs>" in out
    assert "• one\n• two" in out
    assert "`a < b`" in out and "```\nif a < b: **x**\n```" in out  # code untouched
    assert "&lt;script&gt; &amp;" in out


def test_discord_markdown() -> None:
    out = to_discord(SAMPLE)
    assert "**Bold** and *italic*" in out and "[docs](https://example.com/a)" in out
    assert "@\u200beveryone" in out and "```\nif a < b: **x**\n```" in out


def test_plain_text() -> None:
    out = to_plain(SAMPLE)
    assert out.startswith("Report\n")
    assert "Bold and italic and gone, see docs (https://example.com/a)." in out
