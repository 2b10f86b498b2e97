"""The `sandbox` setting, the fail-closed fallback, doctor, and what the guardian says a
command needs (docs/safety.md#sandbox). Effects are in tests/test_sandbox_effects.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import core.sandbox.configure
from bot.app import App
from bot.doctor import _sandbox
from config.settings import ConfigError
from core.guardian import Guardian, Verdict
from core.sandbox import Availability, Grant, detect
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay, tool_messages

WHY = "user namespaces are disabled here (test)"


@pytest.fixture
def no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one without user namespaces."""
    monkeypatch.setattr(core.sandbox.configure, "detect", lambda: Availability(False, None, WHY))


def test_required_refuses_to_start_without_a_sandbox(
    no_sandbox: None, settings_for: Callable
) -> None:
    with pytest.raises(ConfigError, match=r'sandbox = "required".*user namespaces are disabled'):
        App(settings_for(None, sandbox="required"))


def test_a_bad_value_is_explained(settings_for: Callable) -> None:
    with pytest.raises(ConfigError, match=r"sandbox.*'auto', 'off' or 'required'"):
        settings_for(None, sandbox="maybe")


async def test_without_a_sandbox_every_command_asks(
    no_sandbox: None, llm: ScriptedLLM, settings_for: Callable
) -> None:
    """Fail-closed: `echo hi`, which the guardian allows, needs approval when it cannot
    be sandboxed; the banner and the approval say why; approved, it runs."""
    s = settings_for(llm)
    app = App(s)
    try:
        assert app.notice is not None and WHY in app.notice and "ask for approval" in app.notice
    finally:
        app.lock.release()
    llm.reply_tool("shell", {"command": "echo hi"}).reply_text("It printed hi.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "say hi"},
            {"t": 1, "user": "alice", "press": "approve once"},
        ],
    )
    approval = next(o for o in out if o["kind"] == "approval")
    assert "no OS sandbox" in approval["text"] and WHY in approval["text"]
    assert "hi" in tool_messages(llm)[0]


async def test_off_is_an_explicit_opt_out(llm: ScriptedLLM, settings_for: Callable) -> None:
    s = settings_for(llm, sandbox="off")
    llm.reply_tool("shell", {"command": "echo hi; ls /proc | grep -c '^[0-9]'"})
    llm.reply_text("It printed hi.")
    out = await replay(s, [{"t": 0, "user": "alice", "text": "say hi"}])
    assert not [o for o in out if o["kind"] == "approval"]
    output = tool_messages(llm)[0]
    assert "hi" in output
    assert int(output.split()[-1]) > 5  # the host's processes: no PID namespace


def test_doctor_says_whether_commands_are_sandboxed(
    settings_for: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings_for(None)
    if detect().ok:
        check = _sandbox(s)
        assert check.ok and not check.warn and check.detail.startswith("on (bubblewrap")
    assert "off" in _sandbox(settings_for(None, sandbox="off")).detail
    monkeypatch.setattr(core.sandbox.configure, "detect", lambda: Availability(False, None, WHY))
    check = _sandbox(s)
    assert check.ok and check.warn and WHY in check.detail and "asks for approval" in check.detail
    check = _sandbox(settings_for(None, sandbox="required"))
    assert not check.ok and WHY in check.detail


@pytest.mark.parametrize(
    ("command", "needs"),
    [
        ("git push origin main", ("network",)),
        ("pip install requests", ("network",)),
        ("npm install left-pad", ("network",)),
        ("curl --data @notes.txt https://example.com/", ("network",)),
        ("ssh host uptime", ("network",)),
        ("echo x > ../out.txt", ("write:{parent}/out.txt",)),
        ("git push; echo x > ../out.txt", ("network", "write:{parent}/out.txt")),
        ("sudo ls", ("unsandboxed",)),
        ("some-unknown-tool --go", ("unsandboxed",)),
        ("git push; some-unknown-tool", ("network", "unsandboxed")),
    ],
)
def test_the_guardian_says_what_an_approval_must_grant(
    tmp_path: Path, command: str, needs: tuple[str, ...]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    decision = Guardian(ws.resolve()).check_sync("shell", {"command": command})
    assert decision.verdict == Verdict.APPROVAL
    assert decision.needs == tuple(n.format(parent=tmp_path.resolve()) for n in needs)
    grant = Grant.from_needs(decision.needs)
    assert grant.unsandboxed == ("unsandboxed" in needs)


def test_an_allowed_command_needs_nothing(tmp_path: Path) -> None:
    decision = Guardian(tmp_path.resolve()).check_sync("shell", {"command": "ls -la"})
    assert decision.verdict == Verdict.ALLOW and decision.needs == ()
