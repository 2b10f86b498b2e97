"""`steward replay FILE`: a scenario through the real dispatcher on a simulated clock.

Each line is delivered at its simulated time `t`; between lines the clock fires
whatever is due (approval expiry, backoff) without sleeping, and waits until every
task has finished or is blocked on a person or on time. Output: one JSON line per
outbound action.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TextIO

from adapters.replay import ReplayChannel
from bot.app import App
from config.settings import Settings
from core.access import Rules
from core.clock import SimClock


async def run_replay(
    settings: Settings, lines: Iterable[str], out: TextIO, *, drain: float = 3600.0
) -> int:
    """Replay; returns the number of outbound actions printed."""
    clock = SimClock()
    app = App(settings, clock=clock, subcommand="replay")
    # Scenario users are allowed until the scenario sets access rules itself.
    app.access.rules["replay"] = Rules(open=True)

    def emit(item: dict) -> None:
        out.write(json.dumps(item, ensure_ascii=False) + "\n")
        out.flush()

    channel = ReplayChannel(lambda: clock.elapsed, emit)
    [outbox] = await app.start([channel])
    last_t = 0.0
    try:
        for lineno, raw in enumerate(lines, start=1):
            parsed = channel.parse(raw, lineno, last_t)
            if parsed is None:
                continue
            t = parsed.t
            if t < last_t:
                channel.warn("", f"line {lineno}: t={t} is earlier than {last_t}; delivered now")
                t = last_t
            await clock.advance_to(clock.start + t)
            last_t = t
            if parsed.access is not None:
                app.access.rules["replay"] = Rules(
                    allowed={str(u) for u in parsed.access.get("allowed_users", [])},
                    admins={str(u) for u in parsed.access.get("admins", [])},
                )
                continue
            if parsed.restart:
                rules = app.access.rules["replay"]
                await app.stop()
                if parsed.down:  # Steward is down meanwhile: the clock moves, nothing runs
                    last_t = t + parsed.down
                    await clock.advance_to(clock.start + last_t)
                app = App(settings, clock=clock, subcommand="replay")
                app.access.rules["replay"] = rules
                [outbox] = await app.start([channel])
                await clock.activity.wait_idle()
                continue
            if parsed.event is None:
                channel.warn(parsed.conversation, parsed.warning)
                continue
            await app.dispatcher.handle(parsed.event, outbox)
            await clock.activity.wait_idle()
        await clock.advance_to(clock.start + last_t + drain)
    finally:
        await app.stop()
    return len(channel.outbound)
