"""Learning workflows from tasks that worked the same way, and offering to save them:
"That's the 3rd time this worked the same way. Save as workflow 'restart-staging'?"
with [Save] / [Show] / [No] buttons.

What it watches (the dispatcher's `after_task` hook): a task that succeeded without a
workflow, without `delegate`, and whose tool calls all worked is an observation, kept
in `<data dir>/workflow-learning/observed.jsonl` (redacted, at most MAX_OBSERVED, none
older than MAX_AGE). Runs have the same shape when they made the same sequence of tool
calls, in the same scope (one person, or one group conversation), and their requests,
normalised (core/signatures.py), share at least half their words with the newest one.

When `min_runs` runs have one shape, it drafts ONE workflow with ONE model call
(core/workflows/draft.py), then checks it without any model: it must parse, replay every
recorded run exactly in a dry run (each call's tool and arguments as recorded) and pass
its grade (no secrets, no hidden characters, no path outside the workspace, only tools
the person may use). Only a draft that passed is offered, in the conversation, to the
person whose task completed the shape; only they may answer. A shape is drafted once
(`drafted.json` beside the observations remembers it, with its episodes), whatever came
of it; a draft that could not be made (no model, a model error) is tried again on the
next such success.

Saving writes `<data dir>/workflows/<name>.json` through the store (a git commit),
graded again first. The person who taught it saves it, admin or not: every call of a
saved workflow still passes the guardian, the sandbox and approvals as if the model
had asked. Offers are records in `<data dir>/workflow-proposals/`, so a press after a
restart still saves.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from core.clock import Clock
from core.events import Button, Channel, Message
from core.offers import Offer, OfferBook
from core.signatures import normalize_message
from core.spend.payer import paying
from core.workflows.document import Workflow, WorkflowError, match_request, parse, walk
from core.workflows.draft import cleaned, first_object, messages_for
from core.workflows.dryrun import Example, RecordedCall, dry_run
from core.workflows.grade import grade
from core.workflows.store import WorkflowStore
from memory.atomic import atomic_write_bytes
from memory.episodes import Episode
from memory.redact import redact, redact_obj

log = structlog.get_logger("steward.workflows")

SAVE = "wf-save"
SHOW = "wf-show"
SKIP = "wf-skip"
#: Seconds an observation is kept.
MAX_AGE = 30 * 86400.0
#: Observations kept at most (the newest).
MAX_OBSERVED = 500
#: Drafted shapes remembered at most (the newest).
MAX_DRAFTED = 500
#: Word-Jaccard of two normalised requests at or above which they have one shape.
SIMILARITY = 0.5
#: Runs of a shape shown to the model and replayed in the dry run at most (the newest).
MAX_RUNS = 5
#: Characters of the task's reply kept with an observation.
REPLY_CHARS = 1000
#: Characters of the request quoted in the offer.
REQUEST_CHARS = 200
#: Tools whose calls mean the task was not one a workflow can replay.
DELEGATE = "delegate"
WF_PREFIX = "wf__"
_NAME_MAX = 40


def observable(episode: Episode) -> bool:
    """A task a workflow could have done: it succeeded, ran no workflow, delegated
    nothing, and made at least one tool call, every one of which worked."""
    if episode.outcome != "success" or episode.workflow or episode.children:
        return False
    if not episode.tools:
        return False
    for t in episode.tools:
        if not t.ok or t.name == DELEGATE or t.name.startswith(WF_PREFIX):
            return False
    return True


def words(request: str) -> frozenset[str]:
    """The words of a request once normalised (paths, numbers, quotes made placeholders)."""
    return frozenset(re.findall(r"<\w+>|\w+", normalize_message(request).lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def one_line(text: str, limit: int = REQUEST_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _tools_of(run: dict[str, Any]) -> list[str]:
    return [str(c.get("tool", "")) for c in run.get("calls") or []]


def _key(tools: list[str], episodes: list[str]) -> str:
    return ">".join(tools) + "|" + ",".join(sorted(episodes))


def _fence(text: str, info: str = "") -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text.rstrip()}\n{ticks}"


@dataclass(slots=True)
class _Memory:
    """The observations and the drafted shapes, as on disk (loaded once)."""

    observed: list[dict[str, Any]] = field(default_factory=list)
    drafted: list[dict[str, Any]] = field(default_factory=list)


class WorkflowLearner:
    """Observes tasks after they finish (the dispatcher's `after_task` hook), drafts a
    workflow when one shape recurs, offers it, and answers the offer's buttons."""

    def __init__(
        self,
        store: WorkflowStore,
        clock: Clock,
        data_dir: Path,
        *,
        drafter: Any | None,
        allowed: Callable[[str, str, str], bool],
        workspace: Path,
        enabled: bool = True,
        min_runs: int = 3,
    ) -> None:
        self.store = store
        self.clock = clock
        self.drafter = drafter
        #: (platform, user, tool) -> whether this person may use this tool.
        self.allowed = allowed
        self.workspace = workspace
        self.enabled = enabled
        self.min_runs = max(1, min_runs)
        self.folder = data_dir / "workflow-learning"
        self.observed_path = self.folder / "observed.jsonl"
        self.drafted_path = self.folder / "drafted.json"
        #: The offers' records (`<data dir>/workflow-proposals/`) and those of this run.
        self.book = OfferBook(data_dir / "workflow-proposals", "workflow proposal", clock)
        self._memory: _Memory | None = None
        #: One change of the observations or drafted shapes at a time.
        self._lock = asyncio.Lock()
        #: Episodes of shapes being drafted now (the model call is not under the lock).
        self._drafting: set[str] = set()

    # observing --------------------------------------------------------------------

    async def after_task(self, channel: Channel, msg: Message, result: Any) -> None:
        """After a task's reply: observe it, and offer a workflow when its shape recurs."""
        if not self.enabled:
            return
        episode: Episode | None = getattr(result, "episode", None)
        if episode is None or not observable(episode):
            return
        async with self._lock:
            run = await self._observe(episode)
            group = self._group(run)
            if len(group) < self.min_runs:
                return
            if not channel.capabilities.interactive:
                return  # nobody could press; an interactive success of the shape will
            if await self._open_in(channel.name, msg.conversation):
                return
            ids = [str(r["id"]) for r in group]
            if self._drafted(_tools_of(run), ids) or self._drafting.intersection(ids):
                return
            covered = await self._covered(str(run["request"]))
            if covered:
                log.info("workflows.shape_covered", workflow=covered, conversation=msg.conversation)
                return
            runs = group[-MAX_RUNS:]
            self._drafting.update(ids)
        try:
            await self._draft_and_offer(channel, msg, runs, len(group))
        finally:
            self._drafting.difference_update(ids)

    async def _observe(self, episode: Episode) -> dict[str, Any]:
        """Record this run (redacted, as on disk) and return it. Lock held."""
        memory = await self._load()
        run: dict[str, Any] = redact_obj(
            {
                "id": episode.id,
                "started": episode.started.isoformat(),
                "at": self.clock.now(),
                "user": episode.user,
                "channel": episode.channel,
                "conversation": episode.conversation,
                "scope": episode.scope or f"conversation:{episode.channel}:{episode.conversation}",
                "request": episode.request.strip(),
                "reply": episode.reply.strip()[:REPLY_CHARS],
                "calls": [
                    {"tool": t.name, "args": dict(t.args), "ok": t.ok, "result": t.result}
                    for t in episode.tools
                ],
            }
        )
        before = len(memory.observed)
        memory.observed = [o for o in memory.observed if o.get("id") != run["id"]]
        again = len(memory.observed) != before  # the same task seen twice: its newest record
        memory.observed.append(run)
        kept = self._pruned(memory.observed)
        if again or len(kept) != len(memory.observed):
            memory.observed = kept
            data = "".join(_line(o) for o in kept).encode("utf-8")
            await asyncio.to_thread(atomic_write_bytes, self.observed_path, data)
            log.info("workflows.observations_pruned", kept=len(kept))
        else:
            await asyncio.to_thread(_append, self.observed_path, _line(run))
        return run

    def _pruned(self, observed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        since = self.clock.now() - MAX_AGE
        fresh = [o for o in observed if _at(o) >= since]
        return fresh[-MAX_OBSERVED:]

    def _group(self, newest: dict[str, Any]) -> list[dict[str, Any]]:
        """The runs of the newest one's shape, oldest first, the newest last."""
        tools = _tools_of(newest)
        scope = newest.get("scope")
        mine = words(str(newest.get("request", "")))
        assert self._memory is not None
        return [
            o
            for o in self._memory.observed
            if o.get("scope") == scope
            and _tools_of(o) == tools
            and jaccard(words(str(o.get("request", ""))), mine) >= SIMILARITY
        ]

    def _drafted(self, tools: list[str], ids: list[str]) -> bool:
        """Whether a shape with these tools and any of these runs was drafted already."""
        assert self._memory is not None
        wanted = set(ids)
        return any(
            d.get("tools") == tools and wanted.intersection(d.get("episodes") or [])
            for d in self._memory.drafted
        )

    async def _mark(self, runs: list[dict[str, Any]], outcome: str, offer: str = "") -> None:
        """Remember a shape as drafted, whatever came of it, so it is not drafted again."""
        async with self._lock:
            memory = await self._load()
            tools = _tools_of(runs[-1])
            ids = [str(r["id"]) for r in runs]
            memory.drafted.append(
                {
                    "key": _key(tools, ids),
                    "tools": tools,
                    "episodes": sorted(ids),
                    "at": self.clock.now(),
                    "outcome": outcome,
                    **({"offer": offer} if offer else {}),
                }
            )
            since = self.clock.now() - MAX_AGE
            memory.drafted = [d for d in memory.drafted if _at(d) >= since][-MAX_DRAFTED:]
            data = json.dumps({"drafted": memory.drafted}, ensure_ascii=False, indent=1)
            await asyncio.to_thread(atomic_write_bytes, self.drafted_path, data.encode("utf-8"))

    async def _load(self) -> _Memory:
        if self._memory is None:
            self._memory = await asyncio.to_thread(self._read)
        return self._memory

    def _read(self) -> _Memory:
        memory = _Memory()
        bad = 0
        try:
            lines = self.observed_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(item, dict) and isinstance(item.get("calls"), list):
                memory.observed.append(item)
            else:
                bad += 1
        if bad:
            log.warning(
                "workflows.observations_unreadable", lines=bad, path=str(self.observed_path)
            )
            # Rewritten without them, so an append never lands after a torn last line.
            data = "".join(_line(o) for o in memory.observed).encode("utf-8")
            atomic_write_bytes(self.observed_path, data)
        try:
            drafted = json.loads(self.drafted_path.read_text(encoding="utf-8"))
            items = drafted.get("drafted") if isinstance(drafted, dict) else None
            memory.drafted = [d for d in items or [] if isinstance(d, dict)]
        except FileNotFoundError:
            pass
        except ValueError:
            log.warning("workflows.drafted_unreadable", path=str(self.drafted_path))
        return memory

    async def _covered(self, request: str) -> str:
        """The name of a workflow (any status) whose pattern takes this request, or ""."""
        for wf in await asyncio.to_thread(self.store.list):
            try:
                if match_request(wf, request) is not None:
                    return wf.name
            except Exception:  # a person's hand-edited pattern: not this learner's to judge
                log.debug("workflows.match_failed", workflow=wf.name, exc_info=True)
        return ""

    # drafting ---------------------------------------------------------------------

    async def _draft_and_offer(
        self, channel: Channel, msg: Message, runs: list[dict[str, Any]], count: int
    ) -> None:
        newest = runs[-1]
        ids = [str(r["id"]) for r in runs]
        if self.drafter is None:
            log.info("workflows.draft_skipped", reason="no model to draft with", runs=len(runs))
            return
        try:
            with paying(purpose="workflow-draft"):  # the person whose run recurred
                answer = await self.drafter.complete(messages_for(runs), None)
        except Exception as exc:  # the model's failure: tried again on the next success
            log.warning(
                "workflows.draft_failed",
                error=redact(str(exc))[:300],
                conversation=msg.conversation,
                channel=channel.name,
            )
            return
        log.info(
            "workflows.drafted",
            runs=len(runs),
            tokens_in=int(getattr(answer, "tokens_in", 0) or 0),
            tokens_out=int(getattr(answer, "tokens_out", 0) or 0),
            conversation=msg.conversation,
            channel=channel.name,
        )
        found = first_object(str(getattr(answer, "text", "") or ""))
        if found is None:
            await self._refuse(runs, "invalid", ["the model's answer held no JSON object"])
            return
        doc = cleaned(found, str(newest["request"]))
        doc["name"] = await self._free_name(str(doc["name"]))
        try:
            wf = parse(doc)
        except WorkflowError as exc:
            await self._refuse(runs, "invalid", list(exc.problems))
            return
        examples = [
            Example(
                str(r["request"]),
                [
                    RecordedCall(
                        str(c.get("tool", "")),
                        dict(c.get("args") or {}),
                        bool(c.get("ok", True)),
                        str(c.get("result") or ""),
                    )
                    for c in r.get("calls") or []
                ],
            )
            for r in runs
        ]
        problems = list(await dry_run(wf, examples))
        graded = grade(
            wf,
            allowed=lambda tool: self.allowed(channel.name, msg.user, tool),
            workspace=self.workspace,
        )
        if not graded.passed:
            problems += list(graded.problems)
        if problems:
            await self._refuse(runs, "refused", problems, name=wf.name)
            return
        await self._offer(channel, msg, wf, runs, count, ids)

    async def _refuse(
        self, runs: list[dict[str, Any]], outcome: str, problems: list[str], *, name: str = ""
    ) -> None:
        event = "workflows.draft_invalid" if outcome == "invalid" else "workflows.draft_not_offered"
        log.info(event, workflow=name, problems=[redact(p)[:300] for p in problems[:8]])
        await self._mark(runs, outcome)

    async def _free_name(self, base: str) -> str:
        """`base`, or base-2, base-3… when a workflow or an open offer has that name."""
        taken = {wf.name for wf in await asyncio.to_thread(self.store.list)}
        taken |= {
            str(o.record.get("name"))
            for o in self.book.live.values()
            if o.record["status"] == "open"
        }
        name, n = base, 2
        while name in taken:
            suffix = f"-{n}"
            name, n = base[: _NAME_MAX - len(suffix)].rstrip("-") + suffix, n + 1
        return name

    # offering ---------------------------------------------------------------------

    async def _open_in(self, channel: str, conversation: str) -> bool:
        """Whether an offer is open in this conversation (of this run, or on disk)."""
        where = (channel, conversation)
        for offer in self.book.live.values():
            r = offer.record
            if r["status"] == "open" and (r["channel"], r["conversation"]) == where:
                return True
        return await asyncio.to_thread(self._open_on_disk, where)

    def _open_on_disk(self, where: tuple[str, str]) -> bool:
        for path in self.book.store.paths():
            try:
                record, _doc = self.book.store.read(path)
            except (OSError, ValueError):
                continue
            if (
                record.get("status") == "open"
                and (
                    record.get("channel"),
                    record.get("conversation"),
                )
                == where
            ):
                return True
        return False

    async def _offer(
        self,
        channel: Channel,
        msg: Message,
        wf: Workflow,
        runs: list[dict[str, Any]],
        count: int,
        ids: list[str],
    ) -> None:
        pid = secrets.token_hex(4)
        steps = [s for s, _depth in walk(wf.steps) if s.get("kind") in ("call", "model", "judge")]
        tools = wf.tools()
        asks = [s for s in steps if s.get("kind") in ("model", "judge")]
        request = one_line(str(runs[-1]["request"]))
        text = (
            f"That's the {ordinal(count)} time this worked the same way. "
            f"Save as workflow '{wf.name}'? It would run {len(steps)} step(s) "
            f"({', '.join(tools) or 'no tools'}) without asking the model again"
            + (f" (but for {len(asks)} short question(s) to it)" if asks else "")
            + f" for a request like: {request}"
        )
        buttons = [
            Button("Save", f"{SAVE}:{pid}", "primary", typed=f"/workflows save {pid}"),
            Button("Show", f"{SHOW}:{pid}", typed=f"/workflows show-draft {pid}"),
            Button("No", f"{SKIP}:{pid}", typed=f"/workflows skip {pid}"),
        ]
        record: dict[str, Any] = {
            "id": pid,
            "status": "open",
            "user": msg.user,
            "channel": channel.name,
            "conversation": msg.conversation,
            "name": wf.name,
            "tools": _tools_of(runs[-1]),
            "episodes": sorted(ids),
            "text": text,
            "offered_at": self.clock.now(),
        }
        doc = json.dumps(wf.doc, ensure_ascii=False, indent=2)
        # Known before the message goes out: a press may come back before `send` returns.
        offer = self.book.add(record, doc, channel)
        await self.book.save(offer)
        await self._mark(runs, "offered", pid)
        ref = await channel.send(msg.conversation, text, thread=msg.thread, buttons=buttons)
        log.info(
            "workflows.offered",
            offer=pid,
            workflow=wf.name,
            runs=count,
            conversation=msg.conversation,
            channel=channel.name,
        )
        await self.book.sent(offer, ref)

    # answering --------------------------------------------------------------------

    async def answer(self, platform: str, value: str, user: str) -> str:
        """A press (or `/workflows save|show-draft|skip ID`): what the presser is told."""
        action, _, pid = value.strip().partition(":")
        offer = self.book.find(pid.strip())
        if offer is None:
            return "That offer is no longer open."
        record = offer.record
        if record.get("status") != "open":
            return f"That offer was answered already ({record.get('status')})."
        if user != record.get("user") or platform != record.get("channel"):
            return "This offer was for someone else."
        name = str(record.get("name"))
        if action == SHOW:
            return f"Workflow '{name}' as it would be saved:\n" + _fence(offer.body, "json")
        if action == SKIP:
            await self.book.close(offer, "skipped", "Not saved.")
            return "Not saved."
        if action != SAVE:
            return f"Unknown answer {action!r} to a workflow offer."
        return await self._save_workflow(offer, platform, user)

    async def _save_workflow(self, offer: Offer, platform: str, user: str) -> str:
        record = offer.record
        name = str(record.get("name"))
        if await asyncio.to_thread(self.store.get, name) is not None:
            return f"A workflow named '{name}' exists now; this one was not saved."
        record["status"] = "saving"  # a second press meanwhile is told it was answered
        try:
            doc = json.loads(offer.body)
            doc.update(
                status="enabled",
                taught_by=f"{platform}:{user}",
                source_episodes=list(record.get("episodes") or []),
                created=self.clock.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
                runs=0,
                wins=0,
                losses=0,
                losses_in_a_row=0,
            )
            wf = parse(doc)
        except (ValueError, WorkflowError) as exc:
            await self.book.close(offer, "refused", "Not saved: it no longer reads as a workflow.")
            return f"It was not saved: {exc}"
        graded = grade(
            wf,
            allowed=lambda tool: self.allowed(platform, user, tool),
            workspace=self.workspace,
        )
        if not graded.passed:
            await self.book.close(offer, "refused", "Not saved: its grade failed.")
            return "It was not saved: its grade failed: " + "; ".join(graded.problems)
        episodes = ", ".join(record.get("episodes") or [])
        try:
            await self.store.save(wf, by=user, why=f"learned from tasks {episodes}")
        except (WorkflowError, OSError, ValueError) as exc:
            record["status"] = "open"
            return f"It was not saved: {exc}"
        outcome = (
            f"Saved as workflow '{name}' and enabled. `/workflows show {name}` shows it; "
            f"`/workflows disable {name}` stops it."
        )
        await self.book.close(offer, "saved", outcome)
        log.info("workflows.learned", workflow=name, taught_by=f"{platform}:{user}")
        return outcome


def _at(item: dict[str, Any]) -> float:
    try:
        return float(item.get("at", 0.0))
    except (TypeError, ValueError):
        return 0.0


def _line(item: dict[str, Any]) -> str:
    return json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n"


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
