"""`/undo`, `/undo list` and `/undo TASK_ID` (core/snapshots): put back what a task of
this conversation changed in the workspace (and outside it, where a person approved it).

Registered on the dispatcher's router like /schedule, so every channel answers it the
same way. Not while a task of this conversation runs: it could be changing the very
files the undo puts back.
"""

from __future__ import annotations

from typing import Any

from core.snapshots import Blocker, Undo, UndoOutcome

USAGE = "/undo (the last task here), /undo list, /undo TASK_ID"
BUSY = "A task is running here; wait for it (or /cancel it), then /undo."


def told(outcome: UndoOutcome) -> str:
    """What a person is told about an undo (chat and `steward undo`)."""
    rec = outcome.record
    if outcome.status == "unknown":
        ids = ", ".join(outcome.recent) or "none"
        return f"There is no task {outcome.asked} to undo in this conversation (recent: {ids})."
    if outcome.status == "already":
        return (
            f"Task {rec['id']} was already undone by {rec['undone_by']}; "
            f"/undo {rec['undone_by']} brings its changes back."
        )
    if outcome.status == "running":
        return (
            f"Task {rec['id']} is still running (on another worker); wait for it to end, "
            "then /undo."
        )
    if outcome.status == "nothing":
        return "Nothing to undo: no task in this conversation changed files."
    if outcome.status == "blocked":
        why = "; ".join(sorted({_in_the_way(b) for b in outcome.blockers}))
        return f"I did not undo {rec['id']}: {why}."
    done = outcome.restored
    what = "the undo" if rec.get("kind") == "undo" else "task"
    head = f"Undid {what} {rec['id']}"
    if rec.get("request") and rec.get("kind") != "undo":
        head += f" (“{rec['request'][:80]}”)"
    parts = []
    if done is not None and done.restored:
        parts.append("restored " + ", ".join(done.restored))
    if done is not None and done.recreated:
        parts.append("re-created " + ", ".join(done.recreated))
    if done is not None and done.removed:
        parts.append("removed " + ", ".join(done.removed))
    body = "; ".join(parts) if parts else "the files were already as before it"
    return f"{head}: {body}.\nThis undo can be undone too: /undo {outcome.undo_id}"


def _in_the_way(b: Blocker) -> str:
    if b.by is None:
        return f"{b.path} was changed since, outside Steward's tasks"
    what = "undo" if b.by.get("kind") == "undo" else "task"
    req = f" (“{b.by.get('request', '')[:60]}”)" if b.by.get("request") else ""
    return f"{b.path} was changed later by {what} {b.by['id']}{req}; undo that first"


def listing(records: list[dict[str, Any]], limit: int = 10) -> str:
    """`/undo list`: the newest tasks that changed files, with what each changed."""
    if not records:
        return "No task in this conversation has changed files yet."
    lines = ["Tasks that changed files (newest first; /undo TASK_ID undoes one):"]
    for r in reversed(records[-limit:]):
        state = f" — undone by {r['undone_by']}" if r.get("undone_by") else ""
        stat = r.get("diffstat") or [f"? {p}" for p in r.get("files", {})]
        stat = sorted(stat, key=lambda line: ("MDA".find(line[:1]), line))
        shown = ", ".join(stat[:4]) + (f" and {len(stat) - 4} more" if len(stat) > 4 else "")
        label = r.get("request", "")[:60]
        lines.append(f"{r['id']}  “{label}”: {shown or 'in progress'}{state}")
    return "\n".join(lines)


def register(router: Any, undo: Undo) -> None:
    """Add `/undo` to a dispatcher's router (bot/router.py)."""

    async def handler(ctx: Any) -> str:
        d = ctx.services
        key = d.key(ctx.channel, ctx.conversation)
        arg = ctx.arg.strip()
        if arg.lower() == "list":
            return listing(await undo.records_of(key))
        if d.conversations.is_busy(key):
            return BUSY
        return told(await undo.undo(key, arg))

    router.command("undo", handler, help="put back what the last task here changed", usage=USAGE)
