"""Text for platforms: split long answers safely, convert Markdown to each dialect.

Why in the core: every platform needs the same two things, and getting them wrong
is visible (a code block cut in half renders as garbage; `**bold**` shows stars in
Slack). One splitter, one converter per dialect; adapters never touch text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

FENCE_RE = re.compile(r"^(\s*)(```|~~~)(.*)$")


# ── Splitting ──────────────────────────────────────────────────────────────────


def _blocks(text: str) -> list[str]:
    """Paragraphs and whole fenced code blocks, in order (a fence is one block)."""
    blocks: list[str] = []
    current: list[str] = []
    in_fence = False
    for line in text.split("\n"):
        if FENCE_RE.match(line):
            if not in_fence:
                if current:
                    blocks.append("\n".join(current))
                    current = []
                in_fence = True
                current.append(line)
                continue
            current.append(line)
            blocks.append("\n".join(current))
            current = []
            in_fence = False
            continue
        if not in_fence and line.strip() == "":
            if current:
                blocks.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks


def _hard_split(line: str, limit: int) -> list[str]:
    """A single line longer than the limit: cut at a space where possible."""
    parts = []
    while len(line) > limit:
        cut = line.rfind(" ", 0, limit)
        if cut < limit // 2:
            cut = limit
        parts.append(line[:cut])
        line = line[cut:].lstrip(" ")
    parts.append(line)
    return parts


def _split_block(block: str, limit: int) -> list[str]:
    """A block too long for one message: by lines; a code block is closed at each cut
    and reopened (with its language) in the next piece, so every piece renders."""
    lines = block.split("\n")
    fence = FENCE_RE.match(lines[0])
    opener = lines[0] if fence else ""
    closer = fence.group(1) + fence.group(2) if fence else ""
    body = (
        lines[1:-1]
        if fence and len(lines) > 1 and FENCE_RE.match(lines[-1])
        else (lines[1:] if fence else lines)
    )
    room = limit - (len(opener) + len(closer) + 2 if fence else 0)
    if room < 20:
        room = limit
        opener = closer = ""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for raw in body:
        for line in _hard_split(raw, room) if len(raw) > room else [raw]:
            extra = len(line) + (1 if current else 0)
            if current and size + extra > room:
                pieces.append("\n".join(current))
                current, size = [], 0
                extra = len(line)
            current.append(line)
            size += extra
    if current or not pieces:
        pieces.append("\n".join(current))
    if fence and opener:
        return [f"{opener}\n{p}\n{closer}" for p in pieces]
    return pieces


def split_message(text: str, limit: int) -> list[str]:
    """Split on paragraph / code-block boundaries, never inside a code fence, each piece
    at most `limit` characters. Joining the pieces with blank lines gives the text back
    (except where an oversized block had to be cut and its fence reopened)."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    if len(text) <= limit:
        return [text]
    pieces: list[str] = []
    current = ""
    for block in _blocks(text):
        candidates = [block] if len(block) <= limit else _split_block(block, limit)
        for cand in candidates:
            joined = f"{current}\n\n{cand}" if current else cand
            if len(joined) <= limit:
                current = joined
            else:
                if current:
                    pieces.append(current)
                current = cand
    if current:
        pieces.append(current)
    return pieces


# ── Markdown dialects ──────────────────────────────────────────────────────────

_CODE_RE = re.compile(r"(```[\s\S]*?```|~~~[\s\S]*?~~~|`[^`\n]+`)")


def _outside_code(text: str, convert: Callable[[str], str]) -> str:
    """Apply `convert` to everything but code spans and blocks, which stay verbatim."""
    parts = _CODE_RE.split(text)
    return "".join(p if i % 2 else convert(p) for i, p in enumerate(parts))


def _slack_prose(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"<\2|\1>", text)
    text = re.sub(r"^#{1,6}\s+(.+?)\s*#*$", "\x00\\1\x00", text, flags=re.M)
    text = re.sub(r"(\*\*|__)(.+?)\1", "\x00\\2\x00", text)  # bold, protected from italics
    text = re.sub(r"(?<![\w*])\*(?!\s)([^*\n]+?)(?<!\s)\*(?![\w*])", r"_\1_", text)
    text = text.replace("\x00", "*")
    text = re.sub(r"~~(.+?)~~", r"~\1~", text)
    text = re.sub(r"^(\s*)[-*+]\s+", r"\1• ", text, flags=re.M)
    return text


def to_slack(markdown: str) -> str:
    """CommonMark-ish → Slack mrkdwn: *bold*, _italic_, ~strike~, <url|text>, • lists;
    &, <, > escaped outside code (Slack treats <…> as links and mentions)."""
    return _outside_code(markdown, _slack_prose)


def _discord_prose(text: str) -> str:
    # Discord renders CommonMark emphasis, code, lists, quotes and (in bot messages)
    # [text](url) links and #–### headings; deeper headings show their hashes.
    text = re.sub(r"^#{4,6}\s+(.+?)\s*#*$", r"**\1**", text, flags=re.M)
    return text.replace("@everyone", "@\u200beveryone").replace("@here", "@\u200bhere")


def to_discord(markdown: str) -> str:
    """CommonMark-ish → Discord Markdown (nearly the same); mass mentions defused."""
    return _outside_code(markdown, _discord_prose)


def _plain_prose(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"\1 (\2)", text)
    text = re.sub(r"^#{1,6}\s+", "", text, flags=re.M)
    text = re.sub(r"(\*\*|__)(.+?)\1", r"\2", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)([^*\n]+?)(?<!\s)\*(?![\w*])", r"\1", text)
    return re.sub(r"~~(.+?)~~", r"\1", text)


def to_plain(markdown: str) -> str:
    """For platforms without formatting: markers dropped, links spelled out."""
    return _outside_code(markdown, _plain_prose)


def to_markdown(markdown: str) -> str:
    """For channels that render CommonMark themselves (web, terminal, replay)."""
    return markdown


DIALECTS: dict[str, Callable[[str], str]] = {
    "markdown": to_markdown,
    "slack": to_slack,
    "discord": to_discord,
    "plain": to_plain,
}
