"""/rules in every chat and `steward rules …` in a terminal: one implementation.

Why one: a person steering the learner must get the same answer wherever they ask.
Output is sized for chat: a short page of one line per rule, and where the channel
renders Markdown a compact monospace table. Changing rules may be limited to admins;
everyone allowed to talk to Steward may list and show. It lives in bot/ because it is
chat text: the learner (core/learning.py) and the rule store (memory/rules.py) only
hold and judge the rules, this module words them.
"""

from __future__ import annotations

import builtins
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, requires
from core.clock import Clock
from core.learning import LearningConfig
from memory.rules import STATUSES, Rule, RuleStore
from memory.store import MalformedFile

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

PAGE = 10
CHANGES = ("promote", "demote", "disable", "delete", "edit", "add")

USAGE = """Usage: /rules list [candidate|active|retired] [page N] · show ID · stats
Admins: promote ID · demote ID · disable ID · delete ID · edit ID TEXT · add TEXT"""


@dataclass(frozen=True, slots=True)
class Caller:
    user: str
    #: May change rules (an admin, or anyone when changes are not limited).
    may_change: bool
    #: The channel renders Markdown code blocks (a table fits); else plain lines.
    rich: bool = True


class Refused(Exception):
    """A command that could not be done as asked; its text is the answer."""


class RulesCommands:
    def __init__(self, rules: RuleStore, clock: Clock, config: LearningConfig) -> None:
        self.rules = rules
        self.clock = clock
        self.cfg = config

    async def run(self, args: str, caller: Caller) -> str:
        return (await self.execute(args, caller))[0]

    async def execute(self, args: str, caller: Caller) -> tuple[str, bool]:
        """The answer, and whether the command did what was asked (the CLI's exit code)."""
        try:
            return await self._dispatch(args, caller), True
        except Refused as exc:
            return str(exc), False
        except MalformedFile as exc:
            return f"Not changed: {exc} (fix or delete that file by hand).", False

    async def _dispatch(self, args: str, caller: Caller) -> str:
        try:
            words = shlex.split(args)
        except ValueError:
            words = args.split()
        action = words[0].lower() if words else "list"
        rest = words[1:]
        if action in STATUSES:  # `/rules active` is `/rules list active`
            action, rest = "list", words
        if action == "list":
            return self.list(rest, caller)
        if action == "show":
            if not rest:
                raise Refused("Usage: /rules show ID")
            return self.show(rest[0])
        if action == "stats":
            return self.stats()
        if action in CHANGES:
            if not caller.may_change:
                raise Refused("Only an admin can change rules; you can list and show them.")
            return await self.change(action, rest, caller.user, args)
        raise Refused(f"Unknown /rules action {action!r}.\n{USAGE}")

    # reading ---------------------------------------------------------------------------

    def list(self, words: list[str], caller: Caller) -> str:
        status = None
        page = 1
        it = iter(words)
        for w in it:
            if w.lower() in STATUSES:
                status = w.lower()
            elif w.lower() == "page":
                page = _int(next(it, "1"), 1)
            elif w.isdigit():
                page = int(w)
            else:
                raise Refused(f"Unknown filter {w!r}: use one of {', '.join(STATUSES)}.")
        rules, problems = self.rules.load()
        shown = [r for r in rules if status is None or r.status == status]
        shown.sort(key=_order)
        if not shown:
            what = f"{status} rules" if status else "rules"
            lines = [f"No {what} yet. Steward drafts rules from repeated failures."]
            return "\n".join(lines + [f"skipped (malformed): {p}" for p in problems])
        pages = (len(shown) + PAGE - 1) // PAGE
        page = min(max(1, page), pages)
        chunk = shown[(page - 1) * PAGE : page * PAGE]
        if caller.rich:
            rows = [f"{'id':<6} {'status':<9} {'conf':>4} {'W/L':>5}  rule"]
            for r in chunk:
                wl = f"{r.wins}/{r.losses}"
                pin = "*" if r.pinned else " "
                text = _first(r.text, 56)
                rows.append(f"{r.id:<6} {r.status:<9} {r.confidence:>4.2f} {wl:>5} {pin}{text}")
            body = "```\n" + "\n".join(rows) + "\n```"
        else:
            body = "\n".join(
                f"{r.id} [{r.status} {r.confidence:.2f}, {r.wins}W/{r.losses}L] {_first(r.text)}"
                for r in chunk
            )
        foot = []
        if pages > 1:
            nxt = f"/rules list {status + ' ' if status else ''}page {page + 1}"
            foot.append(f"page {page}/{pages}" + (f" — next: {nxt}" if page < pages else ""))
        if any(r.pinned for r in chunk) and caller.rich:
            foot.append("* pinned: written or edited by a person")
        foot += [f"skipped (malformed): {p}" for p in problems]
        return "\n".join([body, *foot])

    def show(self, rule_id: str) -> str:
        r = self.rules.get(rule_id)
        if r is None:
            raise Refused(f"No rule {rule_id}. /rules list shows them.")
        lines = [
            f"{r.id} — {r.status}{' (pinned)' if r.pinned else ''}, source: {r.source}",
            f"Rule: {r.text}",
            f"Trigger: {r.signature or 'every task (a person’s general rule)'}",
        ]
        if r.applies_when:
            lines.append(f"Applies when: {r.applies_when}")
        lines.append(
            f"Confidence {r.confidence:.2f} · {r.trials} trials · {r.wins} wins · {r.losses} losses"
        )
        if r.signature:
            lines.append(
                f"Without it: signature hit {r.baseline_failures} of {r.baseline_tasks} "
                f"matching tasks (p0 {r.baseline_rate:.2f})"
            )
        if r.source_episodes:
            lines.append("Source episodes: " + ", ".join(r.source_episodes[:8]))
        if r.history:
            lines.append("History:")
            for h in r.history[-6:]:
                detail = f" — {h['detail']}" if h.get("detail") else ""
                lines.append(f"  {h.get('at', '')} {h.get('event', '')}{detail}")
        return "\n".join(lines)

    def stats(self) -> str:
        rules, problems = self.rules.load()
        by = {s: sum(r.status == s for r in rules) for s in STATUSES}
        trials = sum(r.trials for r in rules)
        wins = sum(r.wins for r in rules)
        losses = sum(r.losses for r in rules)
        promoted = sum(any(h.get("event") == "promoted" for h in r.history) for r in rules)
        retired = sum(any(h.get("event") == "retired" for h in r.history) for r in rules)
        lines = [
            f"Rules: {len(rules)} ({by['active']} active, {by['candidate']} candidate, "
            f"{by['retired']} retired; {sum(r.pinned for r in rules)} pinned)",
            f"Trials: {trials} ({wins} wins, {losses} losses)",
            f"Promoted by trials: {promoted}; retired by trials: {retired}",
        ]
        if problems:
            lines.append(f"Malformed files skipped: {len(problems)}")
        return "\n".join(lines)

    # changing ----------------------------------------------------------------------------

    async def change(self, action: str, words: builtins.list[str], user: str, raw: str) -> str:
        now = self.clock.utcnow()
        if action == "add":
            text = raw.strip()[len("add") :].strip()
            if not text:
                raise Refused("Usage: /rules add TEXT")
            added = Rule(
                id=self.rules.next_id(),
                text=text,
                status="active",
                confidence=self.cfg.promote,
                pinned=True,
                source="person",
                created=now.isoformat(timespec="seconds"),
            )
            added.note(now, "added", f"by {user}")
            await self.rules.save(added, f"rule {added.id} added by {user} (active, pinned)")
            return f"Added {added.id} (active, pinned; still scored on every task)."
        if not words:
            raise Refused(f"Usage: /rules {action} ID")
        rule = self.rules.get(words[0])
        if rule is None:
            raise Refused(f"No rule {words[0]}. /rules list shows them.")
        record = f"{rule.wins} wins / {rule.losses} losses, confidence {rule.confidence:.2f}"
        if action == "delete":
            await self.rules.delete(rule, f"rule {rule.id} deleted by {user}: {record}")
            return f"Deleted {rule.id} (its history stays in the data dir's git log)."
        if action == "promote":
            rule.status = "active"
            rule.confidence = max(rule.confidence, self.cfg.promote)
            message = f"rule {rule.id} promoted by {user}: {record}"
        elif action == "demote":
            rule.status = "candidate"
            rule.confidence = min(rule.confidence, self.cfg.initial)
            message = f"rule {rule.id} demoted to trial by {user}: {record}"
        elif action == "disable":
            rule.status = "retired"
            message = f"rule {rule.id} disabled by {user}: {record}"
        else:  # edit
            text = raw.strip()[len("edit") :].strip()[len(rule.id) :].strip()
            if not text:
                raise Refused(f"Usage: /rules edit {rule.id} TEXT")
            rule.text = text
            rule.pinned = True
            message = f"rule {rule.id} edited by {user} (now pinned)"
        rule.note(now, action if action != "edit" else "edited", f"by {user}")
        await self.rules.save(rule, message)
        what = message.split(": ")[0].removeprefix(f"rule {rule.id} ")
        return f"{rule.id}: {what}; now {rule.status}."


def _order(r: Rule) -> tuple[int, int, str]:
    rank = {"active": 0, "candidate": 1, "retired": 2}[r.status]
    num = int(r.id[2:]) if r.id[2:].isdigit() else 1 << 30
    return (rank, num, r.id)


def _first(text: str, limit: int = 80) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _int(value: str, default: int) -> int:
    return int(value) if value.isdigit() else default


# -- the /rules chat command ---------------------------------------------------------

HELP = """the rules Steward has learned
  /rules show ID, /rules stats; admins: /rules promote|demote|disable|delete ID,
  /rules edit ID TEXT, /rules add TEXT"""


async def rules(ctx: CommandContext[Dispatcher]) -> str:
    d = ctx.services
    assert d.rules_commands is not None  # the filter
    # Who may change is decided per action inside (listing is for everyone).
    may_change = not d.rules_admins_only or d.access.is_admin(ctx.channel.name, ctx.user)
    rich = getattr(ctx.channel, "dialect", "markdown") != "plain"
    return await d.rules_commands.run(ctx.arg, Caller(ctx.user, may_change, rich))


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command(
        "rules",
        rules,
        usage="/rules [list [candidate|active|retired]]",
        help=HELP,
        filters=[requires(lambda d: d.rules_commands is not None, "Rules are not available here.")],
    )
