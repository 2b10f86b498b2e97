"""Skills on Slack: the real adapter and SDK over Socket Mode to the wire-level fake
(tests/fakes/slack.py), behind the real dispatcher, agent, guardian and sandbox, with
the scripted model. A workspace skill is enabled with /skills, graded, used (use_skill,
then its script through the shell tool) and disabled; one with a hidden character and
one with a secret are refused with the reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.contract.test_contract import Rig, _rig
from tests.fakes.llm import ScriptedLLM
from tests.test_skills_e2e import skill_md, tool_results, tools_of, write_skill


async def said(rig: Rig, text: str, expect: str) -> str:
    """Send `text` as the person in the DM; the first new bot message holding `expect`."""
    before = len(rig.h.sent())
    await rig.h.user_says(text)
    sent = await rig.reply_to(
        lambda s: s in rig.h.sent()[before:] and expect in s.text, f"a reply with {expect!r}"
    )
    return sent.text


async def test_skill_enabled_used_and_disabled_on_slack(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    ws_dir = tmp_path / "ws"
    write_skill(
        ws_dir / "skills" / "stamp",
        {
            "SKILL.md": skill_md(
                "stamp",
                "Stamp a release note. Use when asked to stamp a release.",
                "1. Run `sh skills/stamp/scripts/stamp.sh VERSION`.\n",
            ),
            "scripts/stamp.sh": 'printf "released %s\\n" "$1" > RELEASE.txt\n',
        },
    )
    write_skill(
        ws_dir / "skills" / "sneaky",
        {"SKILL.md": skill_md("sneaky", "Tidy.", "1. Tidy\U000e0041\U000e0042 up.\n")},
    )
    webhook = "https://hooks.slack.com/services/T0000AAAA/B0000BBBB/abcdefghijklmnopqrstuvwx"
    write_skill(
        ws_dir / "skills" / "notify",
        {"SKILL.md": skill_md("notify", "Tell the team.", f"1. POST to {webhook}.\n")},
    )
    async with _rig("slack", llm, settings_for) as rig:
        listed = await said(rig, "/skills list", "Skills:")
        assert "stamp [not enabled yet] (workspace)" in listed

        refused = await said(rig, "/skills enable sneaky", "sneaky is kept disabled")
        assert "an invisible Unicode tag character" in refused and "U+E0041" in refused
        refused = await said(rig, "/skills enable notify", "notify is kept disabled")
        assert "holds a secret (slack_webhook)" in refused and webhook not in refused

        enabled = await said(rig, "/skills enable stamp", "Enabled stamp")
        assert "Grade: passed" in enabled and "scripts/stamp.sh — runs with sh" in enabled

        llm.reply_tool("use_skill", {"name": "stamp"})
        llm.reply_tool("shell", {"command": "sh skills/stamp/scripts/stamp.sh 2.1"})
        llm.reply_text("Stamped release 2.1 with the stamp skill.")
        await said(rig, "stamp release 2.1", "Stamped release 2.1")
        use = tools_of(llm.requests[-3])["use_skill"]
        assert "- stamp: Stamp a release note." in use["description"]
        assert "sneaky" not in use["description"] and "notify" not in use["description"]
        assert "sh skills/stamp/scripts/stamp.sh VERSION" in tool_results(llm.requests[-2])[0]
        assert (ws_dir / "RELEASE.txt").read_text() == "released 2.1\n"

        await said(rig, "/skills disable stamp", "Disabled stamp")
        llm.reply_text("Nothing to stamp with.")
        await said(rig, "stamp release 2.2", "Nothing to stamp with.")
        assert "use_skill" not in tools_of(llm.requests[-1])
    assert (ws_dir / "RELEASE.txt").read_text() == "released 2.1\n"
