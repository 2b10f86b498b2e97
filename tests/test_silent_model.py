"""A model that never answers, on the assembled product: the person hears early (after
`llm_first_notice` seconds of silence, not after a whole `llm_timeout`), is told how long
Steward will keep trying, and the task gives up after `llm_retries + 1` attempts with a
message that says what happened and what to do, without the model server's address or
the raw error text (the log keeps those).

The notice is a task status: the web chat of `steward run` shows it (the replay channel
shows no status), so the notice is checked there; the wording of every kind of failure
is checked through `steward replay`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay
from tests.test_web_e2e import SESSION, frames_until, free_port, running

#: What a person must never read in a failure: the server's address, litellm's name,
#: exception class names, a provider's raw text.
LEAKS = re.compile(
    r"https?://|127\.0\.0\.1|localhost|/v1\b|litellm|Traceback"
    r"|\b[A-Z][A-Za-z]*(?:Error|Exception|Timeout)\b|APITimeout|Error_str|scripted error"
)


def port_of(llm: ScriptedLLM) -> int:
    return int(llm.base_url.rsplit(":", 1)[1].split("/")[0])


def leaks(text: str, port: int | None = None) -> list[str]:
    found = [m.group(0) for m in LEAKS.finditer(text)]
    if port is not None and str(port) in text:
        found.append(str(port))
    return found


async def test_a_hanging_model_is_said_early_with_its_bound_then_given_up_cleanly(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """Through `steward run`'s web chat: the status notice comes while the first attempt
    is still waiting (before it times out), states the bound, and the answer that ends the
    task is clean."""
    llm.responder = lambda _body: Reply.hang(60)
    s = settings_for(llm, port=free_port(), llm_timeout=1.5, llm_first_notice=0.2, llm_retries=1)
    seen: list[dict[str, Any]] = []
    at_notice: dict[str, Any] = {}
    with capture_logs() as logs:
        async with running(s) as (http, url):
            async with http.ws_connect(
                f"{url}/ws?session={SESSION}", headers={"Origin": url}
            ) as ws:
                await ws.send_json({"type": "message", "text": "are you there"})
                await frames_until(
                    ws, lambda f: f["type"] == "progress" and f["kind"] == "status", seen
                )
                # What had happened when the person heard: the first attempt still waiting.
                at_notice["requests"] = len(llm.requests)
                at_notice["events"] = [e["event"] for e in logs]
                final = await frames_until(
                    ws, lambda f: f["type"] == "message" and f["role"] == "assistant", seen
                )
    statuses = [f["text"] for f in seen if f["type"] == "progress" and f["kind"] == "status"]
    # Told while the first attempt was still waiting, not after it timed out...
    assert at_notice["requests"] <= 1 and "llm.retry" not in at_notice["events"], statuses
    # ...once, after 0.2 s of silence, with the bound: 2 attempts of 1.5 s + 0.01 s backoff.
    assert statuses == [
        "The model has not answered for 0.2 s; I'll keep trying for up to 3 s in all "
        "(2 attempts of up to 1.5 s each), then tell you…"
    ]
    # Given up after the stated attempts, and said so plainly.
    assert len(llm.requests) == 2
    text = final["text"]
    assert text.startswith("I could not finish: The model openai/scripted did not answer")
    assert "tried 2 times" in text and "STEWARD_LLM_TIMEOUT" in text
    assert leaks(text, port_of(llm)) == []
    # The log keeps what the person is spared: where, and the raw error.
    [gave_up] = [e for e in logs if e["event"] == "llm.gave_up"]
    assert gave_up["kind"] == "timeout" and gave_up["attempts"] == 2
    assert llm.base_url in gave_up["model"] and gave_up["detail"]


def _refusing(status: int, message: str, **headers: str) -> Callable[[dict], Reply]:
    return lambda _body: Reply.error(status, message=message, headers=headers)


#: kind -> (settings, the scripted model's behaviour, what the person reads)
CASES: dict[str, tuple[dict[str, Any], Callable[[dict], Reply] | None, str]] = {
    "timeout": (
        {"llm_timeout": 0.5, "llm_retries": 1},
        lambda _body: Reply.hang(60),
        "did not answer (tried 2 times, waiting up to 0.5 s each)",
    ),
    "rate_limit": (
        {"llm_retries": 2},
        _refusing(429, "Rate limit reached for requests on org-123 at http://10.0.0.5/"),
        "is rate limited by its provider (tried 3 times)",
    ),
    "auth": (
        {},
        _refusing(401, "Incorrect API key provided: sk-abc***. See http://10.0.0.5/keys"),
        "refused Steward's credentials",
    ),
    "not_found": (
        {},
        _refusing(404, "The model `scripted` does not exist at /srv/models"),
        "does not know this model",
    ),
    "server_error": (
        {"llm_retries": 1},
        _refusing(503, "upstream http://10.0.0.5:8000/v1 down"),
        "had an error at its provider (tried 2 times)",
    ),
    "bad_request": (
        {},
        _refusing(400, "Unrecognized request argument supplied: foo at /srv/app.py"),
        "refused the request",
    ),
    "malformed": (
        {},
        lambda _body: Reply.malformed("<html>Bad gateway at http://10.0.0.5/</html>"),
        "could not be read",
    ),
    "connection": (
        {"llm_retries": 1},
        None,  # nothing listens at the configured address
        "could not be reached (tried 2 times)",
    ),
}


@pytest.mark.parametrize("kind", list(CASES))
async def test_every_model_failure_reads_without_addresses_or_raw_errors(
    llm: ScriptedLLM, settings_for: Callable, kind: str
) -> None:
    """Through `steward replay`: each kind of failure says what happened and what to do,
    never the server's address, a path or the raw error (which the log keeps)."""
    overrides, responder, said = CASES[kind]
    port = port_of(llm)
    if responder is None:
        port = free_port()
        overrides = {**overrides, "api_base": f"http://127.0.0.1:{port}/v1"}
    else:
        llm.responder = responder
    s = settings_for(llm, **overrides)
    with capture_logs() as logs:
        out = await replay(s, [{"t": 0, "user": "alice", "text": "hi"}])
    text = out[-1]["text"]
    assert text.startswith("I could not finish: The model openai/scripted "), text
    assert said in text, text
    assert leaks(text, port) == [], text
    assert "10.0.0.5" not in text and "/srv/" not in text
    [gave_up] = [e for e in logs if e["event"] == "llm.gave_up"]
    assert gave_up["kind"] == kind and gave_up["detail"]
    [ep] = episodes(s)
    assert ep["outcome"] == "failure" and leaks(ep["error"], port) == []


async def test_a_message_too_long_names_no_server(llm: ScriptedLLM, settings_for: Callable) -> None:
    llm.responder = _refusing(
        400,
        "This model's maximum context length is 4096 tokens. However, your messages "
        "resulted in 50004 tokens. Please reduce the length of the messages.",
    )
    s = settings_for(llm)
    out = await replay(s, [{"t": 0, "user": "alice", "text": "word " * 40_000}])
    text = out[-1]["text"]
    assert "Your message is too long for the model openai/scripted:" in text
    assert leaks(text, port_of(llm)) == []
