"""One record of what a tool call did: the guardian's effects, kept on the tool log,
read by the answer gates.

The guardian parses each call once (shell through bashlex, file tools from their
arguments) and says what it reads, writes, deletes, fetches and runs; the gates
check claims against that record instead of re-reading the command text.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.gates import check_answer
from core.guardian import Guardian
from memory.effects import Effects
from memory.episodes import Episode, ToolRecord
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import episodes, replay


@pytest.fixture
def guardian(tmp_path: Path) -> Guardian:
    (tmp_path / "ws").mkdir()
    return Guardian(tmp_path / "ws")


def _cmds(*lines: str) -> tuple[tuple[str, ...], ...]:
    """Commands as `Effects.runs` keeps them: each one's words."""
    return tuple(tuple(shlex.split(line)) for line in lines)


def effects(guardian: Guardian, command: str) -> Effects:
    return guardian.check_sync("shell", {"command": command}).effects


# ── what the guardian says a shell command does ────────────────────────────────


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("cp a.md b.md", Effects(reads=("a.md",), writes=("b.md",), runs=_cmds("cp a.md b.md"))),
        ("cp -t out a b", Effects(reads=("a", "b"), writes=("out",), runs=_cmds("cp -t out a b"))),
        (
            "mv a.txt b.txt",
            Effects(writes=("b.txt",), deletes=("a.txt",), runs=_cmds("mv a.txt b.txt")),
        ),
        ("rm -r build/", Effects(deletes=("build",), runs=_cmds("rm -r build/"))),
        ("rmdir empty", Effects(deletes=("empty",), runs=_cmds("rmdir empty"))),
        ("git rm old.py", Effects(deletes=("old.py",), runs=_cmds("git rm old.py"))),
        (
            "curl -sSL https://example.com/a.tgz -o a.tgz",
            Effects(
                writes=("a.tgz",),
                fetches=("https://example.com/a.tgz",),
                runs=_cmds("curl -sSL https://example.com/a.tgz -o a.tgz"),  # as written
            ),
        ),
        (
            "wget https://example.com/x.tgz",
            Effects(
                writes=("x.tgz",),
                fetches=("https://example.com/x.tgz",),
                runs=_cmds("wget https://example.com/x.tgz"),
            ),
        ),
        (
            "cat in.txt | grep -v x | sort > out.txt",
            Effects(
                reads=("in.txt",),
                writes=("out.txt",),
                runs=_cmds("cat in.txt", "grep -v x", "sort"),
            ),
        ),
        (
            "echo dist | tee -a .gitignore",
            Effects(writes=(".gitignore",), runs=_cmds("echo dist", "tee -a .gitignore")),
        ),
        ("sed -i 's/a/b/' c.toml", Effects(writes=("c.toml",), runs=_cmds("sed -i s/a/b/ c.toml"))),
        (
            "cd sub && echo hi > n.md",
            Effects(writes=("sub/n.md",), runs=_cmds("cd sub", "echo hi")),
        ),
        (  # the makefile it reads: none exists here, so any of the names make tries
            "make 2>&1 > /dev/null",
            Effects(reads=("GNUmakefile", "makefile", "Makefile"), runs=_cmds("make")),
        ),
        ("bash deploy.sh", Effects(reads=("deploy.sh",), runs=_cmds("bash deploy.sh"))),
        ("./run.sh x", Effects(reads=("run.sh",), runs=_cmds("./run.sh x"))),
        ("python build.py", Effects(reads=("build.py",), runs=_cmds("python build.py"))),
        (
            "pip install -r requirements.txt -c constraints.txt",
            Effects(
                reads=("requirements.txt", "constraints.txt"),
                runs=_cmds("pip install -r requirements.txt -c constraints.txt"),
            ),
        ),
        (
            "npm ci",
            Effects(
                reads=("package.json", "package-lock.json", "npm-shrinkwrap.json"),
                runs=_cmds("npm ci"),
            ),
        ),
        ("sort < in.txt", Effects(reads=("in.txt",), runs=_cmds("sort"))),
        (
            "timeout 60 python -m pytest -q",
            Effects(
                runs=_cmds("timeout 60 python -m pytest -q", "python -m pytest -q", "pytest -q")
            ),
        ),
        ("sh -c 'npm test'", Effects(runs=_cmds("sh -c 'npm test'", "npm test"))),
    ],
)
def test_shell_effects(guardian: Guardian, command: str, expected: Effects) -> None:
    assert effects(guardian, command) == expected


def test_paths_outside_the_workspace_are_absolute(guardian: Guardian) -> None:
    got = effects(guardian, "cp notes.md /tmp/elsewhere/n.md")
    assert got.reads == ("notes.md",) and got.writes == ("/tmp/elsewhere/n.md",)


def test_effects_come_with_every_verdict(guardian: Guardian) -> None:
    """An approval or a refusal still says what the call would have done."""
    asked = guardian.check_sync("shell", {"command": "rm -f $OUT"})
    assert asked.verdict == "approval" and asked.effects.deletes == ("$OUT",)
    refused = guardian.check_sync("shell", {"command": "rm -rf ~"})
    assert refused.verdict == "forbid" and refused.effects.runs == (
        ("rm", "-rf", str(Path.home())),
    )


def test_unparseable_text_has_no_effects(guardian: Guardian) -> None:
    decision = guardian.check_sync("shell", {"command": "echo $(("})
    assert decision.verdict == "forbid" and decision.effects == Effects()


def test_file_tools_and_fetch(guardian: Guardian) -> None:
    write = guardian.check_sync("write_file", {"content": "x" * 900, "path": "./docs/n.md"})
    assert write.effects == Effects(writes=("docs/n.md",))
    assert guardian.check_sync("read_file", {"path": "a.md"}).effects == Effects(reads=("a.md",))
    fetch = guardian.check_sync("web_fetch", {"url": "https://example.com/x"})
    assert fetch.effects == Effects(fetches=("https://example.com/x",))


# ── the effects feeding the gates ───────────────────────────────────────────────


def _shell(guardian: Guardian, command: str, ok: bool = True) -> ToolRecord:
    args: dict[str, Any] = {"command": command}
    found = effects(guardian, command)
    return ToolRecord("shell", ok=ok, args=args, effects=found, error="" if ok else "Error: no")


@pytest.mark.parametrize(
    ("answer", "command", "supported"),
    [
        ("I copied a.md to b.md.", "cp a.md b.md", True),
        ("I wrote b.md.", "cp a.md b.md", True),
        ("I wrote a.md.", "cp a.md b.md", False),  # the source was only read
        ("I renamed old.txt to new.txt.", "mv old.txt new.txt", True),
        ("I deleted build/.", "rm -r build/", True),
        ("I deleted `x/`.", "rm -r x", True),
        ("I deleted `x/`.", "rm -r y", False),
        ("I deleted old.py.", "git rm old.py", True),
        ("I downloaded https://example.com/a.tgz.", "curl https://example.com/a.tgz -o f", True),
        ("I saved it to f.", "curl https://example.com/a.tgz -o f", True),
        ("I fetched https://other.org/.", "curl https://example.com/a.tgz -o f", False),
        ("I saved the sorted list to out.txt.", "cat in.txt | sort > out.txt", True),
        ("I created in.txt.", "cat in.txt | sort > out.txt", False),
        ("I wrote notes.md.", "echo '# notes' > docs/notes.md", True),
        ("I wrote notes.md.", "grep notes.md index.txt", False),  # named, not written
        ("I deleted old.log.", "echo rm old.log", False),  # printed, not run
        ("All tests pass.", "cd app && python -m pytest -q", True),
        ("All tests pass.", "cat pytest.ini", False),  # mentions pytest, runs no tests
        ("I committed the change.", "git add -A && git commit -m x", True),
        ("I committed the change.", "echo git commit", False),
        # Outside the workspace the effects keep the path absolute; the answer says it
        # as the command did.
        ("Wrote ../first.txt as asked.", "echo a > ../first.txt", True),
        ("Wrote ../first.txt as asked.", "echo a > ../second.txt", False),
    ],
)
def test_gates_read_shell_effects(
    guardian: Guardian, answer: str, command: str, supported: bool
) -> None:
    result = check_answer(answer, [_shell(guardian, command)])
    assert result.ok() is supported, result.problems


def test_a_failed_call_backs_nothing(guardian: Guardian) -> None:
    result = check_answer("I wrote out.txt.", [_shell(guardian, "ls > out.txt", ok=False)])
    assert result.gate == "evidence"


# ── the tool log keeps it whole; the episode file cuts it ───────────────────────


def test_episode_file_cuts_arguments_and_summarises_effects() -> None:
    record = ToolRecord(
        "write_file",
        ok=True,
        args={"content": "x" * 900, "path": "notes.md"},
        effects=Effects(writes=("notes.md",)),
    )
    assert len(record.args["content"]) == 900  # the log itself is whole
    kept = record.front_matter()
    assert len(kept["arguments"]) == 500 and kept["arguments"].startswith('{"content": "xxx')
    assert kept["effects"] == {"writes": ["notes.md"]}
    many = Effects(runs=tuple(("echo", str(i), "y" * 300) for i in range(30)))
    summary = many.summary()
    assert len(summary["runs"]) == 20 and all(len(r) == 200 for r in summary["runs"])
    assert "effects" not in ToolRecord("list_files", ok=True).front_matter()


def test_effects_survive_plain_data() -> None:
    """A tool record rebuilt from `asdict` (a journal) or an episode's summary keeps its
    effects typed, so the gates can read it."""
    from dataclasses import asdict

    record = ToolRecord(
        "shell",
        ok=True,
        args={"command": "cp a b"},
        effects=Effects(reads=("a",), writes=("b",), runs=(("cp", "a", "b"),)),
    )
    again = ToolRecord(**asdict(record))
    assert again.effects == record.effects
    assert Effects.from_data(record.front_matter()["effects"]) == record.effects
    assert Effects.from_data(None) == Effects()


def test_unparsed_arguments_are_kept_as_sent() -> None:
    record = ToolRecord("shell", ok=False, raw_arguments="{not json")
    assert record.arguments == "{not json" and record.args == {}


async def test_long_content_before_path_passes_the_gate_end_to_end(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The confirmed false alarm, through the real loop: it was "unsupported claim"."""
    s = settings_for(llm)
    llm.reply_tool("write_file", {"content": "line\n" * 300, "path": "notes.md"})
    llm.reply_text("I wrote notes.md.")
    out = await replay(s, [{"t": 0, "user": "alice", "text": "write the notes"}])
    assert out[-1]["text"] == "I wrote notes.md."
    assert (s.workspace / "notes.md").read_text() == "line\n" * 300
    [ep] = episodes(s)
    assert ep["outcome"] == "success" and ep["gates"] == []
    [tool] = ep["tools"]
    assert tool["effects"] == {"writes": ["notes.md"]}
    assert len(tool["arguments"]) == 500


def test_episode_markdown_lists_the_call() -> None:
    from datetime import UTC, datetime

    ep = Episode("e1", datetime.now(UTC), "web", "c", "u", "r", "success")
    ep.tools = [ToolRecord("shell", ok=True, args={"command": "ls -la"})]
    assert '- `shell` {"command": "ls -la"} — ok' in ep.to_markdown()
