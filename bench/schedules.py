"""Schedules: a simulated week on the SimClock with the scripted model.

Ten schedules are made with `/schedule` through the assembled App (dispatcher, agent,
guardian, sandboxed check commands, the scripted model over HTTP, files in a temporary
data dir): cron, interval, one-shots, "only if" checks whose output changes and whose
output does not, one whose model fails 6 times and then recovers, one that reports the
same thing all week. In the middle of the week Steward is stopped for 6 hours and
started again.

Reported, against a naive scheduler in the same run (every due time runs the model once
and posts what it says): model calls, messages posted vs runs, "nothing to report" posts,
the same report posted twice within 24 h, failure/recovery notices, and catch-up runs
after the outage (per schedule). Goals (the issue): unchanged checks cost 0 model calls,
no "nothing to report" post, no repeat within 24 h, exactly one failure and one recovery
notice, one catch-up run per schedule.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

START = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)  # a Monday
DAYS = 7
OUTAGE_AT = timedelta(days=3, hours=12)
OUTAGE = timedelta(hours=6)

SCHEDULES = [
    ("daily", '"0 9 * * 1-5" summarise yesterday\'s failed tasks [daily]'),
    ("disk-model", "every 1h check disk usage of / and tell me only if above 90% [disk-model]"),
    ("disk-check", 'every 1h --check "cat disk.txt" tell me only if above 90% [disk-check]'),
    ("ci-check", 'every 30m --check "cat ci.txt" tell me only if a CI job fails [ci-check]'),
    ("queue", "every 2h report the queue length [queue]"),
    ("remind", "in 20m remind me to rotate the key [remind]"),
    ("friday", "at 2026-12-04 16:00 remind me to write the weekly notes [friday]"),
    ("flaky", "every 1h summarise the error log [flaky]"),
    (
        "certs-check",
        'every 1h --check "cat certs.txt" tell me only if a cert expires [certs-check]',
    ),
    ("digest", "every 6h digest the new issues [digest]"),
]


class Model:
    """The scripted model's answers per schedule (found by the tag in the task)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.clock: Any = None

    def __call__(self, body: dict[str, Any]) -> Any:
        from tests.fakes.llm import Reply

        user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        tag = next((t for t, _ in SCHEDULES if f"[{t}]" in user), "?")
        self.calls[tag] += 1
        n = self.calls[tag]
        day = int((self.clock.now() - START.timestamp()) // 86400)
        if tag == "daily":
            return Reply.text(f"Day {day}: {n} task(s) failed yesterday, see the episodes.")
        if tag == "disk-model":
            if n == 50:
                return Reply.text("Disk / is at 93%: /var/log grew by 12 GB.")
            return Reply.text(f"NOTHING TO REPORT: disk / at {40 + n % 5}%.")
        if tag in ("disk-check", "certs-check"):
            return Reply.text("NOTHING TO REPORT: all within limits.")
        if tag == "ci-check":
            if "FAILED" in user:
                return Reply.text("CI job `integration` fails since the last run.")
            return Reply.text("NOTHING TO REPORT: every CI job is green.")
        if tag == "queue":
            return Reply.text("The queue holds 0 jobs.")
        if tag == "flaky" and n <= 6:
            return Reply.error(500, message="upstream model unavailable")
        if tag == "flaky":
            return Reply.text(f"Error log, day {day}: 2 new warnings.")
        if tag == "digest":
            return Reply.text(f"Digest {n}: {n + 2} new issues.")
        return Reply.text(f"Reminder ({tag}): done as asked, run {n}.")


async def week() -> dict[str, Any]:
    from adapters.replay import ReplayChannel
    from bot.app import App
    from config.settings import load_settings
    from core.access import Rules
    from core.clock import SimClock
    from core.events import Message
    from tests.fakes.llm import ScriptedLLM

    tmp = Path(tempfile.mkdtemp(prefix="bench-schedules-"))
    clock = SimClock(start=START.timestamp())
    model = Model()
    model.clock = clock
    outcomes: list[tuple[float, str, Any]] = []
    async with ScriptedLLM() as llm:
        llm.responder = model
        settings = load_settings(
            env={
                "STEWARD_MODEL": f"openai/{llm.model_id}",
                "STEWARD_API_BASE": llm.base_url,
                "STEWARD_DATA_DIR": str(tmp / "data"),
                "STEWARD_WORKSPACE": str(tmp / "ws"),
                "STEWARD_LLM_RETRIES": "0",
                "STEWARD_LOCAL_MODEL": "off",
            },
            cwd=tmp,
        )
        ws = settings.workspace
        ws.mkdir(parents=True, exist_ok=True)
        for name, text in (("disk.txt", "41%\n"), ("ci.txt", "all green\n"), ("certs.txt", "ok\n")):
            (ws / name).write_text(text)
        channel = ReplayChannel(lambda: clock.elapsed, lambda _item: None)

        async def boot() -> tuple[Any, Any]:
            app = App(settings, clock=clock, subcommand="replay")
            app.access.rules["replay"] = Rules(open=True)
            app.schedules.on_outcome = lambda sid, o: outcomes.append((clock.now(), sid, o))
            [outbox] = await app.start([channel])
            return app, outbox

        app, outbox = await boot()
        for _, text in SCHEDULES:
            await app.dispatcher.handle(
                Message("replay", "ops", "alice", f"/schedule {text}"), outbox
            )
        tags = [tag for tag, _ in SCHEDULES]
        ids = dict(zip(app.schedules.schedules, tags, strict=True))
        made = len(channel.outbound)
        t0 = time.perf_counter()
        red, green = "integration FAILED\n", "all green\n"
        timeline = [  # (when, what): CI turns red twice (green again 2 h later); an outage
            (timedelta(days=1, hours=10), red),
            (timedelta(days=1, hours=12), green),
            (OUTAGE_AT, "outage"),
            (timedelta(days=5, hours=3), red),
            (timedelta(days=5, hours=5), green),
        ]
        restart_at = 0.0
        for when, what in timeline:
            await clock.advance_to((START + when).timestamp())
            if what != "outage":
                (ws / "ci.txt").write_text(what)
                continue
            await app.stop()  # Steward is down for OUTAGE: the clock moves, nothing runs
            await clock.advance_to((START + OUTAGE_AT + OUTAGE).timestamp())
            restart_at = clock.now()
            app, outbox = await boot()
        await clock.advance_to((START + timedelta(days=DAYS)).timestamp())
        await app.stop()
        wall = time.perf_counter() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    posted = [o for o in channel.outbound[made:] if o["kind"] == "message"]
    return {
        "ids": ids,
        "outcomes": outcomes,
        "posted": posted,
        "model_requests": len(llm.requests),
        "restart_at": restart_at,
        "wall": wall,
    }


def main() -> None:
    from bot.logs import configure_logging

    configure_logging("warning", "console")
    r = asyncio.run(week())
    ids, outcomes = r["ids"], r["outcomes"]
    runs = Counter(ids[sid] for _, sid, o in outcomes if o.result not in ("outside_hours_skipped",))
    model_runs = Counter(ids[sid] for _, sid, o in outcomes if o.model_calls)
    results: dict[str, Counter[str]] = defaultdict(Counter)
    for _, sid, o in outcomes:
        results[ids[sid]][o.result] += 1
    naive = sum(runs.values())  # a naive scheduler asks the model at every due time
    texts = [p["text"] for p in r["posted"]]
    nothing_posts = sum("NOTHING TO REPORT" in t.upper() for t in texts)
    # the same report twice within 24 h (per schedule)
    seen: dict[str, float] = {}
    repeats = 0
    for p in r["posted"]:
        body = p["text"].split("] ", 1)[-1]
        if body in seen and p["t"] - seen[body] < 86400:
            repeats += 1
        seen[body] = p["t"]
    failure_notices = sum(t.startswith("Schedule s-") and " failed:" in t for t in texts)
    recoveries = sum(t.startswith("Schedule s-") and "works again (after" in t for t in texts)
    catch_up = Counter(ids[sid] for at, sid, _ in outcomes if abs(at - r["restart_at"]) < 1)
    unchanged_checks = {
        tag: (runs[tag], model_runs[tag]) for tag in ("disk-check", "certs-check", "ci-check")
    }
    print(f"simulated {DAYS} days ({len(ids)} schedules) in {r['wall']:.1f} s wall")
    print(
        f"runs: {naive}; model calls (requests): {r['model_requests']} vs naive {naive} "
        f"({r['model_requests'] / max(1, naive):.1%})"
    )
    for tag, (n, m) in unchanged_checks.items():
        print(f"  {tag}: {n} runs, {m} with a model call")
    print(f"messages posted: {len(texts)} for {naive} runs (naive: {naive})")
    print(f"'nothing to report' posts: {nothing_posts}; same report within 24 h: {repeats}")
    print(f"failure notices: {failure_notices}; recovery notices: {recoveries}")
    late = {tag: catch_up.get(tag, 0) for tag in ids.values()}
    print(f"catch-up runs right after the 6 h outage, per schedule: {late}")
    for tag in ids.values():
        print(f"  {tag:12s} {dict(results[tag])}")


if __name__ == "__main__":
    main()
