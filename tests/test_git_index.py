"""The data dir's git index after a history batch: only the committed paths' entries are
rewritten, the result is what dulwich's whole rewrite gives, and git agrees with it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import dulwich.index
import pytest
from dulwich.index import Index, index_entry_from_stat
from dulwich.objects import Blob
from dulwich.repo import Repo

from memory.git_index import IndexFile, Unsupported, read_layout, splice
from memory.store import INDEX_EVERY, DataStore

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git binary to cross-check")


def _episode(store: DataStore, n: int, text: str = "") -> str:
    rel = f"episodes/2026/12/{n:05d}.md"
    path = store.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nid: {n}\n---\n\nepisode {n} {text}\n")
    return rel


@pytest.fixture
def store(tmp_path: Path):
    s = DataStore(tmp_path / "data")
    s.commit([_episode(s, n) for n in range(10, 310)], "seed: 300 episodes")
    s.sync_index()  # written a moment after the commit that created the repository
    yield s
    s.close()


def _git(root: Path, *args: str) -> str:
    cmd = ["git", "-C", str(root), "-c", "user.name=p", "-c", "user.email=p@x", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def test_a_batch_serializes_only_its_own_entries(
    store: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost of a batch follows the batch, not the data dir: of 300 entries, only the
    five committed are serialized again (dulwich's whole rewrite serialized all 300)."""
    serialized: list[bytes] = []
    real = dulwich.index.write_cache_entry

    def counting(f, entry, *args, **kwargs):  # type: ignore[no-untyped-def]
        serialized.append(entry.name)
        return real(f, entry, *args, **kwargs)

    monkeypatch.setattr(dulwich.index, "write_cache_entry", counting)
    monkeypatch.setattr("memory.git_index.write_cache_entry", counting)
    rels = [_episode(store, n, "again") for n in (5, 100, 200)]
    rels += [_episode(store, 400), _episode(store, 401)]
    store.commit(rels, "memory: 5 episodes")
    store.sync_index()
    assert sorted(serialized) == sorted(r.encode() for r in rels)
    index = Repo(str(store.root)).open_index()
    assert len(index) == 300 + 3 + 1  # three new episodes, and the .gitignore


def _whole(raw_path: Path, changes: dict[bytes, object]) -> bytes:
    """What dulwich's own Index writes for the same changes (the behaviour before)."""
    copy = raw_path.with_name("index.copy")
    shutil.copyfile(raw_path, copy)
    index = Index(str(copy))
    for key, entry in changes.items():
        if entry is None:
            if key in index:
                del index[key]
        else:
            index[key] = entry  # type: ignore[assignment]
    index.write()
    return copy.read_bytes()


def test_the_spliced_index_is_byte_for_byte_dulwichs(store: DataStore) -> None:
    index_path = store.root / ".git" / "index"
    raw = index_path.read_bytes()

    def entry(text: bytes) -> object:
        st = (store.root / ".gitignore").stat()
        return index_entry_from_stat(st, Blob.from_string(text).id, mode=0o100644)

    cases: list[dict[bytes, object]] = [
        {b".a-first.md": entry(b"first")},  # before every entry
        {b"zz/last.md": entry(b"last")},  # after every entry
        {b"episodes/2026/12/00150.md": entry(b"changed")},  # replaced in place
        {b"episodes/2026/12/00010.md": None, b"episodes/2026/12/00309.md": None},  # ends
        {b"episodes/2026/12/00155.md": None, b"episodes/2026/12/00155a.md": entry(b"next")},
        {b"not/there.md": None},  # deleting an absent path changes nothing
        {b"episodes/2026/12/%05d.md" % n: entry(b"%d" % n) for n in range(0, 400, 7)},
    ]
    for changes in cases:
        data, layout = splice(raw, changes)  # type: ignore[arg-type]
        assert data == _whole(index_path, changes), changes
        fresh_layout = read_layout(data)  # the layout worked out as it spliced: the file's
        assert layout.starts.tolist() == fresh_layout.starts.tolist()
        assert layout.entries_end == fresh_layout.entries_end
    # No index yet: the new one holds just the changes.
    fresh, _ = splice(None, {b"a.md": entry(b"a")})  # type: ignore[dict-item]
    assert fresh[:12] == b"DIRC\x00\x00\x00\x02\x00\x00\x00\x01"


@needs_git
def test_git_agrees_after_batches_over_a_persons_own_index(store: DataStore) -> None:
    """A person's git wrote the index last (with its tree cache) and staged a file of
    their own: after Steward's batch, git sees exactly their staged file, and the tree
    git would commit is HEAD's plus it (no stale tree cache)."""
    root = store.root
    (root / "notes").mkdir()
    (root / "notes" / "mine.md").write_text("---\nt: m\n---\nmine\n")
    _git(root, "add", "notes/mine.md")
    _git(root, "commit", "-qm", "a person's note")
    (root / "notes" / "staged.md").write_text("---\nt: s\n---\nstaged\n")
    _git(root, "add", "notes/staged.md")
    assert b"TREE" in (root / ".git" / "index").read_bytes()

    rels = [_episode(store, n, "edited") for n in (20, 21)] + [_episode(store, 500)]
    (root / "episodes/2026/12/00030.md").unlink()
    store.commit([*rels, "episodes/2026/12/00030.md"], "memory: a batch")
    store.sync_index()

    assert _git(root, "status", "--porcelain") == "A  notes/staged.md\n"
    _git(root, "reset", "-q", "notes/staged.md")
    assert _git(root, "write-tree") == _git(root, "rev-parse", "HEAD^{tree}")
    _git(root, "fsck", "--strict")


@needs_git
def test_a_version_4_index_is_rewritten_whole(store: DataStore) -> None:
    root = store.root
    _git(root, "update-index", "--index-version", "4")
    with pytest.raises(Unsupported, match="version 4"):
        splice((root / ".git" / "index").read_bytes(), {})
    store.commit([_episode(store, 600)], "memory: 1 episode")
    store.sync_index()
    assert _git(root, "status", "--porcelain") == ""
    assert "episodes/2026/12/00600.md" in _git(root, "ls-files")


def test_a_damaged_index_is_left_as_it_is(store: DataStore) -> None:
    index_path = store.root / ".git" / "index"
    raw = bytearray(index_path.read_bytes())
    raw[100] ^= 0xFF
    with pytest.raises(Unsupported, match="checksum"):
        splice(bytes(raw), {})
    index_path.write_bytes(bytes(raw))
    store.commit([_episode(store, 700)], "memory: 1 episode")  # the commit is still made
    store.sync_index()
    assert index_path.read_bytes() == bytes(raw)
    assert not (store.root / ".git" / "index.lock").exists()
    repo = Repo(str(store.root))
    head = repo[repo.head()]
    assert "memory: 1 episode" in head.message.decode()  # type: ignore[attr-defined]


@needs_git
def test_an_index_a_persons_git_wrote_between_two_batches_is_read_again(
    store: DataStore,
) -> None:
    """The layout kept from Steward's last write is used only for that very file: after
    a person's `git add` rewrote the index, the next batch keeps their entry."""
    root = store.root
    store.commit([_episode(store, 800)], "memory: 1 episode")
    store.sync_index()  # the layout is kept now
    (root / "mine.md").write_text("mine\n")
    _git(root, "add", "mine.md")
    store.commit([_episode(store, 801)], "memory: 1 episode")
    store.sync_index()
    assert _git(root, "status", "--porcelain") == "A  mine.md\n"
    assert {"mine.md", "episodes/2026/12/00801.md"} <= set(_git(root, "ls-files").split())


def test_successive_updates_from_the_kept_layout_match_a_fresh_read(tmp_path: Path) -> None:
    store = DataStore(tmp_path / "data")
    try:
        store.commit([_episode(store, n) for n in range(50)], "seed")
        store.sync_index()
        index = IndexFile(store.root / ".git" / "index")
        sha = Blob.from_string(b"x").id
        st = (store.root / ".gitignore").stat()
        for step in range(20):
            changes = {
                b"episodes/2026/12/%05d.md" % ((step * 37 + k) % 90): (
                    None if k % 3 == 0 else index_entry_from_stat(st, sha, mode=0o100644)
                )
                for k in range(6)
            }
            index.update(changes)  # type: ignore[arg-type]
            raw = index.path.read_bytes()
            assert index._layout is not None
            kept = index._layout[1]
            assert kept.starts.tolist() == read_layout(raw).starts.tolist(), step
        names = sorted(Index(str(index.path)).paths())
        assert names == sorted(set(names))
    finally:
        store.close()


def test_commits_in_a_burst_write_the_index_once_at_the_end_of_the_interval(
    store: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of commits (rule changes after a run of failing tasks) writes the index
    once, INDEX_EVERY after the last write, with all of their entries; the commits
    themselves are made at once. Nothing has to ask for it."""
    writes: list[int] = []
    real = IndexFile.update

    def counting(self: IndexFile, changes: object) -> None:
        writes.append(len(changes))  # type: ignore[arg-type]
        real(self, changes)  # type: ignore[arg-type]

    monkeypatch.setattr(IndexFile, "update", counting)
    time.sleep(INDEX_EVERY)  # the fixture's own write is an interval old
    rels = [_episode(store, 900 + n) for n in range(5)]
    for rel in rels:
        store.commit([rel], f"rule change {rel}")
    assert writes == [1]  # the first at once, the other four wait for the interval
    repo = Repo(str(store.root))
    assert len(list(repo.get_walker())) == 2 + 5  # .gitignore and the seed, then these
    deadline = time.monotonic() + INDEX_EVERY + 5
    while len(writes) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writes == [1, 4]
    index = repo.open_index()
    assert all(rel.encode() in index for rel in rels)
    repo.close()
