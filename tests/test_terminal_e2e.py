"""`steward chat` as a person uses it: a real pseudo-terminal, typed lines, an approval
answered by typing "a", then /quit. And: nothing but the model endpoint is contacted."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM

STEWARD = str(Path(sys.executable).with_name("steward"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class Terminal:
    """A child process on a pty, read incrementally."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, close_fds=True
        )
        os.close(slave)
        self.screen = ""

    def expect(self, text: str, timeout: float = 40) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} not seen; screen so far:\n{self.screen}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    raw = os.read(self.master, 65536).decode("utf-8", "replace")
                    self.screen += ANSI.sub("", raw)
                except OSError:
                    break
        return self.screen

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=20)
        finally:
            os.close(self.master)


def test_interactive_chat_with_approval(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    llm_thread.reply_tool("shell", {"command": "echo from-terminal > ../term.txt"})
    llm_thread.reply_text("Wrote term.txt next to the workspace.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread), TERM="xterm", COLUMNS="100")
    term = Terminal([STEWARD, "chat"], env, tmp_path)
    try:
        term.expect("/quit to leave")
        term.type("write term.txt outside the workspace")
        term.expect("Approval needed")
        term.type("1")
        term.expect("Wrote term.txt next to the workspace.")
        assert (tmp_path / "term.txt").read_text() == "from-terminal\n"
        term.type("/quit")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert "Approved by owner" in term.screen


def test_interactive_chat_logs_to_a_file_not_the_terminal(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    """A model retry logs a warning; in the REPL it must not land in the prompt."""
    llm_thread.reply_error(500, message="kaput")
    llm_thread.reply_text("All good after one retry.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    # Wide enough that the banner's log path (under pytest's temp folder) is one line.
    env.update(make_env(tmp_path, llm_thread), TERM="xterm", COLUMNS="200")
    log_file = tmp_path / "data" / "steward-chat.log"
    term = Terminal([STEWARD, "chat"], env, tmp_path)
    try:
        term.expect("/quit to leave")
        term.expect(f"logs: {log_file}")  # the banner says where they went
        term.type("hello")
        term.expect("All good after one retry.")
        term.type("/help")  # one command per line, not one paragraph
        term.expect("/proactive quiet")
        term.type("/quit")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert "llm.retry" not in term.screen and "warning" not in term.screen
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    retry = next(e for e in events if e["event"] == "llm.retry")
    assert retry["level"] == "warning" and "kaput" in retry["detail"]
    assert any(e["event"] == "task.started" for e in events)  # info level is kept too
    shown = [line.strip() for line in term.screen.splitlines()]
    assert "/cancel — stop the running task" in shown


AUDIT = r"""
import ipaddress, sys
seen = []
def hook(event, args):
    if event in ("socket.connect", "socket.getaddrinfo"):
        host = args[1][0] if event == "socket.connect" else args[0]
        if isinstance(host, bytes):
            host = host.decode()
        if not isinstance(host, str):
            return
        try:
            if ipaddress.ip_address(host).is_loopback:
                return
        except ValueError:
            if host == "localhost":
                return
        seen.append((event, host))
sys.addaudithook(hook)
from bot.cli import main
code = main(["chat", "-m", "hello"])
print("NONLOOPBACK", seen, file=sys.stderr)
sys.exit(code)
"""


def test_no_network_but_the_model_endpoint(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    llm_thread.reply_text("hi there")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread))
    res = subprocess.run(
        [sys.executable, "-c", AUDIT],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "hi there\n"
    assert "NONLOOPBACK []" in res.stderr


def test_piped_stdin_cannot_approve(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    """The terminal's owner is the person at the terminal, not any process.
    A program feeding `steward chat` through a pipe (one the agent started, say) cannot
    answer an approval: none is asked, and "1" is only text."""
    llm_thread.reply_tool("shell", {"command": "echo piped > ../piped.txt"})
    llm_thread.reply_text("I could not write piped.txt.")
    llm_thread.reply_text("Nothing to choose.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread))
    proc = subprocess.Popen(
        [STEWARD, "chat"],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    out = b""

    def expect(*texts: str, timeout: float = 40) -> None:
        nonlocal out
        deadline = time.monotonic() + timeout
        while not any(text.encode() in out for text in texts):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{texts!r} not seen; output so far:\n{out.decode()}")
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    break
                out += chunk

    try:
        proc.stdin.write(b"write piped.txt outside the workspace\n")
        proc.stdin.flush()
        # Before the fix, the approval was shown and "1" pressed Approve.
        expect("Approval needed", "I could not write piped.txt.")
        proc.stdin.write(b"1\nhello\n")
        proc.stdin.flush()
        expect("Nothing to choose.")
        proc.stdin.close()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (tmp_path / "piped.txt").exists()
    assert "Approval needed" not in out.decode()
    last_user = [
        [m["content"] for m in r["messages"] if m["role"] == "user"][-1]
        for r in llm_thread.requests
    ]
    assert "1" in last_user  # typed text, sent to the model like any message
