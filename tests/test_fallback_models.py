"""Fallback models on the assembled product: two scripted model servers over real HTTP,
`steward replay`'s runner (real dispatcher, agent, client, litellm, simulated clock) and
the `steward` command itself. When the main model does not answer (5xx, 429, a hang, a
refused connection, a request too long for it) the answer comes from the next model of
`fallback_models`, the reply says so once per conversation, a model failing twice in a
row is skipped for `fallback_cooldown` seconds, and a refused request or key does not
fall back."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from config.settings import ConfigError, Settings, load_settings
from core.clock import Clock
from core.model.client import LLMClient, Target
from core.model.errors import LLMError
from core.model.workers import WorkerPool
from tests.conftest import make_env
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_cli import run
from tests.test_replay_e2e import episodes, replay
from tests.test_silent_model import leaks, port_of
from tests.test_web_e2e import free_port

BACKUP = "openai/backup"
NOTICE = (
    "\n\n(Answered by openai/backup, a fallback model: the main model could not answer just now.)"
)


@pytest.fixture
async def backup() -> AsyncIterator[ScriptedLLM]:
    async with ScriptedLLM() as server:
        yield server


def write_chain(tmp_path: Path, *entries: dict[str, str], extra: str = "") -> None:
    """steward.toml with `fallback_models` (a list of inline tables)."""
    tables = ", ".join(
        "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in e.items()) + " }" for e in entries
    )
    (tmp_path / "steward.toml").write_text(f"fallback_models = [{tables}]\n{extra}")


def chain_settings(
    tmp_path: Path, primary: ScriptedLLM, backup: ScriptedLLM, **overrides: Any
) -> Settings:
    write_chain(tmp_path, {"model": BACKUP, "api_base": backup.base_url})
    return load_settings(env=make_env(tmp_path, primary, **overrides), cwd=tmp_path)


def said(out: list[dict[str, Any]]) -> list[str]:
    return [o["text"] for o in out if o["kind"] == "message"]


def always(status: int, message: str = "upstream down") -> Callable[[dict], Reply]:
    return lambda _body: Reply.error(status, message=message)


async def test_a_failing_main_model_is_answered_by_the_fallback_and_said_once(
    llm: ScriptedLLM, backup: ScriptedLLM, tmp_path: Path
) -> None:
    llm.responder = always(500)
    for text in ("from backup one", "from backup two", "from backup three"):
        backup.reply_text(text)
    s = chain_settings(tmp_path, llm, backup, fallback_cooldown=60)
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "first question"},
            {"t": 1, "user": "alice", "text": "second question"},
            {"t": 2, "user": "bob", "text": "bob asks"},
        ],
    )
    # The fallback's own text; the notice once in alice's conversation, once in bob's.
    assert said(out) == [
        "from backup one" + NOTICE,
        "from backup two",
        "from backup three" + NOTICE,
    ]
    assert [o["conversation"] for o in out if o["kind"] == "message"] == ["alice", "alice", "bob"]
    # The main model was asked by the first two messages (one failure each: the second
    # in a row starts its cool-down), not by bob's, sent while it cools down.
    assert len(llm.requests) == 2
    assert [r["model"] for r in backup.requests] == ["backup"] * 3
    assert backup.requests[2]["messages"][-1]["content"] == "bob asks"
    # The episodes record the model that answered.
    assert sorted(ep["model"] for ep in episodes(s)) == [BACKUP] * 3
    assert all(ep["outcome"] == "success" for ep in episodes(s))


async def test_cool_down_skips_the_main_model_until_it_passes(
    llm: ScriptedLLM, backup: ScriptedLLM, tmp_path: Path
) -> None:
    """On the simulated clock: 2 failures in a row, then 60 s without asking the main
    model; after that it is asked first again, and once it has answered, the next
    fallback answer is said again."""
    llm.reply_error(503).reply_error(503).reply_text("main is back").reply_error(429)
    llm.responder = always(500)  # after the scripted ones
    backup.reply_text("b1").reply_text("b2").reply_text("b3").reply_text("b4")
    s = chain_settings(tmp_path, llm, backup, fallback_cooldown=60)
    lines = [
        {"t": 0, "user": "alice", "text": "one"},  # main 503 -> backup (told)
        {"t": 5, "user": "alice", "text": "two"},  # main 503 -> backup; main cools to t=65
        {"t": 30, "user": "alice", "text": "three"},  # cooling: backup only
        {"t": 100, "user": "alice", "text": "four"},  # cooled: main answers
        {"t": 110, "user": "alice", "text": "five"},  # main 429 -> backup: told again
    ]
    out = await replay(s, lines)
    assert said(out) == ["b1" + NOTICE, "b2", "b3", "main is back", "b4" + NOTICE]
    assert len(llm.requests) == 4  # not at t=30
    assert [r["messages"][-1]["content"] for r in llm.requests] == ["one", "two", "four", "five"]
    models = {ep["request"]: ep["model"] for ep in episodes(s)}
    assert models == {
        "one": BACKUP,
        "two": BACKUP,
        "three": BACKUP,
        "four": "openai/scripted",
        "five": BACKUP,
    }


async def test_a_different_fallback_is_said_again(
    llm: ScriptedLLM, backup: ScriptedLLM, tmp_path: Path
) -> None:
    """Two fallbacks: when the second answers after the first did, the conversation is
    told about the second (another model, another notice)."""
    async with ScriptedLLM() as second:
        llm.responder = always(500)
        backup.reply_text("first backup").reply_error(503)
        second.reply_text("second backup")
        write_chain(
            tmp_path,
            {"model": BACKUP, "api_base": backup.base_url},
            {"model": "openai/second", "api_base": second.base_url},
        )
        s = load_settings(env=make_env(tmp_path, llm, fallback_cooldown=60), cwd=tmp_path)
        out = await replay(
            s,
            [
                {"t": 0, "user": "alice", "text": "one"},
                {"t": 1, "user": "alice", "text": "two"},
            ],
        )
    assert said(out) == [
        "first backup" + NOTICE,
        "second backup" + NOTICE.replace("openai/backup", "openai/second"),
    ]


@pytest.mark.parametrize(
    ("kind", "overrides", "responder"),
    [
        ("rate_limit", {}, always(429, "Rate limit reached")),
        ("server_error", {}, always(503)),
        ("timeout", {"llm_timeout": 0.5}, lambda _body: Reply.hang(60)),
        (
            "context_window",
            {},
            always(
                400,
                "This model's maximum context length is 4096 tokens. However, your messages "
                "resulted in 50004 tokens.",
            ),
        ),
    ],
)
async def test_what_falls_back(
    llm: ScriptedLLM,
    backup: ScriptedLLM,
    tmp_path: Path,
    kind: str,
    overrides: dict[str, Any],
    responder: Callable[[dict], Reply],
) -> None:
    llm.responder = responder
    backup.reply_text("the backup's answer")
    s = chain_settings(tmp_path, llm, backup, **overrides)
    out = await replay(s, [{"t": 0, "user": "alice", "text": "hi"}])
    assert said(out) == ["the backup's answer" + NOTICE], kind
    # At once: one attempt at the main model, then the fallback.
    assert len(llm.requests) == 1 and len(backup.requests) == 1


async def test_a_refused_connection_falls_back(backup: ScriptedLLM, tmp_path: Path) -> None:
    backup.reply_text("still here")
    write_chain(tmp_path, {"model": BACKUP, "api_base": backup.base_url})
    env = make_env(tmp_path, None, model="openai/scripted")
    env["STEWARD_API_BASE"] = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens
    s = load_settings(env=env, cwd=tmp_path)
    out = await replay(s, [{"t": 0, "user": "alice", "text": "hi"}])
    assert said(out) == ["still here" + NOTICE]


@pytest.mark.parametrize(
    ("status", "reads"), [(400, "refused the request"), (401, "refused Steward's credentials")]
)
async def test_a_refused_request_or_key_does_not_fall_back(
    llm: ScriptedLLM, backup: ScriptedLLM, tmp_path: Path, status: int, reads: str
) -> None:
    llm.responder = always(status, "Unrecognized request argument supplied: foo")
    s = chain_settings(tmp_path, llm, backup)
    out = await replay(s, [{"t": 0, "user": "alice", "text": "hi"}])
    [text] = said(out)
    assert text.startswith("I could not finish: The model openai/scripted ") and reads in text
    assert backup.requests == [] and len(llm.requests) == 1


async def test_when_every_model_fails_both_are_named_without_addresses(
    llm: ScriptedLLM, backup: ScriptedLLM, tmp_path: Path
) -> None:
    llm.responder = always(500)
    backup.responder = always(503)
    s = chain_settings(tmp_path, llm, backup, llm_retries=3, fallback_cooldown=0)
    out = await replay(s, [{"t": 0, "user": "alice", "text": "hi"}])
    [text] = said(out)
    # 4 attempts in all across the chain: main, backup, main, backup.
    assert len(llm.requests) == 2 and len(backup.requests) == 2
    assert "The model openai/backup had an error at its provider (tried 4 times)" in text
    assert "Steward also tried openai/scripted: no answer there either." in text
    assert leaks(text, port_of(llm)) == [] and leaks(text, port_of(backup)) == []
    assert NOTICE not in text


async def test_every_model_cooling_down_still_asks_the_main_one(
    llm: ScriptedLLM, backup: ScriptedLLM
) -> None:
    """The client on its own: after both models failed twice in a row (both cooling), a
    call is not refused: it goes to the main model, which answers."""
    llm.responder = always(500)
    backup.responder = always(500)
    client = LLMClient(
        model="openai/scripted",
        clock=Clock(),
        api_base=llm.base_url,
        retries=3,
        backoff=0.01,
        stream=False,
        fallbacks=[Target(BACKUP, backup.base_url)],
        cooldown=600,
    )
    with pytest.raises(LLMError):
        await client.complete([{"role": "user", "content": "hi"}])
    assert len(llm.requests) == 2 and len(backup.requests) == 2
    llm.responder = None
    llm.reply_text("main answers")
    result = await client.complete([{"role": "user", "content": "again"}])
    assert result.text == "main answers" and result.model == "openai/scripted"
    assert not result.fallback and len(backup.requests) == 2


async def test_the_meter_records_the_model_that_answered(
    llm: ScriptedLLM, backup: ScriptedLLM
) -> None:
    """What the spend seam is told: the fallback's name and usage, not the main model's."""
    recorded: list[tuple[str, int, int]] = []

    class Recording:
        async def admit(self) -> None:
            return None

        def record(self, model: str, tokens_in: int, tokens_out: int, cost: Any, **_: Any) -> None:
            recorded.append((model, tokens_in, tokens_out))

    llm.reply_error(502)
    backup.reply_text("counted")
    client = LLMClient(
        model="openai/scripted",
        clock=Clock(),
        api_base=llm.base_url,
        stream=False,
        fallbacks=[Target(BACKUP, backup.base_url)],
    )
    client.meter = Recording()
    result = await client.complete([{"role": "user", "content": "hi"}])
    assert result.model == BACKUP and result.fallback and result.attempts == 2
    assert recorded == [(BACKUP, *backup.served_tokens())]


async def test_a_fallback_call_runs_in_a_worker_process(
    llm: ScriptedLLM, backup: ScriptedLLM
) -> None:
    """Under load the attempt's model, server and key travel in its arguments: the worker
    asks the fallback's server."""
    pool = WorkerPool(1, 1, others=lambda: 5)  # always "under load"
    try:
        assert await pool.wait_ready()
        llm.responder = always(500)
        backup.reply_text("from the worker")
        client = LLMClient(
            model="openai/scripted",
            clock=Clock(),
            api_base=llm.base_url,
            stream=False,
            backoff=0.01,
            workers=pool,
            fallbacks=[Target(BACKUP, backup.base_url, "sk-backup")],
        )
        result = await client.complete([{"role": "user", "content": "hi"}])
        assert result.text == "from the worker" and result.model == BACKUP
        assert pool.answered == 1 and len(llm.requests) == 1
    finally:
        await pool.stop()


async def test_the_env_form_uses_the_providers_usual_settings(
    llm: ScriptedLLM, backup: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STEWARD_FALLBACK_MODELS: model strings only; the provider's own variables say
    where (here OPENAI_API_BASE, pointed at the backup server) and with which key."""
    monkeypatch.setenv("OPENAI_API_BASE", backup.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    llm.responder = always(503)
    backup.reply_text("env backup")
    s = load_settings(env=make_env(tmp_path, llm, fallback_models=BACKUP), cwd=tmp_path)
    out = await replay(s, [{"t": 0, "user": "alice", "text": "hi"}])
    assert said(out) == ["env backup" + NOTICE]
    assert backup.requests[0]["model"] == "backup"


def test_mistakes_in_the_chain_are_said_with_the_fix(tmp_path: Path) -> None:
    write_chain(tmp_path, {"model": "openai/a"}, {"model": " "})
    with pytest.raises(ConfigError) as empty:
        load_settings(env=make_env(tmp_path, None), cwd=tmp_path)
    text = str(empty.value)
    assert "entry 2 of `fallback_models`" in text and "steward.toml" in text
    assert "empty model" in text and "Fix:" in text

    write_chain(tmp_path, {"model": "openai/a", "api_key_env": "BACKUP_KEY_NOT_SET"})
    with pytest.raises(ConfigError) as unset:
        load_settings(env=make_env(tmp_path, None), cwd=tmp_path)
    assert "BACKUP_KEY_NOT_SET, which is not set" in str(unset.value)
    assert "export BACKUP_KEY_NOT_SET=" in str(unset.value)
    env = {**make_env(tmp_path, None), "BACKUP_KEY_NOT_SET": "sk-1"}
    [entry] = load_settings(env=env, cwd=tmp_path).fallback_models
    assert entry.key(env) == "sk-1"  # the key is read from the variable, never written


def test_doctor_names_the_fallback_that_is_down(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"
    write_chain(
        tmp_path,
        {"model": "openai/backup-up", "api_base": llm_thread.base_url},
        {"model": "openai/backup-down", "api_base": down},
    )
    done = run(["doctor"], make_env(tmp_path, llm_thread), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(x.startswith("✓ model: openai/scripted") for x in lines), done.stdout
    assert any(x.startswith("✓ fallback model 1 (openai/backup-up):") for x in lines)
    [bad] = [x for x in lines if x.startswith("✗ fallback model 2 (openai/backup-down):")]
    assert "could not be reached" in bad
    assert "fix: fix or remove entry 2 of fallback_models" in done.stdout
    assert "1 problem(s) to fix" in done.stderr


def test_steward_chat_says_which_model_answered(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    """The `steward` command, end to end: the chain from steward.toml."""
    backup = ScriptedLLM()
    backup.start_in_thread()
    try:
        llm_thread.responder = always(500)
        backup.reply_text("answered from the backup")
        write_chain(tmp_path, {"model": BACKUP, "api_base": backup.base_url})
        done: subprocess.CompletedProcess[str] = run(
            ["chat", "-m", "hello"], make_env(tmp_path, llm_thread), tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert "answered from the backup" in done.stdout
        assert "(Answered by openai/backup, a fallback model" in done.stdout
    finally:
        backup.stop_thread()
