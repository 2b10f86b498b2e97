"""The file tools open every path beneath a descriptor of the workspace, following no
link (core/safe_fs.py): the attack that made read_file return a file of Steward's data
dir and write_file write outside the workspace is run here for real, a thread swapping a
folder for a link to the outside while the tools run, with the kernel's openat2 and with
the component-by-component walk used where the kernel lacks it. Also: links to devices,
FIFOs, look-alike dots and control characters in paths, the owner of what is written
when Steward runs as root, and an approved write outside."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import safe_fs
from core.sandbox import Grant
from core.tools import ALL_TOOLS, write_file
from core.tools.base import ToolContext, ToolError
from core.tools.workspace import parse_path

CANARY = "CANARY-7f3a91-steward-data-dir"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both ways of opening beneath the workspace: the kernel's openat2 (where it has
    it) and the O_NOFOLLOW walk, forced by telling safe_fs the kernel lacks openat2."""
    if request.param == "openat2":
        if not safe_fs.openat2_available():
            pytest.skip("this kernel has no openat2 (Linux 5.6+)")
        monkeypatch.setattr(safe_fs, "_openat2_state", True)
    else:
        monkeypatch.setattr(safe_fs, "_openat2_state", False)
    yield request.param


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, shell_timeout=10, output_cap=5000)


async def call(ctx: ToolContext, tool: str, **args: object) -> str:
    return await ALL_TOOLS[tool].run(ctx, args)


async def outcome(ctx: ToolContext, tool: str, **args: object) -> str:
    """The result, or the error the model would read: both must never show the canary.
    (Anything else a tool raises reaches the model as "the tool crashed (...)".)"""
    try:
        return await call(ctx, tool, **args)
    except ToolError as exc:
        return f"Error: {exc}"
    except Exception as exc:
        return f"Error: the tool crashed ({type(exc).__name__}: {exc})."


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
    }


# ── the race ─────────────────────────────────────────────────────────────────────


_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2


def exchange(a: Path, b: Path) -> None:
    """renameat2(RENAME_EXCHANGE): `a` and `b` trade places in one step, so `a` always
    exists, as one or the other (the strongest form of the flip)."""
    if _libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Flipper(threading.Thread):
    """What a sandboxed script did: `ws/d` is, in a tight loop, a real folder and a link
    to a folder outside the workspace that holds the canary."""

    def __init__(self, ws: Path, outside: Path) -> None:
        super().__init__(daemon=True)
        self.ws = ws
        self.stop = threading.Event()
        self.flips = 0
        (ws / "d").mkdir()
        (ws / "d" / "f.txt").write_text("inside\n")
        (ws / "d.link").symlink_to(outside)

    def run(self) -> None:
        d, link = self.ws / "d", self.ws / "d.link"
        while not self.stop.is_set():
            exchange(d, link)
            self.flips += 1
            time.sleep(0)  # let the tools' threads run between flips too


async def test_a_folder_flipped_to_a_link_never_leads_a_tool_outside(
    resolver: str, ws: Path, tmp_path: Path, ctx: ToolContext
) -> None:
    outside = tmp_path / "data-dir"
    outside.mkdir()
    (outside / "f.txt").write_text(f"{CANARY}\n")
    (outside / "policy.toml").write_text(f"# {CANARY}\n")
    before = tree(outside)
    flipper = Flipper(ws, outside)
    flipper.start()
    seen: list[str] = []
    inside_reads = 0
    start = time.monotonic()
    try:
        for i in range(400):
            if time.monotonic() - start > 2.5:
                break
            out = [
                await outcome(ctx, "read_file", path="d/f.txt"),
                await outcome(ctx, "write_file", path=f"d/new{i % 5}.txt", content="w"),
                await outcome(ctx, "write_file", path="d/policy.toml", content="pwned"),
                await outcome(ctx, "edit_file", path="d/f.txt", old_text="in", new_text="in"),
                await outcome(ctx, "list_files", path="d"),
                await outcome(ctx, "search_files", pattern="CANARY|inside", path="d"),
            ]
            if i % 20 == 0:
                out.append(await outcome(ctx, "search_files", pattern="CANARY"))
                out.append(await outcome(ctx, "list_files", recursive=True))
            inside_reads += out[0] == "inside\n"
            seen.extend(out)
    finally:
        flipper.stop.set()
        flipper.join()
    leaked = [text for text in seen if CANARY in text]
    assert not leaked, leaked[:3]
    assert tree(outside) == before  # nothing written, created or changed outside
    assert names(tmp_path) == ["data-dir", "ws"]
    # The race was real: the folder did flip, and the tools did read it when it was one.
    assert flipper.flips > 50 and inside_reads > 0
    assert any("is a symbolic link" in text for text in seen)


# ── what is not a plain file ─────────────────────────────────────────────────────


async def test_a_link_to_dev_zero_is_refused_not_read(
    resolver: str, ws: Path, ctx: ToolContext
) -> None:
    (ws / "notes.md").symlink_to("/dev/zero")
    (ws / "ok.txt").write_text("zero hero\n")
    start = time.monotonic()
    with pytest.raises(ToolError) as err:
        await call(ctx, "read_file", path="notes.md")
    assert str(err.value).startswith("notes.md is a symbolic link to /dev/zero, outside the")
    assert "file tools do not follow links" in str(err.value)
    with pytest.raises(ToolError, match=r"^notes\.md is a symbolic link"):
        await call(ctx, "edit_file", path="notes.md", old_text="a", new_text="b")
    with pytest.raises(ToolError, match=r"^notes\.md is a symbolic link"):
        await call(ctx, "write_file", path="notes.md", content="x")
    assert (ws / "notes.md").is_symlink()  # the link is left as it was
    assert await call(ctx, "search_files", pattern="zero") == "ok.txt:1: zero hero"
    assert await call(ctx, "list_files") == "notes.md -> /dev/zero\nok.txt  (10 bytes)"
    assert time.monotonic() - start < 2


async def test_a_fifo_is_refused_at_once(resolver: str, ws: Path, ctx: ToolContext) -> None:
    os.mkfifo(ws / "pipe")
    (ws / "sub").mkdir()
    os.mkfifo(ws / "sub" / ".gitignore")
    start = time.monotonic()
    with pytest.raises(ToolError) as err:
        await call(ctx, "read_file", path="pipe")
    assert str(err.value) == (
        "pipe is a named pipe (FIFO), not a regular file; file tools only read regular files"
    )
    with pytest.raises(ToolError, match="named pipe"):
        await call(ctx, "edit_file", path="sub/.gitignore", old_text="a", new_text="b")
    with pytest.raises(ToolError, match="named pipe"):
        await call(ctx, "write_file", path="pipe", content="x")
    assert (await call(ctx, "search_files", pattern="x")).startswith("No matches")
    listing = await call(ctx, "list_files", recursive=True)
    assert listing.splitlines() == ["pipe  (named pipe)", "sub/", "sub/.gitignore  (named pipe)"]
    assert time.monotonic() - start < 2


async def test_a_link_inside_the_workspace_is_named_with_its_target(
    resolver: str, ws: Path, ctx: ToolContext
) -> None:
    (ws / "docs" / "v2").mkdir(parents=True)
    (ws / "docs" / "v2" / "notes.md").write_text("hello\n")
    (ws / "notes.md").symlink_to("docs/v2/notes.md")
    (ws / "current").symlink_to("docs/v2")
    with pytest.raises(ToolError) as err:
        await call(ctx, "read_file", path="notes.md")
    assert str(err.value) == (
        "notes.md is a symbolic link to docs/v2/notes.md; file tools do not follow links, "
        "use its target path instead: docs/v2/notes.md"
    )
    with pytest.raises(ToolError) as err:
        await call(ctx, "write_file", path="current/notes.md", content="x")
    assert str(err.value).endswith("use its target path instead: docs/v2/notes.md")
    assert await call(ctx, "read_file", path="docs/v2/notes.md") == "hello\n"
    assert (ws / "docs" / "v2" / "notes.md").read_text() == "hello\n"
    assert await call(ctx, "list_files", path="current") == "current -> docs/v2"


async def test_both_resolvers_do_the_ordinary_work(
    resolver: str, ws: Path, tmp_path: Path, ctx: ToolContext
) -> None:
    out = await call(ctx, "write_file", path="a/b/c/notes.md", content="one\ntwo\n")
    assert out.startswith("Wrote 8 bytes (8 characters) to a/b/c/notes.md")
    assert await call(ctx, "read_file", path="a/b/c/notes.md") == "one\ntwo\n"
    assert await call(ctx, "read_file", path=str(ws / "a/./b/../b/c/notes.md")) == "one\ntwo\n"
    await call(ctx, "edit_file", path="a/b/c/notes.md", old_text="two", new_text="deux")
    assert (ws / "a/b/c/notes.md").read_text() == "one\ndeux\n"
    assert await call(ctx, "search_files", pattern="deux") == "a/b/c/notes.md:2: deux"
    assert await call(ctx, "list_files", path="a", recursive=True) == (
        "b/\nb/c/\nb/c/notes.md  (9 bytes)"
    )
    # A link part way down is named, whichever resolver met it.
    (ws / "a" / "b" / "out").symlink_to(tmp_path)
    with pytest.raises(ToolError, match=r"^a/b/out is a symbolic link to .*outside the workspace"):
        await call(ctx, "read_file", path="a/b/out/ws/a/b/c/notes.md")
    with pytest.raises(ToolError, match=r"No such file: a/b/c/nope\.md\. Files here: notes\.md"):
        await call(ctx, "read_file", path="a/b/c/nope.md")
    assert sorted(p.name for p in (ws / "a/b/c").iterdir()) == ["notes.md"]  # no temp files


# ── names ────────────────────────────────────────────────────────────────────────

SUSPICIOUS = {
    "one dot leader": "\u2024\u2024/secret.txt",
    "two dot leader": "\u2025/secret.txt",
    "fullwidth stop": "\uff0e\uff0e/secret.txt",
    "small stop": "docs/\ufe52\ufe52/secret.txt",
    "ideographic stop": "notes\u3002md",
    "fullwidth solidus": "docs\uff0fsecret.txt",
    "newline": "notes.md\nother.md",
    "carriage return": "notes.md\r",
    "escape": "notes\x1b[2J.md",
    "right-to-left override": "notes\u202etxt.md",
}


@pytest.mark.parametrize("name", list(SUSPICIOUS))
async def test_lookalike_dots_and_control_characters_are_refused(
    ws: Path, tmp_path: Path, ctx: ToolContext, name: str
) -> None:
    path = SUSPICIOUS[name]
    for tool, args in [
        ("read_file", {}),
        ("write_file", {"content": "x"}),
        ("edit_file", {"old_text": "a", "new_text": "b"}),
        ("list_files", {}),
        ("search_files", {"pattern": "x"}),
    ]:
        with pytest.raises(ToolError) as err:
            await call(ctx, tool, path=path, **args)
        message = str(err.value)
        assert message.startswith("The path ") and "File tools refuse such paths" in message
        assert "\n" not in message and "\r" not in message
    assert names(ws) == []
    assert names(tmp_path) == ["ws"]


# ── who owns what Steward writes ─────────────────────────────────────────────────


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files away")
async def test_as_root_a_written_file_takes_its_folders_owner(
    resolver: str, ws: Path, ctx: ToolContext
) -> None:
    """The sandbox runs commands as an unprivileged user when Steward is root: what
    Steward's own tools write must stay theirs to change."""
    os.chown(ws, 4321, 4322)
    (ws / "old.txt").write_text("old")
    (ws / "old.txt").chmod(0o640)
    await call(ctx, "write_file", path="new/deeper/n.txt", content="n")
    await call(ctx, "edit_file", path="old.txt", old_text="old", new_text="new")
    for rel in ("new", "new/deeper", "new/deeper/n.txt", "old.txt"):
        st = (ws / rel).stat()
        assert (st.st_uid, st.st_gid) == (4321, 4322), rel
    assert (ws / "old.txt").stat().st_mode & 0o777 == 0o640


# ── an approved write outside the workspace ──────────────────────────────────────


async def test_an_approved_file_outside_is_written_and_nothing_else(
    resolver: str, ws: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    report = elsewhere / "report.txt"
    ctx = ToolContext(workspace=ws, grant=Grant(write=(str(report),)))
    out = await call(ctx, "write_file", path="../elsewhere/report.txt", content="q3\n")
    assert out.startswith(f"Wrote 3 bytes (3 characters) to {report}")
    assert report.read_text() == "q3\n"
    await call(ctx, "edit_file", path=str(report), old_text="q3", new_text="q4")
    assert report.read_text() == "q4\n"
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(ctx, "write_file", path="../elsewhere/other.txt", content="x")
    # The approved name turned into a link: refused, the link's target untouched.
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    target = parse_path(ws, str(report), granted=ctx.grant.write)  # judged while a file…
    assert target.outside
    report.unlink()
    report.symlink_to(victim)  # …and a link by the time it is opened
    with pytest.raises(ToolError, match=r"report.txt is a symbolic link to .*victim.txt"):
        write_file._write(ws, target, b"pwned")
    with pytest.raises(ToolError, match="outside the workspace"):  # judged now: refused
        await call(ctx, "write_file", path=str(report), content="pwned")
    assert victim.read_text() == "keep"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["report.txt"]
