"""`python -m core.model.worker_main FD`: one model-call worker process.

Started by the pool in Steward's process (core/model/workers.py) with its end of a
private socket pair as FD. It imports litellm, says "ready", then answers each request
(`litellm.acompletion`'s arguments) with the LLMResult, parsed and priced by the same
code as in process (core/model/client.py), or with the failure's facts
(core/model/errors.py `failure_info`), which the caller's retry policy reads. A
request of `None` cancels that call (the caller gave up); end of file ends the worker.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import socket
import sys
from typing import Any

from core.clock import Clock
from core.model.client import LLMClient, load_litellm
from core.model.errors import failure_info
from core.model.workers import frame, read_frame


async def _serve(fd: int) -> None:
    litellm = load_litellm()
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd))
    writer.write(frame("ready"))
    # One per model (each attempt's model, server and key are in its arguments: a
    # fallback's too): its pricing is decided once. An operator's price (`model_prices`)
    # is applied by the caller, which knows the settings.
    clients: dict[str, Any] = {}
    running: dict[int, asyncio.Task[None]] = {}

    async def one(rid: int, kwargs: dict[str, Any]) -> None:
        model = str(kwargs.get("model"))
        client = clients.get(model)
        if client is None:
            client = clients[model] = LLMClient(model=model, clock=Clock(), retries=0)
            client._price_once(litellm)
        try:
            # The LLMResult as in process (`_parse`: text, tool calls, tokens, cost).
            answer: tuple[int, bool, Any] = (
                rid,
                True,
                client._parse(litellm, await litellm.acompletion(**kwargs)),
            )
        except Exception as exc:
            answer = (rid, False, failure_info(exc))
        writer.write(frame(answer))

    while True:
        try:
            rid, kwargs = await read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # Steward closed the pair or died: nothing left to answer
        if kwargs is None:  # the caller gave up (a cancelled task): so does the request
            if (task := running.get(rid)) is not None:
                task.cancel()
            continue
        task = asyncio.create_task(one(rid, kwargs))
        running[rid] = task
        task.add_done_callback(functools.partial(_forget, running, rid))


def _forget(running: dict[int, asyncio.Task[None]], rid: int, _task: object) -> None:
    running.pop(rid, None)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Steward stops its workers itself
    asyncio.run(_serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
