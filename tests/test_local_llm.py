"""The constrained adapter for the tiny local model, against the scripted model server,
and the embedded-model wiring (App, chat, doctor) with a fake server child."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import LOCAL_MODEL_NOTICE, App
from bot.model_check import no_model_message
from core.clock import Clock
from core.events import Message
from core.gates import check_answer, retry_instruction
from core.model.local.client import (
    LOCAL_TOOLS,
    LocalLLM,
    _request_index,
    call_schema,
    compose_answer,
    parse_call,
    route,
)
from memory.episodes import EpisodeStore
from tests.fakes.llm import ScriptedLLM

BENCH = Path(__file__).resolve().parent.parent / "bench" / "local_model"


class StubServer:
    """Stands in for ModelServer: the scripted model is already running."""

    def __init__(self, url: str) -> None:
        self.base_url = url
        self.running = True
        self.ensured = 0
        self.deaths = 0
        self.last_death = ""

    def death_report(self) -> str:
        return ""  # the scripted model never dies

    async def ensure(self) -> str:
        self.ensured += 1
        return self.base_url

    @contextlib.asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        yield


def local(llm: ScriptedLLM, **kw: Any) -> LocalLLM:
    return LocalLLM(server=StubServer(llm.base_url), clock=Clock(), timeout=10, **kw)  # type: ignore[arg-type]


def schemas(*names: str) -> list[dict[str, Any]]:
    from core.tools import tool_schemas

    return tool_schemas(names or LOCAL_TOOLS)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]


# -- routing and schema --------------------------------------------------------------


def test_router_on_the_vendored_requests() -> None:
    """The router's choice on the bench set (the model only fills arguments after it)."""
    rows = [json.loads(x) for x in (BENCH / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 40
    wrong = []
    for row in rows:
        r = route(row["request"])
        got = r.tool if r.kind == "tool" else "none"
        if got != row["expected"]:
            wrong.append((row["request"], got))
    assert not wrong


def test_router_candidates() -> None:
    r = route("create a file hello.txt that says hello world")
    assert r.tool == "write_file"
    assert r.candidates == {"path": ["hello.txt"], "content": ["hello world"]}
    assert route("list everything under src").flags == {"recursive": True}
    assert route("write a haiku about autumn").kind == "chat"
    assert route("what can you do?").kind == "capabilities"


def test_schema_limits_values_to_candidates() -> None:
    schema = call_schema(["read_file"], {"path": ["notes.md"]})
    assert schema["properties"]["tool"] == {"const": "read_file"}
    assert schema["properties"]["arguments"]["properties"]["path"]["enum"] == ["notes.md"]
    free = call_schema(["shell"])["properties"]["arguments"]["properties"]["command"]
    assert free["maxLength"] == 120
    assert len(call_schema(["read_file", "shell"])["oneOf"]) == 2


def test_parse_call_refuses_what_the_schema_would_not_allow() -> None:
    assert parse_call('{"tool": "read_file", "arguments": {"path": "a"}}', ["read_file"]) == (
        "read_file",
        {"path": "a"},
    )
    assert parse_call('{"tool": "shell", "arguments": {"command": "x"}}', ["read_file"]) is None
    assert parse_call('{"tool": "read_file", "arguments": {}}', ["read_file"]) is None
    assert parse_call("not json", ["read_file"]) is None


def test_gate_retry_is_not_taken_for_the_request() -> None:
    from core.gates import GateResult

    note = retry_instruction(GateResult("quality", ["answer says nothing"], []))
    msgs = [*user("list files"), {"role": "assistant", "content": "x"}]
    msgs.append({"role": "user", "content": note or "Your answer says nothing"})
    assert _request_index(msgs) == 1


# -- the adapter against the scripted model ---------------------------------------------


async def test_tool_request_becomes_a_schema_constrained_call(llm: ScriptedLLM) -> None:
    llm.reply_text('{"tool": "read_file", "arguments": {"path": "b.md"}}')
    result = await local(llm).complete(user("read a.md or b.md"), schemas())
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("read_file", {"path": "b.md"})
    ]
    sent = llm.requests[-1]
    assert "tools" not in sent  # no function calling: a schema decides the shape
    fmt = sent["response_format"]
    assert fmt["type"] == "json_object"
    assert fmt["schema"]["properties"]["arguments"]["properties"]["path"]["enum"] == [
        "a.md",
        "b.md",
    ]


async def test_arguments_the_request_settles_are_copied_not_generated(
    llm: ScriptedLLM,
) -> None:
    """One candidate per argument: code copies it, so every code point arrives as sent
    (a tiny model asked to spell an emoji or a rare character can lose it)."""
    texts = ["plain 🚀", "日本語", "שלום עולם", "مرحبا", "e\u0301 n\u0303", "👩\u200d👩\u200d👧 🇯🇵"]
    for text in texts:
        result = await local(llm).complete(user(f'write "{text}" to rocket.txt'), schemas())
        [call] = result.tool_calls
        assert (call.name, json.loads(call.arguments)) == (
            "write_file",
            {"path": "rocket.txt", "content": text},
        )
    assert not llm.requests  # nothing was left for the model to choose
    # Two files: the model picks the path; the content is still copied.
    llm.reply_text('{"tool": "write_file", "arguments": {"path": "b.txt"}}')
    result = await local(llm).complete(user('write "🚀" to a.txt or b.txt'), schemas())
    assert json.loads(result.tool_calls[0].arguments) == {"path": "b.txt", "content": "🚀"}
    props = llm.requests[-1]["response_format"]["schema"]["properties"]["arguments"]
    assert list(props["properties"]) == ["path"]


async def test_chit_chat_goes_without_tools_and_streams(llm: ScriptedLLM) -> None:
    llm.reply_text("Hello! How can I help?")
    seen: list[str] = []

    async def on_text(t: str) -> None:
        seen.append(t)

    result = await local(llm).complete(user("hello!"), schemas(), on_text=on_text)
    assert result.text == "Hello! How can I help?" and not result.tool_calls
    assert "".join(seen) == result.text
    sent = llm.requests[-1]
    assert "tools" not in sent and "response_format" not in sent
    assert sent["messages"][0]["content"].startswith("You are Steward")


async def test_after_the_tool_result_the_answer_is_composed_by_code(llm: ScriptedLLM) -> None:
    msgs = [
        *user("list the files in my workspace"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": '{"path": "."}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "list_files", "content": "a.md  (3 bytes)"},
    ]
    result = await local(llm).complete(msgs, schemas())
    assert not llm.requests  # no model call at all
    assert result.text == "Files in `.`:\n```\na.md  (3 bytes)\n```"
    from memory.episodes import ToolRecord

    tools = [ToolRecord(name="list_files", ok=True, args={"path": "."})]
    assert check_answer(result.text, tools, request="list the files").ok()


def test_compose_reports_failures_plainly() -> None:
    msgs = [
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "shell", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "Not approved (denied); nope."},
    ]
    assert compose_answer(msgs, 0).startswith("shell did not work. Not approved")


async def test_unparseable_json_falls_back_to_chat(llm: ScriptedLLM) -> None:
    llm.reply_text("{oops").reply_text("I could not do that.")
    result = await local(llm).complete(user("read a.md or b.md"), schemas())
    assert result.text == "I could not do that." and not result.tool_calls


async def test_a_tool_not_offered_is_not_called(llm: ScriptedLLM) -> None:
    llm.reply_text("plain answer")
    result = await local(llm).complete(user("run `git status`"), schemas("read_file"))
    assert not result.tool_calls and result.text == "plain answer"


async def test_native_mode_passes_tools_through(llm: ScriptedLLM) -> None:
    llm.reply_tool("list_files", {"path": "."})
    result = await local(llm, mode="native").complete(user("hi"), schemas())
    assert result.tool_calls[0].name == "list_files"
    assert llm.requests[-1]["tools"] and "response_format" not in llm.requests[-1]


# -- wiring: App, notice, no-model message -----------------------------------------------


def fake_child(port: int) -> list[str]:
    return [sys.executable, "-m", "tests.fakes.model_server", "--port", str(port)]


async def test_app_runs_the_embedded_model_end_to_end_with_a_fake_server(
    settings_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from adapters.terminal import OneShotChannel

    monkeypatch.setenv(
        "FAKE_MODEL_JSON", json.dumps({"tool": "read_file", "arguments": {"path": "hello.md"}})
    )
    settings = settings_for(None, local_model="auto")
    (settings.workspace).mkdir(parents=True, exist_ok=True)
    (settings.workspace / "hello.md").write_text("hi from the file")
    app = App(settings, env={}, local_command=fake_child)
    assert app.local is not None and app.notice == LOCAL_MODEL_NOTICE
    assert app.local.proc is None  # lazy: nothing runs before the first task
    assert app.agent is not None and set(app.agent.tools) == set(LOCAL_TOOLS)
    assert app.agent.max_steps == settings.local_model_max_steps
    channel = OneShotChannel(Console(stderr=True, quiet=True), show_progress=False)
    [outbox] = await app.start([channel])
    key = app.dispatcher.key(channel, "terminal")
    try:
        await app.dispatcher.handle(
            Message(channel.name, "terminal", "owner", "read hello.md or notes.md"), outbox
        )
        await app.conversations.wait_idle(key)
        pid = app.local.pid
        assert app.local.running
    finally:
        await app.stop()
    assert not app.local.running and pid is not None
    result = app.dispatcher.last_results[key]
    assert result.outcome == "success", result.reply
    assert "hi from the file" in result.reply
    store = EpisodeStore(settings.data_dir)
    [path] = list(store.iter_files())
    meta = store.read_front_matter(path)
    assert meta["outcome"] == "success" and meta["model"] == "local/smollm2-135m"
    assert "read_file" in json.dumps(meta["tools"])


def test_no_model_message_says_how_to_install_the_local_model(settings_for) -> None:
    auto = settings_for(None, local_model="auto", local_model_path="/nonexistent.gguf")
    assert "can't run" in no_model_message(auto, env={})
    assert "can't run" not in no_model_message(settings_for(None), env={})  # off


def test_app_without_llama_cpp_keeps_the_no_model_behaviour(settings_for) -> None:
    settings = settings_for(None, local_model="auto", local_model_path="/nonexistent.gguf")
    app = App(settings, env={})
    try:
        assert app.agent is None and app.local is None
        assert app.notice is not None and "can't run" in app.notice
    finally:
        app.lock.release()


async def test_doctor_says_how_to_get_the_local_model(
    settings_for, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.doctor import _model
    from core.model.local.runtime import PROVIDER_KEYS

    for key in PROVIDER_KEYS:
        monkeypatch.delenv(key, raising=False)
    settings = settings_for(None, local_model="auto", local_model_path="/nonexistent.gguf")
    [check] = await _model(settings)
    assert not check.ok and "tiny local model can't run" in check.detail
    assert "dev.py run" in check.fix and "STEWARD_MODEL" in check.fix
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    [check] = await _model(settings)
    assert "OPENAI_API_KEY is set" in check.detail


async def test_chit_chat_leaves_tool_output_out_of_the_history(llm: ScriptedLLM) -> None:
    llm.reply_text("Hi!")
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "Files in `.`:\n```\na.md\n```"},
        {"role": "user", "content": "nice, thanks"},
        {"role": "assistant", "content": "You're welcome."},
        {"role": "user", "content": "hello!"},
    ]
    await local(llm).complete(msgs, schemas())
    sent = [m["content"] for m in llm.requests[-1]["messages"][1:]]
    assert sent == ["nice, thanks", "You're welcome.", "hello!"]
