"""Prompt size of a first turn, in tokens, from the scripted model's request log.

One message ("hi") goes through the real app; the request the model received is split
into its parts — system prompt, tool schemas, the person's message — and each is counted
with litellm's offline tokenizer (tiktoken cl100k, bundled with litellm). The figure to
keep small is the share of the tool schemas: they are sent with every model call.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from adapters.replay import ReplayChannel
from bot.app import App
from bot.logs import configure_logging
from config.settings import load_settings
from core.access import Rules
from core.events import Message
from core.model.client import load_litellm, token_counting
from tests.fakes.llm import Reply, ScriptedLLM


async def first_turn() -> dict[str, Any]:
    """The body of the first model request of a fresh conversation."""
    async with ScriptedLLM() as llm:
        llm.responder = lambda body: Reply.text("Hello.")
        tmp = Path(tempfile.mkdtemp(prefix="steward-bench-"))
        settings = load_settings(
            env={
                "STEWARD_MODEL": "openai/scripted",
                "STEWARD_API_BASE": llm.base_url,
                "STEWARD_DATA_DIR": str(tmp / "data"),
                "STEWARD_WORKSPACE": str(tmp / "ws"),
            },
            cwd=tmp,
        )
        app = App(settings)
        app.access.rules["replay"] = Rules(open=True)
        channel = ReplayChannel(time.monotonic, lambda event: None)
        await app.start([channel])
        try:
            await app.dispatcher.handle(Message("replay", "c1", "bench", "hi"), channel)
            await app.conversations.wait_idle("replay:c1")
        finally:
            await app.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return dict(llm.requests[0])


def measure(body: dict[str, Any]) -> dict[str, Any]:
    """A request's parts in tokens: system prompt, tool schemas (each and all), the rest."""
    litellm = load_litellm()

    def count(text: str) -> int:
        return int(litellm.token_counter(model="gpt-4o", text=text))

    system = "\n".join(
        str(m.get("content") or "") for m in body["messages"] if m.get("role") == "system"
    )
    others = "\n".join(
        str(m.get("content") or "") for m in body["messages"] if m.get("role") != "system"
    )
    tools = body.get("tools") or []
    with token_counting(litellm):  # Steward keeps it off: it would answer 0
        parts = {
            "system": count(system),
            "schemas": count(json.dumps(tools, separators=(",", ":"))),
            "message": count(others),
        }
        each = {
            str(t.get("function", {}).get("name", "?")): count(json.dumps(t, separators=(",", ":")))
            for t in tools
        }
    return {**parts, "total": sum(parts.values()), "tools": each}


def main() -> None:
    configure_logging("warning", "json")
    got = measure(asyncio.run(first_turn()))
    schemas, total = got["schemas"], got["total"]
    print(
        f"tools: {len(got['tools'])} schemas, {schemas} tokens "
        f"({schemas / total:.0%} of the prompt)"
    )
    for name, tokens in got["tools"].items():
        print(f"  {name:14s} {tokens}")
    print(f"system prompt: {got['system']} tokens; the message: {got['message']} tokens")
    print(f"first turn's prompt: {total} tokens (cl100k; the JSON as sent, compacted)")
