"""Day caps in the assembled product: `steward run` with Slack (its fake, over Socket
Mode and the Web API) and the scripted model over HTTP. A person's cap stops their
model calls and not another's, /healthz lists the cap reached (admins' notice), and an
admin's `/budget set` lifts it for the next message, kept in the data dir."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.llm import Reply, ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.test_concurrency import last_user
from tests.test_disk_full import ALICE, BOB, ask, drain, env_for, healthz, started, texts_in
from tests.test_terminal_e2e import STEWARD

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def fake() -> Any:
    async with FakeSlack() as server:
        yield server


async def test_a_persons_cap_in_steward_run(
    llm: ScriptedLLM, fake: FakeSlack, tmp_path: Path
) -> None:
    async def respond(body: dict[str, Any]) -> Reply:
        return Reply.text(f"answer to {last_user(body)}")

    llm.responder = respond
    data_dir = tmp_path / "data"
    env = env_for(tmp_path, data_dir, llm, fake)
    env["STEWARD_BUDGET_PERSON_DAY_TOKENS"] = "100"  # one call of alice's is over it
    env["STEWARD_SLACK_ADMINS"] = BOB
    port = int(env["STEWARD_PORT"])
    proc = await asyncio.create_subprocess_exec(
        STEWARD,
        "run",
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    log: list[bytes] = []
    reader = asyncio.create_task(drain(proc.stdout, log))
    try:
        await started(proc, port, log)
        await fake.wait_connected(within=20)
        await ask(fake, "D0ALICE", ALICE, "one")
        assert len(llm.requests) == 1
        await fake.send_envelope("events_api", fake.dm("D0ALICE", ALICE, "two"))
        await fake.wait_for(lambda: any("your day cap" in t for t in texts_in(fake, "D0ALICE")), 30)
        [stopped] = [t for t in texts_in(fake, "D0ALICE") if "your day cap" in t]
        assert "I could not finish: your day cap (100 tokens) is reached" in stopped
        assert "resets at 00:00 UTC" in stopped
        await ask(fake, "D0BOB", BOB, "three")  # bob is still answered
        assert len(llm.requests) == 2  # alice's second message made no model call
        _, health = await healthz(port)
        [reached] = health["budgets"]["reached_today"]
        assert reached.startswith(f"Budget: the day cap of slack:{ALICE} (100 tokens")
        # An admin lifts alice's cap: her next message is answered.
        await fake.send_envelope(
            "events_api", fake.dm("D0BOB", BOB, f"/budget set person tokens off {ALICE}")
        )
        await fake.wait_for(
            lambda: any("is now off (no cap)" in t for t in texts_in(fake, "D0BOB")), 30
        )
        stored = json.loads((data_dir / "budgets.json").read_text())
        assert stored == {"caps": {f"person/tokens/slack:{ALICE}": 0}}
        await ask(fake, "D0ALICE", ALICE, "four")
        assert len(llm.requests) == 3
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 30)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
