"""The log writer redacts like the data dir: a command waiting for approval that carries
tokens or a URL password reaches stderr masked (captured from the real log output of a
replayed task), and ordinary log text is left alone."""

from __future__ import annotations

import json
import random
import string
import time
from collections.abc import Callable

import pytest
import structlog

from bot.logs import configure_logging
from memory.redact import redact_obj
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay

_rng = random.Random(1313)
ALNUM = string.ascii_letters + string.digits


def r(n: int, alphabet: str = ALNUM) -> str:
    """Fake secret material assembled at run time (nothing here looks like a live key)."""
    return "".join(_rng.choice(alphabet) for _ in range(n - 1)) + "7"


GITHUB = "ghp_" + r(36)
SLACK = "xoxb-" + r(12, string.digits) + "-" + r(24)
SLACK_REFRESH = "xoxe-1-" + r(40)
URL_PASSWORD = "pa/ss@wo" + r(6)
AWS_ID = "AKIA" + r(16, string.ascii_uppercase + string.digits)
AWS_SECRET = r(20) + "/" + r(19, ALNUM + "+")


async def test_approval_requested_log_line_carries_no_secret(
    llm: ScriptedLLM,
    settings_for: Callable,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    # In the test body: the log writer holds the stderr it finds, the captured one here.
    configure_logging("info", "json")  # as `steward run` does when stderr is not a terminal
    request.addfinalizer(structlog.reset_defaults)
    command = (
        f"curl -H 'Authorization: token {GITHUB}' -d 'slack={SLACK}&r={SLACK_REFRESH}' "
        f"https://deploy:{URL_PASSWORD}@example.com/hook; "
        f"echo {AWS_ID} {AWS_SECRET} > ../keys.txt"
    )
    llm.reply_tool("shell", {"command": command}).reply_text("done")
    await replay(settings_for(llm), [{"t": 0, "user": "alice", "text": "deploy"}])
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    requested = [line for line in lines if line.get("event") == "approval.requested"]
    assert requested, err
    assert "[REDACTED:" in requested[0]["what"]
    for secret in (GITHUB, SLACK, SLACK_REFRESH, URL_PASSWORD, AWS_ID, AWS_SECRET):
        assert secret not in err
        assert secret[4:-4] not in err  # no part of it either


def test_ordinary_fields_are_untouched() -> None:
    sha = "3b18e512dba79e4c8300dd08aeb37f8e728b8dad"
    event = {
        "event": "tool.end",
        "command": f"git show {sha} -- core/guardian.py && ls /home/alice/project",
        "task_id": "20240101-120000-a1b2c3",
        "tokens": 1234,
        "paths": ["./notes.md", "/tmp/x/y.txt"],
        "timestamp": "2026-12-01T02:00:00Z",
    }
    assert redact_obj(dict(event)) == event


def test_redacting_a_log_line_is_cheap() -> None:
    """The processor runs on every line: a typical one costs well under a millisecond."""
    event = {
        "event": "approval.requested",
        "approval": "a-20261201-1",
        "what": "Run `git push origin main && pytest -q tests/test_guardian.py`",
        "conversation": "slack:C0123",
        "level": "info",
        "timestamp": "2026-12-01T02:00:00.123456Z",
    }
    runs = 2000
    start = time.perf_counter()
    for _ in range(runs):
        redact_obj(event)
    per_line = (time.perf_counter() - start) / runs
    assert per_line < 0.002, f"{per_line * 1e6:.0f} µs per log line"


class BrokenPipe:
    """A stream whose reader has gone, as stderr is after `steward run 2>&1 | head` ends."""

    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("level", ["info", "warning", "error", "exception"])
def test_a_log_line_that_cannot_be_written_is_dropped_not_raised(
    level: str, request: pytest.FixtureRequest, tmp_path
) -> None:
    request.addfinalizer(structlog.reset_defaults)
    configure_logging("debug", "json", stream=BrokenPipe())  # type: ignore[arg-type]
    getattr(structlog.get_logger("t"), level)("server.stopping", n=1)
    closed = open(tmp_path / "log", "w")
    closed.close()
    configure_logging("debug", "json", stream=closed)
    getattr(structlog.get_logger("t"), level)("server.stopping", n=1)  # ValueError: closed file
