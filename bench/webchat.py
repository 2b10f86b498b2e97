"""The web chat's own cost, measured from outside: `steward run` and its real WebSocket.

Three processes, so none takes CPU from another's event loop: the scripted
OpenAI-compatible model (zero latency; `python -m bench.webchat --serve-model`),
`steward run` with the defaults a person gets (web chat only, the scripted model) and
this one, which logs in as a person does (the login URL's token, then the cookie) and
chats over the WebSocket, or calls the model directly with a bare streamed
`litellm.acompletion`, the baseline.

Latency: a bare streamed call (read to its last chunk), then a web chat message (time
from the send to the reply's stored ``message`` frame, the last text a person waits
for), alternately, each message in its own conversation; the added latency is the
difference of the medians (p50) and of the p99s. Throughput: 100 conversations at once,
each sending its next message once its reply came, against 100 concurrent callers
each making the same number of bare streamed calls, each Steward run between two bare
runs. Every reply is checked to be the whole answer, streamed in order.

`BENCH_WEBCHAT_N` (latency pairs, default 200) and `BENCH_WEBCHAT_ROUNDS` (messages per
conversation under load, default 3, at most 5) shorten it;
`BENCH_WEBCHAT_CONVERSATIONS` (default 100) is for the smoke test only.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from bench.data_root import bench_dir, describe
from bench.rss import channels, free_port, start, stop, wait_for
from core.model.client import load_litellm
from memory.login_token import read_token

ANSWER = "Noted: the web chat streamed this answer to you, piece by piece, and stored it."
N = int(os.environ.get("BENCH_WEBCHAT_N", "200") or 200)
CONVERSATIONS = int(os.environ.get("BENCH_WEBCHAT_CONVERSATIONS", "100") or 100)
ROUNDS = min(5, int(os.environ.get("BENCH_WEBCHAT_ROUNDS", "3") or 3))
WARM = 5
#: What the people ask, each round something else (a near-identical request right after
#: its answer is a re-ask, a frustration signal proactive help writes down).
REQUESTS = (
    "what is on my calendar tomorrow morning",
    "summarise the release notes of version four",
    "how many disks does the backup server have",
    "remind me why the deploy was paused last week",
    "draft a short thank-you note for the support team",
    "which billing tickets are still open",
    "when does the office close on friday",
    "translate good evening into spanish",
    "list three ideas for the team lunch",
    "who owns the payments dashboard",
    "explain what a reverse proxy does",
    "suggest a name for the new staging cluster",
    "what was decided at monday's planning meeting",
    "convert forty miles to kilometres",
    "give me a haiku about rain",
    "check the spelling of accommodate",
)
TARGET_ADDED_MS = 3.0
TARGET_THROUGHPUT = 0.8


class ScriptedModel:
    """The scripted model in a process of its own; every request is answered `ANSWER`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.webchat", "--serve-model"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url:
            raise RuntimeError("the scripted model did not start")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # it serves until its stdin closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve_model() -> None:
    """`--serve-model`: print the base URL, serve until stdin closes."""
    from tests.fakes.llm import Reply, ScriptedLLM

    async def serve() -> None:
        llm = ScriptedLLM()
        llm.responder = lambda body: Reply.text(ANSWER)
        await llm.start()
        print(llm.base_url, flush=True)
        await asyncio.to_thread(sys.stdin.read)
        await llm.stop()

    asyncio.run(serve())


class Person:
    """One browser tab of the owner: logged in, one conversation, its frames read."""

    def __init__(self, http: aiohttp.ClientSession, url: str, session: str) -> None:
        self.http, self.url, self.session = http, url, session
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def open(self) -> None:
        self.ws = await self.http.ws_connect(
            f"{self.url}/ws?session={self.session}", headers={"Origin": self.url}
        )
        while (await self.ws.receive_json())["type"] != "history":
            pass

    async def ask(self, text: str) -> float:
        """Send `text`; seconds until the reply's stored message frame. Checks that the
        streamed pieces, in order, are the whole answer, and so is the stored reply."""
        assert self.ws is not None
        streamed: list[str] = []
        t0 = time.perf_counter()
        await self.ws.send_str(json.dumps({"type": "message", "text": text}))
        while True:
            msg = await self.ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"the web chat closed the socket: {msg.type} {msg.data}")
            frame = json.loads(msg.data)
            kind = frame["type"]
            if kind == "progress" and frame["kind"] == "text":
                streamed.append(frame["text"])
            elif kind == "progress" and frame["kind"] == "reset":
                streamed.clear()
            elif kind == "message" and frame["role"] == "assistant":
                elapsed = time.perf_counter() - t0
                break
            elif kind == "error":
                raise RuntimeError(f"the web chat answered an error: {frame}")
        if frame["text"] != ANSWER or "".join(streamed) != ANSWER:
            raise RuntimeError(f"wrong reply: {frame['text']!r}, streamed {streamed!r}")
        return elapsed

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


class Bare:
    """The baseline: a streamed `litellm.acompletion` to the same model, read to its end."""

    def __init__(self, base_url: str) -> None:
        self.litellm = load_litellm()
        self.base_url = base_url

    async def call(self) -> float:
        t0 = time.perf_counter()
        stream = await self.litellm.acompletion(
            model="openai/scripted",
            api_base=self.base_url,
            api_key="x",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
            num_retries=0,
        )
        text = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        elapsed = time.perf_counter() - t0
        if "".join(text) != ANSWER:
            raise RuntimeError(f"bare call got {''.join(text)!r}")
        return elapsed


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p * (len(xs) - 1)))]


async def latency(bare: Bare, http: aiohttp.ClientSession, url: str) -> None:
    base: list[float] = []
    web: list[float] = []
    for i in range(N + WARM):
        person = Person(http, url, f"bench-lat-{i:05d}")
        await person.open()
        t_bare = await bare.call()
        t_web = await person.ask(f"{REQUESTS[i % len(REQUESTS)]} ({i})")
        await person.close()
        if i >= WARM:
            base.append(t_bare)
            web.append(t_web)
    p50b, p99b = statistics.median(base), _pct(base, 0.99)
    p50w, p99w = statistics.median(web), _pct(web, 0.99)
    added = (p50w - p50b) * 1000
    print(
        f"bare streamed litellm call   p50 {p50b * 1000:6.2f} ms  p99 {p99b * 1000:6.2f} ms  "
        "(baseline)"
    )
    print(
        f"web chat, send to the reply  p50 {p50w * 1000:6.2f} ms  p99 {p99w * 1000:6.2f} ms  "
        f"({N} messages, each paired with a bare call)"
    )
    verdict = "meets" if added <= TARGET_ADDED_MS else "MISSES"
    print(
        f"added by Steward: p50 {added:.2f} ms (target <= {TARGET_ADDED_MS:g}: {verdict}), "
        f"p99 {(p99w - p99b) * 1000:.2f} ms; ratio p50 {p50w / p50b:.2f}x bare"
    )


async def bare_load(bare: Bare) -> float:
    """Calls per second, `CONVERSATIONS` callers each making `ROUNDS` calls in turn."""

    async def caller() -> None:
        for _ in range(ROUNDS):
            await bare.call()

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CONVERSATIONS)))
    return CONVERSATIONS * ROUNDS / (time.perf_counter() - t0)


async def web_load(http: aiohttp.ClientSession, url: str, run: int) -> tuple[float, list[float]]:
    """Messages per second, each conversation sending its next message on its reply.

    The tabs are opened before the clock starts and closed after it: an open tab nobody
    reads (while the bare calls run) would not answer the server's pings and be closed."""
    people = [Person(http, url, f"bench-load-{i:05d}") for i in range(CONVERSATIONS)]
    times: list[float] = []

    async def converse(person: Person) -> None:
        for r in range(ROUNDS):
            times.append(await person.ask(REQUESTS[(run * ROUNDS + r) % len(REQUESTS)]))

    try:
        await asyncio.gather(*(p.open() for p in people))
        t0 = time.perf_counter()
        await asyncio.gather(*(converse(p) for p in people))
        elapsed = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(p.close() for p in people))
    return CONVERSATIONS * ROUNDS / elapsed, times


async def throughput(bare: Bare, http: aiohttp.ClientSession, url: str) -> None:
    await web_load(http, url, 0)  # warm: every conversation once, as the bare one is
    await bare_load(bare)
    bare_rates = [await bare_load(bare)]
    web_rates: list[float] = []
    web_times: list[float] = []
    for run in (1, 2):
        rate, times = await web_load(http, url, run)
        web_rates.append(rate)
        web_times += times
        bare_rates.append(await bare_load(bare))
    ratios = [w / ((bare_rates[i] + bare_rates[i + 1]) / 2) for i, w in enumerate(web_rates)]
    print(
        f"under load ({CONVERSATIONS} conversations at once, {ROUNDS} messages each): "
        f"bare streamed calls {', '.join(f'{r:.1f}' for r in bare_rates)} calls/s (baseline); "
        f"web chat {', '.join(f'{r:.1f}' for r in web_rates)} messages/s, "
        f"p99 {_pct(web_times, 0.99) * 1000:.0f} ms"
    )
    ratio = statistics.median(ratios)
    verdict = "meets" if ratio >= TARGET_THROUGHPUT else "MISSES"
    print(
        f"throughput ratio {ratio:.2f}x bare streamed ({', '.join(f'{r:.2f}' for r in ratios)}; "
        f"target >= {TARGET_THROUGHPUT:g}x: {verdict})"
    )


async def _run(model: ScriptedModel) -> None:
    tmp = bench_dir("steward-bench-webchat-")
    port = free_port()
    env = {  # what bench rss gives `steward run`: the defaults, the scripted model
        "STEWARD_DATA_DIR": str(tmp / "data"),
        "STEWARD_WORKSPACE": str(tmp / "ws"),
        "STEWARD_PORT": str(port),
        "STEWARD_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "STEWARD_LOCAL_MODEL": "off",
        "STEWARD_LOG_LEVEL": "warning",
        "STEWARD_MODEL": "openai/scripted",
        "STEWARD_API_BASE": model.base_url,
    }
    server = start(env, tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        await asyncio.to_thread(
            wait_for,
            lambda: channels(port).get("web", {}).get("state") == "connected",
            "the web chat",
            server,
        )
        bare = Bare(model.base_url)
        jar = aiohttp.CookieJar(unsafe=True)  # keeps the login cookie for 127.0.0.1
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(cookie_jar=jar, connector=connector) as http:
            async with http.get(f"{url}/?token={read_token(tmp / 'data')}") as page:
                page.raise_for_status()
            await latency(bare, http, url)
            await throughput(bare, http, url)
        if server.poll() is not None:
            raise RuntimeError(f"steward run exited ({server.returncode})")
    finally:
        stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    print(describe())
    print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]}")
    model = ScriptedModel()
    try:
        asyncio.run(_run(model))
    finally:
        model.close()
    print(f"load after: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve-model"]:
        serve_model()
    else:
        main()
