"""The documentation holds together: README.md and docs/**/*.md link only to files (and
headings) that exist, the README stays a short read, and docs/configuration.md documents
exactly the settings config/default.toml has (and config/platforms.py adds), each with
its environment variable and its default. Each platform's page names its keys."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from config import platforms

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).+?\1")
# [text](target) and ![alt](target), with an optional "title"; nested brackets in the text.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    out: list[str] = []
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        found = FENCE.match(line)
        if found:
            if fence is None:
                fence = found.group(1)
            elif found.group(1) == fence:
                fence = None
            continue
        if fence is None:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation other than '-'
    and '_' removed, each space turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts as its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(path):
        found = HEADING.match(line)
        if not found:
            continue
        base = slug(found.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    out: list[str] = []
    for line in prose_lines(path):
        out.extend(m.group(1) for m in LINK.finditer(INLINE_CODE.sub("", line)))
    return out


def test_the_link_checker_reads_markdown_as_github_does(tmp_path: Path) -> None:
    assert slug("`shell`: the sandbox") == "shell-the-sandbox"
    assert slug("git's control files") == "gits-control-files"
    assert slug("Rules: learned from repeated failures") == "rules-learned-from-repeated-failures"
    assert slug("`web_fetch` and every hand") == "web_fetch-and-every-hand"
    page = tmp_path / "p.md"
    page.write_text(
        "# Top\n## Top\n```sh\n# not a heading [x](nowhere.md)\n```\n"
        'See [a](b.md#c), `[not](a-link.md)` and ![img](i.png "title").\n',
        encoding="utf-8",
    )
    assert anchors(page) == {"top", "top-1"}
    assert links(page) == ["b.md#c", "i.png"]


def test_every_relative_link_resolves() -> None:
    broken: list[str] = []
    for path in markdown_files():
        where = path.relative_to(ROOT)
        for target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # http(s), mailto: not checked
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / unquote(file_part)).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{where}: {target} (no such file)")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: {target} (no heading #{anchor} in {dest.name})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_a_short_read() -> None:
    size = len(README.read_bytes())
    assert size < 30_000, f"README.md is {size} bytes: move detail to a page under docs/"
    text = README.read_text(encoding="utf-8")
    assert "## Quick start" in text
    assert "python3 dev.py run" in text and "python3 dev.py test" in text


def rendered_default(value: Any) -> str:
    """A default as docs/configuration.md writes it."""
    if value in ("", []):
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{int(value) if value.is_integer() else value}`"
    if isinstance(value, list):
        return f"`{', '.join(map(str, value))}`"
    return f"`{value}`"


def documented_settings() -> dict[str, tuple[str, str]]:
    """`key` -> (env cell, default cell) of every table row in docs/configuration.md."""
    rows: dict[str, tuple[str, str]] = {}
    for line in prose_lines(CONFIGURATION):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not re.fullmatch(r"`[a-z0-9_]+`", cells[0]):
            continue
        key = cells[0].strip("`")
        assert key not in rows, f"{key} has two rows in docs/configuration.md"
        rows[key] = (cells[1], cells[2])
    return rows


def test_configuration_page_matches_default_toml() -> None:
    defaults = tomllib.loads((ROOT / "config" / "default.toml").read_text(encoding="utf-8"))
    known = {**dict.fromkeys(platforms.setting_keys(), ""), **defaults}
    rows = documented_settings()
    missing = sorted(set(known) - set(rows))
    assert not missing, f"settings with no row in docs/configuration.md: {missing}"
    unknown = sorted(set(rows) - set(known))
    assert not unknown, f"docs/configuration.md documents settings that do not exist: {unknown}"
    wrong = [
        f"{key}: env {env}, default {default} (expected `STEWARD_{key.upper()}`, "
        f"{rendered_default(known[key])})"
        for key, (env, default) in rows.items()
        if env != f"`STEWARD_{key.upper()}`" or default != rendered_default(known[key])
    ]
    assert not wrong, "docs/configuration.md disagrees with config/default.toml:\n" + "\n".join(
        wrong
    )


def test_each_platform_has_a_page_with_its_keys() -> None:
    readme = README.read_text(encoding="utf-8")
    for spec in platforms.PLATFORMS:
        page = DOCS / "platforms" / f"{spec.name}.md"
        assert page.is_file(), f"no page for {spec.title}: {page.relative_to(ROOT)}"
        assert f"docs/platforms/{spec.name}.md" in readme, f"README does not link {spec.title}"
        text = page.read_text(encoding="utf-8")
        for key in spec.all_keys():
            assert f"`{spec.setting(key.name)}`" in text, (spec.name, key.name)
            assert spec.env(key.name) in text, (spec.name, spec.env(key.name))
        if spec.webhook:
            assert spec.webhook_path in text, (spec.name, spec.webhook_path)
