"""A data dir that cannot take writes: `steward run` keeps answering, says once per
conversation that it could not save to memory and why, turns /healthz and `steward doctor`
red, and exits promptly on SIGTERM; a start on a full disk says so in one line.

The writes fail for real, in the kernel: a 2 MB tmpfs filled up (ENOSPC, where this test may
mount one, i.e. as root), and a file-size limit (RLIMIT_FSIZE, EFBIG) put on the running
process with prlimit, which needs no privilege. Nothing of Steward's is patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from memory.episodes import Episode, EpisodeStore
from memory.health import WriteHealth
from memory.index import JOURNAL_SIZE_LIMIT, MemoryIndex
from tests.conftest import make_env
from tests.fakes.llm import Reply, ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.test_concurrency import last_user
from tests.test_terminal_e2e import STEWARD
from tests.test_web_e2e import free_port

pytestmark = pytest.mark.timeout(120)

ALICE, BOB = "U0ALICE", "U0BOB"
NOTICE = "I could not save this to memory: "
DISK_FULL = "the disk is full"
FILE_LIMIT = "a file would grow past the size limit set for Steward (ulimit -f)"


def can_mount() -> bool:
    return os.name == "posix" and os.geteuid() == 0 and Path("/proc/filesystems").exists()


@contextlib.contextmanager
def tiny_fs(where: Path, size: str = "2m") -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `where` (unmounted after)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> int:
    """Write zeros into `folder` until its filesystem refuses (ENOSPC); bytes written."""
    written = 0
    chunk = b"\0" * 4096
    try:
        with open(folder / "filler", "wb") as fh:
            while True:
                fh.write(chunk)
                fh.flush()
                written += len(chunk)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    return written


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def env_for(tmp_path: Path, data_dir: Path, llm: ScriptedLLM, fake: FakeSlack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(
        make_env(
            tmp_path,
            llm,
            port=free_port(),
            slack_bot_token=fake.bot_token,
            slack_app_token=fake.app_token,
            slack_api_url=fake.base_url,
            slack_allowed_users=f"{ALICE},{BOB}",
            delivery_retries=1,
        )
    )
    env["STEWARD_DATA_DIR"] = str(data_dir)
    return env


async def healthz(port: int) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
            return r.status, await r.json()


async def drain(stream: asyncio.StreamReader, into: list[bytes]) -> None:
    while line := await stream.readline():
        into.append(line)


async def started(proc: asyncio.subprocess.Process, port: int, log: list[bytes]) -> None:
    for _ in range(600):
        if proc.returncode is not None:
            raise AssertionError(f"steward run exited: {b''.join(log)[-2000:]!r}")
        with contextlib.suppress(aiohttp.ClientError):
            status, _ = await healthz(port)
            if status == 200:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("steward run did not start")


def texts_in(fake: FakeSlack, channel: str) -> list[str]:
    return [m["text"] for m in fake.bot_messages() if m.get("channel") == channel]


async def ask(fake: FakeSlack, channel: str, user: str, text: str) -> None:
    """DM Steward and wait for the answer and what follows it (the notice, if any)."""
    before = len(texts_in(fake, channel))
    await fake.send_envelope("events_api", fake.dm(channel, user, text))
    await fake.wait_for(
        lambda: any(f"answer to {text}" in t for t in texts_in(fake, channel)[before:]), 30
    )


async def doctor_is_red(env: dict[str, str], cwd: Path, reason: str) -> None:
    doctor = await asyncio.create_subprocess_exec(
        STEWARD,
        "doctor",
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    said = (await asyncio.wait_for(doctor.communicate(), 60))[0].decode()
    assert doctor.returncode == 1, said
    assert f"✗ memory writes: the running Steward cannot save episode files: {reason}" in said


@pytest.mark.parametrize("how", ["tmpfs", "fsize"])
async def test_failing_writes_are_told_once_per_conversation_and_run_exits_on_sigterm(
    how: str, llm: ScriptedLLM, fake: FakeSlack, tmp_path: Path
) -> None:
    if how == "tmpfs" and not can_mount():
        pytest.skip("mounting a tmpfs needs root here; the fsize case runs everywhere")

    async def respond(body: dict[str, Any]) -> Reply:
        return Reply.text(f"answer to {last_user(body)}")

    llm.responder = respond
    with contextlib.ExitStack() as stack:
        if how == "tmpfs":
            data_dir = stack.enter_context(tiny_fs(tmp_path / "tiny", "8m")) / "data"
        else:
            data_dir = tmp_path / "data"
        env = env_for(tmp_path, data_dir, llm, fake)
        port = int(env["STEWARD_PORT"])
        # Its log goes to a pipe: a file would itself be refused by the size limit.
        proc = await asyncio.create_subprocess_exec(
            STEWARD,
            "run",
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert proc.stdout is not None
        log: list[bytes] = []
        reader = asyncio.create_task(drain(proc.stdout, log))
        try:
            await started(proc, port, log)
            await fake.wait_connected(within=20)
            await ask(fake, "D0ALICE", ALICE, "before")  # memory works: nothing said
            assert not any(NOTICE in t for t in texts_in(fake, "D0ALICE"))
            if how == "tmpfs":
                assert fill(data_dir.parent) > 0
                reason = DISK_FULL
            else:  # no file of the running process may grow any more
                hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, hard))
                reason = FILE_LIMIT

            for text in ("one", "two", "three"):
                await ask(fake, "D0ALICE", ALICE, text)
            await ask(fake, "D0BOB", BOB, "four")
            # The notice follows the answer: wait for it in the second conversation.
            await fake.wait_for(lambda: any(NOTICE in t for t in texts_in(fake, "D0BOB")), 10)
            for channel in ("D0ALICE", "D0BOB"):
                notices = [t for t in texts_in(fake, channel) if NOTICE in t]
                assert len(notices) == 1, texts_in(fake, channel)
                assert notices[0].startswith(NOTICE + reason), notices[0]

            status, health = await healthz(port)
            assert status == 200 and health["ok"] is False
            failing = {f["kind"]: f for f in health["memory"]["failing"]}
            assert "episode" in failing and failing["episode"]["reason"] == reason
            assert failing["episode"]["count"] >= 4

            if how == "fsize":  # one doctor run is enough (it takes seconds: litellm, the model)
                await doctor_is_red(env, tmp_path, reason)

            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            await asyncio.wait_for(proc.wait(), 5)  # the bound: exits within 5 s
            print(f"steward run ({how}) exited {time.monotonic() - t0:.2f}s after SIGTERM")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    await reader
    text = b"".join(log).decode(errors="replace")
    assert "Traceback" not in text.split("server.stopping", 1)[-1], text[-3000:]


def test_start_on_a_full_disk_says_so_in_one_line_and_exits_1(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    """`steward chat -m` on a data dir that cannot grow: one line naming the reason, a
    non-zero exit, no traceback, no hang. Every file write is refused by the kernel: the
    child runs with RLIMIT_FSIZE 0 (a full tmpfs as well, where one can be mounted)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread))

    def no_file_may_grow() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    cases: list[tuple[dict[str, str], Any, str]] = [(env, no_file_may_grow, FILE_LIMIT)]
    with contextlib.ExitStack() as stack:
        if can_mount():
            tiny = stack.enter_context(tiny_fs(tmp_path / "tiny", "1m"))
            fill(tiny)
            cases.append(({**env, "STEWARD_DATA_DIR": str(tiny / "data")}, None, DISK_FULL))
        for case_env, limit, reason in cases:
            done = subprocess.run(
                [STEWARD, "chat", "-m", "hello"],
                env=case_env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=30,
                preexec_fn=limit,
            )
            assert done.returncode == 1, done.stderr  # as docs/memory.md says (not 2: config)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, done.stderr
            assert reason in lines[0] and "Traceback" not in done.stderr, lines[0]
            assert case_env["STEWARD_DATA_DIR"] in lines[0]


async def test_sqlite_write_ahead_log_is_bounded(tmp_path: Path) -> None:
    """The index's WAL is checkpointed and truncated: after many writes it stays near the
    limit, and closing leaves no log behind (it took 1.7 MB of a 2 MB disk before)."""
    data = tmp_path / "data"
    store = EpisodeStore(data)
    index = await MemoryIndex.open(data, progress=False)
    wal = data / "index.sqlite-wal"
    biggest = 0
    started = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(200):
        episode = Episode(
            f"t-{i:04d}", started, "cli", "cli:me", "me", "a request " + "words " * 300, "success"
        )
        await index.add_episode_file(await store.write(episode))
        if wal.exists():
            biggest = max(biggest, wal.stat().st_size)
    await index.close()
    assert biggest <= JOURNAL_SIZE_LIMIT + 256 * 1024, biggest
    assert not wal.exists() or wal.stat().st_size == 0


def test_write_health_says_the_real_reason_once_per_conversation_until_writes_work(
    tmp_path: Path,
) -> None:
    """Failures come from real writes refused by the kernel (a read-only folder would not
    refuse root; a size limit refuses everyone), in a child process with RLIMIT_FSIZE 0."""
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from memory.atomic import atomic_write_text\n"
        "F = resource.RLIMIT_FSIZE\n"
        "resource.setrlimit(F, (0, resource.getrlimit(F)[1]))\n"
        "try:\n"
        "    atomic_write_text(Path(sys.argv[1]) / 'x.md', 'text')\n"
        "except OSError as exc:\n"
        "    print(exc.errno)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True
    )
    refused = OSError(int(done.stdout), os.strerror(int(done.stdout)))
    health = WriteHealth(tmp_path)
    assert health.notice("a") is None  # nothing failed: nothing to say
    health.failed("episode", tmp_path / "x.md", refused)
    health.failed("history", tmp_path / "y.md", OSError(errno.ENOSPC, "No space left on device"))
    assert not health.ok
    first = health.notice("a")
    assert first is not None and first.startswith(NOTICE)
    assert DISK_FULL in first and FILE_LIMIT in first
    assert health.notice("a") is None and health.notice("b") is not None
    health.succeeded("episode")
    assert [f["kind"] for f in health.snapshot()["failing"]] == ["history"]
    health.succeeded("history")
    assert health.ok and health.snapshot() == {"ok": True, "failing": []}
    health.failed("episode", tmp_path / "x.md", refused)  # failing again: told again
    assert health.notice("a") is not None
