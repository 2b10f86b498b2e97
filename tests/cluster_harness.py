"""Start Steward's cluster as real processes: N gateways and M workers (`steward run --role
gateway|worker`), or the single process (`--role all`) beside them, each with its own data
dir, port and log; wait until each is ready, kill one with SIGKILL, restart one, and read
what each logged and how much CPU it used.

Why a module of its own: the end-to-end tests (tests/test_cluster_e2e.py) and the bench
(bench/cluster.py) drive the same processes the same way, and a process that does not get
ready must fail with its own last log lines, not with a bare timeout.

Readiness: a gateway answers 200 on its /healthz and logs `cluster.gateway_ready`; a worker
logs `cluster.worker_ready`; the single process logs `server.started`. Logs are JSON lines
(`STEWARD_LOG_FORMAT=json`) read from stderr by a thread (a full pipe would block the
process) and also written to `<node dir>/log.jsonl` for a post-mortem.

The fakes: `ThreadedFake` runs any wire fake with `start()`/`stop()` coroutines (the fake
Slack, the fake Telegram) on a loop of its own thread, so a synchronous test or bench can
drive it while the processes talk to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

STEWARD = str(Path(sys.executable).with_name("steward"))
#: Seconds a process may take to get ready (several start at once on a 2-core machine).
READY_LIMIT = 90.0
#: What each role logs once it serves.
READY_EVENT = {
    "gateway": "cluster.gateway_ready",
    "worker": "cluster.worker_ready",
    "all": "server.started",
}

F = TypeVar("F")
T = TypeVar("T")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the process binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    pred: Callable[[], T | None], what: str, limit: float = 60.0, every: float = 0.05
) -> T:
    """`pred()`'s first truthy value, polled until `limit` seconds have passed."""
    deadline = time.monotonic() + limit
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {limit:g}s waiting for {what}")
        time.sleep(every)


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (None: the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children() -> dict[int, list[int]]:
    """Every process's children, by parent pid (one pass over /proc)."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants still running,
    plus what its children already reaped had used (the kernel adds those to the parent's
    cutime/cstime): Steward's model worker processes and sandboxed commands count too."""
    tree = _children()
    total = 0
    stack, first = [pid], True
    while stack:
        p = stack.pop()
        fields = _stat(p)
        if fields is None:
            continue
        total += int(fields[11]) + int(fields[12])
        if first:
            total += int(fields[13]) + int(fields[14])
            first = False
        stack.extend(tree.get(p, []))
    return total / _ticks()


def clean_env() -> dict[str, str]:
    """This process's environment without any STEWARD_* variable, so a developer's own
    settings never reach the processes a test starts."""
    return {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}


@dataclass
class Node:
    """One `steward run --role ROLE` process, its own folder (data dir, log) and port."""

    role: str
    name: str
    root: Path
    env: dict[str, str]
    port: int = 0
    proc: subprocess.Popen[str] | None = None
    #: Every log line since the first start, across restarts, in order.
    lines: list[str] = field(default_factory=list)
    #: Index into `lines` where the current run's lines begin.
    run_start: int = 0
    starts: int = 0
    _reader: threading.Thread | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the process (not waiting for it to be ready: start several, then wait)."""
        assert not self.alive(), f"{self.name} is already running"
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_start = len(self.lines)
        self.starts += 1
        log = (self.root / "log.jsonl").open("a", encoding="utf-8")
        # The single process is plain `steward run` (role all is its default).
        role = [] if self.role == "all" else ["--role", self.role]
        proc = subprocess.Popen(
            [STEWARD, "run", *role],
            env={**clean_env(), **self.env},
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.proc = proc

        def read() -> None:
            assert proc.stderr is not None
            with log:
                for line in proc.stderr:
                    self.lines.append(line)
                    log.write(line)

        self._reader = threading.Thread(target=read, name=f"log-{self.name}", daemon=True)
        self._reader.start()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def ready(self) -> bool:
        """Ready as its role says (see the module's docstring); raises if it has exited."""
        if self.proc is None:
            return False
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} ({self.role}) exited with {self.proc.returncode} before it was "
                f"ready; its last log lines:\n{self.tail()}"
            )
        if not self.events(READY_EVENT[self.role], current=True):
            return False
        return self.role != "gateway" or self._healthy()

    def wait_ready(self, limit: float = READY_LIMIT) -> None:
        try:
            wait_until(self.ready, f"{self.name} ({self.role}) to be ready", limit, every=0.1)
        except AssertionError as exc:
            if "exited with" in str(exc):
                raise
            raise AssertionError(f"{exc}; its last log lines:\n{self.tail()}") from None

    def kill9(self) -> None:
        """SIGKILL, as an OOM kill or a lost machine: nothing of Steward's runs after it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        if self._reader is not None:  # every line it wrote, read: its log is complete
            self._reader.join(timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, as a deploy stops it; SIGKILL if it does not exit within `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, limit: float = READY_LIMIT) -> None:
        """Start it again (stopped first if it still runs) on the same data dir and port."""
        self.stop()
        self.start()
        self.wait_ready(limit)

    def events(self, name: str, *, current: bool = False) -> list[dict[str, Any]]:
        """The JSON log records with `event` = name (of the current run only if `current`)."""
        out = []
        for line in self.lines[self.run_start if current else 0 :]:
            if f'"{name}"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == name:
                out.append(record)
        return out

    def tail(self, n: int = 40) -> str:
        return "".join(self.lines[-n:])

    def cpu(self) -> float:
        """CPU seconds so far of this process and its descendants (0 if not running)."""
        return tree_cpu(self.pid) if self.alive() else 0.0


class Cluster:
    """Gateways and workers sharing one NATS, one PostgreSQL database, one name prefix and
    one workspace (a shared volume in a deployment: the same path on every worker).

    `base` is the environment every process gets (the model, the platforms, settings
    for the test); the cluster adds the cluster settings, and per process its own data
    dir, port, worker id and log format."""

    def __init__(
        self,
        root: Path,
        base: dict[str, str],
        *,
        cluster_url: str,
        database_url: str,
        name: str,
        gateways: int = 2,
        workers: int = 3,
    ) -> None:
        self.root = root
        self.workspace = root / "workspace"
        self.database_url = database_url
        shared = {
            **base,
            "STEWARD_CLUSTER_URL": cluster_url,
            "STEWARD_DATABASE_URL": database_url,
            "STEWARD_CLUSTER_NAME": name,
            "STEWARD_WORKSPACE": str(self.workspace),
            "STEWARD_LOG_FORMAT": "json",
        }
        self.gateways = [self._node("gateway", f"gateway{i + 1}", shared) for i in range(gateways)]
        self.workers = [self._node("worker", f"worker{i + 1}", shared) for i in range(workers)]

    def _node(self, role: str, name: str, shared: dict[str, str]) -> Node:
        root = self.root / name
        port = free_port() if role == "gateway" else 0
        env = {
            **shared,
            "STEWARD_DATA_DIR": str(root / "data"),
            "STEWARD_PORT": str(port),
            "STEWARD_WORKER_ID": name,
        }
        return Node(role, name, root, env, port)

    @property
    def nodes(self) -> list[Node]:
        return [*self.gateways, *self.workers]

    def start(self, limit: float = READY_LIMIT) -> None:
        """Start every process at once and wait until all are ready."""
        self.workspace.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_ready(limit)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to every process at once, then wait for each (SIGKILL after `timeout`)."""
        for node in self.nodes:
            if node.alive():
                with contextlib.suppress(OSError):
                    node.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop(max(0.1, deadline - time.monotonic()))

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def events(self, name: str) -> list[tuple[Node, dict[str, Any]]]:
        """Every process's log records named `name`, with the process that logged it."""
        return [(node, record) for node in self.nodes for record in node.events(name)]

    def tails(self, n: int = 15) -> str:
        """The last log lines of every process, for an assertion's message."""
        return "\n".join(f"--- {node.name} ({node.role})\n{node.tail(n)}" for node in self.nodes)

    def cpu(self) -> float:
        return sum(node.cpu() for node in self.nodes)


def single(root: Path, base: dict[str, str]) -> Node:
    """The single process (`steward run --role all`, today's default) with its own data
    dir, workspace and port: the baseline the cluster is compared with."""
    port = free_port()
    env = {
        **base,
        "STEWARD_DATA_DIR": str(root / "data"),
        "STEWARD_WORKSPACE": str(root / "workspace"),
        "STEWARD_PORT": str(port),
        "STEWARD_LOG_FORMAT": "json",
    }
    return Node("all", "single", root, env, port)


class ThreadedFake(Generic[F]):
    """A wire fake served from a loop on its own thread: the processes under test talk to
    it while a synchronous caller drives it with `call` (run on the fake's loop, so the
    fake's state is only ever touched from there)."""

    def __init__(self, fake: F) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedFake[F]:
        self.thread.start()
        self.run(self.fake.start())  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.run(self.fake.stop())  # type: ignore[attr-defined]
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Await `coro` on the fake's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call `fn` (a plain function or one returning a coroutine) on the fake's loop."""

        async def inner() -> T:
            result: Any = fn(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = await result
            return result  # type: ignore[no-any-return]

        return self.run(inner())

    def read(self, fn: Callable[[F], T]) -> T:
        """`fn(fake)` run on the fake's loop: a consistent read of its state."""

        async def inner() -> T:
            return fn(self.fake)

        return self.run(inner())


@contextlib.contextmanager
def threaded(fake: F) -> Iterator[ThreadedFake[F]]:
    with ThreadedFake(fake) as served:
        yield served


#: Where a gateway (or the single process) receives Slack's HTTP-mode events.
SLACK_WEBHOOK = "/webhooks/slack"
#: Telegram user ids of the load's people start here (one private chat each).
TELEGRAM_BASE = 700_000


class Chats:
    """The two platforms the cluster is driven on: Slack in HTTP mode (a webhook platform:
    every gateway receives its events, Slack retries a failed delivery) and Telegram with
    long polling (a socket platform: one gateway at a time holds the poll). Conversation
    `n` is the Slack DM channel `D<n>` with person `U<n>`, or the private Telegram chat of
    person TELEGRAM_BASE + n; everyone is allowed in."""

    def __init__(self, slack: ThreadedFake[Any], telegram: ThreadedFake[Any]) -> None:
        self.slack = slack
        self.telegram = telegram

    def env(self) -> dict[str, str]:
        """The platform settings every process gets (workers need them too: they take the
        platforms' names and capabilities from them)."""
        from tests.fakes.telegram import TOKEN

        return {
            "STEWARD_SLACK_BOT_TOKEN": self.slack.fake.bot_token,
            "STEWARD_SLACK_SIGNING_SECRET": self.slack.fake.signing_secret,
            "STEWARD_SLACK_API_URL": self.slack.fake.base_url,
            "STEWARD_SLACK_ALLOWED_USERS": "*",
            "STEWARD_TELEGRAM_TOKEN": TOKEN,
            "STEWARD_TELEGRAM_API_URL": self.telegram.fake.base_url,
            "STEWARD_TELEGRAM_ALLOWED_USERS": "*",
        }

    @staticmethod
    def slack_channel(n: int) -> str:
        return f"D{n:06d}"

    @staticmethod
    def telegram_chat(n: int) -> int:
        return TELEGRAM_BASE + n

    def slack_event(self, n: int, text: str) -> dict[str, Any]:
        """The Events API payload of person `U<n>`'s DM (built on the fake's loop)."""
        return self.slack.call(self.slack.fake.dm, self.slack_channel(n), f"U{n:06d}", text)

    def post_slack(self, url: str, payload: dict[str, Any]) -> tuple[int, str]:
        """Deliver a payload to `url` (a gateway's base URL) as Slack does: signed, once.
        (0, reason) when the gateway could not be reached at all (Slack retries then)."""
        try:
            return self.slack.run(self.slack.fake.post_event(url + SLACK_WEBHOOK, payload))
        except OSError as exc:  # aiohttp's connection errors are OSErrors
            return 0, str(exc)

    def send_slack(self, url: str, n: int, text: str) -> tuple[int, str]:
        return self.post_slack(url, self.slack_event(n, text))

    def send_telegram(self, n: int, text: str) -> None:
        chat = self.telegram_chat(n)
        self.telegram.call(self.telegram.fake.user_message, text, user=chat)

    def slack_posts(self) -> dict[str, list[str]]:
        """What the bot posted, by DM channel, edits applied, in order."""

        def read(fake: Any) -> dict[str, list[str]]:
            out: dict[str, list[str]] = {}
            for message in fake.bot_messages():
                out.setdefault(str(message.get("channel")), []).append(str(message.get("text")))
            return out

        return self.slack.read(read)

    def telegram_posts(self) -> dict[int, list[str]]:
        """What the bot posted, by chat, edits applied, in order."""

        def read(fake: Any) -> dict[int, list[str]]:
            out: dict[int, list[str]] = {}
            for posted in fake.posted:
                if posted.kind == "message":
                    out.setdefault(posted.chat_id, []).append(posted.raw_text)
            return out

        return self.telegram.read(read)

    def answers(self, n: int, platform: str) -> list[str]:
        """Everything the bot said in conversation `n` of `platform` so far."""
        if platform == "slack":
            return self.slack_posts().get(self.slack_channel(n), [])
        return self.telegram_posts().get(self.telegram_chat(n), [])


#: A request starting with this makes the scripted model ask for a shell command that
#: writes outside the workspace: the approval path.
NEEDS_APPROVAL = "outside:"


class EchoModel:
    """A responder for the scripted model (tests/fakes/llm.py) that any number of
    processes can share: it answers each request from the request alone, after `latency`
    seconds (a model's time to answer; change it between phases), at most `concurrency`
    calls at once (a model server's capacity; the others wait their turn). A person's message
    gets "re: <message>", so a lost, doubled or crossed answer shows; NEEDS_APPROVAL +
    name gets a shell call that writes ../<name>.txt (outside the workspace: it needs
    approval), and its tool result gets "ran <name>"."""

    def __init__(self, latency: float = 0.0, *, concurrency: int = 0) -> None:
        self.latency = latency
        #: Calls answered at once (0: any number): a model server's capacity.
        self.concurrency = concurrency
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, body: dict[str, Any]) -> Any:
        if not self.concurrency:
            return await self._answer(body)
        if self._slots is None:  # made on the server's loop, where every call runs
            self._slots = asyncio.Semaphore(self.concurrency)
        async with self._slots:
            return await self._answer(body)

    async def _answer(self, body: dict[str, Any]) -> Any:
        from tests.fakes.llm import Reply, _content_text

        if self.latency:
            await asyncio.sleep(self.latency)
        messages = body.get("messages") or [{}]
        users = [m for m in messages if m.get("role") == "user"]
        asked = _content_text(users[-1].get("content")) if users else ""
        name = asked.removeprefix(NEEDS_APPROVAL).strip()
        if messages[-1].get("role") == "tool":
            return Reply.text(f"ran {name}")
        if asked.startswith(NEEDS_APPROVAL):
            return Reply.tool("shell", {"command": f"echo {name} > ../{name}.txt"})
        return Reply.text(f"re: {asked}")


class SlackTap:
    """A pass-through in front of the fake Slack's Web API for one gateway: every call is
    forwarded unchanged and its answer returned unchanged, and the tap notes the `ts` of
    each message posted through it. Why: both gateways talk to the same Slack, and only
    this says which gateway posted a message (an approval pressed "through the gateway
    that did not send it" needs to know which one did). Started on the fake's loop."""

    def __init__(self, target: str) -> None:
        self.target = target  # the fake's Web API base, ending in /api/
        self.url = ""
        self.posted: list[str] = []
        self._runner: Any = None
        self._http: Any = None

    async def start(self) -> SlackTap:
        import aiohttp
        from aiohttp import web

        self._http = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.Response:
            method = request.match_info["method"]
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() in ("authorization", "content-type")
            }
            async with self._http.post(
                self.target + method,
                data=await request.read(),
                headers=headers,
                params=request.query,
            ) as resp:
                body = await resp.read()
                if method == "chat.postMessage" and resp.status == 200:
                    with contextlib.suppress(ValueError):
                        ts = json.loads(body).get("ts")
                        if ts:
                            self.posted.append(str(ts))
                return web.Response(
                    status=resp.status,
                    body=body,
                    headers={
                        k: v
                        for k, v in resp.headers.items()
                        if k.lower() in ("content-type", "retry-after")
                    },
                )

        app = web.Application()
        app.router.add_post("/api/{method}", forward)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/api/"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()


class TcpProxy:
    """A TCP pass-through to `host:port` that a test can cut (every connection through it
    closed, new ones refused) and restore: PostgreSQL or NATS going away for a while, for
    the processes behind it only (the real server, shared with other tests, stays up).
    Served on a loop the caller gives (a ThreadedFake's)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.listen_port = 0
        self.up = True
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))

    async def cut(self) -> None:
        """Close every connection through the proxy and refuse new ones."""
        self.up = False
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def restore(self) -> None:
        self.up = True

    async def stop(self) -> None:
        await self.cut()
        if self._server is not None:
            self._server.close()
