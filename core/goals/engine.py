"""Goals: work that goes on by itself toward a goal a person set, under budgets and
circuit breakers that code enforces.

A goal (`/goal TEXT [budget 200k tokens|$2] [until DATE]`) is planned into tasks, kept
in the durable queue (core/goals/queue.py: Markdown files in the data dir), and worked
one step at a time. A step is one job of the goal's conversation queue
(core/conversations.py), so:

* it runs through the normal agent path (guardian, approvals, gates, rules, recall,
  episodes) as the person who set the goal;
* it never interleaves with another task in that conversation, and a person's message
  always goes first: a step that finds a message queued behind it steps aside and is
  queued again after it; the next step is queued only when this one has ended.

One step = the best-ranked task (value × urgency / estimated cost, core/goals/queue.py)
run by the agent, then judged: the answer gates first (a task the gates fail is a
failed task), then one model judgement against the evidence in the tool log, which
also proposes follow-ups. The **drift guard** rejects, with a reason kept in the
queue, a proposal that does not say how it serves the goal or that nearly repeats a
task already done, dropped, failed or queued. Every `goal_review_every` tasks the goal
file is read again (a person may have edited the text) and the queue re-ranked by the
model.

**Stopping is code.** Before every model call — the agent's (through
`TaskRequest.spend`) and the engine's own (plan, judge, review) — the engine checks, in
this order: stop/pause requests (chat, dashboard, or `steward goal stop` from another
process through goals/control/), the goal's state, its deadline, its token and money
budgets, today's budgets of all goals, and the token-velocity breaker. Spend is
litellm's usage and cost per call (a model litellm has no price for is priced at
`goal_usd_per_mtok`). After each task the no-progress (K tasks without an accepted
result) and consecutive-failure breakers are checked. A breaker or the day's budget
pauses the goal (a person resumes it); the goal's own budget ends it (state `budget`).
`/stop` marks the goals stopped and cancels the running task: no model call follows.

A task is tried `goal_task_retries` more times after a failed or rejected attempt;
then it is failed, and said to be in the progress and final reports.

**Restart.** Spend is written after every model call and a task's tool calls before
each runs; the task is marked running before it starts. At the next start a task that
was cut off is run again when none of the calls it started can have changed anything
(only read-only tools), and failed otherwise, with those calls in its log: it is never
run twice in effect.

**Zero idle cost.** Nothing runs, and no timer is armed, while no goal is active.

Size: the engine alone: budget checks, breakers, the drift guard and the step order
stay together because they guard every model call. Its terms are in
core/goals/terms.py, the text of what it asks the model in core/goals/prompts.py, and
the text of what it tells people in core/goals/reports.py.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog

from core.activity import RunWatch
from core.clock import Clock
from core.goals import prompts, reports
from core.goals.prompts import clamp
from core.goals.queue import (
    ACTIVE,
    BUDGET,
    DONE,
    DROPPED,
    ENDED,
    FAILED,
    PAUSED,
    QUEUED,
    RUNNING,
    STOPPED,
    T_DONE,
    T_FAILED,
    WAITING,
    Goal,
    GoalQueue,
    GoalTask,
    now_iso,
    rank,
    similarity,
)
from core.goals.terms import (
    Draft,
    GoalConfig,
    GoalError,
    GoalView,
)
from core.open_questions import IdAllocator, next_id
from core.spend import payer as payers
from core.spend.payer import paying
from core.task_set import TaskSet

#: The tools whose `path` is a file the task produced (shown under "Produced").
FILE_WRITERS = frozenset({"write_file", "edit_file"})

log = structlog.get_logger("steward.goals")


@dataclass(slots=True)
class Deps:
    """What the engine needs of the rest of Steward (core objects only)."""

    agent: Any
    llm: Any
    conversations: Any
    #: A channel (its Outbox) by name; None while it is not running here.
    channel_for: Callable[[str], Any]
    approvals: Any = None
    access: Any = None
    learner: Any = None
    #: Sees each step's progress like the dispatcher's monitor (core/activity.Activity's
    #: `observe`), so a goal's running task and its tool calls show on the dashboard.
    monitor: Callable[..., None] | None = None


class _Halt(Exception):
    """Code decided the goal cannot go on (budget, stop, breaker, deadline)."""

    def __init__(self, state: str, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


@dataclass(slots=True)
class Stats:
    """Counters the tests and the bench read (also in the log)."""

    model_calls: int = 0
    refused_calls: int = 0
    accepted: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    steps: int = 0


_URL = re.compile(r"https?://[^\s)>\]\"']+")


class GoalEngine:
    """Owns the goals of one data dir. Usable without `start` (the CLI: it only edits
    the files); `start` resumes active goals after a restart."""

    def __init__(
        self, queue: GoalQueue, clock: Clock, config: GoalConfig, deps: Deps | None = None
    ) -> None:
        self.queue = queue
        self.clock = clock
        self.config = config
        self.deps = deps
        self.stats = Stats()
        self._started = False
        self._stopping = False
        #: A cluster worker's id numbering (memory/cluster/store.py `allocate_id`): two
        #: goals made at once on two workers never share an id. None: the files'.
        self.ids: IdAllocator | None = None
        #: Goals with a step job submitted and not yet ended.
        self._submitted: set[str] = set()
        #: Goals whose step is running now -> the task it runs (None: planning/judging).
        self._running: dict[str, GoalTask | None] = {}
        #: The agent's task id of a goal's running task (for its pending approvals).
        self._agent_task: dict[str, str] = {}
        #: The asyncio task of a goal's running step (what /stop cancels).
        self._step_task: dict[str, asyncio.Task[Any] | None] = {}
        self._velocity: dict[str, deque[tuple[float, int]]] = {}
        self._subscribers: list[Callable[[GoalView], None]] = []
        self._progress_timer: Callable[[], None] | None = None
        self._posts = TaskSet("goals", activity=clock.activity)

    # ── the contract (dashboard, commands) ──
    def load(self) -> None:
        self.queue.load()

    @property
    def problems(self) -> list[str]:
        return self.queue.problems

    def now(self) -> datetime:
        return self.clock.utcnow()

    def subscribe(self, callback: Callable[[GoalView], None]) -> Callable[[], None]:
        """Called with a goal's view whenever it changes; returns the unsubscribe."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    async def views(self, include_ended: bool = False) -> list[GoalView]:
        return [
            self.view_of(g)
            for g in self.queue.goals.values()
            if include_ended or g.state not in ENDED
        ]

    async def view(self, goal_id: str) -> GoalView | None:
        g = self.queue.goals.get(goal_id.strip())
        return None if g is None else self.view_of(g)

    def view_of(self, g: Goal) -> GoalView:
        tasks = self.queue.tasks_of(g.id)
        running = next((t for t in tasks if t.state in (RUNNING, WAITING)), None)
        return GoalView(
            id=g.id,
            text=g.text,
            state=g.state,
            owner=g.owner,
            channel=g.channel,
            conversation=g.conversation,
            tokens_budget=g.tokens_budget,
            tokens_spent=g.tokens_spent,
            usd_budget=g.usd_budget,
            usd_spent=round(g.usd_spent, 6),
            tasks_done=sum(t.state == T_DONE for t in tasks),
            tasks_failed=sum(t.state == T_FAILED for t in tasks),
            tasks_queued=sum(t.state == QUEUED for t in tasks),
            running=running.title if running is not None else None,
            waiting_approval=self._waiting(g),
            created=g.created,
            until=g.until,
            ended_reason=g.ended_reason,
        )

    def _waiting(self, g: Goal) -> bool:
        deps = self.deps
        task_id = self._agent_task.get(g.id)
        if deps is None or deps.approvals is None or task_id is None:
            return False
        return any(r.task_id == task_id for r in deps.approvals.pending(g.conversation))

    def _changed(self, g: Goal) -> None:
        if not self._subscribers:
            return
        view = self.view_of(g)
        for callback in list(self._subscribers):
            try:
                callback(view)
            except Exception:
                log.warning("goal.subscriber_failed", exc_info=True)

    def get(self, goal_id: str) -> Goal:
        g = self.queue.goals.get(goal_id.strip())
        if g is None:
            known = ", ".join(self.queue.goals) or "none yet"
            raise GoalError(f"No goal {goal_id.strip()!r} (goals: {known}).")
        return g

    async def _new_id(self) -> str:
        """The new goal's id, numbered across the cluster in one (core/open_questions.py)."""
        try:
            return await next_id(self.ids, "goal", "g", self.queue.next_goal_id())
        except ConnectionError as exc:
            log.warning("goal.id_unavailable", error=str(exc.__cause__)[:200])
            raise GoalError(str(exc)) from exc

    async def add(
        self,
        draft: Draft,
        *,
        channel: str,
        conversation: str,
        owner: str,
        thread: str | None = None,
        direct: bool = True,
        space: str | None = None,
        via: str = "/goal",
    ) -> Goal:
        g = Goal(
            id=await self._new_id(),
            text=draft.text,
            owner=owner,
            channel=channel,
            conversation=conversation,
            thread=thread,
            direct=direct,
            space=space,
            tokens_budget=draft.tokens if draft.tokens is not None else self.config.max_tokens,
            usd_budget=draft.usd if draft.usd is not None else self.config.max_usd,
            until=now_iso(draft.until) if draft.until else None,
            created=now_iso(self.now()),
        )
        await self.queue.save_goal(g, f"goal {g.id} added by {owner} via {via}: {g.text[:60]}")
        log.info("goal.added", goal=g.id, owner=owner)
        self._changed(g)
        self._kick(g.id)
        return g

    async def pause(self, goal_id: str, by: str) -> GoalView:
        g = self.get(goal_id)
        if g.state != ACTIVE:
            raise GoalError(f"Goal {g.id} is {g.state}; only an active goal can be paused.")
        g.state, g.ended_reason = PAUSED, f"paused by {by}"
        await self.queue.save_goal(g, f"goal {g.id} paused by {by}")
        self._cancel_running(g)
        self._changed(g)
        self._arm_progress()
        return self.view_of(g)

    async def resume(self, goal_id: str, by: str) -> GoalView:
        g = self.get(goal_id)
        if g.state != PAUSED:
            raise GoalError(f"Goal {g.id} is {g.state}; only a paused goal can be resumed.")
        g.state, g.ended_reason = ACTIVE, None
        g.no_progress = g.failures_in_row = 0  # a person looked at it: breakers start over
        self._velocity.pop(g.id, None)
        await self.queue.save_goal(g, f"goal {g.id} resumed by {by}")
        self._changed(g)
        self._kick(g.id)
        return self.view_of(g)

    async def stop(self, goal_id: str, by: str) -> GoalView:
        g = self.get(goal_id)
        if g.state in ENDED:
            raise GoalError(f"Goal {g.id} already ended ({g.state}).")
        await self._finish(g, STOPPED, f"stopped by {by}")
        return self.view_of(g)

    async def stop_all(self, by: str) -> list[GoalView]:
        """The emergency stop: every goal that has not ended, now."""
        out = []
        for g in list(self.queue.goals.values()):
            if g.state not in ENDED:
                await self._finish(g, STOPPED, f"stopped by {by} (stop all)")
                out.append(self.view_of(g))
        return out

    async def stop_here(self, channel: str, conversation: str, by: str) -> list[GoalView]:
        """`/stop`: every goal of this conversation."""
        out = []
        for g in list(self.queue.goals.values()):
            if g.channel == channel and g.conversation == conversation and g.state not in ENDED:
                await self._finish(g, STOPPED, f"stopped by {by} (/stop)")
                out.append(self.view_of(g))
        return out

    # ── starting and stopping the engine ──
    async def start(self) -> None:
        """Read the files, settle tasks a crash or stop cut off, and go on with every
        active goal whose channel runs here. Called again as more channels come up."""
        if not self._started:
            self.queue.load()
            self._started, self._stopping = True, False
            await self._settle()
        for g in self.queue.goals.values():
            if g.state == ACTIVE:
                self._kick(g.id)
        self._arm_progress()

    async def refresh(self) -> int:
        """Bring goals in memory up to their files, which another process changed: in a
        cluster, a worker not running the timers added a goal, or paused, resumed or
        stopped one, and the data-dir mirror wrote the files here. A goal whose step is
        running or queued here keeps its copy. Goes on with what became active, once
        started. Returns how many goals changed."""
        goals, tasks, _problems = await asyncio.to_thread(self.queue.read)
        busy = set(self._running) | self._submitted
        changed = 0
        for gid, g in goals.items():
            mine = self.queue.goals.get(gid)
            if gid in busy or (mine is not None and mine == g):
                continue
            self.queue.goals[gid] = g
            for tid, t in tasks.items():
                if t.goal == gid:
                    self.queue.tasks[tid] = t
            changed += 1
            self._changed(g)
            if g.state == ACTIVE:
                self._kick(gid)
        if changed:
            log.info("goal.refreshed", changed=changed)
            self._arm_progress()
        return changed

    async def _settle(self) -> None:
        for t in list(self.queue.tasks.values()):
            if t.state not in (RUNNING, WAITING):
                continue
            g = self.queue.goals.get(t.goal)
            effects = t.effects()
            if effects:
                t.state, t.ended = T_FAILED, now_iso(self.now())
                t.reason = (
                    "cut off (Steward stopped or crashed) after these calls started: "
                    + "; ".join(effects)[:500]
                    + ". Not run again, so nothing is done twice."
                )
            elif t.attempts > self.config.task_retries:
                t.state, t.ended = T_FAILED, now_iso(self.now())
                t.reason = "cut off, and no attempts left"
            else:
                t.state, t.reason = QUEUED, "cut off before it changed anything; run again"
            log.info("goal.task_cut_off", task=t.id, now=t.state, effects=len(effects))
            await self.queue.save_task(t, f"goal {t.goal}: task {t.id} cut off -> {t.state}")
            if g is not None:
                self._changed(g)

    async def shutdown(self) -> None:
        """Steward stops: no new step starts; one in flight is cut off by the conversation
        queue's stop and keeps its `running` mark (settled at the next start)."""
        self._stopping = True
        self._started = False
        if self._progress_timer is not None:
            self._progress_timer()
            self._progress_timer = None
        await self._posts.wait()

    # ── the loop: one step at a time, as a job of the conversation's queue ──
    def _kick(self, gid: str) -> None:
        deps = self.deps
        g = self.queue.goals.get(gid)
        if (
            deps is None
            or g is None
            or g.state != ACTIVE
            or not self._started
            or self._stopping
            or gid in self._submitted
            or deps.channel_for(g.channel) is None
        ):
            return
        self._submitted.add(gid)
        deps.conversations.submit(g.key, lambda: self._step(gid))
        self._arm_progress()

    async def _step(self, gid: str) -> Any:
        deps = self.deps
        assert deps is not None
        self._submitted.discard(gid)
        g = self.queue.goals.get(gid)
        if g is None or g.state != ACTIVE or self._stopping:
            return None
        if deps.conversations.queued(g.key):  # a person's message waits: it goes first
            return self._again(gid)
        channel = deps.channel_for(g.channel)
        if channel is None:
            return None
        self._running[gid] = None
        self._step_task[gid] = asyncio.current_task()
        with structlog.contextvars.bound_contextvars(goal=gid):
            try:
                if deps.access is not None and not deps.access.allows(g.channel, g.owner, g.space):
                    raise _Halt(FAILED, f"{g.owner} may no longer use Steward here")
                if deps.agent is None or deps.llm is None:
                    raise _Halt(PAUSED, "no model is configured")
                await self._advance(g, channel)
                self.stats.steps += 1
            except _Halt as halt:
                await self._finish(g, halt.state, halt.reason)
            except asyncio.CancelledError:
                if self._stopping:
                    raise  # shutdown: the task keeps its running mark
                await asyncio.shield(self._cancelled(g))
                raise
            except Exception as exc:
                # The model unreachable for a plan or a judgement (LLMError), or a bug: a
                # failed step, counted by the consecutive-failure breaker.
                if type(exc).__name__ == "LLMError":
                    log.warning("goal.model_failed", error=str(exc)[:300])
                else:
                    log.exception("goal.step_crashed")
                g.failures_in_row += 1
                await self.queue.save_goal(g)
                try:
                    await self._breakers(g)
                except _Halt as halt:
                    await self._finish(g, halt.state, halt.reason)
            finally:
                self._running.pop(gid, None)
                self._step_task.pop(gid, None)
                self._agent_task.pop(gid, None)
        return self._again(gid)

    def _again(self, gid: str) -> Any:
        async def follow() -> None:
            self._kick(gid)

        return follow

    async def _cancelled(self, g: Goal) -> None:
        """A running step was cancelled: by /stop or pause (the goal says so already),
        or by /cancel (a person stopped the task: the goal pauses)."""
        task = self._running.get(g.id)
        if task is not None and task.state in (RUNNING, WAITING):
            ended = g.state in ENDED
            task.state = DROPPED if ended else QUEUED if g.state == PAUSED else T_FAILED
            task.reason = (
                f"cut off: goal {g.state}"
                if g.state != ACTIVE
                else "cancelled by a person (/cancel)"
            )
            if task.state != QUEUED:
                task.ended = now_iso(self.now())
            await self.queue.save_task(task, f"goal {g.id}: task {task.id} {task.state}")
        if g.state == ACTIVE:
            g.state, g.ended_reason = PAUSED, "its running task was cancelled (/cancel)"
            await self.queue.save_goal(g, f"goal {g.id} paused: task cancelled")
            await self._post(g, f"Goal {g.id} paused: its task was cancelled. /goal resume {g.id}")
        self._changed(g)

    def _cancel_running(self, g: Goal) -> None:
        """Cancel the goal's running step, unless this is that step deciding to end."""
        step = self._step_task.get(g.id)
        if step is None or step is asyncio.current_task() or self.deps is None:
            return
        self.deps.conversations.cancel(g.key)

    async def _advance(self, g: Goal, channel: Any) -> None:
        cfg = self.config
        try:
            self._check(g)  # before the step's first model call
        except _Halt:
            self.stats.refused_calls += 1
            raise
        if not g.planned:
            proposals = await self._ask_plan(g)
            g.planned = True
            new = self._consider(g, proposals, parent=None)
            await self._save_step(g, new, f"goal {g.id}: planned {len(new)} task(s)")
            if not any(t.state == QUEUED for t in self.queue.tasks_of(g.id)):
                raise _Halt(FAILED, "the plan had no task that passed the drift guard")
            return
        if cfg.review_every and g.tasks_since_review >= cfg.review_every:
            await self._review(g)
        queued = rank(self.queue.tasks_of(g.id))
        if not queued:
            if g.met:
                raise _Halt(DONE, "the goal is met")
            proposals = await self._ask_plan(g)
            new = self._consider(g, proposals, parent=None)
            await self._save_step(g, new, f"goal {g.id}: planned again, {len(new)} task(s)")
            if not any(t.state == QUEUED for t in new):
                raise _Halt(FAILED, "nothing left to try: no new task passed the drift guard")
            return
        task = queued[0]
        await self._run_task(g, task, channel)

    async def _run_task(self, g: Goal, task: GoalTask, channel: Any) -> None:
        deps = self.deps
        assert deps is not None
        from core.agent import TaskRequest  # here: `steward goal` never needs the agent

        task.state, task.attempts, task.reason = RUNNING, task.attempts + 1, ""
        await self.queue.save_task(task)
        self._running[g.id] = task
        self._changed(g)
        seen: list[float] = [0, 0.0]
        halted: list[_Halt] = []

        async def spend(episode: Any) -> str | None:
            tokens = int(episode.tokens_in or 0) + int(episode.tokens_out or 0)
            cost = episode.cost_usd
            dt = tokens - int(seen[0])
            du = (float(cost) - seen[1]) if cost is not None else self._price(dt)
            seen[0], seen[1] = float(tokens), (float(cost) if cost is not None else seen[1] + du)
            if dt or du:
                self._charge(g, dt, du, calls=1)
                task.tokens += dt
                await self._save_spend(g)
            if task.state == WAITING:
                task.state = RUNNING
            try:
                self._check(g)
            except _Halt as halt:
                halted.append(halt)
                self.stats.refused_calls += 1
                return halt.reason
            return None

        watch = RunWatch(deps.monitor, channel.name, g.conversation, g.owner, task.title)

        writing: dict[str, str] = {}  # a file tool's path, from its start to its end

        async def observe(event: Any) -> None:
            watch.see(event)
            if event.kind == "task_start":
                self._agent_task[g.id] = event.task_id
            elif event.kind == "tool_start":  # before it runs: a restart knows
                task.tools.append(f"{event.tool}: {event.text}"[:300])
                path = (event.data.get("args") or {}).get("path")
                if event.tool in FILE_WRITERS and isinstance(path, str) and path:
                    writing[event.tool] = path
                await self.queue.save_task(task)
            elif event.kind == "tool_end" and event.ok and event.tool in writing:
                # Known now, not when the task ends: a task stopped after this call
                # (/stop, a budget) still lists the file it wrote.
                path = writing.pop(event.tool)
                if path not in task.produced:
                    task.produced.append(path)
                    await self.queue.save_task(task)

        request = TaskRequest(
            channel=channel,
            conversation=g.conversation,
            user=g.owner,
            text=prompts.task_prompt(g, task, self.queue.tasks_of(g.id)),
            thread=g.thread,
            direct=g.direct,
            journaled=False,
            spend=spend,
        )
        try:  # paid by the goal's owner, as work for this goal
            with paying(payers.of(g.channel, g.owner, g.conversation, goal=g.id)):
                result = await deps.agent.run(request, observe)
        finally:
            watch.close()
        episode = result.episode
        self._produced(task, episode, result.reply)
        if deps.learner is not None:
            try:
                await deps.learner.observe(episode)
            except Exception:
                log.warning("goal.learner_failed", exc_info=True)
        g.tasks_since_review += 1
        if halted:
            task.state, task.reason = DROPPED, f"stopped by code: {halted[0].reason}"
            task.ended = now_iso(self.now())
            await self._save_step(g, [], f"goal {g.id}: task {task.id} stopped")
            raise halted[0]
        proposals: list[dict[str, Any]] = []
        accepted = False
        if result.outcome == "denied":
            verdict = f"denied by a person: {episode.error or result.reply}"[:500]
            self._end_task(g, task, T_FAILED, verdict, retry=False)
        elif result.outcome != "success":
            g.failures_in_row += 1
            self._end_task(g, task, T_FAILED, f"the run failed: {episode.error}"[:500])
        else:
            g.failures_in_row = 0
            try:
                judged = await self._ask_judge(g, task, result.reply, episode)
            except _Halt:
                self._end_task(g, task, T_FAILED, "not judged: the budget ran out", retry=False)
                await self._save_step(g, [], f"goal {g.id}: task {task.id} not judged")
                raise
            except ValueError as exc:
                judged = {"accepted": False, "reason": f"the judgement was unreadable ({exc})"}
            accepted = bool(judged.get("accepted"))
            reason = str(judged.get("reason") or "")[:500]
            proposals = list(judged.get("tasks") or [])
            if accepted:
                task.state, task.reason, task.ended = T_DONE, reason, now_iso(self.now())
                task.result = result.reply.strip()[:2000]
                g.no_progress = 0
                self.stats.accepted += 1
                if judged.get("goal_met"):
                    g.met = True
            else:
                self._end_task(g, task, T_FAILED, f"not accepted: {reason}")
        if not accepted:
            g.no_progress += 1
        new = self._consider(g, proposals, parent=task.id)
        await self._save_step(g, new, f"goal {g.id}: task {task.id} {task.state}")
        if g.met:
            raise _Halt(DONE, "the goal is met")
        await self._breakers(g)
        await self._maybe_progress(g)

    def _end_task(
        self, g: Goal, task: GoalTask, state: str, reason: str, retry: bool = True
    ) -> None:
        if retry and task.attempts <= self.config.task_retries:
            task.state, task.reason = QUEUED, f"attempt {task.attempts}: {reason}"
            return
        task.state, task.reason, task.ended = state, reason, now_iso(self.now())
        log.info("goal.task_failed", task=task.id, reason=reason[:200])

    def _produced(self, task: GoalTask, episode: Any, reply: str) -> None:
        for record in getattr(episode, "tools", []) or []:
            if record.name in FILE_WRITERS and record.ok:
                path = record.args.get("path")
                if path and path not in task.produced:
                    task.produced.append(str(path))
        for url in _URL.findall(reply or ""):
            if url not in task.produced:
                task.produced.append(url)

    # ── the engine's own model calls ──
    async def _ask(self, g: Goal, system: str, user: str) -> dict[str, Any]:
        deps = self.deps
        assert deps is not None
        try:
            self._check(g)
        except _Halt:
            self.stats.refused_calls += 1
            raise
        self.stats.model_calls += 1
        with paying(payers.of(g.channel, g.owner, g.conversation, goal=g.id, purpose="goal-judge")):
            result = await deps.llm.complete(
                [{"role": "system", "content": system}, {"role": "user", "content": user}]
            )
        tokens = int(result.tokens_in or 0) + int(result.tokens_out or 0)
        usd = float(result.cost_usd) if result.cost_usd is not None else self._price(tokens)
        self._charge(g, tokens, usd, calls=1)
        await self._save_spend(g)
        return prompts.parse_answer(result.text or "")

    async def _ask_plan(self, g: Goal) -> list[dict[str, Any]]:
        user = prompts.plan_request(g, self.queue.tasks_of(g.id))
        try:
            data = await self._ask(g, prompts.PLANNER.format(n=self.config.max_proposals), user)
        except ValueError as exc:
            log.info("goal.plan_unreadable", error=str(exc))
            return []
        return list(data.get("tasks") or [])

    async def _ask_judge(self, g: Goal, task: GoalTask, reply: str, episode: Any) -> dict[str, Any]:
        user = prompts.judge_request(g, self.queue.tasks_of(g.id), task, reply, episode)
        return await self._ask(g, prompts.JUDGE.format(n=self.config.max_proposals), user)

    async def _review(self, g: Goal) -> None:
        """Re-read the goal (a person may have edited it) and re-rank the queue."""
        fresh = self.queue.reread_goal(g.id)
        if fresh is not None and fresh.text and fresh.text != g.text:
            log.info("goal.text_changed", goal=g.id)
            g.text = fresh.text
        g.tasks_since_review = 0
        queued = rank(self.queue.tasks_of(g.id))
        if not queued:
            return
        try:
            data = await self._ask(g, prompts.REVIEW, prompts.review_request(g, queued))
        except ValueError as exc:
            log.info("goal.review_unreadable", error=str(exc))
            return
        ranks: dict[str, Any] = data["tasks"] if isinstance(data.get("tasks"), dict) else {}
        drops: dict[str, Any] = data["drop"] if isinstance(data.get("drop"), dict) else {}
        changed = []
        for t in queued:
            r = ranks.get(t.id)
            if isinstance(r, dict):
                t.value = clamp(r.get("value"), t.value, 1, 10)
                t.urgency = clamp(r.get("urgency"), t.urgency, 1, 10)
                changed.append(t)
            if t.id in drops:
                t.state, t.ended = DROPPED, now_iso(self.now())
                t.reason = f"review: {str(drops[t.id])[:300]}"
                self.stats.dropped["review"] += 1
                changed.append(t)
        await self._save_step(g, changed, f"goal {g.id}: re-read and re-ranked")

    # ── the drift guard ──
    def _consider(self, g: Goal, proposals: list[Any], parent: str | None) -> list[GoalTask]:
        """Every proposal becomes a task: queued, or dropped with the reason."""
        cfg = self.config
        out: list[GoalTask] = []
        for n, p in enumerate(proposals):
            if not isinstance(p, dict):
                continue
            text = str(p.get("task") or p.get("title") or "").strip()
            if not text:
                continue
            why = str(p.get("why") or "").strip()
            reason, kind = "", ""
            existing = self.queue.tasks_of(g.id)
            if n >= cfg.max_proposals:
                reason, kind = f"over the {cfg.max_proposals} proposals a step may add", "limit"
            elif len(existing) >= cfg.max_tasks:
                reason, kind = f"the goal has {len(existing)} tasks (goal_max_tasks)", "limit"
            elif len(why.split()) < cfg.min_why_words:
                reason, kind = "it does not say how it serves the goal", "no_why"
            else:
                best, near = 0.0, None
                for t in existing:
                    if t.state in (T_DONE, DROPPED, T_FAILED, QUEUED, RUNNING, WAITING):
                        sim = similarity(text, t.text)
                        if sim > best:
                            best, near = sim, t
                if near is not None and best >= cfg.duplicate_similarity:
                    reason = (
                        f"near-duplicate of {near.id} ({near.state}): {near.title!r} "
                        f"(similarity {best:.2f})"
                    )
                    kind = "duplicate"
            task = self.queue.new_task(
                g,
                text,
                why=why,
                parent=parent,
                value=clamp(p.get("value"), 5, 1, 10),
                urgency=clamp(p.get("urgency"), 5, 1, 10),
                cost=int(clamp(p.get("cost"), cfg.task_cost, 100, 10_000_000)),
                created=now_iso(self.now()),
            )
            if reason:
                task.state, task.reason, task.ended = (
                    DROPPED,
                    f"drift guard: {reason}",
                    task.created,
                )
                self.stats.dropped[kind] += 1
                log.info("goal.proposal_dropped", task=task.id, kind=kind)
            out.append(task)
        return out

    # ── budgets and breakers: code, before every model call ──
    def _price(self, tokens: int) -> float:
        return tokens * self.config.usd_per_mtok / 1_000_000

    def _charge(self, g: Goal, tokens: int, usd: float, calls: int) -> None:
        g.tokens_spent += tokens
        g.usd_spent += usd
        g.model_calls += calls
        day = self.now().date().isoformat()
        spend = self.queue.spend
        if spend.day != day:
            spend.day, spend.tokens, spend.usd = day, 0, 0.0
        spend.tokens += tokens
        spend.usd += usd
        window = self._velocity.setdefault(g.id, deque())
        window.append((self.clock.now(), tokens))

    async def _save_spend(self, g: Goal) -> None:
        await self.queue.save_goal(g)
        await self.queue.save_spend()

    def _apply_control(self) -> list[tuple[str, str, str]]:
        """Requests left by `steward goal stop|pause` / `steward stop --all` from another
        process: applied in memory here (and written by the caller's finish)."""
        found = self.queue.control_requests()
        applied = []
        for path, meta in found:
            gid, action = str(meta.get("goal", "")), str(meta.get("action", ""))
            by = str(meta.get("by", "cli"))
            for g in self.queue.goals.values():
                if (gid == "all" or g.id == gid) and g.state not in ENDED:
                    if action == "pause" and g.state == ACTIVE:
                        g.state, g.ended_reason = PAUSED, f"paused by {by}"
                    elif action == "stop":
                        g.state, g.ended_reason = STOPPED, f"stopped by {by}"
                    applied.append((g.id, action, by))
            try:
                path.unlink()
            except OSError:
                pass
        if applied:
            # Counted as running work from now: replay's (and a test's) "idle" must wait
            # for the stop to be written and reported, not only for the refused step.
            self._spawn(self._applied(applied))
        return applied

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background as counted activity: the simulated clock (replay,
        tests) is not idle until it has finished, and `stop` waits for it."""
        self._posts.run(work, "post")

    async def _applied(self, applied: list[tuple[str, str, str]]) -> None:
        for gid, action, by in applied:
            g = self.queue.goals[gid]
            if action == "stop":  # once: the step that was refused may have ended it
                await self._finish(g, STOPPED, f"stopped by {by}")
            else:
                await self.queue.save_goal(g, f"goal {g.id} paused by {by}")
                self._changed(g)

    def _check(self, g: Goal) -> None:
        """Raise _Halt when the goal may not make another model call."""
        cfg = self.config
        self._apply_control()
        if g.state != ACTIVE:
            raise _Halt(g.state, g.ended_reason or f"the goal is {g.state}")
        now = self.now()
        if g.until and (until := datetime.fromisoformat(g.until)) <= now:
            raise _Halt(STOPPED, f"its deadline passed ({until:%Y-%m-%d %H:%M} UTC)")
        if g.tokens_budget and g.tokens_spent >= g.tokens_budget:
            raise _Halt(
                BUDGET, f"its token budget is spent ({g.tokens_spent} of {g.tokens_budget})"
            )
        if g.usd_budget and g.usd_spent >= g.usd_budget:
            raise _Halt(BUDGET, f"its budget is spent (${g.usd_spent:.2f} of ${g.usd_budget:.2f})")
        spend = self.queue.spend
        if spend.day == now.date().isoformat():
            if cfg.day_max_tokens and spend.tokens >= cfg.day_max_tokens:
                raise _Halt(
                    PAUSED,
                    f"today's token budget for all goals is spent ({spend.tokens} of "
                    f"{cfg.day_max_tokens}, goal_day_max_tokens); resume it tomorrow",
                )
            if cfg.day_max_usd and spend.usd >= cfg.day_max_usd:
                raise _Halt(
                    PAUSED,
                    f"today's budget for all goals is spent (${spend.usd:.2f} of "
                    f"${cfg.day_max_usd:.2f}, goal_day_max_usd); resume it tomorrow",
                )
        if cfg.breaker_velocity_tokens:
            window = self._velocity.get(g.id)
            if window:
                since = self.clock.now() - cfg.breaker_velocity_window
                while window and window[0][0] < since:
                    window.popleft()
                used = sum(n for _, n in window)
                if used >= cfg.breaker_velocity_tokens:
                    raise _Halt(
                        PAUSED,
                        f"circuit breaker: {used} tokens in the last "
                        f"{cfg.breaker_velocity_window:g}s (goal_breaker_velocity_tokens "
                        f"{cfg.breaker_velocity_tokens})",
                    )

    async def _breakers(self, g: Goal) -> None:
        cfg = self.config
        if cfg.breaker_failures and g.failures_in_row >= cfg.breaker_failures:
            raise _Halt(
                PAUSED,
                f"circuit breaker: {g.failures_in_row} failed runs in a row "
                "(goal_breaker_failures)",
            )
        if cfg.breaker_no_progress and g.no_progress >= cfg.breaker_no_progress:
            raise _Halt(
                PAUSED,
                f"circuit breaker: {g.no_progress} tasks in a row without an accepted "
                "result (goal_breaker_no_progress)",
            )

    # ── ending, saving, telling ──
    async def _save_step(self, g: Goal, tasks: list[GoalTask], message: str) -> None:
        """The goal and these tasks written, then one commit for the step."""
        paths = [g.relpath]
        await self.queue.save_goal(g)
        running = self._running.get(g.id)
        extra = [running] if running is not None and running not in tasks else []
        for t in [*tasks, *extra]:
            await self.queue.save_task(t)
            paths.append(t.relpath)
        await self.queue.commit(paths, message)
        self._changed(g)

    async def _finish(self, g: Goal, state: str, reason: str) -> None:
        """End (or, for PAUSED, pause) a goal: written, committed, said."""
        if g.state in ENDED and state in ENDED and g.ended:
            return
        g.state, g.ended_reason = state, reason
        dropped = []
        if state in ENDED:
            g.ended = now_iso(self.now())
            for t in self.queue.tasks_of(g.id):
                if t.state == QUEUED:
                    t.state, t.reason, t.ended = DROPPED, f"goal {state}: {reason}", g.ended
                    dropped.append(t)
        await self._save_step(g, dropped, f"goal {g.id} {state}: {reason}")
        log.info("goal.ended" if state in ENDED else "goal.paused", goal=g.id, reason=reason)
        self._cancel_running(g)
        if state in ENDED:
            await self._post(g, reports.final_report(g, self.queue.tasks_of(g.id)))
        else:
            await self._post(
                g,
                f"Goal {g.id} paused: {reason}.\n{self.progress_text(g)}\n"
                f"/goal resume {g.id} to go on, /goal stop {g.id} to end it.",
            )
        self._arm_progress()

    async def _post(self, g: Goal, text: str) -> None:
        deps = self.deps
        channel = deps.channel_for(g.channel) if deps is not None else None
        if channel is None:
            log.info("goal.post_no_channel", goal=g.id)
            return
        try:
            await channel.send(g.conversation, text, thread=g.thread)
        except Exception:  # the Outbox kept it and re-sends it later
            log.warning("goal.post_kept", goal=g.id, exc_info=True)

    def progress_text(self, g: Goal) -> str:
        """The goal's progress note (core/goals/reports.py) as it stands now."""
        return reports.progress_text(g, self.view_of(g), self.queue.tasks_of(g.id))

    async def _maybe_progress(self, g: Goal) -> None:
        every = self.config.progress_every
        if not every:
            return
        last = datetime.fromisoformat(g.last_progress) if g.last_progress else None
        if last is None:
            g.last_progress = g.created
            last = datetime.fromisoformat(g.created)
        if self.now() - last >= timedelta(seconds=every):
            g.last_progress = now_iso(self.now())
            await self.queue.save_goal(g)
            await self._post(g, self.progress_text(g))

    def _arm_progress(self) -> None:
        """One timer while a goal is active (a task blocked on approval for hours still
        gets its progress note); none otherwise — zero idle cost."""
        if self._progress_timer is not None:
            self._progress_timer()
            self._progress_timer = None
        every = self.config.progress_every
        active = [g for g in self.queue.goals.values() if g.state == ACTIVE]
        if not every or not active or not self._started or self._stopping:
            return
        self._progress_timer = self.clock.call_at(self.clock.now() + every, self._tick)

    def _tick(self) -> None:
        self._progress_timer = None
        if self._stopping:
            return

        async def tick() -> None:
            for g in list(self.queue.goals.values()):
                if g.state == ACTIVE:
                    if self._waiting(g):
                        task = self._running.get(g.id)
                        if task is not None and task.state == RUNNING:
                            task.state = WAITING
                            await self.queue.save_task(task)
                    await self._maybe_progress(g)
            self._arm_progress()

        self._spawn(tick())
