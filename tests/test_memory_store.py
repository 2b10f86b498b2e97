"""The data dir store: git versioning, redaction end to end, malformed files, the lock, kill -9.

Fake secrets are built at run time so this file holds nothing a secret scanner flags.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dulwich import porcelain
from dulwich.repo import Repo

from memory.lock import LOCK_NAME, DataDirLocked, acquire
from memory.store import AUTHOR, DataStore, MalformedFile, parse, render

ROOT = Path(__file__).resolve().parent.parent
_rng = random.Random(7)


def rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def log_messages(repo_dir: Path) -> list[str]:
    repo = Repo(str(repo_dir))
    try:
        return [e.commit.message.decode().strip() for e in repo.get_walker()]
    finally:
        repo.close()


def all_git_bytes(repo_dir: Path) -> bytes:
    """Every object decompressed, plus every plain file under .git (refs, reflogs, config)."""
    repo = Repo(str(repo_dir))
    chunks: list[bytes] = []
    try:
        for sha in repo.object_store:
            chunks.append(repo.object_store[sha].as_raw_string())
    finally:
        repo.close()
    for f in (repo_dir / ".git").rglob("*"):
        if f.is_file():
            chunks.append(f.read_bytes())
    return b"\n".join(chunks)


def _s(p: str | bytes) -> str:
    return p.decode() if isinstance(p, bytes) else p


@pytest.fixture
def store(tmp_path: Path):
    s = DataStore(tmp_path / "data")
    yield s
    s.close()


# --- repository ----------------------------------------------------------------------


def test_repo_is_created_on_first_use_with_gitignore(store: DataStore) -> None:
    assert not store.root.exists()
    assert store.ensure_repo() is True
    assert (store.root / ".git").is_dir()
    ignore = (store.root / ".gitignore").read_text().splitlines()
    for pattern in ("index.sqlite*", "index.faiss*", "*.lock", "outbox/", "web/", "*.tmp", "*.log"):
        assert pattern in ignore
    assert store.ensure_repo() is False
    again = DataStore(store.root)
    assert again.ensure_repo() is False
    again.close()
    assert log_messages(store.root) == ["data dir created: ignore caches and runtime files"]
    # Caches, the lock, a temp file, logs and runtime folders are ignored; memory files are not.
    for name in (
        "index.sqlite",
        "index.sqlite-wal",
        "index.faiss",
        LOCK_NAME,
        ".r.md.x1.tmp",
        "steward-chat.log",
        "local-model.log",
    ):
        (store.root / name).write_text("x")
    (store.root / "outbox").mkdir()
    (store.root / "outbox" / "1.json").write_text("{}")
    (store.root / "journal").mkdir()  # an emptied record kept for the next task's
    (store.root / "journal" / ".spare-0a1b").write_text("")
    (store.root / "admin_rooms.json").write_text("{}")
    (store.root / "notes").mkdir()
    (store.root / "notes" / "hand.md").write_text("---\na: 1\n---\n")
    st = porcelain.status(str(store.root), untracked_files="all")
    assert [_s(u) for u in st.untracked] == ["notes/hand.md"]


def test_missing_gitignore_lines_are_added_and_a_persons_lines_kept(tmp_path: Path) -> None:
    root = tmp_path / "data"
    Repo.init(str(root), mkdir=True).close()
    (root / ".gitignore").write_text("scratch/\n*.lock\n")
    s = DataStore(root)
    assert s.ensure_repo() is False
    lines = (root / ".gitignore").read_text().splitlines()
    assert lines[:2] == ["scratch/", "*.lock"] and "index.faiss*" in lines
    assert lines.count("*.lock") == 1
    assert log_messages(root)[0].startswith("ignore caches and runtime files: index.sqlite*")
    s.close()


def test_write_with_commit_shows_in_log_and_history(store: DataStore) -> None:
    path = store.write(
        "rules/r-12.md",
        {"id": "r-12", "status": "active", "confidence": 0.8},
        "Run `git fetch` before `git push`.",
        commit="rule r-12 promoted: 6 wins / 1 loss",
    )
    assert path == store.root / "rules" / "r-12.md"
    repo = Repo(str(store.root))
    head = repo[repo.head()]
    assert head.message.decode().strip() == "rule r-12 promoted: 6 wins / 1 loss"
    assert head.author == AUTHOR and head.committer == AUTHOR
    assert head.tree and repo[head.tree][b"rules"]  # the file is in the tree
    repo.close()
    store.write("episodes/2024/05/01/e-1.md", {"id": "e-1"}, "no commit for episodes")
    store.write(
        "rules/r-12.md",
        {"id": "r-12", "status": "retired", "confidence": 0.0},
        "Run `git fetch` before `git push`.",
        commit="rule r-12 retired: confidence 0.00 after 4 losses",
    )
    hist = store.history("rules/r-12.md")
    assert [h.message for h in hist] == [
        "rule r-12 retired: confidence 0.00 after 4 losses",
        "rule r-12 promoted: 6 wins / 1 loss",
    ]
    assert all(len(h.sha) == 40 and h.date.tzinfo is not None for h in hist)
    assert abs((datetime.now(UTC) - hist[0].date).total_seconds()) < 60
    assert store.history("episodes/2024/05/01/e-1.md") == []
    assert len(log_messages(store.root)) == 3  # created + 2 rule commits, no episode


def test_history_without_repo_is_empty(store: DataStore) -> None:
    assert store.history("rules/r-1.md") == []
    assert not (store.root / ".git").exists()  # reading history does not create a repo


def test_commit_several_files_unchanged_and_deleted(store: DataStore) -> None:
    store.write("rules/a.md", {"id": "a"}, "A")
    store.write("rules/b.md", {"id": "b"}, "B")
    sha = store.commit(["rules/a.md", store.root / "rules" / "b.md"], "rules a, b drafted")
    assert sha is not None and len(sha) == 40
    assert store.commit(["rules/a.md"], "nothing changed") is None
    assert store.remove("rules/a.md", commit="rule a deleted by alice via /rules") is True
    assert [h.message for h in store.history("rules/a.md")] == [
        "rule a deleted by alice via /rules",
        "rules a, b drafted",
    ]
    # Deleting what was never committed is not a change either.
    store.write("rules/c.md", {"id": "c"}, "C")
    assert store.remove("rules/c.md", commit="rule c dropped") is True
    assert log_messages(store.root)[0] == "rule a deleted by alice via /rules"
    with pytest.raises(ValueError, match="cache or runtime"):
        store.commit(["index.sqlite"], "no")
    with pytest.raises(ValueError, match="message"):
        store.commit(["rules/b.md"], "   ")


def test_only_the_agents_files_are_committed(store: DataStore) -> None:
    store.write("notes/plan.md", {"title": "plan"}, "v1", commit="note plan written")
    # A person edits a tracked note, stages another file, and adds an untracked one.
    (store.root / "notes" / "plan.md").write_text("---\ntitle: plan\n---\n\nv2 by a person\n")
    (store.root / "notes" / "staged.md").write_text("---\ntitle: s\n---\n\nstaged by a person\n")
    porcelain.add(str(store.root), [str(store.root / "notes" / "staged.md")])
    (store.root / "notes" / "mine.md").write_text("---\ntitle: mine\n---\n")
    store.write("rules/r-1.md", {"id": "r-1"}, "rule", commit="rule r-1 drafted")
    store.sync_index()  # written a moment after a commit that follows another

    repo = Repo(str(store.root))
    tree = repo[repo[repo.head()].tree]
    notes = repo[tree[b"notes"][1]]
    assert sorted(notes) == [b"plan.md"]  # neither staged.md nor mine.md
    assert b"v1" in repo[notes[b"plan.md"][1]].data  # the committed version, not v2
    assert b"rules" in tree
    repo.close()
    assert "v2 by a person" in (store.root / "notes" / "plan.md").read_text()
    st = porcelain.status(str(store.root))
    assert st.staged["add"] == [b"notes/staged.md"]  # still staged, still theirs
    assert st.unstaged == [b"notes/plan.md"]
    assert [_s(u) for u in st.untracked] == ["notes/mine.md"]
    assert b"rules/r-1.md" not in st.unstaged and not st.staged["modify"]


@pytest.mark.skipif(shutil.which("git") is None, reason="no git binary to cross-check")
def test_git_binary_reads_the_repository(store: DataStore) -> None:
    store.write("rules/r-1.md", {"id": "r-1"}, "x", commit="rule r-1 drafted: 3 failures")
    store.sync_index()  # written a moment after a commit that follows another

    def run(*args: str) -> str:
        cmd = ["git", "-C", str(store.root), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    assert "rule r-1 drafted: 3 failures" in run("log", "--format=%s %an <%ae>")
    assert "Steward <steward@localhost>" in run("log", "-1", "--format=%an <%ae>")
    assert run("status", "--porcelain") == ""
    run("fsck", "--strict")


def test_head_moved_during_commit_is_retried_not_reverted(
    store: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write("rules/a.md", {"id": "a"}, "A", commit="rule a drafted")
    repo = store.repo()
    real = repo.refs.set_if_equals
    calls = {"n": 0}

    def flaky(name, old, new, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            # A person commits notes/p.md between our read of HEAD and our update.
            other = DataStore(store.root)
            other.write("notes/p.md", {"t": 1}, "person", commit="person's note")
            other.close()
            return False
        return real(name, old, new, **kw)

    monkeypatch.setattr(repo.refs, "set_if_equals", flaky)
    store.write("rules/b.md", {"id": "b"}, "B", commit="rule b drafted")
    assert calls["n"] == 2
    assert log_messages(store.root)[:3] == ["rule b drafted", "person's note", "rule a drafted"]
    r = Repo(str(store.root))
    tree = r[r[r.head()].tree]
    assert b"notes" in tree and b"rules" in tree  # the person's commit was kept
    r.close()


# --- redaction end to end -------------------------------------------------------------


def test_secrets_never_reach_the_file_or_git(store: DataStore) -> None:
    openai = "sk-proj-" + rand(40) + "9"
    slack = f"xoxb-{rand(12, string.digits)}-{rand(12, string.digits)}-{rand(24)}"
    pem_lines = [rand(64, string.ascii_letters + string.digits + "+/") for _ in range(5)]
    pem = (
        "-----BEGIN RSA PRIVATE KEY-----\n"
        + "\n".join(pem_lines)
        + "\n-----END RSA PRIVATE KEY-----"
    )
    hand_password = "hunter" + rand(4, string.ascii_lowercase)
    meta = {
        "id": "e-1",
        "request": f"deploy with OPENAI_API_KEY={openai}",
        "password": hand_password,
        "tools": [{"name": "shell", "arguments": f"curl -H 'Authorization: Bearer {slack}'"}],
    }
    body = f"User pasted:\n\n{pem}\n\nand the slack token {slack} and {openai}.\n"
    path = store.write(
        "notes/pasted.md", meta, body, commit=f"note pasted written: contained {openai}"
    )
    secrets = [openai, slack, hand_password, *pem_lines]
    on_disk = path.read_text()
    git_bytes = all_git_bytes(store.root)
    for s in secrets:
        assert s not in on_disk
        assert s.encode() not in git_bytes
    assert "[REDACTED:private_key]" in on_disk and "[REDACTED:openai_key]" in on_disk
    assert "[REDACTED:password]" in on_disk
    # A file the agent wrote another way is redacted on commit, on disk too.
    raw = store.root / "notes" / "raw.md"
    raw.write_text(f"---\nid: raw\n---\n\ntoken {slack}\n")
    store.commit(["notes/raw.md"], "note raw written")
    assert slack not in raw.read_text()
    assert slack.encode() not in all_git_bytes(store.root)
    # Nothing left in a stray temp file either.
    for f in store.root.rglob("*"):
        if f.is_file() and ".git" not in f.parts:
            assert openai.encode() not in f.read_bytes()


# --- reading, malformed files -----------------------------------------------------------


def test_round_trip_keeps_meta_and_body(store: DataStore) -> None:
    when = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    meta = {
        "id": "r-1",
        "started": when,
        "text": "line one\nline two: with colon\n---\n",
        "tags": ["a", "ü"],
        "n": 3,
        "none": None,
    }
    body = "---\nnot front matter\n...\n\n# Heading\n\nünïcode ✓"
    store.write("rules/r-1.md", meta, body)
    got_meta, got_body = store.read("rules/r-1.md")
    assert got_meta == meta
    assert got_body == body + "\n"
    assert parse(render({}, ""), Path("x")) == ({}, "")


BROKEN = {
    "rules/bad-yaml.md": ("---\nid: [unclosed\n---\nbody\n", "not valid YAML"),
    "rules/no-front.md": ("just text\n", "no front matter"),
    "rules/unclosed.md": ("---\nid: x\nbody without end\n", "never closed"),
    "rules/list.md": ("---\n- a\n- b\n---\n", "not a mapping"),
    "rules/tabs.md": ("---\nid: x\n\tbad: indent\n---\n", "not valid YAML"),
}


def test_malformed_files_are_reported_skipped_and_never_rewritten(store: DataStore) -> None:
    store.write("rules/good.md", {"id": "good", "status": "active"}, "fine")
    (store.root / "rules" / "sub").mkdir()
    store.write("rules/sub/nested.md", {"id": "nested"}, "deeper")
    before: dict[Path, bytes] = {}
    for rel, (text, _) in BROKEN.items():
        p = store.root / rel
        p.write_text(text)
        before[p] = p.read_bytes()
    latin = store.root / "rules" / "latin1.md"
    latin.write_bytes("---\nid: caf\xe9\n---\n".encode("latin-1"))
    before[latin] = latin.read_bytes()
    (store.root / "rules" / ".r-9.md.abc123.tmp").write_text("---\nid: half")  # killed write

    docs, problems = store.scan("rules")
    assert [d.relpath for d in docs] == ["rules/good.md", "rules/sub/nested.md"]
    assert docs[0].meta == {"id": "good", "status": "active"} and docs[0].body == "fine\n"
    reasons = {p.path.name: p.reason for p in problems}
    assert len(problems) == len(BROKEN) + 1
    for rel, (_, why) in BROKEN.items():
        assert why in reasons[Path(rel).name], reasons
    assert "not UTF-8" in reasons["latin1.md"]
    assert str(problems[0]).startswith(str(store.root))
    assert "line 3" in reasons["bad-yaml.md"] or "line 2" in reasons["bad-yaml.md"]

    with pytest.raises(MalformedFile) as err:
        store.read("rules/bad-yaml.md")
    assert err.value.path == store.root / "rules" / "bad-yaml.md"
    for rel in BROKEN:
        with pytest.raises(MalformedFile):
            store.write(rel, {"id": "overwrite"}, "agent text", commit="should not happen")
    with pytest.raises(MalformedFile):
        store.write("rules/latin1.md", {"id": "x"}, "y")
    for p, data in before.items():
        assert p.read_bytes() == data
    # Lenient mode for notes a person drops in without front matter.
    docs, problems = store.scan("rules", require_front_matter=False)
    assert "rules/no-front.md" in [d.relpath for d in docs]
    assert store.scan("missing-folder") == ([], [])


def test_paths_are_confined_to_the_data_dir(store: DataStore, tmp_path: Path) -> None:
    for bad in ("../escape.md", ".git/config.md", "rules/.hidden.md", str(tmp_path / "x.md")):
        with pytest.raises(ValueError):
            store.write(bad, {"id": "x"}, "y")
    with pytest.raises(ValueError, match="Markdown"):
        store.write("rules/r.txt", {"id": "x"}, "y")


def test_stale_temp_files_are_removed(store: DataStore) -> None:
    store.write("rules/r.md", {"id": "r"}, "x")
    (store.root / "rules" / ".r.md.k2j3.tmp").write_text("half")
    (store.root / ".gitignore.zz.tmp").write_text("half")
    assert store.remove_stale_temp_files() == 2
    assert [p.name for p in (store.root / "rules").iterdir()] == ["r.md"]


# --- async ------------------------------------------------------------------------------


async def test_async_writes_commit_in_order_without_blocking_the_loop(store: DataStore) -> None:
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    t = asyncio.create_task(ticker())
    paths = await asyncio.gather(
        *(
            store.awrite(
                f"rules/r-{i}.md", {"id": f"r-{i}"}, f"rule {i}", commit=f"rule r-{i} drafted"
            )
            for i in range(12)
        )
    )
    assert await store.acommit(paths[:2], "nothing new") is None
    hist = await store.ahistory("rules/r-3.md")
    docs, problems = await store.ascan("rules")
    assert await store.aremove("rules/r-0.md", commit="rule r-0 deleted")
    stop.set()
    await t
    assert ticks > 5  # the loop kept running while dulwich worked
    assert [h.message for h in hist] == ["rule r-3 drafted"]
    assert len(docs) == 12 and problems == []
    messages = log_messages(store.root)
    assert len(messages) == 1 + 12 + 1  # created, 12 rules, 1 delete: a linear history
    assert sorted(messages[1:13]) == sorted(f"rule r-{i} drafted" for i in range(12))
    meta, body = await store.aread("rules/r-5.md")
    assert meta == {"id": "r-5"} and body == "rule 5\n"


# --- the lock ----------------------------------------------------------------------------

_TRY_LOCK = """
import sys
sys.path.insert(0, {root!r})
from memory.lock import acquire, DataDirLocked
try:
    lock = acquire(sys.argv[1])
except DataDirLocked as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
print("locked", flush=True)
if len(sys.argv) > 2:
    sys.stdin.read()  # hold it until killed
"""


def _lock_script() -> str:
    return _TRY_LOCK.format(root=str(ROOT))


def test_second_process_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    data = tmp_path / ".steward"
    with acquire(data) as lock:
        assert lock.held
        assert (data / LOCK_NAME).read_text().strip() == str(os.getpid())
        res = subprocess.run(
            [sys.executable, "-c", _lock_script(), str(data)],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert res.returncode == 3
        assert res.stderr.strip() == (
            f"Another Steward (pid {os.getpid()}) is using {data}. "
            "Stop it, or set STEWARD_DATA_DIR to another folder."
        )
        with pytest.raises(DataDirLocked, match="already holds"):
            acquire(data)
    assert not lock.held
    lock.release()  # idempotent
    again = subprocess.run(
        [sys.executable, "-c", _lock_script(), str(data)], capture_output=True, text=True
    )
    assert again.returncode == 0 and again.stdout.strip() == "locked"


def test_the_holder_says_what_it_is_and_where_to_reach_it(tmp_path: Path) -> None:
    data = tmp_path / ".steward"
    with acquire(data, "run") as lock:
        assert (data / LOCK_NAME).read_text() == f"{os.getpid()}\nrun\n"
        lock.describe("http://127.0.0.1:8765")
        assert (data / LOCK_NAME).read_text() == f"{os.getpid()}\nrun\nhttp://127.0.0.1:8765\n"
        res = subprocess.run(
            [sys.executable, "-c", _lock_script(), str(data)],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert res.returncode == 3
        assert res.stderr.strip() == (
            f"Another Steward (pid {os.getpid()}, `steward run`) is using {data}. "
            "Stop it, or set STEWARD_DATA_DIR to another folder."
        )
        with pytest.raises(DataDirLocked) as err:
            acquire(data)
        assert (err.value.command, err.value.url) == ("run", "http://127.0.0.1:8765")
    assert (data / LOCK_NAME).read_text() == ""  # released: nothing claims it any more


def test_stale_lock_file_does_not_block(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / LOCK_NAME).write_text("999999\n")  # a crashed Steward's leftover
    lock = acquire(data)
    assert (data / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()


def test_lock_of_a_killed_process_is_free(tmp_path: Path) -> None:
    data = tmp_path / "d"
    child = subprocess.Popen(
        [sys.executable, "-c", _lock_script(), str(data), "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with pytest.raises(DataDirLocked) as err:
            acquire(data)
        assert err.value.pid == child.pid
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert (data / LOCK_NAME).read_text().strip() == str(child.pid)  # stale file stays…
    with acquire(data):  # …and does not block
        pass


# --- kill -9 during writes ---------------------------------------------------------------

_WRITER = """
import hashlib, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from memory.atomic import atomic_write_text
path, run = Path(sys.argv[1]), sys.argv[2]
filler = "lorem ipsum dolor sit amet, consectetur adipiscing elit\\n" * 6000
i = 0
while True:
    i += 1
    body = f"generation {{run}}.{{i}}\\n" + filler
    digest = hashlib.sha256(body.encode()).hexdigest()
    head = f"id: r-1\\ngeneration: '{{run}}.{{i}}'\\ndigest: {{digest}}\\n"
    atomic_write_text(path, f"---\\n{{head}}---\\n\\n{{body}}")
    if i == 1:
        print("ready", flush=True)
"""


def test_kill_9_during_writes_leaves_old_or_new_never_half(store: DataStore) -> None:
    target = store.path("rules/r-1.md")
    target.parent.mkdir(parents=True)
    script = _WRITER.format(root=str(ROOT))
    rng = random.Random(1234)
    kills = 0
    temp_seen = 0
    generations: set[str] = set()
    temps: set[Path] = set()
    deadline = time.monotonic() + 9.0
    while kills < 40 and time.monotonic() < deadline:
        child = subprocess.Popen(
            [sys.executable, "-c", script, str(target), str(kills)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0, 0.02))
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=5)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        kills += 1
        meta, body = store.read("rules/r-1.md")  # parses: never half a file
        assert hashlib.sha256(body.encode()).hexdigest() == meta["digest"]
        assert body.startswith(f"generation {meta['generation']}\n")
        generations.add(meta["generation"])
        new_temps = set(target.parent.glob(".r-1.md.*.tmp")) - temps
        temp_seen += bool(new_temps)  # this kill interrupted a write
        temps |= new_temps
        docs, problems = store.scan("rules")
        assert [d.relpath for d in docs] == ["rules/r-1.md"] and problems == []
    assert kills >= 30, f"only {kills} kills in the time budget"
    assert len(generations) >= kills // 2  # the file really was being rewritten
    assert temp_seen >= 1  # some kills landed mid-write, leaving a temp file behind
    store.remove_stale_temp_files()
    assert [p.name for p in target.parent.iterdir()] == ["r-1.md"]
