"""core/model/litellm_file_ids.py: litellm's file-id rewrite runs only for requests
with a file part, and returns what litellm's own function returns for every request."""

from __future__ import annotations

import copy
import sys
from types import ModuleType
from typing import Any

import pytest

from core.model import litellm_file_ids
from core.model.client import load_litellm
from tests.fresh import fresh_python

PROBE = """
import asyncio, json, sys
from core.clock import Clock
from core.model.client import LLMClient, load_litellm
from tests.fakes.llm import ScriptedLLM

PROXY = "litellm.proxy._types"

async def main():
    seen = {}
    async with ScriptedLLM() as llm:
        client = LLMClient(model="openai/scripted", clock=Clock(), api_base=llm.base_url)
        async def ignore(_delta):
            return None
        llm.reply_text("one")
        await client.complete([{"role": "user", "content": "hi"}])
        llm.reply_text("two")
        await client.complete([{"role": "user", "content": "hi"}], on_text=ignore)
        seen["after_text"] = PROXY in sys.modules
        llm.reply_text("three")
        file_part = {"type": "file", "file": {"file_id": "file-abc"}}
        await load_litellm().acompletion(
            model="openai/scripted", api_base=llm.base_url, api_key="x",
            messages=[{"role": "user", "content": [{"type": "text", "text": "read"}, file_part]}],
            model_file_id_mapping={"file-abc": {"model-1": "provider-file-9"}},
            model_info={"id": "model-1"},
        )
        seen["sent_file_id"] = llm.requests[-1]["messages"][0]["content"][1]["file"]["file_id"]
        seen["after_file"] = PROXY in sys.modules
    print(json.dumps(seen))

asyncio.run(main())
"""


def test_the_proxy_types_load_only_for_a_request_with_a_file() -> None:
    seen = fresh_python(PROBE)
    assert seen == {"after_text": False, "sent_file_id": "provider-file-9", "after_file": True}


def _file(file_id: str | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {**extra}
    if file_id is not None:
        body["file_id"] = file_id
    return {"type": "file", "file": body}


CASES: list[list[Any]] = [
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": [{"type": "text", "text": "look"}]}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}],
    [{"role": "user", "content": [[1, 2, 3]]}],  # token ids, as text_completion sends
    [{"role": "user", "content": None}, {"role": "user", "content": []}],
    [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "assistant", "content": [_file("file-in-assistant")]},  # not a user's
    ],
    [{"role": "user", "content": [_file("file-abc")]}],
    [{"role": "user", "content": [{"type": "text", "text": "x"}, _file("file-zzz")]}],
    [{"role": "user", "content": [_file(None, format="application/pdf")]}],
    [{"role": "user", "content": [{"type": "file", "file": "not a mapping"}]}],
    [{"role": "user", "content": ({"type": "text", "text": "a tuple"},)}],
]


@pytest.mark.parametrize("messages", CASES)
def test_the_gate_returns_what_litellms_function_returns(messages: list[Any]) -> None:
    load_litellm()
    gated = sys.modules["litellm.main"].update_messages_with_model_file_ids
    original = gated.__wrapped__  # installed by load_litellm
    mapping = {"file-abc": {"model-1": "provider-file-9"}}
    expected = original(
        messages=copy.deepcopy(messages), model_id="model-1", model_file_id_mapping=mapping
    )
    mine = copy.deepcopy(messages)
    got = gated(messages=mine, model_id="model-1", model_file_id_mapping=mapping)
    assert got == expected
    if not litellm_file_ids.carries_files(messages):
        assert got is mine and mine == messages  # handed back untouched, not copied


def test_the_file_case_is_litellms_own_rewrite() -> None:
    load_litellm()
    gated = sys.modules["litellm.main"].update_messages_with_model_file_ids
    out = gated(
        messages=[{"role": "user", "content": [_file("file-abc")]}],
        model_id="model-1",
        model_file_id_mapping={"file-abc": {"model-1": "provider-file-9"}},
    )
    assert out[0]["content"][0]["file"]["file_id"] == "provider-file-9"


def test_nothing_is_installed_over_a_litellm_that_differs() -> None:
    def other(messages: Any, model_id: Any) -> Any:
        return messages

    changed = ModuleType("fake_litellm_main")
    changed.update_messages_with_model_file_ids = other  # type: ignore[attr-defined]
    assert litellm_file_ids.install(changed) is False
    assert changed.update_messages_with_model_file_ids is other
    assert litellm_file_ids.install(ModuleType("without_it")) is False

    def same(messages: Any, model_id: Any, model_file_id_mapping: Any) -> Any:
        return messages

    module = ModuleType("fake_litellm_main")
    module.update_messages_with_model_file_ids = same  # type: ignore[attr-defined]
    assert litellm_file_ids.install(module) is True
    assert module.update_messages_with_model_file_ids.__wrapped__ is same
    assert litellm_file_ids.install(module) is False  # once
