"""The guardian's decision for web_fetch: a URL the person wrote runs, any other asks and
names its host, this machine and private networks are refused up front (naming
egress_allow), Steward's own endpoints always."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.egress import EgressPolicy, Endpoint, urls_in
from core.guardian import Guardian, Verdict


@pytest.fixture
def guardian(tmp_path: Path) -> Guardian:
    ws = tmp_path / "ws"
    ws.mkdir()
    return Guardian(ws)


def fetch(g: Guardian, url: str, said: list[str] | None = None):  # type: ignore[no-untyped-def]
    person = urls_in(said) if said is not None else None
    return g.check_sync("web_fetch", {"url": url}, person_urls=person)


def test_a_url_the_person_wrote_runs_without_a_question(guardian: Guardian) -> None:
    said = ["please read https://Docs.Example.com/guide#install and summarise it"]
    decision = fetch(guardian, "https://docs.example.com:443/guide", said)
    assert decision.verdict == Verdict.ALLOW
    assert "the person gave" in decision.reason
    # The same site, another page: not what they wrote.
    other = fetch(guardian, "https://docs.example.com/guide?x=1", said)
    assert other.verdict == Verdict.APPROVAL


def test_any_other_url_asks_and_names_the_host(guardian: Guardian) -> None:
    url = "https://x.example/?d=U1RFV0FSRF9BUElfS0VZPXNrLTEyMw"
    decision = fetch(guardian, url, ["summarise NOTES.md"])
    assert decision.verdict == Verdict.APPROVAL
    assert decision.reason.startswith("web_fetch https://x.example/?d=")
    assert decision.reason.endswith("— x.example is not a site you gave in this conversation")
    assert decision.needs == ("host:x.example",)
    assert decision.effects.fetches == (url,)
    # No person URLs at all (every other caller of the guardian): the same question.
    assert guardian.check_sync("web_fetch", {"url": url}).verdict == Verdict.APPROVAL


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/x",
        "http://2130706433:9/",
        "http://0x7f000001/",
        "http://127.1/",
        "http://user@localhost:9/",
        "http://LOCALHOST./",
        "http://[::1]:9/",
        "http://[::ffff:127.0.0.1]/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.100.100.200/",
        "http://0.0.0.0:8765/",
    ],
)
def test_this_machine_and_private_networks_are_refused_up_front(
    guardian: Guardian, url: str
) -> None:
    # Even when the person wrote it: the owner decides what is reachable, in the settings.
    decision = fetch(guardian, url, [f"fetch {url}"])
    assert decision.verdict == Verdict.FORBID
    assert any(w in decision.reason for w in ("egress_allow", "metadata", "credentials"))


def test_egress_allow_opens_a_private_host_to_the_person_s_urls(tmp_path: Path) -> None:
    g = Guardian(tmp_path, egress=EgressPolicy(["127.0.0.1:8080", "wiki.internal"]))
    url = "http://127.0.0.1:8080/status"
    assert fetch(g, url, [f"check {url}"]).verdict == Verdict.ALLOW
    assert fetch(g, url, ["check the status"]).verdict == Verdict.APPROVAL
    assert fetch(g, "http://127.0.0.1:8081/", ["x"]).verdict == Verdict.FORBID


def test_steward_s_own_endpoints_are_refused_even_when_listed(tmp_path: Path) -> None:
    g = Guardian(
        tmp_path,
        egress=EgressPolicy(
            ["127.0.0.1", "localhost"],
            protected=[
                Endpoint("127.0.0.1", 8000, "Steward's model server (api_base)"),
                Endpoint("localhost", 8765, "Steward's own web server"),
            ],
        ),
    )
    for url in ("http://127.0.0.1:8000/v1/models", "http://2130706433:8000/v1/models"):
        decision = fetch(g, url, [url])
        assert decision.verdict == Verdict.FORBID and "model server" in decision.reason
    decision = fetch(g, "http://localhost:8765/", ["http://localhost:8765/"])
    assert decision.verdict == Verdict.FORBID and "web server" in decision.reason


def test_urls_parsers_disagree_on_are_refused(guardian: Guardian) -> None:
    for url in ("http://ex ample.com/", "http://127.0.0.1%00.example.com/"):
        assert fetch(guardian, url, [url]).verdict == Verdict.FORBID


async def test_check_passes_the_person_s_urls_through(guardian: Guardian) -> None:
    url = "https://docs.example.com/a"
    assert (await guardian.check("web_fetch", {"url": url})).verdict == Verdict.APPROVAL
    allowed = await guardian.check("web_fetch", {"url": url}, person_urls=urls_in([url]))
    assert allowed.verdict == Verdict.ALLOW
