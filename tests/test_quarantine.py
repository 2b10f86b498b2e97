"""Damaged memory files are set aside and shown, not only logged.

A garbled rule, episode and approval in the data dir of a Steward that stopped with an
approval waiting on Slack (its wire fake): at the next `steward run` start (served as the
product serves it) each is moved to `<data dir>/quarantine/<its path>` with its bytes
and a reason file, `/healthz` says memory is not ok and how to clear it, the dashboard
lists them, the approval's Slack message is edited to expired with no buttons left (its
message id is read from the approvals' message index: the garbled file had lost it),
and `steward doctor` fails the memory check naming each file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings
from memory.approvals import ApprovalStore
from memory.quarantine import REASON_SUFFIX, Quarantine
from memory.rules import Rule, RuleStore
from tests.fakes.llm import ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.test_app_lifecycle import dm, stored, with_slack
from tests.test_replay_e2e import replay
from tests.test_terminal_e2e import STEWARD
from tests.test_web_e2e import running

pytestmark = pytest.mark.timeout(150)

#: A rule whose front matter is not YAML (a bracket never closed).
GARBLED_RULE = (
    "---\nid: r-1\nstatus: active\nconfidence: 0.9\n"
    "trigger: {applies_when: [disk full\n---\nRun `df -h` before deleting anything.\n"
)
#: An episode whose front matter lost its closing quote and line.
GARBLED_EPISODE = "---\nid: ep-garbled\nrequest: 'check the disk\noutcome: success\n"
#: What is left of an approval file cut short mid-write on a failing disk: not even UTF-8,
#: and the message id is gone.
GARBLED_APPROVAL = b"---\nid: \xff\xfe\x00\nstatus: pend"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


async def doctor(settings: Settings, tmp_path: Path, llm: ScriptedLLM) -> tuple[int, str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "STEWARD_DATA_DIR": str(settings.data_dir),
        "STEWARD_WORKSPACE": str(settings.workspace),
        "STEWARD_MODEL": f"openai/{llm.model_id}",
        "STEWARD_API_BASE": llm.base_url,
        "STEWARD_LOCAL_MODEL": "off",
        "STEWARD_PORT": str(settings.port),
        "STEWARD_SANDBOX": "off",
    }
    proc = await asyncio.create_subprocess_exec(
        STEWARD,
        "doctor",
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    said = (await asyncio.wait_for(proc.communicate(), 90))[0].decode()
    assert proc.returncode is not None
    return proc.returncode, said


async def test_garbled_rule_episode_and_approval_are_quarantined_and_shown(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], fake: FakeSlack, tmp_path: Path
) -> None:
    settings = with_slack(settings_for, llm, fake)
    data = settings.data_dir
    llm.reply_tool("shell", {"command": "echo x > ../outside.txt"})
    async with running(settings):
        await dm(fake, "write outside the workspace")
        await fake.wait_for(lambda: any(m.get("blocks") for m in fake.bot_messages()), 30)
        [asked] = [dict(m) for m in fake.bot_messages() if m.get("blocks")]
        assert any(b["type"] == "actions" for b in asked["blocks"])  # live buttons
        await stored(settings, lambda r: r.get("message_id") == asked["ts"])
    [record] = ApprovalStore(data).load_all()
    rid = record["id"]

    # Steward is stopped; three files are damaged meanwhile.
    approval = data / "approvals" / f"{rid}.md"
    approval.write_bytes(GARBLED_APPROVAL)
    (data / "rules").mkdir(exist_ok=True)
    (data / "rules" / "r-1.md").write_text(GARBLED_RULE)
    episode = data / "episodes" / "2025" / "01" / "02" / "ep-garbled.md"
    episode.parent.mkdir(parents=True)
    episode.write_text(GARBLED_EPISODE)
    damaged = {
        f"approvals/{rid}.md": GARBLED_APPROVAL,
        "rules/r-1.md": GARBLED_RULE.encode(),
        "episodes/2025/01/02/ep-garbled.md": GARBLED_EPISODE.encode(),
    }

    def edits_of_the_request() -> list[dict[str, Any]]:
        return [u for u in fake.updates if u["ts"] == asked["ts"]]

    async with running(settings) as (http, url):
        async with http.get(f"{url}/healthz") as r:
            health = await r.json()
        assert health["memory"]["ok"] is False and health["ok"] is False, health["memory"]
        shown = {q["path"]: q for q in health["memory"]["quarantined"]}
        assert set(shown) == set(damaged), shown
        assert "not valid YAML" in shown["rules/r-1.md"]["reason"]
        assert "not UTF-8" in shown[f"approvals/{rid}.md"]["reason"]
        assert "steward memory rebuild" in health["memory"]["clear"]

        # The approval's buttons are gone: its message is edited to expired.
        await fake.wait_for(lambda: bool(edits_of_the_request()), 10)
        [update] = edits_of_the_request()
        assert "Expired:" in update["text"] and "damaged" in update["text"]
        blocks = fake.messages[asked["ts"]].get("blocks", [])
        assert not [b for b in blocks if b["type"] == "actions"]

        # The dashboard shows them too.
        async with http.get(f"{url}/api/status") as r:
            status = await r.json()
        assert {q["path"] for q in status["memory"]["quarantined"]} == set(damaged)

    for rel, raw in damaged.items():
        assert not (data / rel).exists(), rel
        kept = data / "quarantine" / rel
        assert kept.read_bytes() == raw, rel  # the bytes as they were
        reason = kept.with_name(kept.name + REASON_SUFFIX).read_text()
        assert f"from: {rel}" in reason and "why: " in reason

    code, said = await doctor(settings, tmp_path, llm)
    assert code == 1, said
    assert "✗ memory: 3 damaged file(s) set aside" in said, said
    for rel in damaged:
        assert rel in said, said
    assert "steward memory rebuild" in said

    # Fixed where it lies and deleted: after a start memory is ok again.
    kept_rule = data / "quarantine" / "rules" / "r-1.md"
    kept_rule.write_text(GARBLED_RULE.replace("[disk full", "disk full}"))
    for rel in damaged:
        if not rel.startswith("rules/"):
            (data / "quarantine" / rel).unlink()
    async with running(settings) as (http, url):
        async with http.get(f"{url}/healthz") as r:
            health = await r.json()
        assert health["memory"]["ok"] is True and health["memory"]["quarantined"] == []
    assert (data / "rules" / "r-1.md").exists()  # put back where it was
    assert not list((data / "quarantine").rglob(f"*{REASON_SUFFIX}"))


def test_a_rule_damaged_while_steward_runs_is_set_aside_at_the_next_load(tmp_path: Path) -> None:
    """The learner reads the rules before every task: a rule broken by hand is
    quarantined there (logged once), never silently left out, and its id is not reused."""
    quarantine = Quarantine(tmp_path)
    store = RuleStore(tmp_path)
    store.quarantine = quarantine
    root = tmp_path / "rules"
    root.mkdir()
    good = Rule(id="r-2", text="Check the runbook.", status="active", confidence=0.9)
    (root / "r-2.md").write_text(
        "---\n" + json.dumps(good.front_matter()) + "\n---\n" + good.text + "\n"
    )
    rules, problems = store.load()
    assert [r.id for r in rules] == ["r-2"] and problems == []

    (root / "r-3.md").write_text("---\nid: r-3\nstatus: [\n---\nx\n")
    (root / "r-4.md").write_text("---\nid: r-4\nstatus: sometimes\n---\nx\n")  # wrong value
    rules, problems = store.load()
    assert [r.id for r in rules] == ["r-2"]
    assert len(problems) == 2 and all("set aside in" in p for p in problems), problems
    assert not (root / "r-3.md").exists() and not (root / "r-4.md").exists()
    assert {q.path for q in quarantine.files()} == {"rules/r-3.md", "rules/r-4.md"}
    assert store.load() == (store.load()[0], [])  # told once, then shown by the quarantine
    assert store.next_id() == "r-5"  # a quarantined rule's id stays its own


async def test_a_second_damage_of_the_same_path_keeps_both_copies(tmp_path: Path) -> None:
    quarantine = Quarantine(tmp_path)
    for text in ("---\nfirst: [\n", "---\nsecond: [\n"):
        path = tmp_path / "approvals" / "ab12.md"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        assert quarantine.put(path, "front matter never closed") is not None
    kept = sorted(q.held for q in quarantine.files())
    assert [p.read_text() for p in kept] == ["---\nfirst: [\n", "---\nsecond: [\n"]


async def test_a_garbled_approval_without_the_index_is_found_from_its_own_lines(
    llm: ScriptedLLM, settings_for: Callable[..., Settings]
) -> None:
    """Through `steward replay`: a record cut short before its closing `---` (a file
    written before the message index existed) still names its message; the message is
    edited to expired with no buttons, and the file is set aside."""
    settings = settings_for(llm)
    llm.reply_tool("shell", {"command": "echo x > ../outside.txt"})
    out = await replay(settings, [{"t": 0, "user": "alice", "text": "write outside"}], drain=0)
    asked = next(o for o in out if o["kind"] == "approval")
    rid = asked["approval"]
    path = settings.data_dir / "approvals" / f"{rid}.md"
    text = path.read_text()
    assert f"message_id: {asked['id']}" in text
    path.write_text(text[: text.index("\n---", 4)])  # the closing line is lost
    (settings.data_dir / "approvals" / "messages.json").unlink(missing_ok=True)

    later = await replay(settings, [], drain=0)
    [edit] = [o for o in later if o["kind"] == "edit"]
    assert edit["id"] == asked["id"] and edit["buttons"] == []
    assert "could not read this request's record" in edit["text"]
    assert "Approval needed" in edit["text"]  # its text, from the damaged lines
    assert not path.exists()
    assert (settings.data_dir / "quarantine" / "approvals" / f"{rid}.md").exists()
