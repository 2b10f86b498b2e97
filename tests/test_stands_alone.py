"""The repository stands alone: a clone has no design notes or conventions file beside
it, no shared reference folder and no issue tracker, so no tracked file may send a
reader to them. Code says why in words. And every docs/ page that code, config or a
test names (a hint in an error message, a comment in config/default.toml) exists, with
the heading its #anchor names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from config.platforms import PLATFORMS
from tests.test_docs_links import anchors

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: What a clone does not have: files that lived beside the checkout, and the tracker's
#: or past work sessions' numbers.
OUTSIDE = re.compile(
    r"DESIGN\.md|CONVENTIONS\.md|\.\./shared|/work/shared|shared/reference/"
    r"|[Ii]ssue [0-9]+|[Ss]ession [0-9]+"
)
#: A page under docs/ named from outside docs/, with an optional #anchor.
DOCS_PATH = re.compile(r"(?<![\w./-])(docs/(?:[\w-]+/)*[\w-]+\.md)(?:#([\w-]+))?")
#: Files in the agent's workspace (or a skill's folder) that tool tests, gate cases and
#: the local model's bench requests use as examples: not pages of this repository.
WORKSPACE_EXAMPLES = frozenset(
    {"docs/x.md", "docs/n.md", "docs/notes.md", "docs/v2/notes.md", "docs/guide.md", "docs/a.md"}
)


def tracked_text() -> list[tuple[str, str]]:
    """(path, text) of every tracked text file but the lock files and this test."""
    try:
        res = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    out: list[tuple[str, str]] = []
    for name in res.stdout.decode("utf-8").split("\0"):
        if not name or name.endswith(".lock") or name == SELF:
            continue
        path = ROOT / name
        if not path.is_file():  # deleted in the work tree, not yet staged
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary: the screenshots
        out.append((name, data.decode("utf-8", errors="replace")))
    return out


def hits(pattern: re.Pattern[str], files: list[tuple[str, str]]) -> list[str]:
    return [
        f"{name}:{n}: {line.strip()}"
        for name, text in files
        for n, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_patterns_find_what_they_are_for() -> None:
    for text in (
        "(issue 26)",
        "Issue 13: the attack",
        # Spelled in pieces, so that this file does not cite what it looks for.
        "see " + "DESIGN" + ".md",
        "CONVENTIONS" + ".md says",
        ".." + "/shared/reference/platforms.md",
        "/work" + "/shared/x",
        "as in session 4",
    ):
        assert OUTSIDE.search(text), text
    for text in ("Approve for this session", "an issue with the token", "shared with"):
        assert not OUTSIDE.search(text), text
    found = DOCS_PATH.findall("(see docs/platforms/slack.md#setup); docs/memory.md's")
    assert found == [("docs/platforms/slack.md", "setup"), ("docs/memory.md", "")]
    assert not DOCS_PATH.findall("docs/platforms/<name>.md, docs/platforms/{name}.md")


def test_nothing_points_outside_the_repository() -> None:
    found = hits(OUTSIDE, tracked_text())
    assert not found, (
        "references to files or a tracker a clone does not have (say the reason in "
        "words, or point to docs/):\n" + "\n".join(found)
    )


def test_every_docs_page_named_in_code_and_config_exists() -> None:
    """Markdown files link with their own relative paths (tests/test_docs_links.py
    checks those); everything else names pages from the checkout's root."""
    broken: list[str] = []
    for name, text in tracked_text():
        if name.endswith(".md"):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for page, anchor in DOCS_PATH.findall(line):
                if page in WORKSPACE_EXAMPLES:
                    continue
                dest = ROOT / page
                if not dest.is_file():
                    broken.append(f"{name}:{n}: {page} (no such file)")
                elif anchor and anchor not in anchors(dest):
                    broken.append(f"{name}:{n}: {page}#{anchor} (no such heading)")
    assert not broken, "docs/ pages that do not exist:\n" + "\n".join(broken)


def test_every_platform_has_the_page_its_messages_name() -> None:
    """config/platforms.py and `steward doctor` build `docs/platforms/<name>.md` from the
    platform's name, out of reach of the scan above."""
    for spec in PLATFORMS:
        assert (ROOT / "docs" / "platforms" / f"{spec.name}.md").is_file(), spec.name
