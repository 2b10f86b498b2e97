"""Declaring MCP servers, naming their tools, and the policy sections for them.

Every mistake in a `[mcp.servers.NAME]` table stops Steward with the file, the key and
the fix; the tool names offered fit every provider; `[mcp.<server>]` policy sections
and MCP always-allow rules are validated and merged under the overlay rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from config.mcp import TOOL_NAME_RE, is_mcp_tool
from config.settings import ConfigError, load_settings
from core.mcp.names import offered_names
from core.policy import PolicyError, builtin_path, merge, parse_text, read_document
from tests.fakes import mcp_servers


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Any:
    (tmp_path / "steward.toml").write_text(text, encoding="utf-8")
    return load_settings(env=env or {}, cwd=tmp_path)


def refused(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text, env)
    return str(exc.value)


def test_both_kinds_of_server_with_every_key(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        """
workspace = "./ws"
[mcp.servers.tickets]
command = "/opt/tickets-mcp/.venv/bin/python"
args = ["-m", "tickets_mcp"]
env = { TICKETS_URL = "https://tickets.example.com", TOKEN = "${TICKETS_TOKEN}" }
network = ["tickets.example.com", "*.cdn.example.com", "api.example.com:8443"]
tools = ["search", "get_*"]
exclude_tools = ["get_secret"]
timeout = 30
trust_annotations = true
[mcp.servers.docs]
url = "https://docs.example.com/mcp"
headers = { Authorization = "Bearer ${DOCS_TOKEN}" }
[mcp.servers.legacy]
url = "https://old.example.com/sse"
enabled = false
""",
        {"TICKETS_TOKEN": "tt-secret-1", "DOCS_TOKEN": "dd-secret-2"},
    )
    tickets, docs, legacy = settings.mcp.servers
    assert tickets.stdio and tickets.args == ("-m", "tickets_mcp") and tickets.timeout == 30
    assert dict(tickets.env) == {
        "TICKETS_URL": "https://tickets.example.com",
        "TOKEN": "tt-secret-1",
    }
    assert tickets.trust_annotations and tickets.network[1] == "*.cdn.example.com"
    assert tickets.offers("search") and tickets.offers("get_issue")
    assert not tickets.offers("get_secret") and not tickets.offers("delete")
    assert docs.transport == "streamable-http" and dict(docs.headers) == {
        "Authorization": "Bearer dd-secret-2"
    }
    assert legacy.transport == "sse" and not legacy.enabled
    assert settings.mcp.enabled == (tickets, docs)
    assert settings.mcp.files == (str(tmp_path / "steward.toml"),)
    assert "dd-secret-2" not in repr(settings) and "tt-secret-1" not in repr(
        settings.mcp
    )  # secrets not shown


@pytest.mark.parametrize(
    ("table", "said"),
    [
        (
            '[mcp.servers.t]\ncomand = "x"',
            "`mcp.servers.t.comand` in {file}: unknown key. Fix: did you mean `command`?",
        ),
        ('[mcp.servers.t]\nargs = ["x"]', "needs exactly one of `command`"),
        ('[mcp.servers.t]\ncommand = "x"\nurl = "http://h/mcp"', "has both `command` and `url`"),
        (
            '[mcp.servers.t]\nurl = "http://h/mcp"\nnetwork = ["h"]',
            "`mcp.servers.t.network` in {file}: does not apply to an HTTP server",
        ),
        (
            '[mcp.servers.t]\ncommand = "x"\nheaders = {}',
            "`mcp.servers.t.headers` in {file}: does not apply to a stdio server",
        ),
        (
            '[mcp.servers.t]\ncommand = "x"\nargs = "-m x"',
            "`mcp.servers.t.args` in {file}: must be a list of non-empty strings",
        ),
        ('[mcp.servers.t]\ncommand = "x"\ntimeout = 0', "must be a number of seconds above 0"),
        (
            '[mcp.servers.t]\ncommand = "x"\nenabled = "no"',
            "`mcp.servers.t.enabled` in {file}: must be true or false",
        ),
        (
            '[mcp.servers.t]\ncommand = "x"\nnetwork = ["https://h/x"]',
            "'https://h/x' is not a host",
        ),
        ('[mcp.servers.t]\nurl = "ftp://h/x"', "'ftp://h/x' is not an http(s) URL"),
        ('[mcp.servers.t]\nurl = "http://h/x"\ntransport = "ws"', "'ws' is not a transport"),
        ('[mcp.servers.a__b]\ncommand = "x"', "'a__b' cannot be a server name"),
        (
            '[mcp.servers.this-name-is-far-too-long-for-a-tool]\ncommand = "x"',
            "cannot be a server name",
        ),
        ("[mcp.tools]\nx = 1", "`mcp.tools` in {file}: unknown key"),
    ],
)
def test_each_mistake_names_the_key_and_the_fix(tmp_path: Path, table: str, said: str) -> None:
    message = refused(tmp_path, table)
    assert said.format(file=tmp_path / "steward.toml") in message
    assert "Fix:" in message


def test_a_variable_that_is_not_set_is_named(tmp_path: Path) -> None:
    message = refused(
        tmp_path, '[mcp.servers.docs]\nurl = "https://h/mcp"\nheaders = { A = "Bearer ${NOPE}" }'
    )
    assert "`mcp.servers.docs.headers.A`" in message and "${NOPE}" in message
    assert "export NOPE=" in message


def test_steward_mcp_config_names_another_file_that_wins(tmp_path: Path) -> None:
    other = mcp_servers.write(
        tmp_path / "more.toml",
        mcp_servers.table("tickets", url="https://new.example.com/mcp"),
        mcp_servers.table("extra", command="/bin/true"),
    )
    (tmp_path / "steward.toml").write_text(
        '[mcp.servers.tickets]\ncommand = "/bin/false"\n', encoding="utf-8"
    )
    settings = load_settings(env={"STEWARD_MCP_CONFIG": str(other)}, cwd=tmp_path)
    servers = {s.name: s for s in settings.mcp.servers}
    assert servers["tickets"].url == "https://new.example.com/mcp"
    assert servers["extra"].command == "/bin/true"
    assert settings.mcp.files == (str(tmp_path / "steward.toml"), str(other))

    other.write_text('model = "x"\n[mcp.servers.a]\ncommand = "/bin/true"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"holds only \[mcp.servers.NAME\] tables"):
        load_settings(env={"STEWARD_MCP_CONFIG": str(other)}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="STEWARD_MCP_CONFIG"):
        load_settings(env={"STEWARD_MCP_CONFIG": str(tmp_path / "missing.toml")}, cwd=tmp_path)


def test_offered_names_fit_every_provider_and_stay_the_same() -> None:
    tools = ["search", "files.read", "files_read", "créer", "x" * 90, "", "a/b", "ok-2"]
    names = offered_names("tickets", tools)
    assert names["search"] == "mcp__tickets__search" and names["ok-2"] == "mcp__tickets__ok-2"
    assert names["files_read"] == "mcp__tickets__files_read"  # a fitting name keeps it
    assert names["files.read"].startswith("mcp__tickets__files_read_")  # the renamed one moves
    assert names["créer"] == "mcp__tickets__cr_er"
    assert len(set(names.values())) == len(tools)
    for name in names.values():
        assert TOOL_NAME_RE.match(name) and is_mcp_tool(name), name
    assert offered_names("tickets", list(reversed(tools))) == names
    assert re.fullmatch(r"mcp__tickets__x+_[0-9a-f]{6}", names["x" * 90])


def test_policy_sections_for_servers_merge_under_the_overlay_rules(tmp_path: Path) -> None:
    builtin = builtin_path().read_text(encoding="utf-8")
    section = '\n[mcp.tickets]\napproval = ["create_*"]\nforbid = ["drop_all"]\n'
    base = parse_text(builtin + section, "base.toml", overlay=False)
    overlay = parse_text(
        """
[mcp.tickets]
allow = ["search", "create_note", "drop_all"]
approval = ["search_secrets"]
forbid = ["delete_*"]
""",
        "overlay.toml",
        overlay=True,
    )
    rules = merge(base, overlay).mcp["tickets"]
    assert rules.verdict("search")[0] == "allow"  # type: ignore[index]
    assert rules.verdict("create_note")[0] == "allow"  # type: ignore[index]  # lifted
    assert rules.verdict("create_ticket")[0] == "approval"  # type: ignore[index]
    assert rules.verdict("delete_ticket")[0] == "forbid"  # type: ignore[index]
    assert rules.verdict("drop_all")[0] == "forbid"  # type: ignore[index]  # never lifted
    assert rules.verdict("search_secrets") == (
        "approval",
        "`search_secrets` in [mcp.tickets] approval of overlay.toml",
    )
    assert rules.verdict("other") is None
    assert any(
        "drop_all" in note and "stays forbidden" in note for note in merge(base, overlay).notes
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[mcp.tickets]\nalow = ["x"]', "`mcp.tickets.alow`: unknown key. Did you mean `allow`?"),
        ('[mcp.tickets]\nallow = "x"', "`mcp.tickets.allow`: must be a list of tool names"),
        ('[mcp."two words"]\nallow = ["x"]', "'two words' is not an MCP server name"),
        (
            '[[always_allow]]\ntool = "mcp__tickets__create"\nmatch = "title=x"',
            "an MCP tool's rule matches any arguments or exactly one set",
        ),
        (
            '[[always_allow]]\ntool = "mcp__bad"\nmatch = "*"',
            "is not a tool an always-allow rule can name",
        ),
    ],
)
def test_policy_mistakes_are_named(text: str, said: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_text(text, "overlay.toml", overlay=True)
    assert said in str(exc.value)


def test_mcp_always_allow_rules_match_the_tool_with_any_or_exact_arguments() -> None:
    overlay = parse_text(
        """
[[always_allow]]
tool = "mcp__tickets__create"
match = "*"
[[always_allow]]
tool = "mcp__tickets__update"
match = '{"id": 7, "fields": {"b": 1, "a": [1, 2]}}'
""",
        "overlay.toml",
        overlay=True,
    )
    policy = merge(read_document(builtin_path(), overlay=False), overlay)
    assert policy.rules_for("mcp__tickets__create", {"title": "anything"})
    assert not policy.rules_for("mcp__tickets__close", {})  # a rule is for one tool only
    assert policy.rules_for("mcp__tickets__update", {"fields": {"a": [1, 2], "b": 1}, "id": 7})
    assert not policy.rules_for("mcp__tickets__update", {"id": 8, "fields": {"a": [1, 2], "b": 1}})
    assert not policy.rules_for("mcp__tickets__update", {"id": 7})
