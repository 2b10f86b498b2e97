"""What the model client asks before and tells after each call: the spend seam.

Why a protocol here: the client (core/model/client.py) is the one door every model
call goes through, so it is where a cap can be enforced by code and every call's
usage recorded; what records and what caps (core/spend/) is wired in by the app,
and a client without a meter (doctor's ping, a worker process) just calls.
"""

from __future__ import annotations

from typing import Protocol


class Meter(Protocol):
    async def admit(self) -> None:
        """Before a model call starts: raise `core.model.errors.LLMError` (kind
        "budget") when a cap that covers the current payer is reached."""

    def record(
        self,
        model: str,
        tokens_in: int,
        tokens_out: int,
        cost_usd: float | None,
        *,
        kind: str = "chat",
    ) -> None:
        """After a call answered: its usage, as the provider reported it, for the
        current payer (core/spend/payer.py). Must not block (no I/O on the loop)."""
