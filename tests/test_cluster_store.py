"""The cluster store against a real PostgreSQL (own database per test, tests/services.py):
migrations, the event journal, conversation leases, exactly-once runs, documents and the
data-dir mirror."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

from memory.cluster import store as store_module
from memory.cluster.mirror import DataDirMirror, is_shared
from memory.cluster.store import ClusterStore, ClusterStoreError
from tests.services import require_postgres, with_database

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def open_store(postgres_url: str) -> AsyncIterator[Callable[[str], Awaitable[ClusterStore]]]:
    """Open stores (one per simulated worker) on this test's database; all closed after."""
    stores: list[ClusterStore] = []

    async def open_(worker: str) -> ClusterStore:
        store = await ClusterStore.open(postgres_url, worker_id=worker)
        stores.append(store)
        return store

    yield open_
    for store in stores:
        await store.close()


async def eventually(check: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait (polling) until check() holds; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


# ---- open and migrations -----------------------------------------------------------


async def test_concurrent_opens_create_the_database_and_migrate_once() -> None:
    """Three workers starting together on a database that does not exist yet: one
    creates it, one applies the migration, all three open."""
    admin = require_postgres()
    name = f"steward_test_{uuid.uuid4().hex[:12]}"
    url = with_database(admin, name)
    try:
        stores = await asyncio.gather(
            *(ClusterStore.open(url, worker_id=f"w{i}") for i in range(3))
        )
        try:
            assert [await s.claim_run("schedule", "s", "t") for s in stores].count(True) == 1
        finally:
            for s in stores:
                await s.close()
        again = await ClusterStore.open(url, worker_id="w4")  # nothing left to apply
        await again.close()
        with psycopg.connect(url) as conn:
            applied = conn.execute(
                "SELECT count(*) FROM _yoyo_log WHERE operation = 'apply'"
            ).fetchone()
            migrations = Path(store_module.__file__).parent / "migrations"
            written = [m for m in migrations.glob("*.sql") if not m.name.endswith(".rollback.sql")]
            assert applied == (len(written),)  # each applied once, by one of the three
            held = conn.execute("SELECT count(*) FROM yoyo_lock").fetchone()
            assert held == (0,)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_unreachable_server_names_the_setting() -> None:
    with pytest.raises(ClusterStoreError) as caught:
        await ClusterStore.open("postgresql://postgres@127.0.0.1:1/steward", worker_id="w")
    message = str(caught.value)
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in message
    assert "STEWARD_DATABASE_URL" in message


async def test_not_a_postgres_url_is_refused() -> None:
    with pytest.raises(ClusterStoreError, match="STEWARD_DATABASE_URL must be a postgresql://"):
        await ClusterStore.open("nats://127.0.0.1:4222", worker_id="w")


async def test_missing_database_and_a_role_that_may_not_create_it() -> None:
    admin = require_postgres()
    role = f"steward_nocreate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN NOCREATEDB')
    try:
        url = with_database(admin, f"steward_missing_{uuid.uuid4().hex[:8]}")
        url = url.replace("postgres@", f"{role}@", 1)
        with pytest.raises(ClusterStoreError) as caught:
            await ClusterStore.open(url, worker_id="w")
        message = str(caught.value)
        assert "does not exist" in message and "may not create databases" in message
        assert "createdb" in message and "STEWARD_DATABASE_URL" in message
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


# ---- event journal -----------------------------------------------------------------


async def test_claim_event_exactly_one_new_then_started_then_done(
    open_store: Callable[[str], Awaitable[ClusterStore]],
) -> None:
    workers = [await open_store(f"w{i}") for i in range(3)]
    key = "slack:message:Ev123"
    claims = await asyncio.gather(
        *(workers[i % 3].claim_event(key, {"text": f"claim {i}"}) for i in range(24))
    )
    states = [state for state, _record in claims]
    assert states.count("new") == 1
    assert states.count("started") == 23
    winner = next(record for state, record in claims if state == "new")
    assert all(record == winner for _state, record in claims)

    await workers[1].finish_event(key)
    assert await workers[2].claim_event(key, {"text": "late"}) == ("done", winner)
    # an event finished without a claim (dropped) can never start afterwards
    await workers[0].finish_event("slack:message:Ev999", "dropped")
    assert (await workers[1].claim_event("slack:message:Ev999", {}))[0] == "done"


# ---- conversation leases -----------------------------------------------------------


async def test_lease_is_exclusive_across_workers_and_freed_on_close(
    open_store: Callable[[str], Awaitable[ClusterStore]],
) -> None:
    a, b = await open_store("a"), await open_store("b")
    assert await a.try_lease("slack:C1") is True
    assert await b.try_lease("slack:C1") is False
    assert await a.try_lease("slack:C1") is False  # held already, even by itself
    assert await b.try_lease("slack:C2") is True  # other conversations are free
    await a.release_lease("slack:C1")
    assert await b.try_lease("slack:C1") is True
    await b.close()
    assert await a.try_lease("slack:C1") is True
    assert await a.try_lease("slack:C2") is True


async def test_lease_session_cut_is_reopened_and_its_leases_are_free(
    postgres_url: str, open_store: Callable[[str], Awaitable[ClusterStore]]
) -> None:
    a, b = await open_store("a"), await open_store("b")
    assert await a.try_lease("line:U1") is True
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE application_name = 'steward-lease-a'"
        )
    assert await b.try_lease("line:U1") is True  # the server freed a's lease
    assert await a.try_lease("line:U2") is True  # a reconnected its lease session
    assert await b.try_lease("line:U2") is False
    assert await a.try_lease("line:U1") is False


HOLDER = """
import asyncio, sys, time
from memory.cluster.store import ClusterStore
async def main():
    store = await ClusterStore.open(sys.argv[1], worker_id="holder")
    assert await store.try_lease("telegram:42")
    print("held", flush=True)
    await asyncio.sleep(120)
asyncio.run(main())
"""


async def test_lease_freed_when_its_worker_is_killed(
    postgres_url: str, open_store: Callable[[str], Awaitable[ClusterStore]]
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        postgres_url,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        while (line := await asyncio.wait_for(proc.stdout.readline(), 60)) != b"held\n":
            assert line, "the holder exited before taking its lease"
        other = await open_store("other")
        assert await other.try_lease("telegram:42") is False
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
        deadline = time.monotonic() + 10
        while not await other.try_lease("telegram:42"):
            assert time.monotonic() < deadline, "the killed worker's lease was never freed"
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# ---- exactly-once runs -------------------------------------------------------------


async def test_claim_run_true_for_exactly_one_caller(
    open_store: Callable[[str], Awaitable[ClusterStore]],
) -> None:
    workers = [await open_store(f"w{i}") for i in range(3)]
    due = "2026-12-07T09:00:00+00:00"
    results = await asyncio.gather(
        *(workers[i % 3].claim_run("schedule", "s-1", due) for i in range(30))
    )
    assert results.count(True) == 1
    assert await workers[0].claim_run("schedule", "s-1", "2026-12-08T09:00:00+00:00") is True
    assert await workers[1].claim_run("goal", "s-1", due) is True  # kinds are apart


# ---- documents ---------------------------------------------------------------------


async def test_documents_since_returns_latest_text_and_tombstones(
    open_store: Callable[[str], Awaitable[ClusterStore]],
) -> None:
    a, b = await open_store("a"), await open_store("b")
    cursor, docs = await b.documents_since(0)
    assert (cursor, docs) == (0, [])
    await a.put_document("rules/r-1.md", "first\n")
    await a.put_document("notes/n.md", "note\r\n")
    cursor, docs = await b.documents_since(0)
    assert docs == [("rules/r-1.md", "first\n"), ("notes/n.md", "note\r\n")]
    await a.put_document("rules/r-1.md", None)
    cursor2, docs = await b.documents_since(cursor)
    assert cursor2 > cursor and docs == [("rules/r-1.md", None)]
    assert await b.documents_since(cursor2) == (cursor2, [])


async def test_document_writes_notify_listeners(
    open_store: Callable[[str], Awaitable[ClusterStore]],
) -> None:
    a, b = await open_store("a"), await open_store("b")
    async with b.document_notifications() as changed:
        assert not changed.is_set()
        await a.put_document("rules/r-2.md", "x\n")
        await asyncio.wait_for(changed.wait(), 5)


# ---- the data-dir mirror -----------------------------------------------------------


def write(root: Path, rel: str, text: str) -> None:
    """Write as Steward and most editors do: a temp file renamed over the old one."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.new.tmp")
    tmp.write_bytes(text.encode("utf-8"))
    tmp.replace(path)


def shared_tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and is_shared(p.relative_to(root).as_posix())
    }


async def test_two_mirrors_converge_and_skip_caches(
    tmp_path: Path, open_store: Callable[[str], Awaitable[ClusterStore]]
) -> None:
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    arrived: list[Path] = []

    async def on_episodes(paths: list[Path]) -> None:
        arrived.extend(paths)

    write(dir_a, "rules/r-1.md", "---\nid: r-1\n---\n\nrule\n")  # there before the start
    mirror_a = DataDirMirror(await open_store("a"), dir_a)
    mirror_b = DataDirMirror(await open_store("b"), dir_b, on_episodes=on_episodes)
    await mirror_a.start()
    await mirror_b.start()
    try:
        assert (dir_b / "rules/r-1.md").read_text() == "---\nid: r-1\n---\n\nrule\n"
        episode = "episodes/2026/12/07/20261207-120000-abcdef.md"
        write(dir_a, episode, "---\nid: e1\n---\n\nan episode\n")
        write(dir_a, "schedules/s-1.md", "---\nid: s-1\n---\n\nevery day\n")
        write(dir_a, "goals/g1.md", "---\nid: g1\n---\n\ngoal\n")
        write(dir_a, "access.json", '{"admins": ["alice"]}\n')
        # caches and per-process state stay where they are
        write(dir_a, "index.sqlite", "not shared")
        write(dir_a, "journal/t1.jsonl", "{}\n")
        write(dir_a, "usage/2026-12-07.jsonl", "{}\n")
        write(dir_a, "rules/.r-9.md.abc.tmp", "half a write")
        write(dir_b, "notes/from-b.md", "written on b\n")
        await mirror_a.sync_once()
        await mirror_b.sync_once()
        await mirror_a.sync_once()
        assert shared_tree(dir_a) == shared_tree(dir_b)
        assert set(shared_tree(dir_a)) == {
            "rules/r-1.md",
            episode,
            "schedules/s-1.md",
            "goals/g1.md",
            "access.json",
            "notes/from-b.md",
        }
        for rel in ("index.sqlite", "journal/t1.jsonl", "usage/2026-12-07.jsonl"):
            assert not (dir_b / rel).exists()
        assert arrived == [dir_b / episode]

        (dir_b / "rules/r-1.md").unlink()  # deletions propagate
        write(dir_b, "schedules/s-1.md", "---\nid: s-1\n---\n\nevery hour\n")
        await mirror_b.sync_once()
        await mirror_a.sync_once()
        assert not (dir_a / "rules/r-1.md").exists()
        assert (dir_a / "schedules/s-1.md").read_text().endswith("every hour\n")
        assert shared_tree(dir_a) == shared_tree(dir_b)
    finally:
        await mirror_a.stop()
        await mirror_b.stop()


async def test_background_mirror_delivers_on_notify(
    tmp_path: Path, open_store: Callable[[str], Awaitable[ClusterStore]]
) -> None:
    """With a 60 s poll, only a poke (local) and NOTIFY (remote) can deliver in time."""
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    arrived: list[Path] = []

    async def on_episodes(paths: list[Path]) -> None:
        arrived.extend(paths)

    mirror_a = DataDirMirror(await open_store("a"), dir_a, interval=60)
    mirror_b = DataDirMirror(await open_store("b"), dir_b, on_episodes=on_episodes, interval=60)
    await mirror_a.start()
    await mirror_b.start()
    try:
        await asyncio.sleep(0.2)  # both listening
        episode = "episodes/2026/12/07/e2.md"
        write(dir_a, episode, "---\nid: e2\n---\n\nhello\n")
        mirror_a.poke()
        await eventually(lambda: (dir_b / episode).exists(), 10)
        await eventually(lambda: arrived == [dir_b / episode], 5)
        (dir_a / episode).unlink()
        mirror_a.poke()
        await eventually(lambda: not (dir_b / episode).exists(), 10)
    finally:
        await mirror_a.stop()
        await mirror_b.stop()


async def test_concurrent_edits_of_one_file_converge(
    tmp_path: Path, open_store: Callable[[str], Awaitable[ClusterStore]]
) -> None:
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    mirror_a = DataDirMirror(await open_store("a"), dir_a)
    mirror_b = DataDirMirror(await open_store("b"), dir_b)
    await mirror_a.start()
    await mirror_b.start()
    try:
        write(dir_a, "rules/r-5.md", "from a\n")
        write(dir_b, "rules/r-5.md", "from b\n")
        await asyncio.gather(mirror_a.sync_once(), mirror_b.sync_once())
        await asyncio.gather(mirror_a.sync_once(), mirror_b.sync_once())
        a_text = (dir_a / "rules/r-5.md").read_text()
        assert a_text == (dir_b / "rules/r-5.md").read_text()
        assert a_text in ("from a\n", "from b\n")
    finally:
        await mirror_a.stop()
        await mirror_b.stop()


async def test_in_place_edits_are_found_by_the_full_scan(
    tmp_path: Path, open_store: Callable[[str], Awaitable[ClusterStore]]
) -> None:
    """An editor writing into the same inode changes no folder's mtime: only the full
    scan (every FULL_SCAN_EVERY s; here every scan) finds it."""
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    mirror_a = DataDirMirror(await open_store("a"), dir_a, full_scan_every=0)
    mirror_b = DataDirMirror(await open_store("b"), dir_b)
    write(dir_a, "notes/n.md", "first\n")
    await mirror_a.start()
    await mirror_b.start()
    try:
        assert (dir_b / "notes/n.md").read_text() == "first\n"
        with (dir_a / "notes/n.md").open("w") as fh:  # same inode, same size
            fh.write("again\n")
        os.utime(dir_a / "notes", ns=(0, 0))  # not even a recent folder mtime to go by
        await mirror_a.sync_once()
        await mirror_b.sync_once()
        assert (dir_b / "notes/n.md").read_text() == "again\n"
    finally:
        await mirror_a.stop()
        await mirror_b.stop()


async def test_a_file_that_is_not_text_stays_local(
    tmp_path: Path, open_store: Callable[[str], Awaitable[ClusterStore]]
) -> None:
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    mirror_a = DataDirMirror(await open_store("a"), dir_a)
    mirror_b = DataDirMirror(await open_store("b"), dir_b)
    (dir_a / "skills" / "deploy").mkdir(parents=True)
    (dir_a / "skills" / "deploy" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    write(dir_a, "skills/deploy/SKILL.md", "---\nname: deploy\n---\n\nsteps\n")
    await mirror_a.start()
    await mirror_b.start()
    try:
        await mirror_a.sync_once()
        await mirror_b.sync_once()
        assert (dir_b / "skills/deploy/SKILL.md").exists()
        assert not (dir_b / "skills/deploy/logo.png").exists()
        assert (dir_a / "skills/deploy/logo.png").exists()
    finally:
        await mirror_a.stop()
        await mirror_b.stop()
