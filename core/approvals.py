"""Approvals: a risky action waits for a person's button press, without blocking anything else.

The button carries only a short opaque id; the request stays here. A decision is
taken once (double clicks and replayed callbacks are no-ops), only by an allowed
approver, and an unanswered request is denied at expiry. The full flow (per
conversation approvers, persistence across restarts, "always allow") grows here
in the safety issue; this is the floor: ask, wait, decide, edit the message.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import structlog

from core.clock import Clock, Waiter
from core.events import ApprovalRequest, Button, Channel, MessageRef

log = structlog.get_logger("steward.approvals")

APPROVE = "approve"
DENY = "deny"


@dataclass(slots=True)
class Decision:
    approved: bool
    by: str
    reason: str


@dataclass(slots=True)
class _Pending:
    request: ApprovalRequest
    channel: Channel
    ref: MessageRef | None
    waiter: Waiter[Decision]
    approvers: frozenset[str]


class Approvals:
    """Creates requests, routes presses to them, expires them on the clock."""

    def __init__(self, clock: Clock, *, timeout: float = 600.0) -> None:
        self.clock = clock
        self.timeout = timeout
        self._pending: dict[str, _Pending] = {}
        self._decided: dict[str, Decision] = {}

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(4)

    def pending(self, conversation: str | None = None) -> list[ApprovalRequest]:
        return [
            p.request
            for p in self._pending.values()
            if conversation is None or p.request.conversation == conversation
        ]

    async def ask(
        self,
        channel: Channel,
        *,
        what: str,
        why: str,
        risk: str,
        asked_by: str,
        conversation: str,
        thread: str | None = None,
        task_id: str = "",
    ) -> Decision:
        """Send the request and wait for a decision; never raises for a person's silence."""
        if not channel.capabilities.interactive:
            log.info("approval.unavailable", channel=channel.name, what=what)
            return Decision(
                False,
                "nobody",
                "no one can approve here (one-shot mode); run `steward chat` or use a chat channel",
            )
        rid = self.new_id()
        request = ApprovalRequest(
            id=rid,
            what=what,
            why=why,
            risk=risk,
            asked_by=asked_by,
            conversation=conversation,
            channel=channel.name,
            expires_at=self.clock.now() + self.timeout,
            task_id=task_id,
            buttons=[
                Button("Approve", f"{APPROVE}:{rid}", "primary"),
                Button("Deny", f"{DENY}:{rid}", "danger"),
            ],
        )
        waiter: Waiter[Decision] = Waiter(self.clock, deadline=request.expires_at)
        pending = _Pending(request, channel, None, waiter, frozenset({asked_by}))
        self._pending[rid] = pending
        log.info("approval.requested", approval=rid, what=what, conversation=conversation)
        try:
            pending.ref = await channel.send_approval(request, thread=thread)
        except Exception:
            log.exception("approval.send_failed", approval=rid)
            self._pending.pop(rid, None)
            return Decision(False, "nobody", "the approval request could not be delivered")
        try:
            decision = await waiter.wait()
        except TimeoutError:
            decision = Decision(False, "expiry", f"nobody answered within {self.timeout:.0f}s")
            await self._finish(rid, decision)
        return decision

    async def press(self, value: str, user: str) -> str:
        """Handle a button value or `/approve ID`; returns a short line for the presser."""
        action, _, rid = value.partition(":")
        if action not in (APPROVE, DENY) or not rid:
            return "That button is not an approval."
        if rid in self._decided:
            d = self._decided[rid]
            return f"Already {'approved' if d.approved else 'denied'} by {d.by}."
        pending = self._pending.get(rid)
        if pending is None:
            return f"No pending approval with id {rid}."
        if user not in pending.approvers:
            log.warning("approval.refused_presser", approval=rid, user=user)
            return "You are not an approver for this request."
        approved = action == APPROVE
        decision = Decision(approved, user, "approved" if approved else "denied")
        await self._finish(rid, decision)
        return f"{'Approved' if approved else 'Denied'}."

    async def _finish(self, rid: str, decision: Decision) -> None:
        pending = self._pending.pop(rid, None)
        if pending is None:
            return
        self._decided[rid] = decision
        pending.waiter.wake(decision)
        log.info("approval.decided", approval=rid, approved=decision.approved, by=decision.by)
        if pending.ref is not None:
            if decision.by == "expiry":
                outcome = f"Expired: denied ({decision.reason})"
            else:
                outcome = f"{'✓ Approved' if decision.approved else '✗ Denied'} by {decision.by}"
            try:
                await pending.channel.edit(
                    pending.ref, f"{pending.request.text()}\n\n{outcome}", buttons=[]
                )
            except Exception:
                log.exception("approval.edit_failed", approval=rid)
