"""Undo in a cluster: the snapshot store beside the shared workspace, used by two workers
at once, each a real process with its own data dir (core/snapshots).

What must hold: two workers snapshotting the one workspace at the same moment (and one
of them pruning meanwhile) leave a store whose every record can be read back whole;
`/undo` taken by worker B puts back exactly the files a task of worker A changed; an
open record of a task A still runs is neither settled nor undone from B, and is once A
is dead; no command in the sandbox can write the store.

The database URL is set only because it is what makes the store shared (a cluster); no
test here connects to it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import signal
import stat
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings, load_settings
from core.sandbox.bwrap import Sandbox
from core.sandbox.configure import detect
from core.snapshots import SnapshotStore, Undo, from_settings, store_root
from core.snapshots.store import StoreMismatch
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay
from tests.test_undo_replay import REQUEST, said, script_task, tree
from tests.test_undo_replay import seed as seed_replay

#: Tasks each worker runs in the concurrent test.
ROUNDS = 20
#: Files per task whose bytes both workers write (the same blobs, stored at once).
SAME_BYTES = 60
#: Never connected to: setting it is what makes this a cluster's configuration.
CLUSTER_DB = "postgresql://steward@127.0.0.1:1/steward"
SPAWN = multiprocessing.get_context("spawn")


def worker_settings(tmp_path: Path, name: str, **more: Any) -> Settings:
    """Worker `name`'s settings: its own data dir, the shared workspace, a cluster."""
    env = make_env(tmp_path, None, database_url=CLUSTER_DB, **more)
    env["STEWARD_DATA_DIR"] = str(tmp_path / f"data-{name}")
    return load_settings(env=env, cwd=tmp_path)


def open_undo(settings: Settings) -> Undo:
    undo = from_settings(settings, settings.workspace.resolve(), settings.data_dir)
    assert undo is not None
    return undo


# ── what each worker process does ───────────────────────────────────────────────
async def _concurrent(undo: Undo, ws: Path, name: str, start: Event) -> None:
    """ROUNDS tasks, each writing its own file, a log, and files whose bytes the other
    worker writes too at about the same time (the same objects, stored by both at once);
    worker "a" prunes with no grace after every task, while "b" snapshots."""
    folder = ws / name
    folder.mkdir(exist_ok=True)
    start.wait(30)
    for i in range(ROUNDS):
        task = f"{name}{i:02d}"
        await undo.before_tool(task, conversation=f"slack:{name}", request=task, tool="shell")
        (folder / f"f{i}.txt").write_text(f"{name} {i}\n" * (i + 1))
        with (folder / "log.txt").open("a") as fh:
            fh.write(f"{task}\n")
        common = folder / f"common{i % 3}"
        common.mkdir(exist_ok=True)
        for k in range(SAME_BYTES):
            (common / f"{k}.txt").write_text(f"same {i} {k}\n")
        undo.after_tool(task, "shell")
        await undo.after_task(task)
        if name == "a":
            await undo.prune(grace=0)


async def _one_task(undo: Undo, ws: Path) -> None:
    """A task of conversation slack:C1 that edits, adds, removes and chmods."""
    await undo.before_tool("t-a", conversation="slack:C1", request="tidy up", tool="shell")
    (ws / "notes" / "keep.md").write_text("rewritten\n")
    (ws / "new").mkdir()
    (ws / "new" / "b.txt").write_text("brand new\n")
    (ws / "notes" / "old.md").unlink()
    (ws / "run.sh").chmod(0o644)
    undo.after_tool("t-a", "shell")
    await undo.after_task("t-a")


async def _stays_open(undo: Undo, ws: Path, ready: Event) -> None:
    """A task that changed a file and never ends (until the process is killed)."""
    await undo.before_tool("t-open", conversation="slack:C2", request="long", tool="shell")
    (ws / "notes" / "keep.md").write_text("half done\n")
    ready.set()
    await asyncio.sleep(600)


def worker_main(tmp_path: Path, name: str, mode: str, start: Event, ready: Event) -> None:
    """A worker-like process: worker `name`'s settings and undo service, one job."""
    settings = worker_settings(tmp_path, name)
    undo = open_undo(settings)
    ws = settings.workspace.resolve()

    async def run() -> None:
        await undo.recover()
        if mode == "concurrent":
            await _concurrent(undo, ws, name, start)
        elif mode == "one":
            await _one_task(undo, ws)
        else:
            await _stays_open(undo, ws, ready)

    asyncio.run(run())
    undo.close()


def start_worker(tmp_path: Path, name: str, mode: str) -> tuple[Any, Event, Event]:
    start, ready = SPAWN.Event(), SPAWN.Event()
    proc = SPAWN.Process(target=worker_main, args=(tmp_path, name, mode, start, ready))
    proc.start()
    return proc, start, ready


def seed(ws: Path) -> None:
    (ws / "notes").mkdir(parents=True, exist_ok=True)
    (ws / "notes" / "keep.md").write_text("# keep\n")
    (ws / "notes" / "old.md").write_bytes(b"old notes\n" * 50)
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)


def readable_whole(store: SnapshotStore, tree_id: str) -> int:
    """Every file of snapshot `tree_id` read back (KeyError: an object is missing)."""
    files = store.flatten(tree_id)
    for _mode, sha in files.values():
        store.blob(sha)
    return len(files)


# ── tests ────────────────────────────────────────────────────────────────────────
def test_a_cluster_keeps_one_store_beside_the_workspace(tmp_path: Path) -> None:
    one = load_settings(env=make_env(tmp_path, None), cwd=tmp_path)
    single = open_undo(one)
    assert single.store.root == one.data_dir / "snapshots" and not single.store.shared
    assert single.owner == ""
    single.close()

    a, b = worker_settings(tmp_path, "a"), worker_settings(tmp_path, "b")
    ws = a.workspace.resolve()
    for s in (a, b):
        assert store_root(s, ws, s.data_dir) == ws.parent / ".steward-snapshots"
    chosen = worker_settings(tmp_path, "c", snapshot_dir=str(tmp_path / "elsewhere"))
    assert store_root(chosen, ws, chosen.data_dir) == tmp_path / "elsewhere"


def test_two_workers_snapshot_at_once_and_the_store_stays_whole(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    procs = [start_worker(tmp_path, name, "concurrent") for name in ("a", "b")]
    for _proc, start, _ready in procs:
        start.set()
    for proc, _start, _ready in procs:
        proc.join(120)
        assert proc.exitcode == 0

    settings = worker_settings(tmp_path, "c")
    undo = open_undo(settings)
    records = undo.load()
    assert sorted(r["id"] for r in records) == sorted(
        f"{n}{i:02d}" for n in "ab" for i in range(ROUNDS)
    )
    for rec in records:
        assert rec["after"] is not None, rec["id"]
        readable_whole(undo.store, rec["before"])
        assert readable_whole(undo.store, rec["after"]) >= 2
        name, i = rec["id"][0], int(rec["id"][1:])
        assert f"{name}/f{i}.txt" in rec["files"], rec["files"]
    # Nothing was left locked or half-written, and no worker is left alive in it.
    assert not list((undo.store.root / "objects").glob("*/*.lock"))
    assert [p.name for p in (undo.store.root / "owners").glob("*.lock")] == [f"{undo.owner}.lock"]
    undo.close()


def test_undo_on_another_worker_restores_exactly(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    seed(ws)
    before = tree(ws)
    proc, _start, _ready = start_worker(tmp_path, "a", "one")
    proc.join(60)
    assert proc.exitcode == 0
    assert tree(ws) != before

    undo_b = open_undo(worker_settings(tmp_path, "b"))
    listed = asyncio.run(undo_b.records_of("slack:C1"))
    assert [r["id"] for r in listed] == ["t-a"]
    done = asyncio.run(undo_b.undo("slack:C1"))
    assert done.status == "done", done
    assert tree(ws) == before
    assert stat.S_IMODE((ws / "run.sh").stat().st_mode) == 0o755
    assert not (ws / "new").exists()
    undo_b.close()

    # The undo is a record every worker sees: worker a, started again, undoes it.
    undo_a = open_undo(worker_settings(tmp_path, "a"))
    again = asyncio.run(undo_a.undo("slack:C1", done.undo_id))
    assert again.status == "done", again
    assert (ws / "new" / "b.txt").read_text() == "brand new\n"
    undo_a.close()


def test_a_task_running_on_another_worker_is_left_to_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    seed(ws)
    before = tree(ws)
    proc, _start, ready = start_worker(tmp_path, "a", "open")
    try:
        assert ready.wait(60)
        undo_b = open_undo(worker_settings(tmp_path, "b"))
        asyncio.run(undo_b.recover())
        (rec,) = undo_b.load()
        assert rec["after"] is None and rec["owner"] != undo_b.owner
        busy = asyncio.run(undo_b.undo("slack:C2"))
        assert busy.status == "running"
        assert (ws / "notes" / "keep.md").read_text() == "half done\n"
    finally:
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    # Its worker is dead: the next look settles the record, and the undo goes through.
    done = asyncio.run(undo_b.undo("slack:C2"))
    assert done.status == "done", done
    assert tree(ws) == before
    assert not (undo_b.store.root / "owners" / f"{rec['owner']}.lock").exists()
    undo_b.close()


def test_a_prune_on_one_worker_leaves_the_other_naming_no_lost_object(tmp_path: Path) -> None:
    """Worker b cached folder x's tree; x went, a pruned what no snapshot kept; x came
    back the same: b must store its tree again, not name the pruned one."""
    ws, root = tmp_path / "ws", tmp_path / "store"
    (ws / "x").mkdir(parents=True)
    (ws / "x" / "f.txt").write_text("one\n")
    a = SnapshotStore(root, ws, shared=True)
    b = SnapshotStore(root, ws, shared=True)
    b.snapshot()
    shutil.rmtree(ws / "x")
    b.snapshot()
    assert a.owners is not None
    assert a.prune(a.owners.live_trees(), grace=0) > 0
    (ws / "x").mkdir()
    (ws / "x" / "f.txt").write_text("one\n")
    assert readable_whole(b, b.snapshot()) == 1
    a.close()
    b.close()


def test_one_store_per_workspace(tmp_path: Path) -> None:
    shared = tmp_path / "store"
    first = SnapshotStore(shared, tmp_path / "ws1", shared=True)
    first.close()
    with pytest.raises(StoreMismatch, match="snapshot_dir"):
        SnapshotStore(shared, tmp_path / "ws2", shared=True)


def writable_mounts(argv: list[str]) -> list[str]:
    """The destinations bubblewrap binds writable (`--bind SRC DEST`)."""
    return [argv[i + 2] for i, a in enumerate(argv) if a == "--bind"]


@pytest.mark.parametrize("where", ["srv", "home"])
def test_the_sandbox_cannot_write_the_store(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default store sits beside the workspace: the sandbox binds the workspace and
    nothing above it writable, so no command reaches the store (a home folder holding
    both is a private tmpfs inside)."""
    home = tmp_path / "home"
    base = home if where == "home" else tmp_path / "srv"
    monkeypatch.setenv("HOME", str(home))
    env = make_env(tmp_path, None, database_url=CLUSTER_DB)
    env["STEWARD_WORKSPACE"] = str(base / "workspace")
    settings = load_settings(env=env, cwd=tmp_path)
    undo = open_undo(settings)
    root = str(undo.store.root)
    ws = settings.workspace.resolve()
    sandbox = Sandbox(bwrap="bwrap", workspace=ws, hidden=(settings.data_dir,), home=str(home))
    argv = sandbox.argv(f"touch {root}/lock {root}/tasks/x.json")
    for dest in writable_mounts(argv):
        assert not (root == dest or root.startswith(dest.rstrip("/") + "/")), dest
    assert str(ws) in writable_mounts(argv)
    found = detect()
    if found.ok and found.bwrap:  # where bubblewrap runs, try it for real
        import subprocess

        real = Sandbox(bwrap=found.bwrap, workspace=ws, hidden=(settings.data_dir,))
        ran = subprocess.run(
            real.argv(f"touch {root}/tasks/x.json || mkdir -p {root}/tasks/y"),
            capture_output=True,
            timeout=60,
        )
        assert ran.returncode != 0
        assert not (undo.store.root / "tasks" / "x.json").exists()
        assert not (undo.store.root / "tasks" / "y").exists()
    undo.close()


async def test_undo_through_the_app_of_another_worker(llm: ScriptedLLM, tmp_path: Path) -> None:
    """The whole path: worker a's App runs a task (edit, shell, write) through the agent;
    `/undo` sent to worker b's App puts the workspace back byte for byte."""
    a = worker_settings(tmp_path, "a", model=f"openai/{llm.model_id}", api_base=llm.base_url)
    b = worker_settings(tmp_path, "b", model=f"openai/{llm.model_id}", api_base=llm.base_url)
    seed_replay(a.workspace)
    before = tree(a.workspace)
    script_task(llm)
    out = await replay(a, [{"t": 0, "user": "alice", "text": REQUEST}])
    assert "— /undo to revert" in said(out)[0]
    assert not (a.workspace / "build").exists()
    assert not (a.data_dir / "snapshots").exists() and not (b.data_dir / "snapshots").exists()

    out = await replay(b, [{"t": 0, "user": "alice", "text": "/undo"}])
    [undone] = said(out)
    assert undone.startswith("Undid task "), undone
    assert tree(a.workspace) == before


async def test_no_approval_opens_the_shared_store(tmp_path: Path) -> None:
    """In a cluster the store sits outside the data dir, beside the workspace: the App
    must count it among Steward's own files, so a grant asking to write it is refused
    and the guardian treats it as Steward's, as it does the data dir."""
    from bot.app import App
    from core.sandbox.bwrap import GrantRefused
    from core.sandbox.grant import Grant

    settings = worker_settings(tmp_path, "a")
    root = store_root(settings, settings.workspace.resolve(), settings.data_dir)
    assert not root.is_relative_to(settings.data_dir.resolve())
    app = App(settings)
    try:
        assert root in app._own_files()
        assert str(root) in {str(p) for p in app.guardian.own_paths}
        sandbox = app.sandbox.sandbox
        if sandbox is not None:  # where bubblewrap runs: the grant itself is refused
            with pytest.raises(GrantRefused):
                sandbox.check(Grant(write=(str(root / "tasks"),)))
    finally:
        await app.stop()


@pytest.mark.parametrize("made", [[], ["info"], ["info", "pack"]])
def test_a_store_half_made_by_another_worker_opens(tmp_path: Path, made: list[str]) -> None:
    """What a worker starting at the same moment, or one killed while making the store,
    leaves behind (some of the object store's folders) must not stop the next start."""
    settings = worker_settings(tmp_path, "a")
    root = store_root(settings, settings.workspace.resolve(), settings.data_dir)
    for folder in made:
        (root / "objects" / folder).mkdir(parents=True)
    undo = open_undo(settings)
    assert (undo.store.root / "objects" / "pack").is_dir()
    undo.close()
