"""Episodes: one Markdown file per finished task, YAML front matter + a readable summary.

Markdown is the source of truth (docs/memory.md): a person can read, grep, edit
and version it; indexes built later are caches over these files.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from memory import hops
from memory.atomic import after_folder_syncs, folder_syncs_grouped
from memory.documents import DocError, from_text
from memory.effects import Effects
from memory.health import health_for
from memory.records import RecordStore, Written, read_record
from memory.store import MalformedFile, parse, render

#: How much of a call's arguments an episode file keeps (the tool log keeps them whole).
EPISODE_ARGUMENTS_CHARS = 500
#: Characters of a tool call's result kept in memory and in the journal (ToolRecord.result).
RESULT_CHARS = 4000


#: Fields of `Episode.to_record` that Steward makes itself (ids, times, counters, enum
#: words, the configured model's name, ids of episodes and rules): nothing a person, a
#: tool or the model wrote, so nothing to redact. The journal's "done" line skips them:
#: it is written on the reply path. Everything else is redacted as before.
GENERATED_FIELDS = frozenset(
    {
        "id",
        "started",
        "channel",
        "outcome",
        "model",
        "steps",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "duration_s",
        "gates",
        "recalled",
        "context",
        "task_environmental",
        "rules_applied",
        "rules_trial",
        "snapshot",
    }
)


@dataclass(slots=True)
class ToolRecord:
    name: str
    ok: bool
    verdict: str = "allow"
    error: str = ""
    signature: str = ""
    duration_s: float = 0.0
    #: The call's arguments as parsed, whole (cut only when the episode is written).
    args: dict[str, Any] = field(default_factory=dict)
    #: A timeout, rate limit, 5xx, network error or refusal: recorded, never a rule.
    environmental: bool = False
    #: Not run because a person denied it (or let the approval expire): a decision,
    #: never counted as a failure (core/signatures.py `is_decision`).
    decision: bool = False
    #: What the call reads, writes, deletes, fetches and runs, as the guardian saw it
    #: (empty when it was never judged: unknown tool, arguments that did not parse).
    effects: Effects = field(default_factory=Effects)
    #: The arguments text as sent, only when it was not a JSON object (else "").
    raw_arguments: str = ""
    #: What the model read back from the call, cut to RESULT_CHARS: kept in memory and in
    #: the journal (the workflow learner replays it in a dry run), not in the episode file.
    result: str = ""

    def __post_init__(self) -> None:
        # A record rebuilt from plain data (a journal, `asdict`) gets its effects back typed.
        if not isinstance(self.effects, Effects):
            self.effects = Effects.from_data(self.effects)

    @property
    def arguments(self) -> str:
        """The arguments as one JSON text (what the episode file and its summary show)."""
        if self.raw_arguments:
            return self.raw_arguments
        return json.dumps(self.args, ensure_ascii=False) if self.args else ""

    def front_matter(self) -> dict[str, Any]:
        """This call as the episode file keeps it: arguments cut, effects summarised."""
        out: dict[str, Any] = {
            "name": self.name,
            "ok": self.ok,
            "verdict": self.verdict,
            "error": self.error,
            "signature": self.signature,
            "duration_s": self.duration_s,
            "arguments": self.arguments[:EPISODE_ARGUMENTS_CHARS],
            "environmental": self.environmental,
            "decision": self.decision,
        }
        effects = self.effects.summary()
        if effects:
            out["effects"] = effects
        return out


@dataclass(slots=True)
class Episode:
    id: str
    started: datetime
    channel: str
    conversation: str
    user: str
    request: str
    #: success | failure | cancelled | denied (answered, and its last tool call was
    #: denied by a person or its approval expired: a decision, not a failure) |
    #: interrupted (Steward stopped mid-task; asked about after the restart)
    outcome: str
    #: person:<channel>:<user> for direct messages, conversation:<channel>:<id> for groups.
    scope: str = ""
    reply: str = ""
    model: str = ""
    steps: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    duration_s: float = 0.0
    error: str = ""
    tools: list[ToolRecord] = field(default_factory=list)
    #: Which answer gates fired ("evidence", "quality", "passed after retry").
    gates: list[str] = field(default_factory=list)
    #: Ids of the past episodes shown to the model for this task (recall).
    recalled: list[str] = field(default_factory=list)
    #: Prompt context of this task in tokens: budget, episodes, summary, history, turns.
    context: dict[str, int] = field(default_factory=dict)
    #: The failed task's own signature (task:<kind>:<message>), beside the tools' ones.
    task_signature: str = ""
    task_environmental: bool = False
    #: Rules injected into the prompt (active ones and trials), and which were trials.
    rules_applied: list[str] = field(default_factory=list)
    rules_trial: list[str] = field(default_factory=list)
    #: The workspace snapshot taken before the task's first change (core/snapshots), and
    #: what it changed ("M notes.md (+3 -1)", "D build/out.bin"): `/undo` reverts it.
    snapshot: str = ""
    changes: list[str] = field(default_factory=list)
    #: The learned workflow this task ran (core/workflows), "" when it ran none.
    workflow: str = ""
    #: The children `delegate` ran (core/delegate.py), each as a plain record: id, task,
    #: outcome, reply, tools, steps, tokens and cost, and its own children. Their tokens
    #: and cost are also counted in this episode's (what the task cost in all).
    children: list[dict[str, Any]] = field(default_factory=list)

    @property
    def error_signatures(self) -> list[str]:
        sigs = {t.signature for t in self.tools if t.signature}
        if self.task_signature:
            sigs.add(self.task_signature)
        return sorted(sigs)

    @property
    def environmental_signatures(self) -> list[str]:
        sigs = {t.signature for t in self.tools if t.signature and t.environmental}
        if self.task_signature and self.task_environmental:
            sigs.add(self.task_signature)
        return sorted(sigs)

    @property
    def decision_signatures(self) -> list[str]:
        """Signatures of calls a person denied: recorded, never a failure to learn from."""
        return sorted({t.signature for t in self.tools if t.signature and t.decision})

    @property
    def failure_signatures(self) -> list[str]:
        """`error_signatures` without the decisions: what actually went wrong."""
        decisions = set(self.decision_signatures)
        return [s for s in self.error_signatures if s not in decisions]

    def front_matter(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "started": self.started.isoformat(),
            "channel": self.channel,
            "conversation": self.conversation,
            "user": self.user,
            "scope": self.scope,
            "request": self.request,
            "outcome": self.outcome,
            "error": self.error or None,
            "error_signatures": self.error_signatures,
            "environmental_signatures": self.environmental_signatures,
            "decision_signatures": self.decision_signatures,
            "tools": [t.front_matter() for t in self.tools],
            "gates": self.gates,
            "recalled": self.recalled,
            "context": self.context,
            "rules_applied": self.rules_applied,
            "rules_trial": self.rules_trial,
            "model": self.model,
            "steps": self.steps,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": self.cost_usd,
            "duration_s": round(self.duration_s, 3),
            **({"snapshot": self.snapshot, "changes": self.changes} if self.snapshot else {}),
            **({"workflow": self.workflow} if self.workflow else {}),
            **({"children": self.children} if self.children else {}),
        }

    def to_record(self) -> dict[str, Any]:
        """Every field as plain JSON data: what the task journal keeps of a finished task
        until its episode file is written (core/persist.py), so a crash in between loses
        nothing."""
        # Field by field, not dataclasses.asdict: its deep copy is most of the cost, and
        # this runs on the reply path (every value here is a str, number, list or dict
        # that the finished task no longer changes).
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["started"] = self.started.isoformat()
        data["tools"] = [
            {
                name: t.effects.to_data() if name == "effects" else getattr(t, name)
                for name in ToolRecord.__dataclass_fields__
            }
            for t in self.tools
        ]
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Episode:
        """The inverse of `to_record`; unknown keys (a newer version's) are ignored."""
        names = set(cls.__dataclass_fields__)
        kept = {k: v for k, v in data.items() if k in names}
        kept["started"] = datetime.fromisoformat(str(kept["started"]))
        tool_names = set(ToolRecord.__dataclass_fields__)
        kept["tools"] = [
            ToolRecord(**{k: v for k, v in t.items() if k in tool_names})
            for t in kept.get("tools") or []
        ]
        return cls(**kept)

    def to_markdown(self) -> str:
        """The whole file as written, before redaction (front matter + `body`)."""
        return render(self.front_matter(), self.body())

    def body(self) -> str:
        """The readable part: request, tools with their outcome, outcome, reply."""
        lines = ["## Request", "", self.request.strip(), ""]
        if self.tools:
            lines += ["## Tools", ""]
            for t in self.tools:
                mark = "ok" if t.ok else f"failed: {t.error.splitlines()[0] if t.error else ''}"
                lines.append(f"- `{t.name}` {t.arguments[:120]} — {mark}")
            lines.append("")
        lines += ["## Outcome", "", f"{self.outcome}" + (f": {self.error}" if self.error else "")]
        if self.reply.strip():
            lines += ["", "## Reply", "", self.reply.strip()]
        return "\n".join(lines)


class EpisodeStore:
    """Writes and reads episodes under <data dir>/episodes/YYYY/MM/DD/<id>.md."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "episodes"
        self.health = health_for(data_dir)  # a failed write is said out loud, not only logged
        # No read cache: a rebuild reads each episode once, and 100k cached would only hold memory.
        self.store = RecordStore(self.root, "episode", health=self.health, cache_size=0)

    def path_for(self, episode: Episode) -> Path:
        d = episode.started  # one joinpath, no strftime: twice per message
        return self.root.joinpath(
            f"{d.year:04d}", f"{d.month:02d}", f"{d.day:02d}", f"{episode.id}.md"
        )

    async def write(self, episode: Episode) -> Path:
        path = self.path_for(episode)
        # Rendered and redacted in the thread too (the store redacts: secrets pasted in
        # chat or printed by tools never reach the disk): the YAML dump and the secret
        # scan are milliseconds of CPU the event loop (other conversations' replies) need
        # not wait for. The episode is finished: nothing mutates it any more.
        await self.health.guard(
            "episode", path, lambda: asyncio.to_thread(self._write_one, path, episode)
        )
        return path

    def _write_one(self, path: Path, episode: Episode) -> Written:
        return self.store.write_file(path, episode.front_matter(), episode.body())

    def _write_all(
        self, paths: list[Path], episodes: list[Episode], then: Callable[[], None] | None
    ) -> list[Written | OSError]:
        results: list[Written | OSError] = []
        # One fsync per folder for the batch (memory/atomic.py; for the writer's whole
        # batch when run there), made before `then` closes the journal records: those
        # go only once the episodes are durable.
        with folder_syncs_grouped():
            try:
                for path, episode in zip(paths, episodes, strict=True):
                    try:
                        results.append(self._write_one(path, episode))
                    except OSError as exc:
                        results.append(exc)
            finally:
                if then is not None:
                    after_folder_syncs(then)
        return results

    async def write_many(
        self, episodes: list[Episode], *, then: Callable[[], None] | None = None
    ) -> list[Written | None]:
        """Write a batch in one thread hop (core/persist.py batches under load); each file
        as `write` would, its failure counted by the health record like `write`'s; None
        where it failed. Each `Written` holds the file's text and stat, so the index
        adds it without reading it back. `then` (blocking) runs in the same hop once
        every file is written or has failed: the journal's unlinks (TaskJournal.closing)."""
        paths = [self.path_for(e) for e in episodes]
        # On the data dir's writer (memory/hops.py), with the journal's and transcripts'
        # writes of the same moment: one thread hop for them all, their folders synced
        # once; not in the default pool, where litellm prepares each request.
        results = await hops.run(partial(self._write_all, paths, episodes, then))
        out: list[Written | None] = []
        for path, result in zip(paths, results, strict=True):

            async def outcome(result: Written | OSError = result) -> None:
                if isinstance(result, OSError):
                    raise result

            try:
                await self.health.guard("episode", path, outcome)
            except OSError:
                out.append(None)
            else:
                out.append(None if isinstance(result, OSError) else result)
        return out

    def iter_files(self) -> Iterator[Path]:
        if self.root.is_dir():
            yield from sorted(self.root.rglob("*.md"))

    @staticmethod
    def read_front_matter(path: Path) -> dict[str, Any]:
        """Parse one episode's front matter; raises ValueError naming the file when malformed
        (`MalformedFile`: also when a field Steward relies on has the wrong kind of value)."""
        meta, _body = read_record(path)
        if not meta:
            raise MalformedFile(path, "front matter is empty")
        problem = _wrong_fields(meta)
        if problem:
            raise MalformedFile(path, problem)
        return meta


#: Fields every reader of an episode uses, and the kinds of value they must have (a
#: word a person typed by hand, `request: 42`, still reads; a mapping there does not).
_SCALAR = (str, int, float, bool)
_FIELD_KINDS: dict[str, tuple[type, ...]] = {
    "id": _SCALAR,
    "request": _SCALAR,
    "outcome": _SCALAR,
    "channel": _SCALAR,
    "tools": (list,),
    "error_signatures": (list,),
    "rules_applied": (list,),
}


def _wrong_fields(meta: dict[str, Any]) -> str:
    """What is wrong with the kinds of an episode's fields ("" when nothing is)."""
    for name, kinds in _FIELD_KINDS.items():
        value = meta.get(name)
        if value is not None and not isinstance(value, kinds):
            return f"{name} is a {type(value).__name__}, not a {kinds[0].__name__}"
    tools = meta.get("tools") or []
    if any(not isinstance(t, dict) for t in tools):
        return "tools holds something other than 'name: …' mappings"
    return ""


def damage(path: Path, data_dir: Path) -> str | None:
    """Why `path` cannot be read as an episode (as the memory index and the readers here
    read it), or None; an I/O error is not damage. memory/quarantine.py asks it."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    try:
        rel = path.relative_to(data_dir).as_posix()
    except ValueError:
        rel = f"episodes/{path.name}"
    try:
        from_text(data_dir, rel, "episode", text, 0, len(raw))
        meta, _body = parse(text, path)
    except DocError as exc:
        return exc.reason
    except MalformedFile as exc:
        return exc.reason
    if not meta:
        return "front matter is empty"
    return _wrong_fields(meta) or None
