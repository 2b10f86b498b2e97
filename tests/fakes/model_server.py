"""A stand-in for the local model server, run as a child process by the supervisor
tests: `python -m tests.fakes.model_server --host 127.0.0.1 --port N [--start-delay S]`.

It serves `GET /v1/models` and a minimal non-streaming `POST /v1/chat/completions`
that answers "fake local model: <last user text>", or, when the request carries a
`response_format` with a schema, the JSON object in the `FAKE_MODEL_JSON` variable.
`--fail` exits at once with code 3 (a server that can't start). `--crash-on-chat SIG`
dies of that signal (e.g. SIGILL) on every chat request, as llama.cpp did when it used
instructions the kernel had not enabled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

from aiohttp import web


async def models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})


CRASH: signal.Signals | None = None


async def chat(request: web.Request) -> web.Response:
    body = await request.json()
    if CRASH is not None:
        print("fake model server: first matrix multiply ...", flush=True)
        signal.signal(CRASH, signal.SIG_DFL)
        os.kill(os.getpid(), CRASH)
    user = next(
        (m.get("content") for m in reversed(body.get("messages", [])) if m.get("role") == "user"),
        "",
    )
    content = f"fake local model: {user}"
    if body.get("response_format") and os.environ.get("FAKE_MODEL_JSON"):
        content = os.environ["FAKE_MODEL_JSON"]
    return web.json_response(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


async def serve(host: str, port: int, delay: float) -> None:
    await asyncio.sleep(delay)
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"fake model server on {host}:{port} pid {os.getpid()}", flush=True)
    await asyncio.Event().wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--start-delay", type=float, default=0.0)
    p.add_argument("--fail", action="store_true")
    p.add_argument("--crash-on-chat", default="")
    args = p.parse_args()
    if args.crash_on_chat:
        global CRASH
        CRASH = signal.Signals[args.crash_on_chat]
    if args.fail:
        print("fake model server: refusing to start", flush=True)
        return 3
    asyncio.run(serve(args.host, args.port, args.start_delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
