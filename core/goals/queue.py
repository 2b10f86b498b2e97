"""The durable goal queue: goals and their tasks as Markdown files in the data dir.

Why files a person can read: a goal runs unattended, so what it planned, why, what it
spent and what it produced must be inspectable (and `git log`-able) without Steward
running. Layout:

    goals/<goal id>.md        front matter (owner, where, budgets, spend, state,
                              breaker counters) + the goal text as the person wrote it
    tasks/<goal id>-t<n>.md   front matter (goal, parent, why, value, urgency, estimated
                              cost, state, attempts, the tool calls it started, result)
                              + the task text
    goals/spend.md            today's spend of all goals (the daily budgets)
    goals/control/*.md        stop/pause requests from `steward goal …` while Steward runs

Definition changes and task endings are commits (one per step of a goal, batched);
running state (spend after each model call, a task's tool log as it runs) is a plain
atomic write, like episodes: a kill -9 leaves the old file or the new one
(memory.atomic). A malformed file is reported by path and skipped, never overwritten.

Ranking (`score`): value × urgency / estimated cost, where value and urgency are the
model's 1-10 estimates for the task and the cost is its estimated tokens in thousands
(at least 1). The highest score runs first; ties go to the older task. Every N tasks
the engine re-reads the goal and asks for fresh values (core/goals/engine.py).

The drift guard's near-duplicate test (`similarity`) is the larger of the word-set
Jaccard index and difflib's ratio of the normalised texts (lower case, punctuation and
filler words removed): "Write the intro section" and "write intro section." match.
Numbers must agree for the difflib part to count ("section 2" does not repeat
"section 3"; then only the Jaccard index counts).
"""

from __future__ import annotations

import difflib
import re
import secrets
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from core.tools.base import READ_ONLY_TOOLS
from memory.atomic import atomic_write_bytes
from memory.store import DataStore, parse, render

log = structlog.get_logger("steward.goals")

GOALS = "goals"
TASKS = "tasks"
SPEND_FILE = f"{GOALS}/spend.md"
CONTROL = f"{GOALS}/control"
_GOAL_ID = re.compile(r"^g(\d+)$")
_TASK_ID = re.compile(r"^(g\d+)-t(\d+)$")

#: Goal states (the dashboard contract names them).
ACTIVE, PAUSED, STOPPED, DONE, FAILED, BUDGET = (
    "active",
    "paused",
    "stopped",
    "done",
    "failed",
    "budget",
)
GOAL_STATES = (ACTIVE, PAUSED, STOPPED, DONE, FAILED, BUDGET)
ENDED = (STOPPED, DONE, FAILED, BUDGET)
#: Task states.
QUEUED, RUNNING, WAITING, T_DONE, T_FAILED, DROPPED = (
    "queued",
    "running",
    "waiting-approval",
    "done",
    "failed",
    "dropped",
)
TASK_STATES = (QUEUED, RUNNING, WAITING, T_DONE, T_FAILED, DROPPED)


def now_iso(dt: datetime | None = None) -> str:
    return (dt or datetime.now(UTC)).isoformat(timespec="seconds")


@dataclass(slots=True)
class Goal:
    """One goal: what a person asked for, where, as whom, under which budgets."""

    id: str
    text: str
    owner: str
    channel: str
    conversation: str
    state: str = ACTIVE
    thread: str | None = None
    direct: bool = True
    space: str | None = None
    tokens_budget: int | None = None
    usd_budget: float | None = None
    until: str | None = None
    created: str = ""
    ended: str | None = None
    #: Why it ended or was paused (a person, a budget, a breaker, done).
    ended_reason: str | None = None
    # ── spend and counters (running state) ──
    tokens_spent: int = 0
    usd_spent: float = 0.0
    model_calls: int = 0
    #: The first plan was made (tasks proposed).
    planned: bool = False
    next_task: int = 1
    tasks_since_review: int = 0
    #: Tasks in a row that ended without an accepted result.
    no_progress: int = 0
    #: Tasks in a row whose run failed (an error, a gate, a step limit).
    failures_in_row: int = 0
    #: The model judged the goal met (with the last accepted task).
    met: bool = False
    last_progress: str | None = None

    @property
    def relpath(self) -> str:
        return f"{GOALS}/{self.id}.md"

    @property
    def key(self) -> str:
        """The conversation queue's key (bot/dispatcher.Dispatcher.key)."""
        return f"{self.channel}:{self.conversation}"

    def front_matter(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("text")
        return data


@dataclass(slots=True)
class GoalTask:
    """One task of a goal's queue."""

    id: str
    goal: str
    text: str
    why: str = ""
    parent: str | None = None
    value: float = 5.0
    urgency: float = 5.0
    #: Estimated tokens.
    cost: int = 5000
    state: str = QUEUED
    attempts: int = 0
    result: str = ""
    #: Why it was dropped or failed.
    reason: str = ""
    created: str = ""
    ended: str | None = None
    tokens: int = 0
    #: Every tool call the task started ("name: summary"), written before it runs: a
    #: restart knows what may already have happened.
    tools: list[str] = field(default_factory=list)
    #: Files it wrote and links it found (the final report lists them).
    produced: list[str] = field(default_factory=list)

    @property
    def relpath(self) -> str:
        return f"{TASKS}/{self.id}.md"

    @property
    def title(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return first if len(first) <= 80 else first[:77] + "..."

    def front_matter(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("text")
        return data

    def effects(self) -> list[str]:
        """The tool calls it started that may have changed something."""
        return [t for t in self.tools if t.partition(":")[0].strip() not in READ_ONLY_TOOLS]


def score(task: GoalTask) -> float:
    """value × urgency / estimated cost in thousands of tokens (at least 1)."""
    return task.value * task.urgency / max(task.cost / 1000.0, 1.0)


def rank(tasks: list[GoalTask]) -> list[GoalTask]:
    """Queued tasks, best first (ties: the older task first)."""
    queued = [t for t in tasks if t.state == QUEUED]
    return sorted(queued, key=lambda t: (-score(t), _task_order(t.id)))


_FILLER = frozenset(
    "a an the of to in on for and or with from by at into this that these those it its "
    "is be are was all any some please then also".split()
)


def normalise(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return " ".join(w for w in words if w not in _FILLER)


def similarity(a: str, b: str) -> float:
    """0..1: how much two task texts say the same (see the module docstring)."""
    na, nb = normalise(a), normalise(b)
    if not na or not nb:
        return 0.0
    sa, sb = set(na.split()), set(nb.split())
    jaccard = len(sa & sb) / len(sa | sb)
    if {w for w in sa if _ANCHOR.search(w)} != {w for w in sb if _ANCHOR.search(w)}:
        return jaccard  # "section 2" is not "section 3": numbers must agree for a repeat
    return max(jaccard, difflib.SequenceMatcher(None, na, nb).ratio())


_ANCHOR = re.compile(r"\d")


def _fields(cls: Any, meta: dict[str, Any]) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in meta.items() if k in known}


def goal_from(meta: dict[str, Any], body: str) -> Goal:
    data = _fields(Goal, meta)
    data["text"] = body.strip()
    for key in ("id", "owner", "channel", "conversation"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"missing or empty `{key}`")
    if data.get("state", ACTIVE) not in GOAL_STATES:
        raise ValueError(f"`state` must be one of {', '.join(GOAL_STATES)}")
    return Goal(**data)


def task_from(meta: dict[str, Any], body: str) -> GoalTask:
    data = _fields(GoalTask, meta)
    data["text"] = body.strip()
    for key in ("id", "goal"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"missing or empty `{key}`")
    if data.get("state", QUEUED) not in TASK_STATES:
        raise ValueError(f"`state` must be one of {', '.join(TASK_STATES)}")
    for key in ("tools", "produced"):
        if not isinstance(data.get(key, []), list):
            data[key] = []
    return GoalTask(**data)


@dataclass(slots=True)
class DaySpend:
    day: str = ""
    tokens: int = 0
    usd: float = 0.0


class GoalQueue:
    """Reads the files on `load` (a person may have edited one); writes through the
    DataStore (redacted, atomic, committed when asked)."""

    def __init__(self, data_dir: Path, store: DataStore | None = None) -> None:
        self.data_dir = data_dir
        self.store = store or DataStore(data_dir)
        self.goals: dict[str, Goal] = {}
        self.tasks: dict[str, GoalTask] = {}
        self.spend = DaySpend()
        self.problems: list[str] = []

    # ── reading ──
    def load(self) -> None:
        self.goals, self.tasks, self.problems = self.read()
        self.spend = self._read_spend()

    def read(self) -> tuple[dict[str, Goal], dict[str, GoalTask], list[str]]:
        """Every readable goal and task as the files are now, and a line per broken file
        (`load` keeps them; a cluster's timers compare them with memory: `refresh`)."""
        goals: dict[str, Goal] = {}
        tasks: dict[str, GoalTask] = {}
        problems: list[str] = []
        gdir, tdir = self.data_dir / GOALS, self.data_dir / TASKS
        for path in sorted(gdir.glob("g*.md"), key=lambda p: _goal_order(p.stem)):
            if not _GOAL_ID.match(path.stem):
                continue
            try:
                meta, body = parse(path.read_text(encoding="utf-8"), path)
                g = goal_from(meta, body)
                goals[g.id] = g
            except (OSError, ValueError, TypeError) as exc:
                log.warning("goals.malformed", path=str(path), error=str(exc))
                problems.append(f"{path}: {exc}")
        for path in sorted(tdir.glob("g*-t*.md"), key=lambda p: _task_order(p.stem)):
            try:
                meta, body = parse(path.read_text(encoding="utf-8"), path)
                t = task_from(meta, body)
                tasks[t.id] = t
            except (OSError, ValueError, TypeError) as exc:
                log.warning("goals.task_malformed", path=str(path), error=str(exc))
                problems.append(f"{path}: {exc}")
        return goals, tasks, problems

    def reread_goal(self, gid: str) -> Goal | None:
        """The goal's file as it is now (a person may have edited the text)."""
        path = self.data_dir / GOALS / f"{gid}.md"
        try:
            meta, body = parse(path.read_text(encoding="utf-8"), path)
            return goal_from(meta, body)
        except (OSError, ValueError, TypeError) as exc:
            log.warning("goals.reread_failed", path=str(path), error=str(exc))
            return None

    def _read_spend(self) -> DaySpend:
        path = self.data_dir / SPEND_FILE
        if not path.is_file():
            return DaySpend()
        try:
            meta, _ = parse(path.read_text(encoding="utf-8"), path)
            return DaySpend(
                str(meta.get("day", "")),
                int(meta.get("tokens", 0) or 0),
                float(meta.get("usd", 0.0) or 0.0),
            )
        except (OSError, ValueError, TypeError) as exc:
            log.warning("goals.spend_malformed", path=str(path), error=str(exc))
            return DaySpend()

    def tasks_of(self, gid: str) -> list[GoalTask]:
        return sorted(
            (t for t in self.tasks.values() if t.goal == gid), key=lambda t: _task_order(t.id)
        )

    def next_goal_id(self) -> str:
        highest = 0
        for gid in self.goals:
            m = _GOAL_ID.match(gid)
            if m:
                highest = max(highest, int(m.group(1)))
        gdir = self.data_dir / GOALS
        if gdir.is_dir():
            for path in gdir.glob("g*.md"):
                m = _GOAL_ID.match(path.stem)
                if m:
                    highest = max(highest, int(m.group(1)))
        return f"g{highest + 1}"

    def new_task(self, goal: Goal, text: str, **kw: Any) -> GoalTask:
        tid = f"{goal.id}-t{goal.next_task}"
        goal.next_task += 1
        task = GoalTask(id=tid, goal=goal.id, text=text.strip(), **kw)
        self.tasks[tid] = task
        return task

    # ── writing ──
    async def save_goal(self, goal: Goal, message: str | None = None) -> None:
        self.goals[goal.id] = goal
        await self.store.awrite(goal.relpath, goal.front_matter(), goal.text + "\n", commit=message)

    async def save_task(self, task: GoalTask, message: str | None = None) -> None:
        self.tasks[task.id] = task
        await self.store.awrite(task.relpath, task.front_matter(), task.text + "\n", commit=message)

    async def save_spend(self) -> None:
        s = self.spend
        body = "Today's spend of all goals (the daily budgets: goal_day_max_tokens/usd).\n"
        await self.store.awrite(
            SPEND_FILE, {"day": s.day, "tokens": s.tokens, "usd": round(s.usd, 6)}, body
        )

    async def commit(self, paths: list[str], message: str) -> None:
        await self.store.acommit(paths, message)

    # ── stop/pause requests from another process ──
    def control_requests(self) -> list[tuple[Path, dict[str, Any]]]:
        """Requests `steward goal stop|pause` and `steward stop --all` left while this
        process held the data dir (read before every goal model call: one listdir)."""
        cdir = self.data_dir / CONTROL
        try:
            paths = sorted(cdir.glob("*.md"))
        except OSError:
            return []
        out = []
        for path in paths:
            try:
                meta, _ = parse(path.read_text(encoding="utf-8"), path)
            except (OSError, ValueError):
                meta = {}
            out.append((path, meta))
        return out


def request_control(data_dir: Path, goal: str, action: str, by: str) -> Path:
    """Leave a stop/pause request for the Steward that holds the data dir (no lock, no
    commit: that process applies it before its next model call and commits the result)."""
    when = datetime.now(UTC)
    path = data_dir / CONTROL / f"{when:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}.md"
    meta = {"goal": goal, "action": action, "by": by, "at": now_iso(when)}
    text = render(meta, f"{action} {goal} requested by {by}\n")
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


def _goal_order(stem: str) -> tuple[int, str]:
    m = _GOAL_ID.match(stem)
    return (int(m.group(1)) if m else 1 << 30, stem)


def _task_order(stem: str) -> tuple[int, int, str]:
    m = _TASK_ID.match(stem)
    if not m:
        return (1 << 30, 0, stem)
    return (_goal_order(m.group(1))[0], int(m.group(2)), stem)


__all__ = [
    "ACTIVE",
    "BUDGET",
    "DONE",
    "DROPPED",
    "ENDED",
    "FAILED",
    "PAUSED",
    "QUEUED",
    "RUNNING",
    "STOPPED",
    "T_DONE",
    "T_FAILED",
    "WAITING",
    "DaySpend",
    "Goal",
    "GoalQueue",
    "GoalTask",
    "rank",
    "request_control",
    "score",
    "similarity",
]
