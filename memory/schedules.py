"""Schedules on disk: <data dir>/schedules/<id>.md, front matter + the task text.

Why files and not APScheduler's job store: a job store pickles callables (or keeps
rows in a database a person can't read), while Steward's memory is Markdown a person
can open, edit and `git log`. So each schedule is one file: what it is (when, what,
where, for whom) and its run state (next run, the last check's output hash, what was
posted recently, failures, today's tokens). Changes of the definition (added, paused,
resumed, deleted) are commits; run-state updates are plain atomic writes, like
episodes (one commit per run would bury the history). A kill -9 leaves the old file
or the new one (memory.atomic). Active hours per conversation live in
`schedules/hours.md`.

A person may edit a file by hand (the text, the timezone, a token ceiling); the
engine reads the files again at each start. A malformed file is reported by path
and skipped, never overwritten.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import structlog

from memory.store import DataStore, parse

log = structlog.get_logger("steward.schedules")

FOLDER = "schedules"
HOURS_FILE = f"{FOLDER}/hours.md"
_ID = re.compile(r"^s-(\d+)$")
KINDS = ("cron", "interval", "once")
OUTSIDE = ("defer", "skip")


@dataclass(slots=True)
class Schedule:
    """One schedule. Times are ISO 8601 strings with an offset (readable in the file)."""

    id: str
    kind: str  # cron | interval | once
    #: As the person wrote it: a crontab line, an interval ("1h30m") or a time.
    spec: str
    text: str
    channel: str
    conversation: str
    user: str
    timezone: str = "UTC"
    thread: str | None = None
    direct: bool = True
    #: The platform's workspace/guild/team of the conversation (access rules may name it).
    space: str | None = None
    #: Interval length in seconds (kind interval).
    every: float = 0.0
    #: When an interval counts from; the one time of a one-shot.
    anchor: str = ""
    #: A shell command run first; unchanged output (and exit code) ends the run
    #: without any model call.
    check: str = ""
    #: "only if …": the task ends with a verdict and "nothing to report" posts nothing.
    quiet: bool = False
    #: A run due outside the conversation's active hours: defer (to the window's start)
    #: or skip.
    outside: str = "defer"
    max_tokens_run: int = 0
    max_tokens_day: int = 0
    paused: bool = False
    #: A one-shot that ran (kept for the record; `list` shows it as done).
    done: bool = False
    created: str = ""
    # ── run state ──
    next_run: str | None = None
    #: The due time of a run that started and has not finished (set before it starts,
    #: so a kill -9 during it is seen at the next start: one catch-up run).
    running: str | None = None
    last_run: str | None = None
    last_result: str = ""
    runs: int = 0
    model_runs: int = 0
    posts: int = 0
    check_hash: str = ""
    #: Content hash -> when it was posted (kept for the repeat window).
    sent: dict[str, str] = field(default_factory=dict)
    failures: int = 0
    failure_notice: bool = False
    day: str = ""
    day_tokens: int = 0
    day_notice: bool = False

    @property
    def relpath(self) -> str:
        return f"{FOLDER}/{self.id}.md"

    def front_matter(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("text")
        return data


def schedule_from(meta: dict[str, Any], body: str) -> Schedule:
    known = {f.name for f in fields(Schedule)}
    data = {k: v for k, v in meta.items() if k in known}
    data["text"] = body.strip()
    for key in ("id", "kind", "spec", "channel", "conversation", "user"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"missing or empty `{key}`")
    if data["kind"] not in KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(KINDS)}, not {data['kind']!r}")
    if data.get("outside", "defer") not in OUTSIDE:
        raise ValueError(f"`outside` must be defer or skip, not {data['outside']!r}")
    if not isinstance(data.get("sent", {}), dict):
        data["sent"] = {}
    return Schedule(**data)


class ScheduleStore:
    """Reads the files fresh on `load` (a person may have edited one); writes through the
    DataStore (redacted, atomic, committed when a message is given)."""

    def __init__(self, data_dir: Path, store: DataStore | None = None) -> None:
        self.data_dir = data_dir
        self.root = data_dir / FOLDER
        self.store = store or DataStore(data_dir)

    def load(self) -> tuple[list[Schedule], list[str]]:
        """Every readable schedule (ordered by id), plus a problem line per broken file."""
        found: list[Schedule] = []
        problems: list[str] = []
        if not self.root.is_dir():
            return found, problems
        for path in sorted(self.root.glob("s-*.md"), key=_id_order):
            try:
                meta, body = parse(path.read_text(encoding="utf-8"), path)
                found.append(schedule_from(meta, body))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("schedules.malformed", path=str(path), error=str(exc))
                problems.append(f"{path}: {exc}")
        return found, problems

    def next_id(self) -> str:
        highest = 0
        if self.root.is_dir():
            for path in self.root.glob("s-*.md"):
                m = _ID.match(path.stem)
                if m:
                    highest = max(highest, int(m.group(1)))
        return f"s-{highest + 1}"

    async def save(self, schedule: Schedule, message: str | None = None) -> Path:
        """Write (and commit when `message` is given)."""
        return await self.store.awrite(
            schedule.relpath, schedule.front_matter(), schedule.text + "\n", commit=message
        )

    async def delete(self, schedule: Schedule, message: str) -> bool:
        return await self.store.aremove(schedule.relpath, commit=message)

    def hours(self) -> dict[str, dict[str, str]]:
        """Active hours per conversation key (`channel:conversation`)."""
        path = self.data_dir / HOURS_FILE
        if not path.is_file():
            return {}
        try:
            meta, _ = parse(path.read_text(encoding="utf-8"), path)
        except (OSError, ValueError) as exc:
            log.warning("schedules.hours_malformed", path=str(path), error=str(exc))
            return {}
        return {
            str(k): {"hours": str(v.get("hours", "")), "timezone": str(v.get("timezone", "UTC"))}
            for k, v in meta.items()
            if isinstance(v, dict)
        }

    async def save_hours(self, hours: dict[str, dict[str, str]], message: str) -> None:
        body = "Active hours per conversation (`/schedule hours`); runs due outside them wait.\n"
        await self.store.awrite(HOURS_FILE, dict(sorted(hours.items())), body, commit=message)


def _id_order(path: Path) -> tuple[int, str]:
    m = _ID.match(path.stem)
    return (int(m.group(1)) if m else 1 << 30, path.stem)


__all__ = ["KINDS", "OUTSIDE", "Schedule", "ScheduleStore", "schedule_from"]
