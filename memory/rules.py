"""Rules on disk: <data dir>/rules/<id>.md, front matter + the rule text.

Every change goes through the data dir's git repository (DataStore.awrite with a
commit message that carries the evidence), so `git log rules/r-12.md` is the
rule's whole story. A person may edit a file by hand: the text's hash no longer
matches `text_sha`, and the rule is treated as theirs (pinned: scored, never
rewritten). A file that cannot be read as a rule is never fatal and never
overwritten: in a running Steward it is set aside in quarantine/ (memory/quarantine.py)
and shown by /healthz, `steward doctor` and the dashboard, instead of silently no
longer applying; elsewhere (`steward rules list`) it is reported by path.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from pathlib import Path
from typing import Any

import structlog

from memory.dirwatch import DirWatch
from memory.quarantine import FOLDER as QUARANTINE_FOLDER
from memory.quarantine import Quarantine
from memory.store import DataStore, MalformedFile, parse

log = structlog.get_logger("steward.rules")

STATUSES = ("candidate", "active", "retired")
#: Entries of a rule's own history kept in its front matter (git keeps everything).
HISTORY_KEPT = 30
_ID = re.compile(r"^r-(\d+)$")


def text_sha(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()[:16]


@dataclass(slots=True)
class Rule:
    id: str
    text: str
    status: str = "candidate"
    confidence: float = 0.3
    #: A person wrote or edited it: the learner scores it but never rewrites or retires it.
    pinned: bool = False
    #: learned | person
    source: str = "learned"
    #: The trigger: the error signature it prevents ("" for a person's rule: every task).
    signature: str = ""
    #: The kinds of request it applies to, in words (drafted with the rule).
    applies_when: str = ""
    #: Requests of the episodes it was drafted from (matched against new requests).
    examples: list[str] = field(default_factory=list)
    source_episodes: list[str] = field(default_factory=list)
    trials: int = 0
    wins: int = 0
    losses: int = 0
    #: Matching tasks that ran without this rule, and how many hit the signature.
    baseline_tasks: int = 0
    baseline_failures: int = 0
    created: str = ""
    updated: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Hash of the text the learner last wrote; a mismatch means a person edited it.
    written_sha: str = ""
    path: Path | None = None

    @property
    def relpath(self) -> str:
        return f"rules/{self.id}.md"

    @property
    def baseline_rate(self) -> float:
        """How often the signature hits matching tasks without this rule (Laplace-smoothed,
        so two observations do not look like certainty)."""
        return (self.baseline_failures + 1) / (self.baseline_tasks + 2)

    def note(self, at: datetime, event: str, detail: str = "") -> None:
        entry = {"at": at.isoformat(timespec="seconds"), "event": event}
        if detail:
            entry["detail"] = detail
        self.history = [*self.history, entry][-HISTORY_KEPT:]
        self.updated = entry["at"]

    def copy(self) -> Rule:
        """A shallow copy, as copy.copy makes, ~5x faster: the learner copies every rule
        for every task (RuleStore.load)."""
        new = object.__new__(Rule)
        for name, value in zip(Rule.__slots__, _slot_values(self), strict=True):
            object.__setattr__(new, name, value)
        return new

    def front_matter(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "confidence": round(self.confidence, 4),
            "pinned": self.pinned,
            "source": self.source,
            "signatures": [self.signature] if self.signature else [],
            "trigger": {
                "signature": self.signature,
                "applies_when": self.applies_when,
                "examples": self.examples,
            },
            "source_episodes": self.source_episodes,
            "trials": self.trials,
            "wins": self.wins,
            "losses": self.losses,
            "baseline": {"tasks": self.baseline_tasks, "failures": self.baseline_failures},
            "created": self.created,
            "updated": self.updated,
            "text_sha": text_sha(self.text),
            "history": self.history,
        }


def rule_from(meta: dict[str, Any], body: str, path: Path) -> Rule:
    status = str(meta.get("status", "candidate"))
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    trigger = meta.get("trigger") or {}
    if isinstance(trigger, str):  # a hand-written file may say `trigger: <words>`
        trigger = {"applies_when": trigger}
    if not isinstance(trigger, dict):
        raise ValueError("trigger must be a mapping (signature, applies_when, examples)")
    sigs = meta.get("signatures") or []
    signature = str(trigger.get("signature") or (sigs[0] if sigs else "") or "")
    baseline = meta.get("baseline") or {}
    text = body.strip()
    written = str(meta.get("text_sha") or "")
    rule = Rule(
        id=str(meta.get("id", path.stem)),
        text=text,
        status=status,
        confidence=float(meta.get("confidence", 0.0)),
        pinned=bool(meta.get("pinned", False)),
        source=str(meta.get("source", "person")),
        signature=signature,
        applies_when=str(trigger.get("applies_when") or ""),
        examples=[str(x) for x in trigger.get("examples") or []],
        source_episodes=[str(x) for x in meta.get("source_episodes") or []],
        trials=int(meta.get("trials", 0)),
        wins=int(meta.get("wins", 0)),
        losses=int(meta.get("losses", 0)),
        baseline_tasks=int(baseline.get("tasks", 0)),
        baseline_failures=int(baseline.get("failures", 0)),
        created=str(meta.get("created", "")),
        updated=str(meta.get("updated", "")),
        history=[h for h in meta.get("history") or [] if isinstance(h, dict)],
        written_sha=written,
        path=path,
    )
    if written != text_sha(text):  # written or edited by a person, not by the learner
        rule.pinned = True
    return rule


def _read_rule(path: Path) -> Rule:
    """The rule in `path`; `MalformedFile` (with the reason) when it is not one, OSError
    when it cannot be read at all."""
    try:
        meta, body = parse(path.read_text(encoding="utf-8"), path)
        return rule_from(meta, body, path)
    except MalformedFile:
        raise
    except UnicodeDecodeError as exc:
        raise MalformedFile(path, f"not UTF-8 text ({exc.reason})") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise MalformedFile(path, f"front matter value of the wrong kind: {exc}") from None


def damage(path: Path) -> str | None:
    """Why `path` cannot be read as a rule, or None (also when it cannot be opened: an
    I/O error is not damage). memory/quarantine.py asks it."""
    try:
        _read_rule(path)
    except MalformedFile as exc:
        return exc.reason
    except OSError:
        return None
    return None


#: Every slot of a Rule, read in one call (Rule.copy).
_slot_values = attrgetter(*Rule.__slots__)


class RuleStore:
    """Reads every rule fresh (a person or `steward rules` may have changed a file since);
    writes through the DataStore so each change is one commit."""

    def __init__(self, data_dir: Path, store: DataStore | None = None) -> None:
        self.data_dir = data_dir
        self.root = data_dir / "rules"
        self.store = store or DataStore(data_dir)
        #: file name -> ((mtime_ns, size), parsed rule or problem). Parsing YAML is ~1.5
        #: ms a rule and the learner reads every rule twice per task; an unchanged file
        #: is not parsed again (an edit by hand changes its mtime, so it is picked up).
        self._parsed: dict[str, tuple[tuple[int, int], Rule | str]] = {}
        #: Whether anything in the folder changed since the last full look, and what
        #: that look found, in order (`_parsed`'s items): memory/dirwatch.py.
        self._watch = DirWatch(self.root)
        self._last: list[Rule | str] | None = None
        #: Set by the process holding the data dir's lock (bot/app.py): a damaged rule
        #: is then moved there and shown, not only skipped. None: reported only.
        self.quarantine: Quarantine | None = None

    def load(self) -> tuple[list[Rule], list[str]]:
        """All readable rules (fresh copies: callers may change them), plus one problem
        line per file that could not be read.

        The learner calls this before every task's model call and again after it, on
        the event loop, so it is lean: when nothing in the folder changed
        since the last look (inotify, one system call: memory/dirwatch.py), copies of
        what that look found; else file names from one scandir, a stat each, and only a
        changed file parsed again. Every call sees every file as it is on disk (where
        inotify cannot see every change, a network file system, within MAX_AGE s)."""
        changed = self._watch.changed()  # first: a change during the look is news next time
        if self._last is not None and not changed:
            return _copies(self._last)
        root = str(self.root)
        try:
            with os.scandir(root) as entries:
                names = [e.name for e in entries if e.name.endswith(".md")]
        except OSError:  # no folder yet (or not one): no rules, until the watch says
            self._last = []
            return [], []
        names.sort(key=_name_order)
        parsed = self._parsed
        items: list[Rule | str] = []
        for name in names:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # removed meanwhile
            stamp = (st.st_mtime_ns, st.st_size)
            cached = parsed.get(name)
            if cached is None or cached[0] != stamp:
                cached = (stamp, self._parse(self.root / name))
                parsed[name] = cached
            items.append(cached[1])
        for gone in parsed.keys() - set(names):
            del parsed[gone]
        self._last = items
        return _copies(items)

    def _parse(self, path: Path) -> Rule | str:
        try:
            return _read_rule(path)
        except MalformedFile as exc:
            if self.quarantine is not None:
                held = self.quarantine.put(path, exc.reason)  # logged there, once
                if held is not None:
                    return f"{path}: {exc.reason} (set aside in {held.held})"
            log.warning("rules.malformed", path=str(path), error=exc.reason)
            return f"{path}: {exc.reason}"
        except OSError as exc:
            log.warning("rules.unreadable", path=str(path), error=str(exc))
            return f"{path}: cannot read: {exc.strerror or exc}"

    def get(self, rule_id: str) -> Rule | None:
        return next((r for r in self.load()[0] if r.id == rule_id), None)

    def next_id(self) -> str:
        """One past the highest id in rules/ and in quarantine/rules/ (a rule set aside
        keeps its id: its file may be fixed and put back)."""
        highest = 0
        for folder in (self.root, self.data_dir / QUARANTINE_FOLDER / "rules"):
            if not folder.is_dir():
                continue
            for path in folder.glob("*.md"):
                m = _ID.match(path.stem.split("~", 1)[0])
                if m:
                    highest = max(highest, int(m.group(1)))
        return f"r-{highest + 1}"

    async def save(self, rule: Rule, message: str) -> Path:
        """Write and commit; raises MalformedFile rather than overwrite a broken file."""
        path = await self.store.awrite(
            rule.relpath, rule.front_matter(), rule.text + "\n", commit=message
        )
        rule.path, rule.written_sha = path, text_sha(rule.text)
        return path

    async def delete(self, rule: Rule, message: str) -> bool:
        return await self.store.aremove(rule.relpath, commit=message)


def _copies(items: list[Rule | str]) -> tuple[list[Rule], list[str]]:
    """`load`'s answer from parsed files: copies of the rules (callers may change them;
    the parsed ones are replaced, never mutated in place) and the problems."""
    rules = [item.copy() for item in items if isinstance(item, Rule)]
    return rules, [item for item in items if isinstance(item, str)]


def _name_order(name: str) -> tuple[int, str]:
    """r-2.md before r-10.md; names that are no rule id last, by name."""
    stem = name[:-3]
    m = _ID.match(stem)
    return (int(m.group(1)) if m else 1 << 30, stem)


__all__ = ["STATUSES", "Rule", "RuleStore", "damage", "rule_from", "text_sha"]
