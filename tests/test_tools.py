"""The tools against real files, real subprocesses and a real local HTTP server."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from core.egress import EgressPolicy
from core.tools import ALL_TOOLS, tool_schemas
from core.tools.base import ToolContext, ToolError
from core.tools.workspace import Target, display, parse_path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, shell_timeout=10, output_cap=2000, fetch_timeout=5)


async def call(ctx: ToolContext, tool: str, **args: object) -> str:
    return await ALL_TOOLS[tool].run(ctx, args)


# ── registry ────────────────────────────────────────────────────────────────────


def test_registry_order_and_schemas() -> None:
    assert list(ALL_TOOLS) == [
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "search_files",
        "shell",
        "web_fetch",
        "web_search",
        "code_symbols",
        "code_definition",
        "code_references",
        "code_impact",
        "browser_open",
        "browser_click",
        "browser_type",
        "browser_text",
        "browser_screenshot",
        "browser_close",
    ]
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(ALL_TOOLS)
    for schema in schemas:
        assert schema["type"] == "function"
        assert schema["function"]["parameters"]["type"] == "object"
        assert "\n" not in schema["function"]["description"]
    assert [s["function"]["name"] for s in tool_schemas(["shell", "read_file"])] == [
        "read_file",
        "shell",
    ]
    with pytest.raises(ValueError, match="nope"):
        tool_schemas(["nope"])


# ── workspace confinement ───────────────────────────────────────────────────────


def test_parse_relative_absolute_and_new_paths(ws: Path) -> None:
    (ws / "a.txt").write_text("x")
    real = Path(os.path.realpath(ws))
    assert parse_path(ws, "a.txt") == Target("a.txt", "a.txt", "a.txt")
    assert parse_path(ws, str(ws / "a.txt")).rel == "a.txt"
    assert parse_path(ws, str(real / "a.txt")).rel == "a.txt"
    assert parse_path(ws, "new/dir/b.txt").rel == "new/dir/b.txt"
    assert parse_path(ws, "sub/../a.txt").rel == "a.txt"
    assert parse_path(ws, "./").shown == "."
    assert display(ws, real / "new/dir/b.txt") == "new/dir/b.txt"
    assert display(ws, real) == "."


@pytest.mark.parametrize(
    "path", ["../outside.txt", "a/../../outside.txt", "new/../../x", "/etc/passwd"]
)
def test_resolve_refuses_escapes(ws: Path, path: str) -> None:
    with pytest.raises(
        ToolError, match=r"is outside the workspace .*file tools only work inside it"
    ):
        parse_path(ws, path)


async def test_symlink_out_of_the_workspace_is_refused_for_read_and_write(
    ws: Path, tmp_path: Path, ctx: ToolContext
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (ws / "link.txt").symlink_to(secret)
    (ws / "linkdir").symlink_to(tmp_path)
    (ws / "dangling").symlink_to(tmp_path / "not-yet")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "read_file", path="link.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "write_file", path="link.txt", content="pwned")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "write_file", path="linkdir/new.txt", content="pwned")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "write_file", path="dangling", content="pwned")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "edit_file", path="link.txt", old_text="top", new_text="x")
    assert secret.read_text() == "top secret"
    assert not (tmp_path / "new.txt").exists()
    assert not (tmp_path / "not-yet").exists()


async def test_escape_via_dotdot_and_absolute_path(
    ws: Path, tmp_path: Path, ctx: ToolContext
) -> None:
    (tmp_path / "outside.txt").write_text("no")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "read_file", path="../outside.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "read_file", path=str(tmp_path / "outside.txt"))
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "list_files", path="..")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "search_files", pattern="no", path="..")
    (ws / "in.txt").write_text("yes")
    assert await call(ctx, "read_file", path=str(ws / "in.txt")) == "yes"


# ── read_file ───────────────────────────────────────────────────────────────────


async def test_read_file_whole_and_ranges(ws: Path, ctx: ToolContext) -> None:
    (ws / "notes.md").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    assert (await call(ctx, "read_file", path="notes.md")).startswith("line 1\nline 2\n")
    part = await call(ctx, "read_file", path="notes.md", offset=3, limit=2)
    assert part.startswith("line 3\nline 4\n")
    assert "[lines 3-4 of 10; use offset=5 to read on]" in part
    tail = await call(ctx, "read_file", path="notes.md", offset=9)
    assert tail.startswith("line 9\nline 10\n") and "[lines 9-10 of 10]" in tail
    with pytest.raises(ToolError, match="past the end"):
        await call(ctx, "read_file", path="notes.md", offset=50)
    with pytest.raises(ToolError, match="offset must be"):
        await call(ctx, "read_file", path="notes.md", offset=0)


async def test_read_file_missing_lists_neighbours(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.md").write_text("a")
    (ws / "b.md").write_text("b")
    (ws / "docs").mkdir()
    with pytest.raises(ToolError) as err:
        await call(ctx, "read_file", path="notes.md")
    assert str(err.value) == "No such file: notes.md. Files here: a.md, b.md, docs/"
    with pytest.raises(ToolError, match=r"No such file: docs/x.md. The folder docs/ is empty"):
        await call(ctx, "read_file", path="docs/x.md")


async def test_read_file_binary_folder_and_cap(ws: Path, ctx: ToolContext) -> None:
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(ToolError, match="binary file"):
        await call(ctx, "read_file", path="img.png")
    (ws / "sub").mkdir()
    with pytest.raises(ToolError, match="is a folder"):
        await call(ctx, "read_file", path="sub")
    (ws / "big.txt").write_text("x" * 100 + "\n" * 1 + "y" * 5000)
    out = await call(ctx, "read_file", path="big.txt")
    assert len(out) < ctx.output_cap + 100
    assert "[output cut:" in out


# ── write_file / edit_file ──────────────────────────────────────────────────────


async def test_write_file_creates_parents_atomically(ws: Path, ctx: ToolContext) -> None:
    out = await call(ctx, "write_file", path="deep/er/note.md", content="héllo\n")
    sha = hashlib.sha256("héllo\n".encode()).hexdigest()[:12]
    assert out == (
        f"Wrote 7 bytes (6 characters) to deep/er/note.md, verified on disk (sha256 {sha}): "
        '"héllo\\n"'
    )
    assert (ws / "deep/er/note.md").read_text() == "héllo\n"
    (ws / "deep/er/note.md").chmod(0o600)
    await call(ctx, "write_file", path="deep/er/note.md", content="second")
    assert (ws / "deep/er/note.md").read_text() == "second"
    assert (ws / "deep/er/note.md").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (ws / "deep/er").iterdir()) == ["note.md"]  # no temp files
    with pytest.raises(ToolError, match="content must be a string"):
        await call(ctx, "write_file", path="x.md", content=None)
    with pytest.raises(ToolError, match="is a folder"):
        await call(ctx, "write_file", path="deep", content="x")


async def test_edit_file_zero_one_many(ws: Path, ctx: ToolContext) -> None:
    target = ws / "app.py"
    target.write_text("def main():\n    value = 1\n    print(value)\n\nvalue = 1\n")
    with pytest.raises(ToolError) as err:
        await call(ctx, "edit_file", path="app.py", old_text="valeu = 1", new_text="value = 2")
    assert "not found in app.py" in str(err.value)
    assert "Closest line (2)" in str(err.value)
    with pytest.raises(ToolError, match="whitespace"):
        await call(
            ctx, "edit_file", path="app.py", old_text="def main():\n  value = 1", new_text=""
        )
    with pytest.raises(ToolError, match=r"appears 2 times in app\.py"):
        await call(ctx, "edit_file", path="app.py", old_text="value = 1", new_text="value = 2")
    assert target.read_text().count("value = 1") == 2  # untouched after errors
    out = await call(
        ctx, "edit_file", path="app.py", old_text="print(value)", new_text="return value"
    )
    after = target.read_bytes()
    assert out == (
        'Replaced 1 occurrence in app.py with 12 bytes (12 characters): "return value"; '
        f"app.py is now {len(after)} bytes, verified on disk "
        f"(sha256 {hashlib.sha256(after).hexdigest()[:12]})"
    )
    out = await call(
        ctx,
        "edit_file",
        path="app.py",
        old_text="value = 1",
        new_text="value = 2",
        replace_all=True,
    )
    assert out.startswith(
        'Replaced 2 occurrences in app.py with 9 bytes (9 characters): "value = 2"; '
    )
    assert target.read_text() == "def main():\n    value = 2\n    return value\n\nvalue = 2\n"
    with pytest.raises(ToolError, match="No such file"):
        await call(ctx, "edit_file", path="nope.py", old_text="a", new_text="b")


#: Text beyond ASCII that must survive a write and an edit byte for byte: an emoji, a
#: ZWJ family (one glyph, five code points), CJK, Hebrew and Arabic (right to left, with
#: a right-to-left mark), and combining marks (e + U+0301, and stacked Vietnamese marks).
UNICODE_CASES = {
    "emoji": "plain 🚀",
    "zwj": "family 👨\u200d👩\u200d👧",
    "cjk": "日本語のテキストと中文",
    "hebrew": "שלום עולם\u200f!",
    "arabic": "مرحبا بالعالم",
    "combining": "cafe\u0301 Vie\u0323\u0302t",
}


@pytest.mark.parametrize("name", list(UNICODE_CASES))
async def test_write_and_edit_round_trip_unicode_byte_exact(
    ws: Path, ctx: ToolContext, name: str
) -> None:
    text = UNICODE_CASES[name]
    data = text.encode("utf-8")
    out = await call(ctx, "write_file", path=f"{name}.txt", content=text)
    assert (ws / f"{name}.txt").read_bytes() == data
    sha = hashlib.sha256(data).hexdigest()[:12]
    assert out.startswith(f"Wrote {len(data)} bytes ({len(text)} characters) to {name}.txt")
    assert f"sha256 {sha}" in out and out.endswith(json.dumps(text, ensure_ascii=False))
    assert text in out  # quoted as written: nothing escaped away or normalized
    # Edit it in the middle, into text of another script: still byte-exact.
    other = UNICODE_CASES["arabic" if name != "arabic" else "cjk"]
    out = await call(
        ctx,
        "edit_file",
        path=f"{name}.txt",
        old_text=text,
        new_text=f"[{text}|{other}]",
    )
    expected = f"[{text}|{other}]".encode()
    assert (ws / f"{name}.txt").read_bytes() == expected
    assert f"{name}.txt is now {len(expected)} bytes" in out
    assert f"sha256 {hashlib.sha256(expected).hexdigest()[:12]}" in out
    assert f"[{text}|{other}]" in out


async def test_a_dropped_character_is_visible_in_the_result(ctx: ToolContext) -> None:
    """The reported case: `write "plain 🚀" to rocket.txt` reached the tool as "plain "
    (the tiny model's grammar dropped the emoji). The tool can't know, but its result
    shows the characters and the text, so a person comparing sees the emoji missing."""
    asked = await call(ctx, "write_file", path="rocket.txt", content="plain 🚀")
    dropped = await call(ctx, "write_file", path="rocket.txt", content="plain ")
    assert asked.startswith("Wrote 10 bytes (7 characters) to rocket.txt")
    assert asked.endswith('"plain 🚀"')
    assert dropped.startswith("Wrote 6 bytes (6 characters) to rocket.txt")
    assert dropped.endswith('"plain "')


async def test_long_content_is_quoted_cut_and_says_so(ws: Path, ctx: ToolContext) -> None:
    text = "line one\n" + "x" * 500
    out = await call(ctx, "write_file", path="long.txt", content=text)
    assert "\n" not in out  # one line: newlines in the content are escaped
    assert out.endswith(f"… (first 80 of {len(text)} characters)")
    assert (ws / "long.txt").read_text() == text


async def test_half_an_emoji_is_refused_with_a_message(ws: Path, ctx: ToolContext) -> None:
    """JSON can carry a lone surrogate ("\\ud83d"): a clear error, not a crash, no file."""
    with pytest.raises(ToolError, match=r"content has an invalid character at position 6"):
        await call(ctx, "write_file", path="half.txt", content="plain \ud83d")
    assert not (ws / "half.txt").exists()
    (ws / "a.txt").write_text("abc")
    with pytest.raises(ToolError, match="new_text has an invalid character"):
        await call(ctx, "edit_file", path="a.txt", old_text="b", new_text="\udc00")
    assert (ws / "a.txt").read_text() == "abc"


def lossy_replace(monkeypatch: pytest.MonkeyPatch, drop: int) -> None:
    """A filesystem that loses the last `drop` bytes of every file renamed into place
    (what a full disk, a sync folder or a converting mount can do): os.replace really
    moves the file, then the file is cut."""
    real = os.replace

    def replace(
        src: str, dst: str, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None
    ) -> None:
        real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        fd = os.open(dst, os.O_WRONLY, dir_fd=dst_dir_fd)  # written beneath a folder fd
        try:
            os.ftruncate(fd, max(os.fstat(fd).st_size - drop, 0))
        finally:
            os.close(fd)

    monkeypatch.setattr(os, "replace", replace)


async def test_write_fails_loudly_when_disk_differs(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    lossy_replace(monkeypatch, drop=4)
    with pytest.raises(ToolError) as err:
        await call(ctx, "write_file", path="rocket.txt", content="plain 🚀")
    message = str(err.value)
    assert message.startswith("rocket.txt was written but what is on disk differs")
    assert "expected 10 bytes" in message and "found 6 bytes" in message
    assert "first difference at byte 6" in message
    assert (ws / "rocket.txt").read_bytes() == b"plain "  # what it found, as it said


async def test_edit_fails_loudly_when_disk_differs(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "note.md").write_text("hello world\n")
    lossy_replace(monkeypatch, drop=1)
    with pytest.raises(ToolError, match=r"note.md was written but what is on disk differs"):
        await call(ctx, "edit_file", path="note.md", old_text="world", new_text="🌍")


# ── list_files / search_files ───────────────────────────────────────────────────


def make_tree(ws: Path) -> None:
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "mod.py").write_text("import os\n# TODO: tidy\n")
    (ws / "src" / "main.py").write_text("print('hi')  # TODO later\n")
    (ws / "README.md").write_text("# Title\nTODO: docs\n")
    (ws / "data.bin").write_bytes(b"TODO\x00\x01\x02")
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("TODO in git\n")


async def test_list_files(ws: Path, ctx: ToolContext) -> None:
    make_tree(ws)
    top = await call(ctx, "list_files")
    assert top.splitlines() == ["README.md  (19 bytes)", "data.bin  (7 bytes)", "src/"]
    deep = await call(ctx, "list_files", path="src", recursive=True)
    assert deep.splitlines() == [
        "main.py  (26 bytes)",
        "pkg/",
        "pkg/mod.py  (23 bytes)",
    ]
    capped = await call(ctx, "list_files", recursive=True, max_entries=2)
    assert capped.splitlines()[:2] == ["README.md  (19 bytes)", "data.bin  (7 bytes)"]
    assert "4 more entries not shown" in capped
    (ws / "empty").mkdir()
    assert await call(ctx, "list_files", path="empty") == "(empty folder)"
    with pytest.raises(ToolError, match="No such"):
        await call(ctx, "list_files", path="missing")


async def test_search_files(ws: Path, ctx: ToolContext) -> None:
    make_tree(ws)
    out = await call(ctx, "search_files", pattern=r"TODO")
    assert out.splitlines() == [
        "README.md:2: TODO: docs",
        "src/main.py:1: print('hi')  # TODO later",
        "src/pkg/mod.py:2: # TODO: tidy",
    ]
    only_py = await call(ctx, "search_files", pattern="TODO", glob="*.py", path="src")
    assert "README" not in only_py and only_py.count("\n") == 1
    capped = await call(ctx, "search_files", pattern="TODO", max_results=1)
    assert capped.startswith("README.md:2:") and "stopped after 1 matches" in capped
    assert (await call(ctx, "search_files", pattern="nothing-here")).startswith("No matches")
    with pytest.raises(ToolError, match=r"Invalid regular expression '\(unclosed'.*missing \)"):
        await call(ctx, "search_files", pattern="(unclosed")


# ── shell ───────────────────────────────────────────────────────────────────────


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the group? Zombies are dead, just unreaped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            return True
    return False


def _group_gone(pgid: int, *, within: float) -> bool:
    deadline = time.monotonic() + within
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


async def test_shell_runs_in_workspace(ws: Path, ctx: ToolContext) -> None:
    out = await call(ctx, "shell", command="pwd; echo out; echo err >&2")
    lines = out.splitlines()
    assert lines[0] == "exit code 0"
    assert Path(lines[1]) == _real(ws)
    assert "out" in lines and "err" in lines
    # stdin is closed: `cat` ends at once instead of waiting for input
    assert await call(ctx, "shell", command="cat") == "exit code 0\n"


async def test_shell_nonzero_exit_is_an_error(ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as err:
        await call(ctx, "shell", command="echo oops; exit 2")
    assert str(err.value) == "exit code 2\noops\n"


async def test_shell_timeout_kills_the_whole_group(ctx: ToolContext) -> None:
    start = time.monotonic()
    with pytest.raises(ToolError) as err:
        await call(ctx, "shell", command="echo pid=$$; sleep 30 & sleep 30; wait", timeout=0.5)
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert message.startswith("Command timed out after 0.5s and was stopped; partial output:")
    pgid = int(re.search(r"pid=(\d+)", message).group(1))
    assert _group_gone(pgid, within=2.0)


async def test_shell_env_is_an_allowlist(monkeypatch: pytest.MonkeyPatch, ws: Path) -> None:
    """Only the allowlist and what the owner lists in `sandbox_env` cross: a secret with
    an ordinary name (DATABASE_URL) stays out as surely as one called *_TOKEN."""
    monkeypatch.setenv("FOO_API_KEY", "s3cret-key")
    monkeypatch.setenv("GITHUB_TOKEN", "s3cret-token")
    monkeypatch.setenv("STEWARD_SLACK_SIGNING", "s3cret-steward")
    monkeypatch.setenv("DATABASE_URL", "postgres://u:s3cret-db@h/d")
    monkeypatch.setenv("HARMLESS_SETTING", "visible")
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    ctx = ToolContext(
        workspace=ws,
        env={"EXTRA": "given"},
        sandbox_env=("HARMLESS_SETTING", "STEWARD_SLACK_SIGNING"),
    )
    out = await call(
        ctx,
        "shell",
        command='echo "[$FOO_API_KEY][$GITHUB_TOKEN][$STEWARD_SLACK_SIGNING][$DATABASE_URL]"; '
        'echo "$HARMLESS_SETTING $EXTRA $LC_TIME"; env',
    )
    assert "[][][][]" in out
    assert "visible given C.UTF-8" in out  # listed, set by Steward, and the locale
    assert "s3cret" not in out  # STEWARD_* never crosses, even when listed
    assert "PATH=" in out


async def test_shell_output_is_capped(ws: Path) -> None:
    ctx = ToolContext(workspace=ws, output_cap=1000)
    out = await call(ctx, "shell", command="seq 1 100000")
    assert out.startswith("exit code 0\n1\n2\n")
    assert "[output cut:" in out
    assert out.rstrip().endswith("100000")  # the tail is kept too
    assert len(out) < 1200


async def test_shell_rejects_bad_arguments(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="command must be"):
        await call(ctx, "shell", command="")
    with pytest.raises(ToolError, match="timeout must be"):
        await call(ctx, "shell", command="true", timeout=-1)


# ── web_fetch ───────────────────────────────────────────────────────────────────

PAGE = """<!doctype html><html><head><title>Release notes</title>
<style>body { color: red }</style><script>var tracking = 1;</script></head>
<body><nav>Home | About</nav>
<h1>Version   2.0</h1>
<p>Faster   startup.</p>
<p>Fixed
   the login bug.</p>
<footer>Copyright footer</footer></body></html>"""


@pytest.fixture
async def site() -> AsyncIterator[str]:
    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def big(_: web.Request) -> web.Response:
        return web.Response(text="z" * 200_000, content_type="text/plain")

    async def data(_: web.Request) -> web.Response:
        return web.json_response({"ok": True, "items": [1, 2]})

    async def binary(_: web.Request) -> web.Response:
        return web.Response(body=b"\x00\x01", content_type="application/octet-stream")

    async def missing(_: web.Request) -> web.Response:
        return web.Response(status=404, text="gone")

    async def moved(_: web.Request) -> web.Response:
        raise web.HTTPFound("/page")

    async def loop(_: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    app = web.Application()
    app.router.add_get("/page", page)
    app.router.add_get("/big", big)
    app.router.add_get("/data", data)
    app.router.add_get("/bin", binary)
    app.router.add_get("/missing", missing)
    app.router.add_get("/moved", moved)
    app.router.add_get("/loop", loop)
    runner = web.AppRunner(app)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def fetch_ctx(ws: Path, site: str) -> ToolContext:
    """The test site is on 127.0.0.1, which the egress policy refuses unless listed."""
    return ToolContext(
        workspace=ws,
        fetch_timeout=5,
        fetch_max_bytes=10_000,
        output_cap=5000,
        egress=EgressPolicy([site.removeprefix("http://")]),
    )


async def test_web_fetch_html_becomes_text(site: str, fetch_ctx: ToolContext) -> None:
    out = await call(fetch_ctx, "web_fetch", url=f"{site}/moved")
    assert out.splitlines()[:2] == [f"URL: {site}/page", "Title: Release notes"]
    assert "Version 2.0" in out
    assert "Faster startup." in out
    assert "Fixed the login bug." in out
    for furniture in ("tracking", "color: red", "Home | About", "Copyright footer"):
        assert furniture not in out


async def test_web_fetch_json_and_limits(site: str, fetch_ctx: ToolContext) -> None:
    out = await call(fetch_ctx, "web_fetch", url=f"{site}/data")
    assert json.loads(out.split("\n\n", 1)[1]) == {"ok": True, "items": [1, 2]}
    big = await call(fetch_ctx, "web_fetch", url=f"{site}/big")
    assert "[download cut at 10000 bytes" in big
    assert "[output cut:" in big  # 10 000 bytes > output_cap 5000
    short = await call(fetch_ctx, "web_fetch", url=f"{site}/big", max_chars=100)
    assert short.count("z") == 100


async def test_web_fetch_errors(site: str, fetch_ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="HTTP 404"):
        await call(fetch_ctx, "web_fetch", url=f"{site}/missing")
    with pytest.raises(ToolError, match="application/octet-stream"):
        await call(fetch_ctx, "web_fetch", url=f"{site}/bin")
    with pytest.raises(ToolError, match="Too many redirects"):
        await call(fetch_ctx, "web_fetch", url=f"{site}/loop")
    for url in ("file:///etc/passwd", "ftp://example.com/x", "javascript:alert(1)", "example.com"):
        with pytest.raises(ToolError, match="Only http:// and https://"):
            await call(fetch_ctx, "web_fetch", url=url)


async def test_web_fetch_refuses_what_the_egress_policy_refuses(site: str, ws: Path) -> None:
    """No egress_allow: the test site on 127.0.0.1 is this machine, refused before any
    request, with the setting that would allow it named."""
    ctx = ToolContext(workspace=ws, fetch_timeout=5)
    with pytest.raises(ToolError) as refused:
        await call(ctx, "web_fetch", url=f"{site}/page")
    message = str(refused.value)
    assert message.startswith("Not fetched: 127.0.0.1 is a loopback address")
    assert "STEWARD_EGRESS_ALLOW=127.0.0.1:" in message
    with pytest.raises(ToolError, match="ambiguous"):
        await call(ctx, "web_fetch", url="http://ex ample.com/")
