"""What the dispatcher needs from its optional collaborators, as Protocols.

Why Protocols rather than the concrete classes: the dispatcher is wired with the
guardian, the learner, proactive help and the task journal in `bot/app.py`, and with
smaller stand-ins (or None) elsewhere; naming only the methods it calls keeps that
contract visible and checked, where `Any` let any typo through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from core.agent import TaskResult
from core.events import Channel, Message
from core.interrupted import Answer as InterruptedAnswer
from core.policy import OverlayView
from core.proactive import Status as ProactiveStatus


class PolicyOverlay(Protocol):
    """The guardian's always-allow overlay, for /policy."""

    def overlay_view(self) -> OverlayView: ...

    def revoke(self, rule_id: str) -> bool: ...


class LearnerHooks(Protocol):
    """core/learning.Learner: credited with every finished task."""

    async def observe(self, episode: Any) -> list[str]: ...


class _Now(Protocol):
    def now(self) -> float: ...


class _ProactiveSettings(Protocol):
    @property
    def quick_cancel(self) -> float: ...

    @property
    def timezone(self) -> str: ...


class ProactiveHooks(Protocol):
    """core/proactive.Proactive: the signals it reads and what /proactive reports and sets."""

    @property
    def clock(self) -> _Now: ...

    @property
    def config(self) -> _ProactiveSettings: ...

    def user_key(self, channel: str, user: str) -> str: ...

    async def on_message(self, channel: Channel, msg: Message) -> None: ...

    async def on_quick_edit(self, channel: Channel, user: str, conversation: str) -> None: ...

    async def on_answer(self, user_key: str, sid: str, accepted: bool) -> None: ...

    async def on_task_finished(
        self, channel: Channel, msg: Message, result: TaskResult
    ) -> None: ...

    async def on_task_cancelled(
        self, channel: Channel, msg: Message, started_at: float
    ) -> None: ...

    def status(self, channel: Channel, user: str, conversation: str) -> ProactiveStatus: ...

    async def set_off(self, channel: Channel, user: str, off: bool) -> None: ...

    async def set_quiet(self, channel: Channel, user: str, spec: str) -> str: ...


class _Stopping(Protocol):
    @property
    def stopping(self) -> bool: ...


class InterruptedTasks(Protocol):
    """core/interrupted.Interrupted: "Run it again?" about tasks a previous run left."""

    @property
    def journal(self) -> _Stopping: ...

    async def answer(self, value: str, user: str) -> InterruptedAnswer: ...

    async def recover(self, channels: dict[str, Channel]) -> int: ...

    # A message queued behind a running task: journaled, named, closed, resumed.
    def bind(self, resume: Callable[[Channel, Message, str], Awaitable[None]]) -> None: ...

    async def accept(self, channel: str, msg: Message, text: str) -> str | None: ...

    def taken(self, record_id: str, task_id: str) -> None: ...

    def settle(self, record_id: str) -> None: ...
