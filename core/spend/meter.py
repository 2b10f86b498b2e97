"""The app's meter: every model call the client makes becomes a line of the usage ledger.

Why here and not in the client: the client (core/model/client.py) only knows a call
happened and what the server said it used; who it was for is the context's payer
(core/spend/payer.py), and where it goes is the app's ledger (memory/usage.py). The
embedder (memory/), which may not import core, is handed `record_embedding` as a plain
callback by the app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from core.spend import payer as payers
from memory.usage import UsageRow


class Sink(Protocol):
    """Where rows go: memory/usage.py's `UsageLedger` (one process) or a cluster's
    (memory/cluster/usage.py); `add` does no I/O on the event loop."""

    def add(self, row: UsageRow) -> None: ...


class SpendMeter:
    """`core.model.meter.Meter`: records each call for the current payer; `caps` (the
    budgets, when set) may stop a call before it starts."""

    __slots__ = ("caps", "ledger", "now")

    def __init__(self, ledger: Sink, now: Callable[[], float], caps: Any = None) -> None:
        self.ledger = ledger
        self.now = now
        #: The budgets' object (its `admit(payer)` raises LLMError kind "budget"); None: no caps.
        self.caps = caps

    async def admit(self) -> None:
        """Before a call: the caps that cover the current payer decide."""
        if self.caps is not None:
            await self.caps.admit(payers.current())

    def record(
        self,
        model: str,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float | None,
        *,
        kind: str = "chat",
    ) -> None:
        """After a call: one ledger row for the current payer (no I/O here)."""
        p = payers.current()
        self.ledger.add(
            UsageRow(
                at=self.now(),
                model=model,
                tokens_in=int(tokens_in or 0),
                tokens_out=int(tokens_out or 0),
                cost_usd=cost_usd,
                person=p.person,
                conversation=p.conversation,
                schedule=p.schedule,
                goal=p.goal,
                purpose="embedding" if kind == "embedding" else p.purpose,
                kind=kind,
            )
        )

    def record_embedding(self, model: str, tokens: int, cost_usd: float | None) -> None:
        """The embedder's callback (memory/embedder.py `on_usage`): an embedding call's
        input tokens, for the current payer, purpose "embedding"."""
        self.record(model, tokens, 0, cost_usd, kind="embedding")
