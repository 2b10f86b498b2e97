"""`Browsers`: the browser of each running task, started by its first browser call and
closed when the task ends (the agent's `on_task_end`), or when Steward stops.

Why one Chromium per task, not one shared: a task's cookies, logins and open pages
are its own, and ending the process is the one close that leaves nothing behind. It
costs a start (about a second) per task that browses; a task that never does starts
nothing, and Steward itself never loads Playwright.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from core.browser.session import BrowserConfig, BrowserSession
from core.egress import EgressPolicy

if TYPE_CHECKING:
    from core.sandbox import Sandbox

log = structlog.get_logger("steward.browser")


def unavailable(enabled: bool, chromium: str, sandbox: Sandbox | None) -> str | None:
    """Why the browser tools cannot be offered here, in words naming the fix; None: they can."""
    if not enabled:
        return "browser_enabled is false"
    if sandbox is None:
        return (
            "the browser runs only inside the OS sandbox, which is off or unavailable here "
            "(see docs/safety.md#sandbox)"
        )
    if not (os.path.isfile(chromium) and os.access(chromium, os.X_OK)):
        return (
            f"Chromium was not found at {chromium} (setting browser_chromium; on Debian and "
            "Ubuntu: apt-get install chromium)"
        )
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (python3 dev.py setup installs it)"
    return None


class Browsers:
    """The running tasks' browsers, by task id."""

    def __init__(
        self,
        config: BrowserConfig,
        *,
        workspace: Path,
        sandbox: Sandbox,
        egress: EgressPolicy,
    ) -> None:
        self.config = config
        self.workspace = workspace
        self.sandbox = sandbox
        self.egress = egress
        self._sessions: dict[str, BrowserSession] = {}
        self._starting: dict[str, asyncio.Lock] = {}

    def offered(self, tool: str, task_id: str) -> bool:
        """Whether `tool`'s schema goes with task `task_id`'s model calls: `browser_open`
        always, the tools that act on a page only once the task has a browser open (six
        schemas on every call of every task cost about 470 prompt tokens)."""
        if not tool.startswith("browser_") or tool == "browser_open":
            return True
        return self.get(task_id) is not None

    def get(self, task_id: str) -> BrowserSession | None:
        """The task's open browser, if it has one."""
        session = self._sessions.get(task_id)
        return session if session is not None and not session.closed else None

    async def session(self, task_id: str) -> BrowserSession:
        """The task's browser, started on its first call (ToolError when it cannot start)."""
        lock = self._starting.setdefault(task_id, asyncio.Lock())
        async with lock:
            session = self.get(task_id)
            if session is None:
                dead = self._sessions.pop(task_id, None)
                if dead is not None:  # its Chromium died: what is left of it goes first
                    await dead.close()
                session = BrowserSession(
                    self.config,
                    task_id=task_id,
                    workspace=self.workspace,
                    sandbox=self.sandbox,
                    egress=self.egress,
                )
                await session.start()
                self._sessions[task_id] = session
                log.info("browser.session_started", task_id=task_id, pid=session.pid)
            return session

    async def end(self, task_id: str) -> None:
        """Close the task's browser, if it opened one (the task has ended)."""
        self._starting.pop(task_id, None)
        session = self._sessions.pop(task_id, None)
        if session is not None:
            await session.close()
            log.info("browser.session_closed", task_id=task_id)

    async def stop(self) -> None:
        """Close every browser (Steward is stopping)."""
        await asyncio.gather(*(self.end(task_id) for task_id in list(self._sessions)))

    def __len__(self) -> int:
        return len(self._sessions)
