"""Offers a person answers with buttons after a task ("Save as skill?", "Save as
workflow?"): their records on disk and their message, kept the same way for each kind.

Why one place: an offer must survive a restart (a press after one still answers it, so
each is a record in the data dir beside the text it would save), must not lose a press
that arrives while its own message is still being sent (the record is known before the
send, and written one write at a time, so a later write of an older state never lands
last), and once answered shows the answer in its message without its buttons.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from core.clock import Clock
from core.events import Channel, MessageRef
from memory.records import RecordStore

log = structlog.get_logger("steward.offers")


@dataclass(slots=True)
class Offer:
    """One offer: its record, the text it would save, and where its message is."""

    record: dict[str, Any]
    body: str
    channel: Channel | None = None
    ref: MessageRef | None = None


class OfferBook:
    """The offers of one kind: `<folder>/<id>.md` records, and those of this run."""

    def __init__(self, folder: Path, kind: str, clock: Clock) -> None:
        self.store = RecordStore(folder, kind)
        self.clock = clock
        self.kind = kind
        #: Offers of this run, open or answered while their message was being sent.
        self.live: dict[str, Offer] = {}
        self._writing = asyncio.Lock()

    def add(self, record: dict[str, Any], body: str, channel: Channel) -> Offer:
        """A new offer, known before its message goes out (a press may come back first)."""
        offer = self.live[record["id"]] = Offer(record, body, channel)
        return offer

    def find(self, oid: str) -> Offer | None:
        """An offer of this run, else one of an earlier run from its record on disk."""
        offer = self.live.get(oid)
        if offer is not None:
            return offer
        if not re.fullmatch(r"[0-9a-f]{8}", oid):
            return None
        try:
            record, body = self.store.read(self.store.path(oid))
        except (OSError, ValueError):
            return None
        return Offer(record, body)

    async def save(self, offer: Offer) -> None:
        """Write the offer's record as it is now, one write at a time (the writes run in
        threads and could otherwise land in either order)."""
        async with self._writing:
            record = dict(offer.record)
            await self.store.save(self.store.path(record["id"]), record, offer.body)

    async def sent(self, offer: Offer, ref: MessageRef | None) -> None:
        """Its message went out: remember where, and show an answer that came meanwhile."""
        offer.ref = ref
        if ref is not None:
            offer.record.update(message_id=ref.id, thread=ref.thread)
            await self.save(offer)
        if offer.record["status"] != "open":
            await self.edit(offer)

    async def close(self, offer: Offer, status: str, outcome: str) -> None:
        """Answered: the record says how and when, and the message shows it."""
        offer.record.update(status=status, outcome=outcome, answered_at=self.clock.now())
        await self.save(offer)
        log.info("offer.answered", kind=self.kind, offer=offer.record["id"], status=status)
        await self.edit(offer)

    async def edit(self, offer: Offer) -> None:
        """The offer's message shows the answer, without its buttons."""
        if offer.channel is None or offer.ref is None:
            return
        record = offer.record
        self.live.pop(record["id"], None)
        try:
            await offer.channel.edit(
                offer.ref, f"{record.get('text', '')}\n\n{record.get('outcome', '')}", buttons=[]
            )
        except Exception:
            log.warning("offer.edit_failed", kind=self.kind, offer=record["id"], exc_info=True)
