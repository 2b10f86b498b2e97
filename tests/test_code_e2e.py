"""The code tools through the whole product: `steward run`'s server with the web chat
and Slack (Socket Mode, on tests/fakes/slack.py) at once, the scripted model asking
code_definition, code_references, code_impact and code_symbols about the repository of
tests/test_code_index.py through the real dispatcher, agent, guardian and tools.

Asserted on what the model was shown (the right definitions, uses and impact), on what
the person got in each chat, and on the effects: nothing was asked (the tools only
read), no undo snapshot was taken, the index is in the data dir, not the workspace."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from config.settings import Settings
from memory.approvals import ApprovalStore
from tests.fakes.llm import ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.test_app_lifecycle import bot_texts, dm, with_slack
from tests.test_code_index import REPO, write_repo
from tests.test_replay_e2e import tool_messages
from tests.test_web_e2e import SESSION, frames_until, running

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


async def test_a_conversation_about_code_in_the_web_chat_and_on_slack(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], fake: FakeSlack
) -> None:
    settings = with_slack(settings_for, llm, fake)
    write_repo(settings.workspace)
    workspace_before = files_under(settings.workspace)

    llm.reply_tools(
        [("code_definition", {"name": "square"}), ("code_references", {"name": "square"})]
    )
    llm.reply_tool("code_impact", {"path_or_symbol": "square"})
    llm.reply_text("square is in geo/util.py; renaming it touches 6 files, one test.")
    async with running(settings) as (http, url):
        seen: list[dict] = []
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "what would renaming square touch?"})
            final = await frames_until(
                ws, lambda f: f["type"] == "message" and f["text"].startswith("square is"), seen
            )
        assert final["text"].endswith("touches 6 files, one test.")
        started = [f["tool"] for f in seen if f["type"] == "progress" and f["kind"] == "tool_start"]
        assert started == ["code_definition", "code_references", "code_impact"]
        definition, references, impact = tool_messages(llm)
        assert definition.splitlines()[:3] == [
            "1 definition of square:",
            "geo/util.py:1-2 function square",
            "  1  def square(x: float) -> float:",
        ]
        assert "4 uses in 2 files" in references
        assert "  15 call in Circle.area: return 3.14159 * square(self.r)" in references
        assert "  5 call in fine: return square(2)" in references
        assert "  geo/shapes.py:15 Circle.area (14-15) calls square" in impact
        assert "  tests/test_shapes.py:5 test_circle_area (4-5) calls area" in impact
        assert "Tests among them (1): tests/test_shapes.py" in impact
        assert "[partial: 1 file has syntax errors" in impact

        # On Slack: the broken file's symbols, then the impact of a whole file in Go.
        llm.reply_tool("code_symbols", {"path": "broken.py"})
        llm.reply_tool("code_impact", {"path_or_symbol": "svc/util/strings.go"})
        llm.reply_text("broken.py is cut at line 8; strings.go reaches svc/main.go and a test.")
        await dm(fake, "is broken.py ok, and what uses svc/util/strings.go?")
        await fake.wait_for(lambda: any("cut at line 8" in t for t in bot_texts(fake)), 30)
        symbols, go_impact = tool_messages(llm)
        assert "12-13 function after_error" in symbols
        assert "[partial: syntax errors at line 8;" in symbols
        assert "  svc/main.go:11 main (9-12) calls Pad" in go_impact
        assert "Tests among them (1): svc/util/strings_test.go" in go_impact

    # Effects: nothing was asked (the tools only read); the workspace is as it was, no
    # snapshot was taken before the calls, and the index lives in the data dir.
    assert ApprovalStore(settings.data_dir).load_all() == []
    assert files_under(settings.workspace) == workspace_before
    assert files_under(settings.data_dir / "snapshots" / "tasks") == []  # no task to undo
    [stored] = (settings.data_dir / "code_index").glob("*.sqlite")
    assert stored.stat().st_size > 0
    assert len(workspace_before) == len(REPO)
