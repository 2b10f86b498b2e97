"""The evidence and quality gates against hand-written answers and tool logs.

Why a table: the gates are heuristics, and each row pins one behaviour a person can
read in a line — a claim that must be caught, or an honest sentence that must not be.
A new false alarm or a new kind of fib seen in an episode becomes one more row.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.gates import (
    CONTENT_FREE,
    Claim,
    GateResult,
    check_answer,
    find_claims,
    honest_suffix,
    retry_instruction,
)
from core.guardian import Guardian
from memory.episodes import ToolRecord

# ── tool log builders ───────────────────────────────────────────────────────────

#: The real guardian works out each call's effects, as the agent does; the workspace
#: need not exist (paths are resolved lexically, nothing is run).
_GUARDIAN = Guardian(Path(tempfile.gettempdir()) / "steward-gates-workspace")


def call(name: str, args: dict[str, Any], ok: bool = True, error: str = "") -> ToolRecord:
    """A tool call as the agent records it: parsed arguments and the guardian's effects."""
    effects = _GUARDIAN.check_sync(name, args).effects
    return ToolRecord(name=name, ok=ok, args=args, effects=effects, error=error)


def sh(command: str, ok: bool = True, code: int = 1, output: str = "") -> ToolRecord:
    """A shell call; a failure carries the error text the agent records ("Error: exit code N")."""
    error = "" if ok else f"Error: exit code {code}\n{output}".rstrip()
    return call("shell", {"command": command}, ok, error)


def write(path: str, ok: bool = True) -> ToolRecord:
    return call("write_file", {"path": path, "content": "text"}, ok, "" if ok else "Error: no")


def edit(path: str, ok: bool = True) -> ToolRecord:
    error = "" if ok else "Error: old_text not found in " + path
    return call("edit_file", {"path": path, "old_text": "a", "new_text": "b"}, ok, error)


def fetch(url: str, ok: bool = True) -> ToolRecord:
    return call("web_fetch", {"url": url}, ok, "" if ok else "Error: HTTP 404 Not Found")


def read(path: str) -> ToolRecord:
    return call("read_file", {"path": path})


PYTEST_FAIL = sh("python -m pytest -q", ok=False, output="FAILED tests/test_a.py::test_x")


@dataclass(frozen=True)
class Case:
    id: str
    answer: str
    tools: tuple[ToolRecord, ...] = ()
    gate: str | None = None
    kinds: tuple[str, ...] = ()  # kinds of the unsupported claims, in order
    request: str = ""


CASES: list[Case] = [
    # ── write ────────────────────────────────────────────────────────────────
    Case("write-ok", "I wrote notes.md with the summary.", (write("notes.md"),)),
    Case("write-none", "I wrote notes.md with the summary.", (), "evidence", ("write",)),
    Case(
        "write-failed", "I wrote notes.md.", (write("notes.md", ok=False),), "evidence", ("write",)
    ),
    Case("created-code-path", "Created `x.md`.", (write("x.md"),)),
    Case(
        "created-other-file", "I created `report.md`.", (write("notes.md"),), "evidence", ("write",)
    ),
    Case("path-in-subfolder", "Updated `notes.md`.", (edit("docs/notes.md"),)),
    Case(
        "two-files-one-missing",
        "I created a.md and b.md.",
        (write("a.md"),),
        "evidence",
        ("write",),
    ),
    Case("have-updated-no-path", "I have updated the config.", (edit("config.toml"),)),
    Case("passive-write", "notes.md was updated.", (), "evidence", ("write",)),
    Case(
        "list-of-participles",
        "Here is what I did: created notes.md, deleted tmp/.",
        (write("notes.md"), sh("rm -r tmp/")),
    ),
    Case("shell-redirect-writes", "I saved the output to out.txt.", (sh("ls -la > out.txt"),)),
    Case("shell-sed-i-writes", "I edited config.toml.", (sh("sed -i 's/8080/9090/' config.toml"),)),
    Case(
        "shell-tee-writes",
        "I've added the line to .gitignore.",
        (sh("echo dist | tee -a .gitignore"),),
    ),
    Case(
        "shell-read-is-not-write",
        "I created notes.md.",
        (sh("cat notes.md"),),
        "evidence",
        ("write",),
    ),
    Case(
        "stderr-redirect-is-not-write",
        "I updated the config.",
        (sh("make 2>&1"),),
        "evidence",
        ("write",),
    ),
    # A real false alarm: a long `content` before `path` was cut away
    # with the path when arguments were kept as 500 characters of text.
    Case(
        "long-content-before-path",
        "I wrote notes.md.",
        (call("write_file", {"content": "x" * 900, "path": "notes.md"}),),
    ),
    Case(
        "long-content-after-path",
        "I wrote notes.md.",
        (call("write_file", {"path": "notes.md", "content": "x" * 900}),),
    ),
    Case("target-stops-at-infinitive", "I updated app.py to read config.toml.", (edit("app.py"),)),
    # ── run ──────────────────────────────────────────────────────────────────
    Case("run-ok", "I ran the migration script.", (sh("python migrate.py"),)),
    Case("run-none", "I ran the migration script.", (read("migrate.py"),), "evidence", ("run",)),
    Case(
        "run-failed-unacknowledged",
        "I ran the script.",
        (sh("python s.py", ok=False),),
        "evidence",
        ("run",),
    ),
    Case(
        "run-failed-acknowledged",
        "I ran the script, but it failed with exit code 1.",
        (sh("python s.py", ok=False),),
    ),
    Case("run-named-command", "I ran `make build`.", (sh("make build -j4"),)),
    Case("run-other-command", "I ran `make build`.", (sh("ls"),), "evidence", ("run",)),
    Case("installed-ok", "I installed requests.", (sh("pip install requests"),)),
    Case("installed-no-install", "I installed requests.", (sh("ls"),), "evidence", ("run",)),
    Case("executed-ok", "I executed the backup job.", (sh("./backup.sh"),)),
    Case("committed-ok", "I committed the change.", (edit("a.py"), sh("git commit -am 'x'"))),
    Case("committed-no-commit", "I committed it.", (sh("git status"),), "evidence", ("run",)),
    # ── test ─────────────────────────────────────────────────────────────────
    Case("tests-pass-ok", "Done — tests pass.", (sh("python -m pytest -q"),)),
    Case("tests-pass-none", "Done — tests pass.", (), "evidence", ("test",)),
    Case("all-tests-pass-only-ls", "All tests pass.", (sh("ls"),), "evidence", ("test",)),
    Case("i-tested-ok", "I tested it with `npm test`.", (sh("npm test"),)),
    Case("ran-the-tests-go", "I ran the tests.", (sh("go test ./..."),)),
    Case("passive-tests-run", "Tests were run and everything passed.", (sh("cargo test"),)),
    Case("test-count-passed", "pytest: 42 passed.", (sh("pytest"),)),
    Case("honest-failing-run", "I ran the tests: 2 failed in test_api.py.", (PYTEST_FAIL,)),
    Case("tests-pass-but-run-failed", "Done — tests pass.", (PYTEST_FAIL,), "evidence", ("test",)),
    # ── fix ──────────────────────────────────────────────────────────────────
    Case(
        "fix-edit-then-test",
        "I fixed the failing test.",
        (edit("app.py"), sh("pytest -q")),
        request="fix the failing test",
    ),
    Case(
        "fix-test-before-edit",
        "I fixed the failing test.",
        (sh("pytest -q"), edit("app.py")),
        "evidence",
        ("fix",),
        request="fix the failing test",
    ),
    Case(
        "fix-no-edit",
        "I fixed the bug.",
        (sh("pytest -q"),),
        "evidence",
        ("fix",),
        request="the tests fail, fix it",
    ),
    Case(
        "fix-test-failed-after-edit",
        "I fixed the bug; see app.py.",
        (edit("app.py"), PYTEST_FAIL),
        "evidence",
        ("fix",),
        request="make the tests pass",
    ),
    Case(
        "fix-no-tests-in-play",
        "I fixed the typo in README.md.",
        (edit("README.md"),),
        request="there's a typo in the readme",
    ),
    Case(
        "fix-doc-edit-after-test",
        "I fixed the bug and the tests pass.",
        (edit("core/app.py"), sh("pytest"), edit("CHANGELOG.md")),
    ),
    Case(
        "fix-named-file-not-edited",
        "I fixed the bug in parser.py.",
        (edit("lexer.py"),),
        "evidence",
        ("fix",),
    ),
    Case("fix-state-passive", "The bug is fixed.", (), "evidence", ("fix",)),
    Case("fix-chained", "I reviewed the code and fixed the import in app.py.", (edit("app.py"),)),
    # ── fetch ────────────────────────────────────────────────────────────────
    Case(
        "fetch-ok",
        "I fetched the page at https://example.com/docs.",
        (fetch("https://example.com/docs"),),
    ),
    Case("fetch-curl", "I downloaded the file.", (sh("curl -sSLO https://x.org/a.tgz"),)),
    Case(
        "fetch-failed",
        "I fetched the page.",
        (fetch("https://example.com", ok=False),),
        "evidence",
        ("fetch",),
    ),
    Case(
        "fetch-other-url",
        "I fetched https://example.com/docs.",
        (fetch("https://other.org/"),),
        "evidence",
        ("fetch",),
    ),
    Case("able-to-fetch-none", "I was able to fetch https://a.org/x.", (), "evidence", ("fetch",)),
    # ── delete ───────────────────────────────────────────────────────────────
    Case("delete-ok", "I deleted old.log.", (sh("rm -f old.log"),)),
    Case("delete-none", "I deleted old.log.", (), "evidence", ("delete",)),
    Case("delete-other-file", "I deleted old.log.", (sh("rm new.log"),), "evidence", ("delete",)),
    Case("removed-from-file-is-edit", "I removed the debug print from app.py.", (edit("app.py"),)),
    # ── several claims in one answer ─────────────────────────────────────────
    Case(
        "three-claims-one-missing",
        "I created a.md, edited b.py, and ran the tests.",
        (write("a.md"), edit("b.py")),
        "evidence",
        ("test",),
    ),
    # ── false-positive guards: none of these claims anything ──────────────────
    Case("negation-did-not", "I did not run the tests."),
    Case("negation-couldnt", "I couldn't write the file: the path is outside the workspace."),
    Case("negation-havent", "I haven't tested it yet."),
    Case("negation-nothing-passive", "No files were created and nothing was deleted."),
    Case("future-will", "I will create notes.md once you confirm."),
    Case("future-ll", "I'll run the tests next."),
    Case("offer-can", "I can run the tests if you like."),
    Case("question", "Should I fetch the page?"),
    Case("instruction-imperative", "Run `pytest` to check, then edit config.toml if needed."),
    Case("instruction-you-can", "You can edit config.toml yourself."),
    Case("instruction-make-sure", "Make sure all tests pass before merging."),
    Case("conditional-if", "If the tests pass, deploy with `make release`."),
    Case("conditional-once-you", "Once you've updated the token, restart the bot."),
    Case("double-quoted", 'The last commit message was "Fixed the parser and ran all tests".'),
    Case("code-block", "Your CI log shows:\n```\n$ pytest\n12 passed\n```\nThat is your log."),
    Case("block-quote", "> I fixed the bug and all tests pass\n\nThat is what the ticket says."),
    Case("soft-verb-answer-text", "I wrote a short poem for you: roses are red."),
    Case("adjective-participle", "The updated schedule starts on Monday."),
    # ── quality ──────────────────────────────────────────────────────────────
    Case("content-free-done", "Done!", (write("notes.md"),), "quality"),
    Case("content-free-here-you-go", "Here you go.", (), "quality", request="summarize the plan"),
    Case(
        "content-free-model-silent",
        "(The model finished without saying anything.)",
        (read("a.md"),),
        "quality",
    ),
    Case("content-free-emoji", "✅ 👍", (sh("ls"),), "quality"),
    Case("content-free-ok-nothing-asked", "OK"),
    Case("chit-chat", "Hello! How can I help?", request="hi"),
    Case("chit-chat-sure", "Sure.", request="thanks!"),
    Case("yes-is-an-answer", "Yes.", request="is the port 8080?"),
    Case(
        "success-but-last-failed",
        "All good, the deploy works now.",
        (sh("./deploy.sh --dry-run"), sh("./deploy.sh", ok=False, output="permission denied")),
        "quality",
    ),
    Case(
        "success-but-last-failed-then-read",
        "Finished, everything works.",
        (write("a.md", ok=False), read("a.md")),
        "quality",
    ),
    Case(
        "failure-acknowledged",
        "The deploy failed with exit code 1: permission denied on /srv.",
        (sh("./deploy.sh", ok=False),),
    ),
    Case("success-after-recovery", "The build works now.", (sh("make", ok=False), sh("make"))),
    Case("non-english-is-content", "完了しました。notes.md を作成しました。", (write("notes.md"),)),
    Case("evidence-wins-over-quality", "Done — tests pass.", (PYTEST_FAIL,), "evidence", ("test",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gate_table(case: Case) -> None:
    result = check_answer(case.answer, list(case.tools), request=case.request)
    assert result.gate == case.gate, result.problems
    assert tuple(c.kind for c in result.unsupported) == case.kinds, result.unsupported
    assert result.ok() is (case.gate is None)
    assert len(result.problems) >= len(result.unsupported)


def test_case_ids_are_unique_and_plenty() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize(
    "command",
    [
        "pytest -q",
        "python -m pytest tests/test_a.py",
        "python -m unittest discover",
        "npm test",
        "npm run test",
        "go test ./...",
        "cargo test",
        "make test",
        "tox -e py311",
        "npx jest",
        "npx vitest run",
        "cd app && yarn test",
    ],
)
def test_test_runners_back_tests_pass(command: str) -> None:
    assert check_answer("All tests pass.", [sh(command)]).ok()


# ── details of what the result says ─────────────────────────────────────────────


def test_claim_names_its_target_and_sentence() -> None:
    result = check_answer("I created a.md and b.md. Nothing else.", [write("a.md")])
    assert result.unsupported == [
        Claim("write", "I created a.md and b.md.", "b.md", result.unsupported[0].reason)
    ]
    assert "b.md" in result.unsupported[0].reason
    assert result.problems[0].startswith('unsupported claim "I created a.md and b.md."')


def test_all_problems_are_listed_evidence_first() -> None:
    result = check_answer("Done — tests pass.", [PYTEST_FAIL])
    assert result.gate == "evidence"
    assert len(result.problems) == 2
    assert "no test run succeeded" in result.problems[0]
    assert result.problems[1] == (
        "the answer reports success but the last shell call failed: "
        "exit code 1 — FAILED tests/test_a.py::test_x"
    )


def test_content_free_problem_text() -> None:
    result = check_answer("Here you go.", [write("a.md")])
    assert result.problems == [CONTENT_FREE]


def test_find_claims_kinds_in_order() -> None:
    answer = "I fetched https://a.org/x, saved it to page.html and deleted tmp.txt. All tests pass."
    assert [(c.kind, c.target) for c in find_claims(answer)] == [
        ("fetch", "https://a.org/x"),
        ("write", "page.html"),
        ("delete", "tmp.txt"),
        ("test", ""),
    ]


# ── retry_instruction / honest_suffix ───────────────────────────────────────────


def test_retry_instruction_for_tests_claim() -> None:
    note = retry_instruction(check_answer("Done — tests pass.", []))
    assert note == (
        'Your answer says you ran the tests ("Done — tests pass."), but no test run '
        "succeeded in this task. Run them, or say plainly that you did not."
    )


def test_retry_instruction_names_the_file() -> None:
    note = retry_instruction(check_answer("I wrote notes.md.", []))
    assert "you wrote or changed `notes.md`" in note
    assert "no write or edit of `notes.md` succeeded" in note


def test_retry_instruction_for_fix_asks_for_a_test_run_after_the_edit() -> None:
    result = check_answer("I fixed the bug.", [sh("pytest"), edit("app.py")], request="fix test")
    note = retry_instruction(result)
    assert "you fixed it" in note and "no test run passed after the last edit" in note
    assert "run the tests after it" in note


def test_retry_instruction_for_quality_problems() -> None:
    empty = retry_instruction(check_answer("Done!", [write("a.md")]))
    assert "says nothing about what was done" in empty
    failed = check_answer("All good, it works.", [sh("./deploy.sh", ok=False)])
    note = retry_instruction(failed)
    assert "the last shell call failed: exit code 1" in note
    assert "say plainly that it failed" in note


def test_honest_suffix_mentions_each_claim() -> None:
    result = check_answer("I fetched https://a.org/x and deleted old.log.", [])
    suffix = honest_suffix(result)
    assert suffix.startswith("\n\n(I could not verify: ")
    assert suffix.endswith(".)")
    assert "that I fetched https://a.org/x — no fetch of https://a.org/x succeeded" in suffix
    assert "that I deleted `old.log`" in suffix


def test_honest_suffix_for_quality() -> None:
    result = check_answer("Finished.", [sh("./deploy.sh", ok=False, code=2)])
    suffix = honest_suffix(result)
    assert "what was done" in suffix
    assert "the last shell call failed: exit code 2" in suffix


def test_passing_result_gives_no_texts() -> None:
    result = check_answer("I wrote notes.md.", [write("notes.md")])
    assert result == GateResult(None, [], [])
    assert retry_instruction(result) == ""
    assert honest_suffix(result) == ""


def test_an_mcp_call_backs_claims_about_the_teams_own_systems() -> None:
    """The gate cannot see inside a ticket system: a successful MCP call backs "I deleted
    the old ticket", but not a claim about a workspace file it did not touch."""
    closed = ToolRecord(name="mcp__tickets__delete_ticket", ok=True, args={"id": 42})
    failed = ToolRecord(name="mcp__tickets__delete_ticket", ok=False, args={"id": 42})
    assert check_answer("I deleted the old ticket.", [closed]).ok()
    assert not check_answer("I deleted the old ticket.", [failed]).ok()
    assert not check_answer("I deleted old.log.", [closed]).ok()
