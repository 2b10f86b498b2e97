"""The policy as data: config/policy.toml, a deployment's overlay, always-allow rules, the CLI.

What must hold (safety is fail-closed): a policy that cannot be loaded
refuses everything with a reason naming the file, the key and the fix; an overlay can
tighten anything, can relax approval → allow only through its allow lists or exact
always-allow rules, and can never allow a forbidden call.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bot.cli.policy import run_check
from bot.commands.policy import describe
from core.guardian import Guardian, Verdict
from core.policy import (
    AlwaysAllowRule,
    CredentialSpec,
    OptionRisks,
    PolicyDoc,
    PolicyError,
    SubcommandSpec,
    builtin_path,
    overlay_text_with_rule,
    overlay_text_without_rule,
    parse_text,
    read_document,
    render_document,
    render_rule,
    toml_str,
)

A, P, F = Verdict.ALLOW, Verdict.APPROVAL, Verdict.FORBID
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "data").mkdir()
    return ws


@pytest.fixture
def overlay(tmp_path: Path) -> Path:
    return tmp_path / "data" / "policy.toml"


def guardian_with(ws: Path, overlay: Path, text: str | None = None) -> Guardian:
    if text is not None:
        overlay.write_text(text, encoding="utf-8")
    return Guardian(ws, overlay_path=overlay)


def verdict(g: Guardian, command: str) -> Verdict:
    return g.check_sync("shell", {"command": command}).verdict


# ── the built-in policy file ───────────────────────────────────────────────────────


def test_builtin_policy_has_every_section() -> None:
    path = builtin_path()
    assert path.name == "policy.toml" and path.parent.name == "config"
    doc = read_document(path, overlay=False)
    assert doc.max_delete_files == 20
    assert {"ls", "cat", "grep", "pytest"} <= set(doc.allow)
    assert {"cp", "mv", "tee"} <= set(doc.workspace_writers)
    assert doc.approval["ssh"] == "connects to a remote host"
    assert doc.forbid["mkfs.*"] == "formats a filesystem"
    assert "/etc" in doc.protected_dirs and "LD_PRELOAD" in doc.risky_env_vars
    assert ".env" in doc.env_files
    assert any(c.path == ".ssh" for c in doc.credentials)
    assert {"git", "pip", "npm", "cargo"} <= {p for k in doc.subcommands for p in k.split()}
    assert doc.always_allow == []


def test_every_section_of_the_builtin_file_is_explained() -> None:
    text = builtin_path().read_text(encoding="utf-8")
    for marker in (
        "max_delete_files =",
        "[allow]",
        "[approval]",
        "[forbid]",
        "[protected]",
        "[environment]",
        "[env_files]",
        "[[credentials]]",
        "[subcommands.git]",
    ):
        before = text[: text.index(marker)].rstrip().splitlines()
        assert before[-1].lstrip().startswith("#"), f"{marker} has no comment above it"
    assert "can never turn a forbidden call into an allowed one" in text


# ── a policy that cannot be loaded refuses everything ──────────────────────────────

MALFORMED = [
    ("[allow\ncommands = []", "not valid TOML", "Fix the line"),
    ("[alow]\ncommands = ['docker']", "`alow`: unknown key", "Did you mean `allow`?"),
    ("[approval]\ndocker = 3", "`approval.docker`: the reason must be one line", "Write it as"),
    ("[allow]\ncommands = 'docker'", "`allow.commands`: must be a list", 'commands = ["name"'),
    ("max_delete_files = -1", "`max_delete_files`: must be a whole number", "max_delete_files ="),
    ("[[credentials]]\nregex = '(['\nwhat = 'x'", "`credentials[1].regex`: not a valid", "Fix"),
    ("[[credentials]]\nwhat = 'x'", "`credentials[1]`: needs exactly one of", "path ="),
    ("[[always_allow]]\ntool = 'rm'\nmatch = 'x'", "`always_allow[1].tool`", "Use one of"),
]


@pytest.mark.parametrize(("text", "problem", "fix"), MALFORMED, ids=[m[1] for m in MALFORMED])
def test_a_malformed_overlay_forbids_everything_with_a_clear_reason(
    ws: Path, overlay: Path, text: str, problem: str, fix: str
) -> None:
    g = guardian_with(ws, overlay, text)
    for tool, args in (("shell", {"command": "ls"}), ("read_file", {"path": "notes.md"})):
        decision = g.check_sync(tool, args)
        assert decision.verdict == F
        assert decision.reason.startswith("the guardian's policy could not be loaded")
        assert str(overlay) in decision.reason and problem in decision.reason
        assert fix in decision.reason
    assert describe(g.overlay_view()).startswith("Policy error:")
    with pytest.raises(ValueError, match="could not be loaded"):
        g.always_allow("shell", {"command": "docker ps"}, added_by="u1")


def test_a_malformed_or_missing_builtin_policy_forbids_everything(ws: Path, tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text(builtin_path().read_text() + "\n[[always_allow]]\ntool='shell'\nmatch='ls'\n")
    decision = Guardian(ws, policy_path=bad).check_sync("shell", {"command": "ls"})
    assert decision.verdict == F
    assert "always-allow rules belong in a deployment's overlay" in decision.reason
    missing = Guardian(ws, policy_path=tmp_path / "nope.toml").check_sync(
        "shell", {"command": "ls"}
    )
    assert missing.verdict == F and "does not exist" in missing.reason


async def test_the_async_check_also_forbids_on_a_policy_error(ws: Path, overlay: Path) -> None:
    g = guardian_with(ws, overlay, "[allow]\ncommands = 'docker'")
    assert (await g.check("shell", {"command": "ls"})).verdict == F


def test_an_edited_overlay_applies_to_the_next_call(ws: Path, overlay: Path) -> None:
    g = guardian_with(ws, overlay)
    assert verdict(g, "docker ps") == P
    overlay.write_text("[allow]\ncommands = ['docker']\n")
    assert verdict(g, "docker ps") == A
    overlay.write_text("[allow\n")
    assert verdict(g, "docker ps") == F
    overlay.unlink()
    assert verdict(g, "docker ps") == P


# ── what an overlay may add ─────────────────────────────────────────────────────────


def test_overlay_allowlist_turns_approval_into_allow(ws: Path, overlay: Path) -> None:
    assert verdict(guardian_with(ws, overlay), "docker ps") == P
    assert verdict(guardian_with(ws, overlay), "ssh host uptime") == P
    g = guardian_with(ws, overlay, "[allow]\ncommands = ['docker', 'ssh']\n")
    assert verdict(g, "docker ps") == A
    assert verdict(g, "ssh host uptime") == A
    # Arguments are still judged: credentials stay forbidden, outside writes still ask.
    assert verdict(g, "docker cp ~/.ssh/id_rsa c:/") == F
    assert verdict(g, "docker ps > /etc/x") == P


def test_overlay_adds_forbidden_and_approval_commands(ws: Path, overlay: Path) -> None:
    g = guardian_with(
        ws,
        overlay,
        '[forbid]\nterraform = "changes cloud infrastructure"\n'
        '[approval]\nmake = "runs the deploy Makefile"\n',
    )
    decision = g.check_sync("shell", {"command": "terraform apply"})
    assert decision == type(decision)(F, "`terraform apply` changes cloud infrastructure")
    assert verdict(g, "sudo terraform destroy") == F
    assert verdict(g, "bash -c 'ls && terraform plan'") == F
    assert g.check_sync("shell", {"command": "make deploy"}).reason == (
        "`make deploy` runs the deploy Makefile"
    )


def test_overlay_tightening_beats_its_own_allow_entry(ws: Path, overlay: Path) -> None:
    g = guardian_with(
        ws, overlay, "[allow]\ncommands = ['docker']\n[approval]\ndocker = 'runs containers'\n"
    )
    assert verdict(g, "docker ps") == P


def test_overlay_credentials_protected_dirs_and_subcommands(ws: Path, overlay: Path) -> None:
    g = guardian_with(
        ws,
        overlay,
        "[[credentials]]\npath = 'secrets/prod.key'\nwhat = 'the production key'\n"
        "[protected]\ndirs = ['/srv/data']\n"
        "[subcommands.npm]\nallow = ['install']\n"
        "[subcommands.git.approval]\ncommit = 'records history'\n"
        "[subcommands.git.forbid]\npush = 'pushes to the shared remote'\n",
    )
    decision = g.check_sync("read_file", {"path": "secrets/prod.key"})
    assert decision.verdict == F and "the production key" in decision.reason
    assert verdict(g, "cat secrets/prod.key") == F
    assert verdict(g, "rm -rf /srv/data") == F
    assert verdict(g, "npm install") == A
    assert verdict(g, "git commit -m x") == P
    assert verdict(g, "git push origin main") == F
    assert verdict(g, "git status") == A


def test_overlay_can_never_allow_a_forbidden_command(ws: Path, overlay: Path) -> None:
    g = guardian_with(
        ws,
        overlay,
        "max_delete_files = 500\n[allow]\ncommands = ['mkfs.ext4', 'rm']\n"
        "[subcommands.git]\nallow = ['credential']\n",
    )
    assert verdict(g, "mkfs.ext4 /dev/sdb1") == F
    assert verdict(g, "git credential fill") == F
    assert verdict(g, "rm -rf /") == F
    text = describe(g.overlay_view())
    assert "`mkfs.ext4` stays forbidden (formats a filesystem)" in text
    assert "`git credential` stays forbidden" in text
    assert "`rm` is judged by its arguments" in text
    assert "max_delete_files = 500 is ignored" in text
    assert g.policy().max_delete_files == 20


# ── max_delete_files ────────────────────────────────────────────────────────────────


def test_deleting_more_than_max_delete_files_needs_approval(ws: Path, overlay: Path) -> None:
    logs = ws / "logs"
    logs.mkdir()
    for i in range(21):
        (logs / f"{i}.log").write_text("x")
    g = guardian_with(ws, overlay)
    names = [f"f{i}" for i in range(21)]
    assert verdict(g, "rm " + " ".join(names[:20])) == A
    decision = g.check_sync("shell", {"command": "rm " + " ".join(names)})
    assert decision.verdict == P
    assert decision.reason.endswith("deletes more than 20 files at once (max_delete_files)")
    assert verdict(g, "rm logs/*.log") == P
    assert verdict(g, "rm logs/1*.log") == A  # 1, 10–19: 11 files
    assert verdict(g, "rm -rf logs") == P
    (logs / "0.log").unlink()
    assert verdict(g, "rm -rf logs") == A  # exactly 20
    g = guardian_with(ws, overlay, "max_delete_files = 2\n")
    assert verdict(g, "rm a b") == A
    assert verdict(g, "rm a b c") == P


# ── always-allow rules ──────────────────────────────────────────────────────────────


def test_always_allow_allows_exactly_that_command(ws: Path, overlay: Path) -> None:
    g = guardian_with(ws, overlay)
    call = {"command": "git push origin main"}
    assert g.check_sync("shell", call).verdict == P
    rule = g.always_allow("shell", call, added_by="U123")
    # The rule keeps what the command needs beyond the sandbox (docs/safety.md#sandbox).
    assert g.check_sync("shell", call) == type(g.check_sync("shell", call))(
        A, f"allowed by always-allow rule {rule}", ("network",)
    )
    # Narrow: another argument, or the same command inside a longer one, still asks.
    assert verdict(g, "git push origin dev") == P
    assert verdict(g, "git push origin main --force") == P
    assert verdict(g, "git push origin main; pip install x") == P
    # Written to the overlay: a new guardian (a restart) reads it back.
    assert verdict(Guardian(ws, overlay_path=overlay), "git push origin main") == A
    [saved] = read_document(overlay, overlay=True).always_allow
    assert (saved.id, saved.tool, saved.match, saved.added_by) == (
        rule,
        "shell",
        "git push origin main",
        "U123",
    )
    assert saved.reason == "`git push origin main` pushes commits to a remote repository"
    assert saved.added_at.endswith("Z")
    # Idempotent: the same call again is the same rule.
    assert g.always_allow("shell", call, added_by="U999") == rule
    assert len(read_document(overlay, overlay=True).always_allow) == 1
    text = describe(g.overlay_view())
    assert str(overlay) in text and rule in text and "git push origin main" in text


def test_always_allow_refuses_a_forbidden_call(ws: Path, overlay: Path) -> None:
    g = guardian_with(ws, overlay)
    with pytest.raises(ValueError, match="forbidden"):
        g.always_allow("shell", {"command": "rm -rf /"}, added_by="U1")
    with pytest.raises(ValueError, match="forbidden"):
        g.always_allow("read_file", {"path": "~/.ssh/id_rsa"}, added_by="U1")
    with pytest.raises(ValueError, match="cannot be always-allowed"):
        g.always_allow("delete_everything", {}, added_by="U1")
    assert not overlay.exists()
    with pytest.raises(ValueError, match="no policy overlay"):
        Guardian(ws).always_allow("shell", {"command": "docker ps"}, added_by="U1")


def test_a_hand_written_rule_for_a_forbidden_command_still_forbids(ws: Path, overlay: Path) -> None:
    g = guardian_with(
        ws,
        overlay,
        "[[always_allow]]\nid = 'oops'\ntool = 'shell'\nmatch = 'rm -rf /'\n"
        "[[always_allow]]\ntool = 'read_file'\nmatch = '~/.ssh/id_rsa'\n",
    )
    decision = g.check_sync("shell", {"command": "rm -rf /"})
    assert decision.verdict == F
    assert "always-allow rule oops matches, but a forbidden call is never allowed" in (
        decision.reason
    )
    assert g.check_sync("read_file", {"path": "~/.ssh/id_rsa"}).verdict == F


def test_revoke_removes_only_that_rule_and_keeps_what_a_person_wrote(
    ws: Path, overlay: Path
) -> None:
    written = "# our team's additions\n[allow]\ncommands = ['docker']  # we use containers\n"
    g = guardian_with(ws, overlay, written)
    first = g.always_allow("shell", {"command": "git push origin main"}, added_by="U1")
    second = g.always_allow("shell", {"command": "pip install httpx"}, added_by="U2")
    assert overlay.read_text().startswith(written)
    assert g.revoke(first) is True
    assert verdict(g, "git push origin main") == P
    assert verdict(g, "pip install httpx") == A
    assert overlay.read_text().startswith(written)
    assert g.revoke(first) is False
    assert g.revoke("nosuchid") is False
    assert g.revoke(second) is True
    assert overlay.read_text().strip() == written.strip()
    assert describe(g.overlay_view()).splitlines()[1] == "Allowed commands added: docker"


def test_describe_overlay_when_there_is_none(ws: Path, overlay: Path) -> None:
    expected = "No overlay: the built-in policy applies (config/policy.toml)."
    assert describe(guardian_with(ws, overlay).overlay_view()) == expected
    assert describe(guardian_with(ws, overlay, "# nothing yet\n").overlay_view()) == expected


# ── the agent may not change its own rules ──────────────────────────────────────────


def test_the_policy_files_cannot_be_changed_by_the_agent(tmp_path: Path, ws: Path) -> None:
    builtin = ws / "config" / "policy.toml"  # a workspace that holds Steward's own code
    builtin.parent.mkdir()
    builtin.write_text(builtin_path().read_text())
    data = ws / ".steward"  # a data dir inside the workspace
    data.mkdir()
    g = Guardian(ws, overlay_path=data / "policy.toml", policy_path=builtin)
    for command in (
        "echo x >> config/policy.toml",
        "sed -i 's/forbid/allow/' config/policy.toml",
        "echo '[allow]' > .steward/policy.toml",
        "rm -rf .steward",
        "rm -rf .",
        "mv .steward old",
        "find .steward -delete",
    ):
        decision = g.check_sync("shell", {"command": command})
        assert decision.verdict == F, command
        assert "the agent may not change its own rules" in decision.reason
    assert g.check_sync("write_file", {"path": ".steward/policy.toml", "content": ""}).verdict == F
    assert g.check_sync("edit_file", {"path": "config/policy.toml"}).verdict == F
    assert g.check_sync("read_file", {"path": ".steward/policy.toml"}).verdict == A
    assert verdict(g, "cat config/policy.toml") == A
    # What is inside the data dir (approvals, access list, memory) is Steward's,
    # not the agent's, to read or change, even when the data dir is in the workspace.
    assert verdict(g, "rm -rf .steward/notes") == F
    assert verdict(g, "cat .steward/access.json") == F


# ── writing TOML ────────────────────────────────────────────────────────────────────

TRICKY_TEXT = [
    "plain",
    'say "hi"',
    "back\\slash \\n not a newline",
    "line one\nline two\ttab\r",
    "ünïcødé ✓ ⏎",
    "bell\x07 del\x7f nul-free",
    "cat <<'EOF' > x\nrm -rf /\nEOF",
    "",
]


@pytest.mark.parametrize("text", TRICKY_TEXT)
def test_toml_strings_round_trip(text: str) -> None:
    assert tomllib.loads(f"x = {toml_str(text)}\n") == {"x": text}


def test_a_whole_overlay_round_trips() -> None:
    doc = PolicyDoc(
        max_delete_files=5,
        allow=["docker", "kubectl"],
        workspace_writers=["rsync2"],
        approval={"make": "runs the Makefile", "mail mailx": 'sends "mail"'},
        forbid={"terraform": "changes cloud infrastructure", "aws*": "talks to AWS"},
        protected_dirs=["/srv/data"],
        risky_env_vars=["KUBECONFIG"],
        env_files=["*.secret"],
        credentials=[
            CredentialSpec("the deploy key", path="keys/deploy"),
            CredentialSpec("a token", regex=r"token\d+\.txt", examples=("~/token1.txt",)),
            CredentialSpec("metadata", regex=r"10\.0\.0\.1", boundary=False),
        ],
        subcommands={
            "git": SubcommandSpec(("lfs",), {"commit": "records"}, {"push": "no pushing"}),
            "poetry pdm": SubcommandSpec(("(none)",)),
        },
        options={
            "terraform tofu": OptionRisks({"-chdir": "works elsewhere"}, ("-out",), ("-var-file",)),
            "git-log": OptionRisks(writes=("--output",)),
        },
        always_allow=[
            AlwaysAllowRule(f"id{i}", "shell", text, "U1", "2025-01-01T00:00:00Z", "why")
            for i, text in enumerate(TRICKY_TEXT[:-1])
        ],
    )
    assert parse_text(render_document(doc), "t", overlay=True) == doc


def test_rules_survive_an_inline_array_and_odd_formatting() -> None:
    text = 'always_allow = [{id = "a1", tool = "shell", match = "ls -la"}]\n'
    rule = AlwaysAllowRule("b2", "shell", "docker ps")
    added = overlay_text_with_rule(text, rule, "t")
    assert [r.id for r in parse_text(added, "t", overlay=True).always_allow] == ["a1", "b2"]
    removed = overlay_text_without_rule(added, "a1", "t")
    assert removed is not None
    assert [r.id for r in parse_text(removed, "t", overlay=True).always_allow] == ["b2"]
    assert overlay_text_without_rule(removed, "zz", "t") is None
    assert render_rule(rule).startswith("[[always_allow]]\n")


# ── steward policy check / show ─────────────────────────────────────────────────────


def _check(guardian: Guardian, **kwargs: object) -> tuple[int, str, str]:
    ns = argparse.Namespace(
        **{"shell_command": [], "file": None, "json": False, "tool": None, "args": "{}", **kwargs}
    )
    out, err = io.StringIO(), io.StringIO()
    code = run_check(guardian, ns, out, err)
    return code, out.getvalue(), err.getvalue()


def test_check_usage_mistakes_exit_3(ws: Path, overlay: Path, tmp_path: Path) -> None:
    g = guardian_with(ws, overlay)
    assert _check(g)[0] == 3
    code, _, err = _check(g, tool="read_file", args="{not json")
    assert code == 3 and "--args are not valid JSON" in err
    code, _, err = _check(g, file=str(tmp_path / "missing.txt"))
    assert code == 3 and "cannot read" in err
    code, out, _ = _check(g, shell_command=["ls", "|", "wc", "-l"])
    assert (code, out) == (0, "allow: read-only or workspace-local commands only\n")


def _cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env["STEWARD_DATA_DIR"] = str(tmp_path / "data")
    env["STEWARD_WORKSPACE"] = str(tmp_path / "ws")
    env["HOME"] = str(tmp_path / "home")
    return env


STEWARD = str(Path(sys.executable).with_name("steward"))


def test_cli_check_a_command(tmp_path: Path, ws: Path) -> None:
    res = subprocess.run(
        [STEWARD, "policy", "check", "--", "rm", "-rf", "/"],
        capture_output=True,
        text=True,
        env=_cli_env(tmp_path),
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert res.stdout == "forbid: `rm -rf /` deletes /, a system or home folder\n"


def test_cli_check_a_file_as_json_with_the_deployments_overlay(
    tmp_path: Path, ws: Path, overlay: Path
) -> None:
    overlay.write_text("[allow]\ncommands = ['docker']\n")
    commands = tmp_path / "commands.txt"
    commands.write_text(
        "# what the agent runs most\nls -la\n\ndocker ps\ngit push origin main\n"
        'tool:read_file {"path": "../.env"}\n'
    )
    res = subprocess.run(
        [STEWARD, "policy", "check", "--file", str(commands), "--json"],
        capture_output=True,
        text=True,
        env=_cli_env(tmp_path),
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [(x["command"], x["verdict"]) for x in lines] == [
        ("ls -la", "allow"),
        ("docker ps", "allow"),
        ("git push origin main", "approval"),
        ('tool:read_file {"path": "../.env"}', "forbid"),
    ]
    assert lines[2]["reason"] == "`git push origin main` pushes commits to a remote repository"


def test_cli_check_a_tool_call_without_importing_litellm(tmp_path: Path, ws: Path) -> None:
    """`policy check` is a quick local tool: it must not pay for litellm (seconds)."""
    script = (
        "import sys\n"
        "import bot.cli.policy\n"
        "from bot.cli import main\n"
        "code = main(['policy', 'check', '--tool', 'read_file', '--args', "
        '\'{"path": "~/.ssh/id_rsa"}\'])\n'
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'litellm')\n"
        "print('litellm modules:', loaded)\n"
        "sys.exit(code)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=_cli_env(tmp_path),
        cwd=ROOT,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    verdict_line, modules_line = res.stdout.splitlines()
    assert verdict_line == (
        "forbid: read_file `~/.ssh/id_rsa` touches credentials (SSH keys (~/.ssh))"
    )
    assert modules_line == "litellm modules: []"


def test_risky_variables_may_name_a_family_by_prefix(ws: Path, overlay: Path) -> None:
    """`GIT_CONFIG_*` covers GIT_CONFIG_KEY_0…; a bad name still says how to write it."""
    assert verdict(guardian_with(ws, overlay), "GIT_CONFIG_KEY_7=core.pager git log") == P
    g = guardian_with(ws, overlay, '[environment]\nrisky = ["MY_TOOL_*"]\n')
    assert verdict(g, "MY_TOOL_HOOK=x ls") == P
    assert verdict(g, "MY_TOOLS=x ls") == A
    bad = guardian_with(ws, overlay, '[environment]\nrisky = ["*_HOOK"]\n')
    reason = bad.check_sync("shell", {"command": "ls"}).reason
    assert "GIT_CONFIG_*" in reason


# ── what programs' options do: [options.<program>] ─────────────────────────────────


def test_option_risks_come_from_the_policy_and_an_overlay_can_add_some(
    ws: Path, overlay: Path
) -> None:
    g = guardian_with(ws, overlay)
    assert "make" in g.policy().options  # the built-in file says what make --eval does
    assert verdict(g, "make --ev='x: ; id' x") == P  # abbreviated, `=`: still --eval
    assert verdict(g, "rg --hostname-bin=/tmp/x foo") == A
    g = guardian_with(
        ws,
        overlay,
        '[options.rg.runs]\n"--hostname-bin" = "runs a program to find the host name"\n'
        '[options.make]\nwrites = ["--out"]\n',
    )
    decision = g.check_sync("shell", {"command": "rg --hostname-bin=/tmp/x foo"})
    assert decision.verdict == P and "runs a program to find the host name" in decision.reason
    assert verdict(g, "make --out /tmp/x") == P
    assert verdict(g, "make --ev='x: ; id' x") == P  # the built-in entry is still there
    assert "Options of rg: runs --hostname-bin" in describe(g.overlay_view())


def test_an_option_entry_that_is_not_an_option_is_refused_with_the_fix(
    ws: Path, overlay: Path
) -> None:
    g = guardian_with(ws, overlay, '[options.tar]\nwrites = ["output"]\n')
    reason = g.check_sync("shell", {"command": "ls"}).reason
    assert "'output' is not an option" in reason and '"--output"' in reason


# ── the schema's wording and comment-preserving edits (core/policy/) ─────────────────


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[[credentials]]\npath = 'x'\nwhat = 'w'\nexampels = []",
            "`credentials[1].exampels`: unknown key. Did you mean `examples`?",
        ),
        (
            "[[always_allow]]\ntool = 'shell'\nmatch = 'ls'\n"
            "[[always_allow]]\ntool = 'shell'\nmatch = 'ls'",
            "`always_allow[2].id`: ",
        ),
        ("[subcommands.git]\nallow = 'push'", "`subcommands.git.allow`: must be a list"),
        ("[options.tar]\nwrites = ['f']", "`options.tar`: 'f' is not an option"),
    ],
)
def test_schema_errors_name_the_key_as_written(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_text(text, "overlay.toml", overlay=True)
    assert str(info.value).startswith("overlay.toml: ") and message in str(info.value)


def test_rule_edits_keep_comments_between_and_inside_rules() -> None:
    text = (
        "# ours\n[[always_allow]]\nid = 'a1'  # the deploy\ntool = 'shell'\nmatch = 'make deploy'\n"
        "\n# keep this note\n[forbid]\nterraform = 'changes cloud infrastructure'  # no\n"
    )
    added = overlay_text_with_rule(text, AlwaysAllowRule("b2", "shell", "docker ps"), "t")
    assert "id = 'a1'  # the deploy" in added and "# keep this note" in added
    assert "terraform = 'changes cloud infrastructure'  # no" in added
    assert [r.id for r in parse_text(added, "t", overlay=True).always_allow] == ["a1", "b2"]
    removed = overlay_text_without_rule(added, "b2", "t")
    assert removed is not None and "id = 'a1'  # the deploy" in removed
    assert "# keep this note" in removed and "docker ps" not in removed


def test_importing_the_policy_does_not_import_tomlkit() -> None:
    """tomlkit loads when an overlay is edited, not at start-up (resident memory)."""
    code = "import sys, core.policy, core.guardian.guard; print('tomlkit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
