"""Approvals on disk: <data dir>/approvals/<id>.md, so none is lost or approved by a restart.

Each request is written when it is asked and again when it is decided; the file is
the record a person can audit ("who approved `git push` on Tuesday?"). Written and
read through the one record store (`memory.records`): redacted, atomic, cached.

A file that cannot be read (garbled, cut short, not UTF-8, without an id or status) is
set aside in quarantine/ (memory/quarantine.py) as the records are read. Its request
can then no longer be approved, and its chat message must not keep live buttons; but
the message id was in the damaged file. So the chat message of each request waiting
for a decision is also kept in a small index beside the records, `approvals/messages.json`
(id → channel, conversation, message id, text; only requests still pending, so it
stays small), and failing that the damaged file's lines are searched for those fields.
What was found is handed to core/approvals.py (`take_damaged`), which edits the message
to expired when the channel starts.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

import structlog
import yaml

from memory.atomic import atomic_write_text
from memory.quarantine import Quarantine, quarantine_for
from memory.records import RecordStore, read_record
from memory.redact import redact
from memory.store import MalformedFile

log = structlog.get_logger("steward.approvals.store")

#: The index of pending requests' chat messages, beside the records (not a `*.md` record).
MESSAGES_NAME = "messages.json"
#: Characters of a request's text kept in the index (what its expired message shows).
TEXT_KEPT = 2000
_FIELD_LINE = re.compile(r"^(id|status|channel|conversation|message_id|text):(?:[ \t]|$)")


def _check(meta: dict[str, Any], path: Path) -> None:
    """`MalformedFile` unless the record has what every reader uses: an id and a status."""
    rid, status = meta.get("id"), meta.get("status")
    if not rid or not status:
        raise MalformedFile(path, "no id or no status in the front matter")
    if not isinstance(rid, (str, int)) or not isinstance(status, str):
        raise MalformedFile(path, "id or status is not a single word")


def damage(path: Path) -> str | None:
    """Why `path` cannot be read as an approval record, or None (also for an I/O error,
    which is not damage). memory/quarantine.py asks it."""
    try:
        meta, _body = read_record(path)
        _check(meta, path)
    except MalformedFile as exc:
        return exc.reason
    except OSError:
        return None
    return None


def salvage(raw: bytes) -> dict[str, Any]:
    """The fields a damaged record still shows: each top-level `key: value` entry (with
    its continuation lines) parsed on its own, one that does not parse skipped. What is
    left to find its chat message and show what was asked."""
    found: dict[str, Any] = {}
    entries: list[list[str]] = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if _FIELD_LINE.match(line):
            entries.append([line])
        elif entries and (not line.strip() or line[:1] in (" ", "\t")):
            entries[-1].append(line)
        else:
            entries.append([])  # anything else ends the entry before it
    for lines in entries:
        if not lines:
            continue
        try:
            value = yaml.safe_load("\n".join(lines))
        except yaml.YAMLError:
            continue
        if not isinstance(value, dict):
            continue
        for key, item in value.items():
            if key in found or isinstance(item, bool):
                continue
            if isinstance(item, (str, int, float)):
                found[str(key)] = str(item)
    return found


class ApprovalStore:
    def __init__(self, data_dir: Path, *, quarantine: Quarantine | None = None) -> None:
        self.records = RecordStore(data_dir / "approvals", "approval")
        self.root = self.records.root
        self.quarantine = quarantine or quarantine_for(data_dir)
        self.messages_path = self.root / MESSAGES_NAME
        self._messages_lock = threading.Lock()
        self._damaged: list[dict[str, Any]] = []

    def path(self, approval_id: str) -> Path:
        return self.records.path(approval_id)

    async def save(self, record: dict[str, Any]) -> None:
        body = f"{record.get('what', '')}\n\nWhy: {record.get('why', '')}\n"
        # The message index first: once the record says where its message is, so does
        # the index (a stop or a crash between the two leaves at most an extra entry).
        await asyncio.to_thread(self._note_message, record)
        await self.records.save(self.path(record["id"]), record, body)

    def load_all(self) -> list[dict[str, Any]]:
        """Every readable record. A damaged file is set aside in quarantine/ (what is known
        of its chat message waits in `take_damaged`); one that cannot be opened is logged
        with its path and left alone."""
        records = []
        for path in self.records.paths():
            try:
                meta, _body = self.records.read(path)
                _check(meta, path)
                records.append(meta)
            except MalformedFile as exc:
                self._set_aside(path, exc.reason)
            except (OSError, ValueError) as exc:
                log.warning("approvals.malformed", path=str(path), error=str(exc))
        return records

    def take_damaged(self) -> list[dict[str, Any]]:
        """The requests set aside since the last call, each as what is known of it: `id`,
        `damaged` (why), `quarantined` (where), and from the message index (or the damaged
        lines) `status`, `channel`, `conversation`, `message_id`, `text` where known."""
        taken, self._damaged = self._damaged, []
        return taken

    def _set_aside(self, path: Path, reason: str) -> None:
        rid = path.stem
        try:
            raw = path.read_bytes()
        except OSError:
            raw = b""
        known = self._messages().get(rid)
        if known is not None:
            stub = {**known, "status": "pending", "found_in": MESSAGES_NAME}
        else:
            stub = {**salvage(raw), "found_in": "damaged file"}
        held = self.quarantine.put(path, reason)
        if held is None:  # could not be moved: logged there; it is read again next time
            return
        self.records.forget(path)
        stub.update(id=rid, damaged=reason, quarantined=str(held.held))
        if not (stub.get("channel") and stub.get("message_id")):
            log.warning(
                "approvals.damaged_message_unknown",
                approval=rid,
                path=str(held.held),
                detail="its chat message is named neither in the index nor in the file",
            )
        self._damaged.append(stub)

    # -- the pending requests' chat messages ----------------------------------------------

    def _messages(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.messages_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning(
                "approvals.messages_unreadable", path=str(self.messages_path), error=str(exc)
            )
            return {}
        return (
            {str(k): v for k, v in data.items() if isinstance(v, dict)}
            if isinstance(data, dict)
            else {}
        )

    def _note_message(self, record: dict[str, Any]) -> None:
        """Keep the index in step with a saved record: a pending request with a message is
        in it, any other is not. Written only when it changes (rare: a few per approval)."""
        rid = str(record.get("id"))
        entry = None
        if record.get("status") == "pending" and record.get("message_id"):
            entry = {
                "channel": str(record.get("channel") or ""),
                "conversation": str(record.get("conversation") or ""),
                "message_id": str(record["message_id"]),
                "text": redact(str(record.get("text") or ""))[:TEXT_KEPT],
            }
        self._update_messages(rid, entry)

    def forget_message(self, rid: str) -> None:
        """The request's message was dealt with (edited to expired)."""
        self._update_messages(rid, None)

    def _update_messages(self, rid: str, entry: dict[str, Any] | None) -> None:
        with self._messages_lock:
            messages = self._messages()
            if messages.get(rid) == entry or (entry is None and rid not in messages):
                return
            if entry is None:
                del messages[rid]
            else:
                messages[rid] = entry
            try:
                atomic_write_text(self.messages_path, json.dumps(messages, ensure_ascii=False))
            except OSError as exc:  # the records themselves are written: this only helps
                log.warning("approvals.messages_unwritable", error=str(exc))
