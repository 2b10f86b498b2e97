"""The real `steward` command in a subprocess, against the scripted model over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory.episodes import EpisodeStore
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM

STEWARD = str(Path(sys.executable).with_name("steward"))


@contextlib.contextmanager
def steward_run(env: dict[str, str], cwd: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`steward run` as a process, yielded with its "Steward is running: open …" line once
    it serves (JSON log lines come first); stopped with SIGINT as a person would."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    server = subprocess.Popen(
        [STEWARD, "run"],
        env={**base, **env},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        ready = next((x for x in server.stderr if x.startswith("Steward is running: open ")), "")
        assert ready, "steward run ended before it served"
        yield server, ready
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run(
    args: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    return subprocess.run(
        [STEWARD, *args],
        env={**base, **env},
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_does_not_import_litellm() -> None:
    code = "import sys, bot.cli; bot.cli._parser().format_help(); print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_help_lists_subcommands(tmp_path: Path) -> None:
    for argv in ([STEWARD, "--help"], [sys.executable, "-m", "bot", "--help"]):
        out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=True)
        for name in ("run", "chat", "rules", "memory", "replay", "doctor"):
            assert name in out.stdout


def test_chat_m_writes_file_runs_shell_and_records_episode(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    llm_thread.reply_tool("write_file", {"path": "report.md", "content": "# Report\nall good\n"})
    llm_thread.reply_tool("shell", {"command": "grep -c good report.md"})
    llm_thread.reply_text("Created report.md; it mentions 'good' once.")
    env = make_env(tmp_path, llm_thread)
    res = run(["chat", "-m", "write a report and check it"], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "Created report.md; it mentions 'good' once.\n"
    assert (tmp_path / "ws" / "report.md").read_text() == "# Report\nall good\n"
    assert "write_file" in res.stderr and "shell" in res.stderr  # tool lines on stderr
    tool_result = [m for m in llm_thread.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert tool_result["content"].startswith("exit code 0") and "1" in tool_result["content"]
    store = EpisodeStore(tmp_path / "data")
    [path] = list(store.iter_files())
    meta = store.read_front_matter(path)
    assert meta["outcome"] == "success" and meta["channel"] == "terminal"
    assert path.parent.parent.parent.parent == tmp_path / "data" / "episodes"


def test_chat_m_denies_outside_write_when_nobody_can_approve(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    llm_thread.reply_tool("shell", {"command": "echo x > ../escaped.txt"})
    llm_thread.reply_text("I could not write it.")
    res = run(["chat", "-m", "write outside"], make_env(tmp_path, llm_thread), tmp_path)
    assert not (tmp_path / "escaped.txt").exists()
    msgs = llm_thread.requests[-1]["messages"]
    told = next(m for m in msgs if m["role"] == "tool")["content"]
    assert "Not approved" in told and "one-shot" in told
    # The only tool call was denied, so the work was not done: exit 1
    # (docs/platforms/terminal.md), and the answer goes to stderr with why, not to stdout
    # as if it had worked.
    assert res.returncode == 1
    assert res.stdout == ""
    assert "I could not write it." in res.stderr
    assert "counted as failed: its tool call did not succeed" in res.stderr


@pytest.mark.parametrize(
    "calls",
    [
        [("shell", {"command": "shutdown -h now"})],  # refused by the policy
        [("read_file", {"path": "missing.md"}), ("list_files", {"path": "nowhere"})],  # errors
    ],
    ids=["refused", "errors"],
)
def test_chat_m_exits_1_when_no_tool_call_succeeded(
    llm_thread: ScriptedLLM, tmp_path: Path, calls: list[tuple[str, dict[str, str]]]
) -> None:
    for name, args in calls:
        llm_thread.reply_tool(name, args)
    llm_thread.reply_text("That did not work; nothing was done.")
    res = run(["chat", "-m", "do it"], make_env(tmp_path, llm_thread), tmp_path)
    assert res.returncode == 1, res.stderr
    assert res.stdout == ""
    assert "counted as failed" in res.stderr


def test_chat_m_recovered_from_a_failed_call_succeeds(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.md").write_text("hello\n")
    llm_thread.reply_tool("read_file", {"path": "note.md"})  # a typo: fails
    llm_thread.reply_tool("read_file", {"path": "notes.md"})
    llm_thread.reply_text("notes.md says hello.")
    res = run(["chat", "-m", "read my notes"], make_env(tmp_path, llm_thread), tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "notes.md says hello.\n"


APPROVAL_NOTE = "Nobody can answer an approval here"


def test_chat_reads_piped_stdin_as_messages(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    """`echo "list files" | steward chat`: every line answered in turn, in one conversation."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("hi\n")
    llm_thread.reply_tool("list_files", {"path": "."})
    llm_thread.reply_text("There is a.txt.")
    llm_thread.reply_text("I found one file, a.txt.")
    stdin = "list files\n\n   \nwhat did you find?\n"
    res = run(["chat"], make_env(tmp_path, llm_thread), tmp_path, stdin=stdin)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "There is a.txt.\nI found one file, a.txt.\n"
    assert res.stderr.count(APPROVAL_NOTE) == 1
    assert "list_files" in res.stderr  # tool lines on stderr, as with -m
    # Blank lines were skipped (two tasks, three model turns), and the second message
    # was answered knowing the first exchange.
    assert len(llm_thread.requests) == 3
    second = llm_thread.requests[-1]["messages"]
    assert [m["content"] for m in second if m["role"] == "user"][-1] == "what did you find?"
    assert any("There is a.txt." in str(m.get("content")) for m in second)
    assert len(list(EpisodeStore(tmp_path / "data").iter_files())) == 2


def test_piped_chat_exits_1_when_a_message_failed(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    llm_thread.reply_tool("shell", {"command": "echo x > ../escaped.txt"})
    llm_thread.reply_text("I could not write it: it needs an approval.")
    llm_thread.reply_text("Hello!")
    stdin = "write outside the workspace\nhello\n"
    res = run(["chat"], make_env(tmp_path, llm_thread), tmp_path, stdin=stdin)
    assert res.returncode == 1
    assert not (tmp_path / "escaped.txt").exists()  # denied: nobody could approve
    assert res.stdout == "Hello!\n"  # the later message was still answered
    assert "I could not write it" in res.stderr and "counted as failed" in res.stderr
    assert res.stderr.count(APPROVAL_NOTE) == 1


def test_piped_chat_commands_and_quit(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    stdin = "/help\n/quit\nnever sent\n"
    res = run(["chat"], make_env(tmp_path, llm_thread), tmp_path, stdin=stdin)
    assert res.returncode == 0, res.stderr
    assert "/cancel — stop the running task\n" in res.stdout
    assert llm_thread.requests == []  # /quit ended it before the last line


def test_chat_while_steward_run_holds_the_data_dir_says_what_to_do(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    """The Quick start offers `steward chat` next to `steward run`: with both, the
    refused chat must say how to get on (stop run, use its web chat, other data dir)."""
    env = make_env(tmp_path, llm_thread)
    with steward_run(env, tmp_path) as (server, ready):
        url = ready.split("open ", 1)[1].split()[0].split("?", 1)[0].rstrip("/")
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), url
        for args, stdin in ((["chat", "-m", "hi"], None), (["chat"], "hi\n")):
            res = run(args, env, tmp_path, stdin=stdin)
            assert res.returncode == 2, res.stderr
            err = res.stderr
            assert f"`steward run` (pid {server.pid}) is using it" in err
            assert "stop `steward run` first" in err
            assert f"web chat at {url} instead" in err  # the port it really listens on
            assert "STEWARD_DATA_DIR" in err and "Traceback" not in err
        assert llm_thread.requests == []


def test_in_use_message_depends_on_what_holds_the_data_dir(tmp_path: Path) -> None:
    from bot.app import in_use_message
    from config.settings import load_settings
    from memory.lock import DataDirLocked

    s = load_settings(env=make_env(tmp_path, None, port=8765), cwd=tmp_path)
    d = tmp_path / "data"
    unknown = in_use_message(DataDirLocked(d, 7), "chat", s)
    assert "another Steward (pid 7)" in unknown
    assert "web chat instead, by default at http://127.0.0.1:8765" in unknown
    other = in_use_message(DataDirLocked(d, 7, "replay"), "chat", s)
    assert "`steward replay` (pid 7)" in other and "web chat" not in other
    assert "STEWARD_DATA_DIR" in unknown and "STEWARD_DATA_DIR" in other
    # Commands other than chat keep the lock's own message.
    assert in_use_message(DataDirLocked(d, 7, "run"), "replay", s) == str(
        DataDirLocked(d, 7, "run")
    )


def test_chat_m_model_outage_exits_nonzero(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    for _ in range(2):
        llm_thread.reply_error(500, message="kaput")
    env = make_env(tmp_path, llm_thread, llm_retries=1)
    res = run(["chat", "-m", "hi"], env, tmp_path)
    assert res.returncode == 1
    assert res.stdout == ""
    assert "The model openai/scripted" in res.stderr and "tried 2 times" in res.stderr


def test_chat_m_without_model(tmp_path: Path) -> None:
    res = run(["chat", "-m", "hi"], make_env(tmp_path, None), tmp_path)
    assert res.returncode == 3
    assert "No model is configured" in res.stderr and "STEWARD_MODEL" in res.stderr


def test_chat_m_without_model_says_so_before_loading_the_pipeline(tmp_path: Path) -> None:
    """Exit 3 comes before litellm, the agent or any adapter is imported (it must be
    instant: bench/cli_startup.py measures it)."""
    probe = (
        "import sys\n"
        "from bot.cli import main\n"
        "try:\n"
        "    main(['chat', '-m', 'hi'])\n"
        "except SystemExit as exc:\n"
        "    heavy = ('litellm', 'bot.app', 'core.agent', 'structlog')\n"
        "    print(exc.code, [m for m in heavy if m in sys.modules])\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    res = subprocess.run(
        [sys.executable, "-c", probe],
        env={**base, **make_env(tmp_path, None)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.stdout.strip() == "3 []", res.stderr
    assert "No model is configured" in res.stderr


def test_bad_config_names_the_key(tmp_path: Path) -> None:
    res = run(
        ["chat", "-m", "hi"], {**make_env(tmp_path, None), "STEWARD_MAX_STEPS": "many"}, tmp_path
    )
    assert res.returncode == 2
    assert "`max_steps`" in res.stderr and "'many'" in res.stderr and "Traceback" not in res.stderr


def test_replay_command(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    llm_thread.reply_tool("shell", {"command": "echo hi > ../out.txt"}).reply_text(
        "Wrote the file next to the workspace."
    )
    scenario = tmp_path / "s.jsonl"
    scenario.write_text(
        json.dumps({"t": 0, "user": "alice", "text": "go"})
        + "\n"
        + json.dumps({"t": 4, "user": "alice", "press": "Approve"})
        + "\n"
    )
    res = run(["replay", str(scenario)], make_env(tmp_path, llm_thread), tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["kind"] for x in lines] == ["approval", "edit", "message"]
    assert lines[-1] == {
        **lines[-1],
        "t": 4,
        "text": "Wrote the file next to the workspace.",
        "conversation": "alice",
    }


def test_doctor(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    ok = run(["doctor"], make_env(tmp_path, llm_thread), tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "✓ model: openai/scripted" in ok.stdout
    bad = run(["doctor"], make_env(tmp_path, None), tmp_path)
    assert bad.returncode == 1
    assert "✗ model: no model configured" in bad.stdout and "fix: set STEWARD_MODEL" in bad.stdout


def test_memory_and_rules_commands(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    env = make_env(tmp_path, llm_thread)
    llm_thread.reply_text("the answer")
    assert run(["chat", "-m", "deploy the parser service"], env, tmp_path).returncode == 0
    stats = run(["memory", "stats"], env, tmp_path)
    assert "episodes: 1 success=1" in stats.stdout
    found = run(["memory", "search", "parser", "--json"], env, tmp_path)
    [hit] = json.loads(found.stdout)
    assert hit["request"] == "deploy the parser service"
    rules = run(["rules", "list"], env, tmp_path)
    assert rules.returncode == 0 and "No rules yet" in rules.stdout


def test_no_model_is_decided_without_settings_only_for_a_plain_environment() -> None:
    """`chat -m` says "no model" before pydantic is imported only when nothing else could
    be a mistake to name first (bench/cli_startup: < 300 ms)."""
    from config.providers import surely_no_model

    plain = {"STEWARD_LOCAL_MODEL": "off", "STEWARD_DATA_DIR": "d", "STEWARD_WORKSPACE": "w"}
    assert surely_no_model({**plain, "PATH": "/bin"})
    assert not surely_no_model({**plain, "STEWARD_MAX_STEPS": "many"})  # named first
    assert not surely_no_model({**plain, "STEWARD_MODEL": "openai/x"})
    assert not surely_no_model({**plain, "OPENAI_API_KEY": "sk-1"})
    assert not surely_no_model({**plain, "STEWARD_LOCAL_MODEL": "auto"})  # may be installed
    assert not surely_no_model({**plain, "STEWARD_DATA_DIR": " "})  # a config error


def _without_embedding_credentials(
    args: list[str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """`steward <args>` with a hosted embedder named and only the chat model's
    STEWARD_API_* set (no OPENAI_* in its environment at all)."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STEWARD_", "OPENAI_")) and k != "LITELLM_API_KEY"
    }
    env = {
        **base,
        **make_env(tmp_path, None),
        "STEWARD_MODEL": "openai/scripted",
        "STEWARD_API_BASE": "http://127.0.0.1:9/v1",
        "STEWARD_API_KEY": "x",
        "STEWARD_EMBEDDING_MODEL": "openai/embed-small",
    }
    return subprocess.run(
        [STEWARD, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def test_run_with_an_embedding_model_it_cannot_ask_names_the_setting(tmp_path: Path) -> None:
    """A hosted embedder without its provider's credentials (only the chat model's
    STEWARD_API_* set): `steward run` stops with one line naming the setting and the
    variables it reads, exit 2, no traceback."""
    res = _without_embedding_credentials(["run"], tmp_path)
    assert res.returncode == 2, res.stderr
    [line] = [x for x in res.stderr.splitlines() if x.startswith("steward: ")]
    assert line.startswith("steward: STEWARD_EMBEDDING_MODEL=openai/embed-small: ")
    assert "OPENAI_API_KEY" in line and "STEWARD_API_KEY" in line
    assert "Traceback" not in res.stderr


def test_memory_search_with_an_embedding_model_it_cannot_ask_names_the_setting(
    tmp_path: Path,
) -> None:
    """`steward memory` opens the index with the same embedder, asked the same way."""
    res = _without_embedding_credentials(["memory", "search", "deploy"], tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("steward: STEWARD_EMBEDDING_MODEL=openai/embed-small: ")
    assert "Traceback" not in res.stderr
