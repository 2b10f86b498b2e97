"""Shared fixtures: a scripted model server and settings that point at it.

Settings are built from an explicit env mapping, never from the developer's real
environment, so a STEWARD_* variable in someone's shell can't change a test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings, load_settings
from tests.fakes.llm import ScriptedLLM
from tests.scratch import in_memory

# postgres_url, nats_url, cluster_prefix: the cluster's real services (tests/services.py).
pytest_plugins = ["tests.services"]

# Everything in the tests talks to 127.0.0.1; a proxy from the environment would
# swallow that traffic (slack_sdk ignores NO_PROXY).
for _var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(_var, None)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
# Scratch files (tmp_path, tempfile, subprocesses' TMPDIR) in RAM: see tests/scratch.py.
in_memory()


@pytest.fixture
async def llm() -> AsyncIterator[ScriptedLLM]:
    async with ScriptedLLM() as server:
        yield server


@pytest.fixture
def llm_thread() -> Iterator[ScriptedLLM]:
    """The scripted model on its own thread, for tests that wait on a subprocess."""
    server = ScriptedLLM()
    server.start_in_thread()
    try:
        yield server
    finally:
        server.stop_thread()


def make_env(tmp_path: Path, llm: ScriptedLLM | None, **overrides: Any) -> dict[str, str]:
    env = {
        "STEWARD_DATA_DIR": str(tmp_path / "data"),
        "STEWARD_WORKSPACE": str(tmp_path / "ws"),
        "STEWARD_LLM_BACKOFF": "0.01",
        "STEWARD_LLM_TIMEOUT": "10",
        "STEWARD_PORT": "0",
        # Tests of the no-model path must not pick up a local model installed in the venv.
        "STEWARD_LOCAL_MODEL": "off",
    }
    if llm is not None:
        env["STEWARD_MODEL"] = f"openai/{llm.model_id}"
        env["STEWARD_API_BASE"] = llm.base_url
    for key, value in overrides.items():
        env[f"STEWARD_{key.upper()}"] = str(value)
    return env


@pytest.fixture
def settings_for(tmp_path: Path) -> Callable[..., Settings]:
    def build(llm: ScriptedLLM | None, **overrides: Any) -> Settings:
        return load_settings(env=make_env(tmp_path, llm, **overrides), cwd=tmp_path)

    return build


@pytest.fixture
async def in_process(
    tmp_path: Path,
    llm: ScriptedLLM,
    nats_url: str,
    postgres_url: str,
    cluster_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Any]:
    """A cluster gateway (its dashboard included) in this process, on the real NATS and
    PostgreSQL and the Slack fake; the test starts its workers
    (tests/test_cluster_transport.py `Cluster`)."""
    from tests.fakes.slack import FakeSlack
    from tests.test_cluster_transport import Cluster

    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)  # slack_sdk would proxy 127.0.0.1
    async with FakeSlack() as fake:
        cluster = Cluster(tmp_path, fake, llm, nats_url, postgres_url, cluster_prefix)
        try:
            await cluster.start_gateway()
            yield cluster
        finally:
            await cluster.stop()
