"""A URL setting is never shown with its secret: `/healthz` (no login), `steward doctor`
(pasted into bug reports) and the start-up log show STEWARD_API_BASE (and any URL in a
status line) without its userinfo password or a credential-named query value
(`memory.redact.redact_shown`, the one helper for all of them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from bot.server import _shown_health
from config.settings import Settings
from memory.redact import redact_shown
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_cli import run
from tests.test_paas import free_port
from tests.test_web_e2e import running

SECRET = "hunter2pw"


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (
            f"openai/gpt at https://user:{SECRET}@llm.example/v1",
            "openai/gpt at https://user:[REDACTED:url_password]@llm.example/v1",
        ),
        (f"https://:{SECRET}@llm.example/v1", "https://:[REDACTED:url_password]@llm.example/v1"),
        (
            f"https://llm.example/v1?key={SECRET}&model=x",
            "https://llm.example/v1?key=[REDACTED:api_key]&model=x",
        ),
        ("https://h.example/v1?api-key=abc", "https://h.example/v1?api-key=[REDACTED:api_key]"),
        ("https://h.example/?access_token=abc", "https://h.example/?access_token=[REDACTED:token]"),
        (
            "https://h.example/cb#token=abc&state=1",
            "https://h.example/cb#token=[REDACTED:token]&state=1",
        ),
        (
            "https://s3.example/o?X-Amz-Signature=abc&X-Amz-Expires=60",
            "https://s3.example/o?X-Amz-Signature=[REDACTED:api_key]&X-Amz-Expires=60",
        ),
    ],
)
def test_secrets_in_urls_are_redacted(shown: str, expected: str) -> None:
    assert redact_shown(shown) == expected
    assert redact_shown(expected) == expected  # idempotent


@pytest.mark.parametrize(
    "kept",
    [
        "http://127.0.0.1:8080/v1",
        "https://host.example:8443/users/@alice/",
        "https://user@host.example/repo.git",  # a user name alone is no secret
        "https://h.example/v1?monkey=1&tokens=5&model=gpt",
        "openai/gpt-4.1-mini",
        "the web chat is at http://localhost:8765/ (log in first)",
    ],
)
def test_urls_without_secrets_are_unchanged(kept: str) -> None:
    assert redact_shown(kept) == kept


def test_a_channel_detail_naming_a_url_is_redacted() -> None:
    health = {"state": "reconnecting", "detail": f"cannot reach https://bot:{SECRET}@mm.example"}
    assert SECRET not in json.dumps(_shown_health(health))


async def test_healthz_of_a_running_server_shows_api_base_without_its_secrets(
    settings_for: Callable[..., Settings],
) -> None:
    settings = settings_for(
        None,
        port=free_port(),
        model="openai/some-model",
        api_base=f"https://steward:{SECRET}@llm.example/v1?key=k{SECRET}",
    )
    async with (
        running(settings, login=False) as (_http, url),
        aiohttp.ClientSession() as anyone,  # no login: anybody who can reach the port
        anyone.get(f"{url}/healthz") as resp,
    ):
        body = await resp.text()
    assert resp.status == 200
    assert SECRET not in body
    model = json.loads(body)["model"]
    assert model == (
        "openai/some-model at https://steward:[REDACTED:url_password]@llm.example/v1"
        "?key=[REDACTED:api_key]"
    )


def test_doctor_shows_api_base_without_its_password(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    """The model check names the model and its api_base, answered or not (here the
    model client refuses a password in the URL next to its key: the error says so)."""
    base = llm_thread.base_url.replace("://", f"://steward:{SECRET}@", 1)
    env = make_env(tmp_path, llm_thread, api_base=base)
    done = run(["doctor"], env, tmp_path)
    shown = "model: The model openai/scripted at http://steward:[REDACTED:url_password]@127.0.0.1"
    assert shown in done.stdout, done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
