"""How the browser tools are set up: offered only where they can run, Playwright never
loaded by Steward's start, Chromium started only by a task's first browser call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bot.app import App
from core.browser import unavailable
from core.browser.tools import NAMES
from tests.fakes.llm import ScriptedLLM
from tests.fresh import fresh_python
from tests.test_browser_e2e import why_not

START = """
import json, sys
from pathlib import Path
from bot.app import App
from config.settings import load_settings
root = sys.argv[1]
env = {
    "STEWARD_DATA_DIR": root + "/data", "STEWARD_WORKSPACE": root + "/ws",
    "STEWARD_MODEL": "openai/scripted", "STEWARD_API_BASE": "http://127.0.0.1:9/v1",
    "STEWARD_LOCAL_MODEL": "off", "STEWARD_PORT": "0",
}
app = App(load_settings(env=env, cwd=Path(root)))
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"playwright", "pyee"})
offered = sorted(n for n in app.toolbox if n.startswith("browser_"))
print(json.dumps({"loaded": loaded, "offered": offered, "browsers": app.browsers is not None}))
"""


@pytest.mark.skipif(why_not() is not None, reason=f"no browser here: {why_not()}")
def test_starting_steward_loads_no_playwright_and_starts_no_browser(tmp_path: Path) -> None:
    got = fresh_python(START, str(tmp_path))
    assert got["loaded"] == []  # Playwright is imported by a task's first browser call
    assert got["browsers"] is True and got["offered"] == sorted(NAMES)


async def test_the_tools_are_not_offered_when_switched_off_or_without_chromium(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    for overrides in ({"browser_enabled": "false"}, {"browser_chromium": str(tmp_path / "no")}):
        app = App(settings_for(llm, **overrides))
        try:
            assert app.browsers is None
            assert app.agent is not None and not NAMES & set(app.agent.tools)
        finally:
            app.lock.release()


def test_why_the_browser_is_not_offered_names_the_fix(tmp_path: Path) -> None:
    assert unavailable(False, "/usr/bin/chromium", None) == "browser_enabled is false"
    no_sandbox = unavailable(True, "/usr/bin/chromium", None)
    assert no_sandbox is not None and "OS sandbox" in no_sandbox
    missing = unavailable(True, str(tmp_path / "chromium"), object())  # type: ignore[arg-type]
    assert missing is not None and "browser_chromium" in missing and "apt-get" in missing
