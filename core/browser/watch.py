"""The egress policy as the browser's proxy uses it, remembering what it refused.

Why: the proxy refuses a page's request to this machine or a private network without a
word to anyone but the page (which sees a failed load). The model should know that part
of the page was kept from loading, and why, so each browser tool's answer names the
refusals since the last one. The rules are the owner's (`egress_allow`, Steward's own
endpoints, read live), unchanged.
"""

from __future__ import annotations

from core.egress import EgressPolicy, EgressRefused

#: Refusals kept between two tool answers (a page retrying in a loop must not grow it).
MAX_KEPT = 50


class WatchedPolicy(EgressPolicy):
    """`base`'s rules; `take()` returns (and forgets) what was refused since last asked."""

    def __init__(self, base: EgressPolicy) -> None:
        super().__init__((entry.text for entry in base.allow), more_protected=base.endpoints)
        self._refused: dict[tuple[str, int], str] = {}

    async def resolve(self, host: str, port: int, lookup_timeout: float | None = None) -> list[str]:
        try:
            return await super().resolve(host, port, lookup_timeout)
        except EgressRefused as exc:
            if len(self._refused) < MAX_KEPT:
                self._refused.setdefault((exc.host, exc.port), exc.reason)
            raise

    def take(self) -> list[str]:
        """One line per refused host:port since the last call."""
        lines = [
            f"{f'[{host}]' if ':' in host else host}:{port} ({why})"
            for (host, port), why in self._refused.items()
        ]
        self._refused.clear()
        return lines
