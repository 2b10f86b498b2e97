"""The OS sandbox judged by effects, not by verdicts (docs/safety.md#sandbox).

Every command of tests/sandbox_corpus.txt runs for real through the shell tool, in the
sandbox, with the guardian bypassed (as if it had allowed everything): inside a
temporary world of canary files around the workspace, with Steward's data dir, config
file and home beside it, a TCP server listening on every host address, and secrets in
the test process's environment. After each command: nothing outside the workspace
changed (nor the workspace's .git/config and .git/hooks), the server saw no connection,
no secret appears in the output, and no process the command started is still alive.

Then the other side: harmless work still works inside (python, git commits, a build),
a grant opens exactly what it says for one command, and the assembled product asks for
the network once, lets that one approved command reach the server and not the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.egress import EgressPolicy
from core.sandbox import Grant, Sandbox, SandboxUser, detect
from core.sandbox.identity import choose_user, hand_over
from core.tools.base import ToolContext, ToolError
from core.tools.shell import run as shell_run
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay, tool_messages

CORPUS = Path(__file__).with_name("sandbox_corpus.txt")
AVAILABLE = detect()
#: In CI (which sets CI=true) these must run, not skip: a machine without a sandbox
#: fails there instead of passing with nothing proved.
REQUIRED = os.environ.get("SANDBOX_TESTS_REQUIRED") == "1" or os.environ.get("CI") == "true"
if REQUIRED and not AVAILABLE.ok:
    raise RuntimeError(f"CI needs the OS sandbox for these tests: {AVAILABLE.reason}")
pytestmark = pytest.mark.skipif(
    not AVAILABLE.ok, reason=f"no OS sandbox on this machine: {AVAILABLE.reason}"
)

#: Marks the background processes of this test run (`sleep {SLEEP}`).
SLEEP = f"{4000 + secrets.randbelow(5000)}.{secrets.randbelow(10**6):06d}"
#: A secret in Steward's own environment: the name keeps it out of the command's
#: environment; only reading the parent process (/proc, ps e) could find it.
ENV_SECRET_NAME = "STEWARD_SANDBOX_CANARY_TOKEN"
ENV_SECRET = "STEWARD_SECRET_env_" + secrets.token_hex(8)


def as_the_product_would(ws: Path) -> SandboxUser | None:
    """The sandbox user `steward run` would choose (nobody, where the tests run as
    root), with the workspace handed to it as at start-up."""
    user = choose_user(None, ws.resolve())
    if user is not None:
        hand_over(ws.resolve(), user)
    return user


def corpus() -> list[tuple[str, str]]:
    entries = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, _, command = line.partition("\t")
        entries.append((kind, command))
    return entries


class Listener:
    """A TCP server on every host address that counts whoever connects."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with contextlib.suppress(OSError):
                conn.settimeout(1)
                conn.recv(1024)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nreached")
            conn.close()

    def close(self) -> None:
        self.sock.close()


def host_ip() -> str:
    """The host's own non-loopback address (the sandbox must not reach it either)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent for UDP connect
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@dataclass
class World:
    root: Path
    ws: Path
    data: Path
    config: Path
    home: Path
    tmpmark: Path
    secrets: list[str]
    sandbox: Sandbox

    def ctx(
        self, grant: Grant | None = None, timeout: float = 15, egress: EgressPolicy | None = None
    ) -> ToolContext:
        return ToolContext(
            workspace=self.ws,
            shell_timeout=timeout,
            sandbox=self.sandbox,
            grant=grant,
            egress=egress,
        )

    def fill(self, command: str, port: int) -> str:
        for key, value in {
            "{ROOT}": self.root,
            "{DATA}": self.data,
            "{CONFIG}": self.config,
            "{HOME}": self.home,
            "{PORT}": port,
            "{HOSTIP}": host_ip(),
            "{TMPMARK}": self.tmpmark,
            "{SLEEP}": SLEEP,
        }.items():
            command = command.replace(key, str(value))
        return command

    def outside(self) -> dict[str, str]:
        """A digest of everything outside the workspace, plus .git/config and .git/hooks."""
        state: dict[str, str] = {}
        for folder, dirs, files in os.walk(self.root):
            here = Path(folder)
            if here == self.ws:
                dirs[:] = [d for d in dirs if d == ".git"]
                files = []
            if here == self.ws / ".git":
                dirs[:] = [d for d in dirs if d == "hooks"]
                files = [f for f in files if f == "config"]
            for name in [*dirs, *files]:
                path = here / name
                st = path.lstat()
                key = str(path.relative_to(self.root))
                if path.is_symlink():
                    state[key] = "link:" + os.readlink(path)
                elif path.is_file():
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    state[key] = f"{st.st_mode:o}:{digest}"
                else:
                    state[key] = f"{st.st_mode:o}"
        state["tmpmark"] = str(self.tmpmark.exists())
        return state


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    root = tmp_path / "world"
    ws, data, home = root / "ws", root / ".steward", root / "home"
    for folder in (ws, data / "approvals", home / ".ssh"):
        folder.mkdir(parents=True)
    found = [f"STEWARD_SECRET_{name}_{secrets.token_hex(8)}" for name in "adcs"]
    (root / "canary.txt").write_text("canary\n")
    (data / "access.json").write_text(f'{{"pairing": "{found[0]}"}}\n')
    (data / "approvals" / "a1.md").write_text(f"pending: {found[1]}\n")
    config = root / "steward.toml"
    config.write_text(f'slack_bot_token = "{found[2]}"\n')
    (home / ".ssh" / "id_rsa").write_text(f"-----BEGIN KEY----- {found[3]}\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", str(ws)], check=True)
    (ws / "README.md").write_text("workspace\n")
    subprocess.run([*git, "-C", str(ws), "add", "."], check=True)
    subprocess.run([*git, "-C", str(ws), "commit", "-qm", "start"], check=True)
    monkeypatch.setenv(ENV_SECRET_NAME, ENV_SECRET)
    monkeypatch.setenv("STEWARD_TEST_API_KEY", ENV_SECRET)
    assert AVAILABLE.bwrap is not None
    sandbox = Sandbox(
        bwrap=AVAILABLE.bwrap,
        workspace=ws.resolve(),
        hidden=(data, config),
        home=str(home),
        user=as_the_product_would(ws),
    )
    tmpmark = Path("/tmp") / f"steward-sandbox-mark-{secrets.token_hex(6)}"
    yield World(root, ws, data, config, home, tmpmark, [*found, ENV_SECRET], sandbox)
    tmpmark.unlink(missing_ok=True)


async def run_shell(ctx: ToolContext, command: str) -> str:
    try:
        return await shell_run(ctx, {"command": command})
    except ToolError as exc:
        return str(exc)


def survivors() -> list[str]:
    """Processes still alive that a corpus command started (marked with SLEEP)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if SLEEP.encode() in cmdline and b"pytest" not in cmdline:
                found.append(f"{pid}: {cmdline.decode(errors='replace')}")
    return found


async def wait_for(check: Callable[[], bool], seconds: float = 1.0) -> bool:
    """Real processes end in real time: poll briefly (no simulated clock can help)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.05)
    return check()


def test_the_corpus_is_large_and_covers_every_class() -> None:
    entries = corpus()
    kinds = {kind for kind, _ in entries}
    assert len(entries) >= 40
    assert kinds == {"write", "data", "symlink", "secret", "network", "background", "githook"}


@pytest.mark.parametrize(("kind", "command"), corpus(), ids=[c for _, c in corpus()])
async def test_no_effect_escapes_the_sandbox(
    world: World, listener: Listener, kind: str, command: str
) -> None:
    before = world.outside()
    connections = listener.connections
    text = world.fill(command, listener.port)
    output = await run_shell(world.ctx(timeout=10), text)
    if kind == "background":
        await asyncio.sleep(1.5)  # a delayed write would land by now
    assert await wait_for(lambda: not survivors()), f"processes outlived the command: {survivors()}"
    after = world.outside()
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed, f"{text!r} changed {sorted(changed)} outside the workspace\n{output}"
    assert listener.connections == connections, f"{text!r} reached the host: {output}"
    leaked = [s for s in world.secrets if s in output]
    assert not leaked, f"{text!r} printed a secret of Steward's:\n{output}"


async def test_harmless_work_still_works(world: World) -> None:
    ctx = world.ctx()
    out = await run_shell(ctx, "python3 -c 'print(6 * 7)'")
    assert out.startswith("exit code 0") and "42" in out
    out = await run_shell(
        ctx,
        "mkdir -p pkg && printf 'def f():\\n    return 1\\n' > pkg/mod.py "
        "&& python3 -m compileall -q pkg && ls pkg/__pycache__",
    )
    assert out.startswith("exit code 0") and "mod.cpython" in out
    out = await run_shell(
        ctx,
        "git add pkg && git -c user.name=t -c user.email=t@example.invalid commit -qm build "
        "&& git log --oneline | wc -l",
    )
    assert out.startswith("exit code 0") and out.strip().endswith("2")
    out = await run_shell(
        ctx, "git init -q sub && cd sub && echo x > a && git add a && git commit -qm a && echo ok"
    )
    assert out.startswith("exit code 0") and "ok" in out
    out = await run_shell(ctx, "echo tmp > /tmp/t && cat /tmp/t && echo h > ~/x && cat ~/x")
    assert out.startswith("exit code 0") and "tmp" in out and "h" in out
    out = await run_shell(ctx, "printf 'int main(void){return 0;}' > m.c && gcc m.c -o m && ./m")
    assert out.startswith("exit code 0")
    has_pytest = await run_shell(ctx, "python3 -m pytest --version")
    if has_pytest.startswith("exit code 0"):
        (world.ws / "test_x.py").write_text("def test_x():\n    assert True\n")
        out = await run_shell(ctx, "python3 -m pytest -q -p no:cacheprovider test_x.py")
        assert out.startswith("exit code 0") and "1 passed" in out


async def test_git_commits_work_but_config_and_hooks_stay_read_only(world: World) -> None:
    ctx = world.ctx()
    out = await run_shell(ctx, "echo x > .git/hooks/pre-commit")
    assert "Read-only file system" in out
    out = await run_shell(ctx, "git config user.name evil")
    assert not out.startswith("exit code 0")
    out = await run_shell(
        ctx,
        "echo more >> README.md && git -c user.name=t -c user.email=t@example.invalid "
        "commit -qam more && git log --oneline | wc -l",
    )
    assert out.startswith("exit code 0") and out.strip().endswith("2")


async def test_a_network_grant_reaches_the_network_for_that_command_only(
    world: World, listener: Listener
) -> None:
    """Granted, the command reaches the hosts it was granted through Steward's proxy, and
    nothing else: not another host, not the host's own addresses (unless the owner
    listed one, as this test does for its server), not its abstract Unix sockets."""
    listed = EgressPolicy([f"127.0.0.1:{listener.port}"])
    command = f"curl -s --max-time 3 http://127.0.0.1:{listener.port}/"
    before = listener.connections
    grant = Grant.from_needs(["network"], ["127.0.0.1"])
    out = await run_shell(world.ctx(grant, egress=listed), command)
    assert "reached" in out and listener.connections == before + 1
    out = await run_shell(world.ctx(), command)
    assert "reached" not in out and listener.connections == before + 1
    assert "no network" in out  # the model is told why, and how to ask
    # The grant names its hosts: another one is refused by the proxy, and said so.
    other = f"curl -s --max-time 3 http://{host_ip()}:{listener.port}/"
    out = await run_shell(world.ctx(grant, egress=listed), other)
    assert "reached" not in out and listener.connections == before + 1
    assert "network: refused" in out
    # Not listed by the owner: the host's own address stays out of reach, granted or not.
    out = await run_shell(world.ctx(Grant(network=True)), command)
    assert "reached" not in out and listener.connections == before + 1
    # The sandbox never shares the host's network namespace: no abstract Unix socket.
    name = f"steward-test-{secrets.token_hex(4)}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(1)
    try:
        probe = (
            'python3 -c "import socket; s = socket.socket(socket.AF_UNIX); '
            f"s.connect('\\0{name}'); print('connected')\""
        )
        out = await run_shell(world.ctx(grant, egress=listed), probe)
        assert "connected" not in out.split("\n", 1)[1]
    finally:
        server.close()


async def test_a_write_grant_opens_exactly_that_path(world: World) -> None:
    target = world.root / "canary.txt"
    ctx = world.ctx(Grant.from_needs([f"write:{target}"]))
    out = await run_shell(ctx, f"echo granted > {target}; echo x > {world.root}/other.txt")
    assert target.read_text() == "granted\n"
    assert not (world.root / "other.txt").exists()  # written to the sandbox's own /tmp
    # A new file outside: only that name is granted (never its folder), and said so.
    new = world.root / "new.txt"
    grant = Grant.from_needs([f"write:{new}"])
    assert grant.write == (str(new.parent.resolve() / "new.txt"),)
    assert f"create the file {new.parent.resolve() / 'new.txt'}" in grant.describe()
    out = await run_shell(
        world.ctx(grant),
        f"echo new > {new}; echo x > {world.root}/sibling.txt; ls {world.root}; "
        f"cat {world.data}/access.json {world.home}/.ssh/id_rsa",
    )
    assert new.read_text() == "new\n"
    assert not (world.root / "sibling.txt").exists()
    assert "canary.txt" not in out  # the folder around it is not visible either
    assert not any(s in out for s in world.secrets)
    assert (world.ws / ".git" / "hooks").is_dir()
    out = await run_shell(world.ctx(grant), "echo x > .git/hooks/pre-commit")
    assert "Read-only" in out
    # Granted but left alone: the empty placeholder is removed again.
    unused = Grant.from_needs([f"write:{world.root}/unused.txt"])
    await run_shell(world.ctx(unused), "true")
    assert not (world.root / "unused.txt").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the case of Steward running as root")
async def test_a_granted_file_is_written_through_a_copy_as_the_sandbox_user(
    world: World,
) -> None:
    """As root, the command does not keep root's rights to write a root-owned file: it
    writes a copy it owns, which Steward then puts in place (owner and mode kept)."""
    target = world.root / "canary.txt"
    target.chmod(0o640)
    grant = Grant.from_needs([f"write:{target}"])
    out = await run_shell(
        world.ctx(grant), f"id -u; head -c 5 /etc/shadow; echo; echo more >> {target}"
    )
    assert out.split("\n")[1] != "0" and "Permission denied" in out  # nobody, no shadow
    assert target.read_text() == "canary\nmore\n"
    st = target.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o640)
    # Left alone, the file is not rewritten at all (same inode, same mtime).
    before = target.stat()
    await run_shell(world.ctx(grant), f"cat {target}")
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


async def test_steward_s_own_files_are_never_grantable(world: World) -> None:
    """A grant of the data dir, the config, or a folder holding one, runs nothing."""
    for path in (world.data / "policy.toml", world.config, world.root):
        grant = Grant.from_needs([f"write:{path}"])
        out = await run_shell(world.ctx(grant), f"echo pwned > {path}/x; echo ran > ran.txt")
        assert "did not run" in out and "Steward's own" in out, out
        assert not (world.ws / "ran.txt").exists()
    assert not (world.data / "policy.toml").exists()


def test_what_the_guardian_cannot_name_is_asked_as_unsandboxed() -> None:
    assert Grant.from_needs([]).unsandboxed
    assert Grant.from_needs(["network", "something-new"]).unsandboxed
    assert Grant.from_needs(["write:/"]).unsandboxed
    assert Grant.from_needs(["network"]) == Grant(network=True)
    assert "without the sandbox" in Grant(unsandboxed=True).describe()
    assert Grant(network=True).describe().startswith("use the network to reach any public host")
    assert "pypi.org" in Grant.from_needs(["network"], ["PyPI.org"]).describe()


async def test_the_timeout_kills_everything_in_the_sandbox(world: World) -> None:
    out = await run_shell(world.ctx(timeout=0.5), f"sleep {SLEEP} & sleep {SLEEP}; wait")
    assert "timed out" in out
    assert await wait_for(lambda: not survivors()), survivors()


async def test_approved_network_reaches_the_server_once_through_the_product(
    llm: ScriptedLLM, settings_for: Callable, listener: Listener, tmp_path: Path
) -> None:
    """`steward replay`: the guardian asks for the network for a `curl --data` upload,
    the approval message says so, the approved command reaches the local server; the
    next command, allowed by the guardian but not granted anything, cannot."""
    s = settings_for(llm, egress_allow=f"127.0.0.1:{listener.port}")
    url = f"http://127.0.0.1:{listener.port}/"
    llm.reply_tool("shell", {"command": f"curl -s --max-time 3 --data hello {url}"})
    llm.reply_tool("shell", {"command": f"curl -s --max-time 3 {url}"})
    llm.reply_text("Posted once; the second request had no network.")
    before = listener.connections
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "post hello"},
            {"t": 1, "user": "alice", "press": "approve once"},
        ],
    )
    approval = next(o for o in out if o["kind"] == "approval")
    assert "use the network" in approval["text"]
    assert "without the sandbox" not in approval["text"]
    assert listener.connections == before + 1
    first, second = tool_messages(llm)
    assert "reached" in first
    assert "reached" not in second and "no network" in second
    assert [o for o in out if o["kind"] == "approval"] == [approval]  # asked once


async def test_data_and_config_inside_the_workspace_stay_hidden(world: World) -> None:
    """Someone put the data dir and steward.toml inside the workspace: still masked."""
    data, config = world.ws / ".steward", world.ws / "steward.toml"
    (data / "approvals").mkdir(parents=True)
    (data / "access.json").write_text(f"{world.secrets[0]}\n")
    config.write_text(f'slack_bot_token = "{world.secrets[2]}"\n')
    sandbox = Sandbox(
        bwrap=world.sandbox.bwrap,
        workspace=world.ws.resolve(),
        hidden=(data, config),
        home=world.sandbox.home,
        user=as_the_product_would(world.ws),
    )
    ctx = ToolContext(workspace=world.ws, shell_timeout=10, sandbox=sandbox)
    out = await run_shell(
        ctx,
        "cat .steward/access.json steward.toml; echo '{}' > .steward/access.json; "
        "echo x >> steward.toml; ls -a .steward",
    )
    assert not any(s in out for s in world.secrets)
    assert (data / "access.json").read_text() == f"{world.secrets[0]}\n"
    assert config.read_text() == f'slack_bot_token = "{world.secrets[2]}"\n'
