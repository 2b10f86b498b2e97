"""Steward offers to save a task that worked in several steps as a skill: the offer is
graded first, carries buttons, and nothing is saved without the person's press. Through
the web chat of `steward run`, with the scripted model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.fakes.llm import ScriptedLLM
from tests.test_skills_e2e import tools_of
from tests.test_web_e2e import SESSION, frames_until, free_port, running

REQUEST = "make the weekly report"
DONE = "The weekly report is in report.txt."


def script_task(llm: ScriptedLLM, command: str = "wc -l data.csv > report.txt") -> None:
    llm.reply_tool("write_file", {"path": "data.csv", "content": "a,1\nb,2\n"})
    llm.reply_tool("shell", {"command": command})
    llm.reply_tool("read_file", {"path": "report.txt"})
    llm.reply_text(DONE)


def offer(frame: dict) -> bool:
    return frame["type"] == "message" and any(
        b["label"] == "Save as skill" for b in frame.get("buttons") or []
    )


async def test_a_task_that_worked_is_offered_as_a_skill_and_saved_on_press(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    script_task(llm)
    s = settings_for(llm, port=free_port())
    seen: list[dict] = []
    async with running(s) as (http, url):
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": REQUEST})
            offered = await frames_until(ws, offer, seen)
            assert "That worked in 3 steps" in offered["text"]
            assert "Skill `make-weekly-report`" in offered["text"]
            assert "Grade: passed" in offered["text"]
            # Nothing is saved before the press.
            assert not (tmp_path / "data" / "skills").exists()
            save = next(b for b in offered["buttons"] if b["label"] == "Save as skill")
            await ws.send_json(
                {"type": "press", "value": save["value"], "message_id": offered["id"]}
            )
            await frames_until(
                ws,
                lambda f: "Saved as skill `make-weekly-report` and enabled" in f.get("text", ""),
                seen,
            )
            llm.reply_text("Here is the report again.")
            await ws.send_json({"type": "message", "text": "the weekly report again"})
            await frames_until(ws, lambda f: f.get("text") == "Here is the report again.", seen)
    skill = tmp_path / "data" / "skills" / "make-weekly-report" / "SKILL.md"
    text = skill.read_text()
    assert text.startswith("---\nname: make-weekly-report\n")
    assert "wc -l data.csv > report.txt" in text and "`write_file`" in text
    use = tools_of(llm.requests[-1])["use_skill"]
    assert "make-weekly-report: Steps that worked for a request like: make" in use["description"]
    assert "enabled: true" in (tmp_path / "data" / "skills.md").read_text()


async def test_no_thanks_saves_nothing_and_a_task_with_a_secret_is_not_offered(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    script_task(llm)
    token = "xoxb-" + "1234567890-abcdefghijklmnop"
    script_task(llm, f"printf '%s\\n' {token} > report.txt")
    s = settings_for(llm, port=free_port())
    seen: list[dict] = []
    async with running(s) as (http, url):
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": REQUEST})
            offered = await frames_until(ws, offer, seen)
            skip = next(b for b in offered["buttons"] if b["label"] == "No thanks")
            await ws.send_json(
                {"type": "press", "value": skip["value"], "message_id": offered["id"]}
            )
            await frames_until(ws, lambda f: "Not saved." in f.get("text", ""), seen)
    assert not (tmp_path / "data" / "skills").exists()
    [record] = list((tmp_path / "data" / "skill-proposals").glob("*.md"))
    assert "status: skipped" in record.read_text()

    # Another conversation: a task whose command held a token is never offered as a
    # skill (its draft fails the grade), though it worked in as many steps.
    s2 = settings_for(llm, port=free_port())
    seen2: list[dict] = []
    async with running(s2) as (http, url):
        session = "test-session-0002"
        async with http.ws_connect(f"{url}/ws?session={session}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "stamp the weekly report"})
            await frames_until(
                ws, lambda f: f.get("role") == "assistant" and f["text"].startswith(DONE), seen2
            )
            await ws.send_json({"type": "message", "text": "/status"})
            await frames_until(ws, lambda f: f.get("text", "").startswith("Idle"), seen2)
    assert not [f for f in seen2 if offer(f)]
    assert (tmp_path / "ws" / "report.txt").read_text() == token + "\n"
    episodes = [p.read_text() for p in (tmp_path / "data" / "episodes").rglob("*.md")]
    stamped = next(e for e in episodes if "stamp the weekly report" in e)
    assert "outcome: success" in stamped
    assert not (tmp_path / "data" / "skills").exists()
