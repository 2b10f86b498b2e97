"""Approvals: a risky action waits for a person's decision, without blocking anything else.

The button carries only a short opaque id (`approve:1a2b3c4d`); the request stays on
the server. A request is decided once (double clicks, two approvers at once and
replayed callbacks are no-ops), only by a configured approver (default: the person
who asked), and an unanswered one is denied at expiry. Every request is stored, so
after a restart it is expired with a visible edit, never silently lost or approved.

"Approve for this session" belongs to the person who pressed it: it covers later
identical calls that same person asks in that conversation, nobody else's. An approver
pressing it on someone else's request approves that request, and covers their own
later calls, not the asker's (a session grant never lets anyone run unasked what they
could not approve themselves). A grant also names the content of the files the call
reads (`pin`), so it ends when one of them changes. For web_fetch a grant and an
"Always for this host" rule cover the URL's host, not only the exact URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from core.clock import Clock, Waiter
from core.events import ApprovalRequest, Button, Channel, MessageRef
from core.open_questions import APPROVAL, UNREACHABLE, SharedQuestions
from core.open_questions import claim as claim_question
from core.open_questions import share as share_question
from core.policy import HOST_PREFIX, url_host
from memory.approvals import ApprovalStore

log = structlog.get_logger("steward.approvals")

APPROVE = "approve"  # once
SESSION = "session"  # this call, for the rest of this conversation's session
ALWAYS = "always"  # a narrow rule in the policy overlay
DENY = "deny"
ACTIONS = (APPROVE, SESSION, ALWAYS, DENY)

#: Why a request left pending by a previous run was expired (shown in its edited message).
RESTART_REASON = "Steward restarted before this was answered; the task stopped. Ask again."
#: Why a request whose stored record was damaged was expired: its file could not be read
#: after a restart and was set aside (memory/approvals.py, memory/quarantine.py).
DAMAGED_REASON = (
    "Steward restarted and could not read this request's record (the file was damaged; "
    "it is kept in the data dir's quarantine/ folder), so it can no longer be approved; "
    "the task stopped. Ask again."
)

#: Why a request whose worker died (in a cluster) was expired when someone pressed it.
ORPHANED_REASON = (
    "the worker running this task stopped before this was answered, so nothing was run; "
    'the task is asked about again ("Run it again?")'
)

AlwaysAllow = Callable[[str, dict[str, Any], str], str]
#: What a session grant keeps of the files a call reads (`Guardian.pin`): the same
#: files with the same content give the same text; "" none; None: a file cannot be
#: named, so no grant can cover the call.
Pin = Callable[[str, dict[str, Any]], str | None]


@dataclass(slots=True)
class ApprovalDecision:
    """What a person (or the timeout) decided on one approval request."""

    approved: bool
    by: str
    reason: str


@dataclass(slots=True)
class PressAnswer:
    """What to tell the presser; `private` answers go only to them where possible."""

    text: str
    private: bool = False
    decided: bool = False


@dataclass(slots=True)
class _Pending:
    request: ApprovalRequest
    channel: Channel
    ref: MessageRef | None
    waiter: Waiter[ApprovalDecision]
    approvers: frozenset[str]
    tool: str
    args: dict[str, Any]
    record: dict[str, Any]
    #: What a session grant of this call keeps of its files (None: no grant possible).
    pin: str | None = ""
    #: Only "Approve once" and "Deny" are offered (and accepted): a call that must be
    #: asked every time (one that runs as root to write outside the workspace).
    once_only: bool = False
    #: The post of the request: a press can come before it returns the message's id.
    delivery: asyncio.Future[None] | None = None


#: How long a stop waits for an approval message already being posted (see below).
IN_FLIGHT_GRACE = 10.0


async def _finish_in_flight(step: asyncio.Future[None]) -> None:
    """Await `step`; when the caller is cancelled meanwhile (Steward stopping), let the
    step finish first, for up to `IN_FLIGHT_GRACE` seconds, then stop as asked.

    Why: a person who presses Ctrl-C just as an approval is posted has the message on
    the platform before its id is stored; cut there, the next start finds a pending
    record with no message to edit, and its buttons stay live forever. Under load that
    window was wide enough to hit. (A kill -9 in the same instant still leaves it.)"""
    try:
        await asyncio.shield(step)
    except asyncio.CancelledError:
        if not step.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(step), IN_FLIGHT_GRACE)
        raise


def fetch_host(tool: str, args: dict[str, Any]) -> str | None:
    """The host a web_fetch call fetches from (`example.com`), None for other calls."""
    url = args.get("url") if tool == "web_fetch" else None
    found = url_host(url) if isinstance(url, str) else None
    return found[len(HOST_PREFIX) :] if found else None


def _grant_key(
    conversation_key: str, person: str, tool: str, args: dict[str, Any], pin: str = ""
) -> str:
    """One session grant: a conversation, the person it belongs to, the call (for
    web_fetch its host) and the content of the files it reads."""
    host = fetch_host(tool, args)
    what = f"{HOST_PREFIX}{host}" if host is not None else json.dumps(args, sort_keys=True)
    return "\x00".join((conversation_key, person, tool, what, pin))


def approval_buttons(rid: str, tool: str = "", *, once_only: bool = False) -> list[Button]:
    """The four choices of an approval request; a press carries `<choice>:<request id>`,
    and each says what a person types instead (`/approve ID [session|always]`, `/deny ID`:
    bot/commands/approvals.py reads it). A web_fetch request is approved per host: its
    "always" button says so. `once_only`: only "Approve once" and "Deny"."""
    once = Button("Approve once", f"{APPROVE}:{rid}", "primary", typed=f"/approve {rid}")
    deny = Button("Deny", f"{DENY}:{rid}", "danger", typed=f"/deny {rid}")
    if once_only:
        return [once, deny]
    return [
        once,
        Button("Approve for this session", f"{SESSION}:{rid}", typed=f"/approve {rid} session"),
        Button(
            "Always for this host" if tool == "web_fetch" else "Always allow",
            f"{ALWAYS}:{rid}",
            typed=f"/approve {rid} always",
        ),
        deny,
    ]


def approval_of(buttons: Sequence[Button]) -> str | None:
    """The id of the approval request `buttons` decide; None for any other buttons (an
    offer of help). For the renderers that show an approval unlike other questions."""
    for button in buttons:
        action, _, rid = button.value.partition(":")
        if action in ACTIONS and rid:
            return rid
    return None


class Approvals:
    """Creates requests, routes presses to them, expires them on the clock, stores them."""

    def __init__(
        self,
        clock: Clock,
        store: ApprovalStore,
        *,
        timeout: float = 600.0,
        approvers: dict[str, list[str]] | None = None,
        always_allow: AlwaysAllow | None = None,
        pin: Pin | None = None,
    ) -> None:
        self.clock = clock
        self.store = store
        self.timeout = timeout
        self.approvers = approvers or {}
        self.always_allow = always_allow
        self.pin = pin
        self._pending: dict[str, _Pending] = {}
        self._decided: dict[str, ApprovalDecision] = {}
        self._grants: set[str] = set()
        #: Requests a previous run left pending whose channel has not started yet
        #: (None: the stored records are not read yet).
        self._left_open: list[dict[str, Any]] | None = None
        #: A cluster worker's shared store of open questions (core/open_questions.py):
        #: a request whose worker died is then expired by whichever worker a press reaches.
        self.shared: SharedQuestions | None = None

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(4)

    def approvers_for(self, channel: str, conversation: str, asked_by: str) -> frozenset[str]:
        """Configured approvers of the conversation, else of the channel, else the asker."""
        for scope in (f"{channel}:{conversation}", channel):
            if scope in self.approvers:
                return frozenset(self.approvers[scope])
        return frozenset({asked_by})

    def is_pending(self, rid: str) -> bool:
        """Whether request `rid` waits for a decision in this process: in a cluster, a
        press goes to the worker where this is true (bot/cluster/worker.py)."""
        return rid in self._pending

    def pending(self, conversation: str | None = None) -> list[ApprovalRequest]:
        return [
            p.request
            for p in self._pending.values()
            if conversation is None or p.request.conversation == conversation
        ]

    async def _load_left_open(self) -> list[dict[str, Any]]:
        """Read the stored records once per process, off the event loop: every decision is
        remembered (a late or replayed press is answered "already decided", never acted
        on), and the requests a previous run left pending are returned."""
        if self._left_open is None:
            records = await asyncio.to_thread(self.store.load_all)
            left: list[dict[str, Any]] = []
            for record in records:
                rid = str(record["id"])
                if record["status"] == "pending":
                    # Its task died with the previous process: whatever channel it is on,
                    # it can no longer be approved, even before that channel is back.
                    self._decided[rid] = ApprovalDecision(False, "restart", RESTART_REASON)
                    left.append(record)
                else:
                    self._decided[rid] = ApprovalDecision(
                        record["status"] == "approved",
                        str(record.get("decided_by") or "?"),
                        str(record.get("reason") or record["status"]),
                    )
            # Records whose file was damaged (set aside as they were read): never
            # approvable; those still waiting with a known message have it expired below.
            for stub in self.store.take_damaged():
                rid = str(stub["id"])
                if rid in self._decided:
                    continue
                self._decided[rid] = ApprovalDecision(False, "restart", DAMAGED_REASON)
                if stub.get("status") == "pending" and stub.get("message_id"):
                    left.append(stub)
            if self._left_open is None:  # two channels started at once: the first read wins
                self._left_open = left
        return self._left_open

    async def recover(self, channels: dict[str, Channel]) -> int:
        """At start-up, as each channel starts: requests a previous run left pending lost
        their task. Expire those of the channels in `channels` visibly (their message is
        edited, so buttons no one can use any more disappear). A request whose channel is
        not (yet) running stays pending on disk and waits for a later call: expiring it
        when the first channel (the web chat) starts would leave its Slack or Discord
        message showing live buttons forever. Mirrors `Suggestions.recover`."""
        left = await self._load_left_open()
        mine = [r for r in left if str(r.get("channel")) in channels]
        self._left_open = [r for r in left if str(r.get("channel")) not in channels]
        for record in mine:
            rid = str(record["id"])
            damaged = bool(record.get("damaged"))
            reason = DAMAGED_REASON if damaged else RESTART_REASON
            if damaged:  # its file is in quarantine: nothing to rewrite, the message remains
                await asyncio.to_thread(self.store.forget_message, rid)
            else:
                record.update(
                    status="expired",
                    decided_by="restart",
                    reason=RESTART_REASON,
                    decided_at=self.clock.now(),
                )
                await self.store.save(record)
            channel = channels[str(record.get("channel"))]
            if record.get("message_id"):
                ref = MessageRef(
                    channel.name, str(record.get("conversation") or ""), str(record["message_id"])
                )
                text = str(record.get("text") or "").strip()
                try:
                    await channel.edit(
                        ref,
                        f"{text}\n\nExpired: {reason}" if text else f"Expired: {reason}",
                        buttons=[],
                    )
                except Exception:
                    log.warning("approval.recover_edit_failed", approval=rid, exc_info=True)
            log.info(
                "approval.expired_on_restart", approval=rid, channel=channel.name, damaged=damaged
            )
        return len(mine)

    async def ask(
        self,
        channel: Channel,
        *,
        tool: str,
        args: dict[str, Any],
        what: str,
        why: str,
        risk: str,
        asked_by: str,
        conversation: str,
        thread: str | None = None,
        task_id: str = "",
        once_only: bool = False,
    ) -> ApprovalDecision:
        """Send the request and wait for a decision; a person's silence is a denial.

        A session grant the asker holds for this call in this conversation (their own
        press of "Approve for this session") approves it without asking, unless
        `once_only` (the call is asked every time, and only "Approve once" is offered)."""
        pin = None if once_only else await self._pin(tool, args)
        if pin is not None:
            grant = _grant_key(f"{channel.name}:{conversation}", asked_by, tool, args, pin)
            if grant in self._grants:
                log.info(
                    "approval.session_grant_used",
                    tool=tool,
                    conversation=conversation,
                    asked_by=asked_by,
                )
                return ApprovalDecision(True, "session", "approved earlier for this session")
        if not channel.capabilities.interactive:
            log.info("approval.unavailable", channel=channel.name, what=what)
            return ApprovalDecision(
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
            buttons=approval_buttons(rid, tool, once_only=once_only),
        )
        approvers = self.approvers_for(channel.name, conversation, asked_by)
        record: dict[str, Any] = {
            "id": rid,
            "status": "pending",
            "what": what,
            "why": why,
            "risk": risk,
            "text": request.text(),
            "tool": tool,
            "args": json.dumps(args, sort_keys=True)[:2000],
            "asked_by": asked_by,
            "approvers": sorted(approvers),
            "channel": channel.name,
            "conversation": conversation,
            "task_id": task_id,
            "created": self.clock.now(),
            "expires_at": request.expires_at,
            "message_id": None,
        }
        waiter: Waiter[ApprovalDecision] = Waiter(self.clock, deadline=request.expires_at)
        pending = _Pending(
            request, channel, None, waiter, approvers, tool, args, record, pin, once_only
        )
        self._pending[rid] = pending
        await self.store.save(record)
        log.info("approval.requested", approval=rid, what=what, conversation=conversation)
        delivery = pending.delivery = asyncio.ensure_future(self._deliver(pending, thread))
        try:
            await _finish_in_flight(delivery)
        except Exception:
            log.exception("approval.send_failed", approval=rid)
            await self._finish(
                rid, ApprovalDecision(False, "nobody", "the request could not be delivered")
            )
            return ApprovalDecision(False, "nobody", "the approval request could not be delivered")
        await share_question(self.shared, APPROVAL, rid, record)
        try:
            return await waiter.wait()
        except TimeoutError:
            decision = ApprovalDecision(
                False, "expiry", f"nobody answered within {self.timeout:g}s"
            )
            await claim_question(self.shared, APPROVAL, rid)  # its row goes: nobody answers now
            await self._finish(rid, decision)
            return decision

    async def _deliver(self, pending: _Pending, thread: str | None) -> None:
        """Post the request and store its message's id: one step, so that a stop in
        between (see `_finish_in_flight`) cannot leave a posted message whose id no record
        holds: a later start could not expire it, and its buttons would stay live."""
        request = pending.request
        pending.ref = await pending.channel.send(
            request.conversation, request.text(), thread=thread, buttons=request.buttons
        )
        pending.record["message_id"] = pending.ref.id
        await self.store.save(pending.record)

    async def _pin(self, tool: str, args: dict[str, Any]) -> str | None:
        """`pin` off the event loop (it hashes files); an error means no grant (None)."""
        if self.pin is None:
            return ""
        try:
            return await asyncio.to_thread(self.pin, tool, args)
        except Exception:
            log.exception("approval.pin_failed", tool=tool)
            return None

    def pending_records(self) -> list[dict[str, Any]]:
        """The stored record of each request waiting now (tool, arguments, approvers): what
        the dashboard lists, read from the same state the buttons decide."""
        return [dict(p.record) for p in self._pending.values()]

    async def press(self, value: str, user: str, *, owner: bool = False) -> PressAnswer:
        """Handle a button value or `/approve ID`; idempotent.

        `owner`: the press comes from Steward's owner (the logged-in dashboard), who may
        decide any request; everything else (once only, the record, the edited chat
        message) is the same as for a press in the chat."""
        action, _, rid = value.partition(":")
        if action not in ACTIONS or not rid:
            return PressAnswer("That button is not an approval.", private=True)
        if rid in self._decided:
            d = self._decided[rid]
            word = (
                "approved"
                if d.approved
                else ("expired" if d.by in ("expiry", "restart") else "denied")
            )
            return PressAnswer(
                f"Already {word}" + (f" by {d.by}." if word != "expired" else "."), private=True
            )
        pending = self._pending.get(rid)
        if pending is None:
            return PressAnswer(f"No pending approval with id {rid}.", private=True)
        if not owner and user not in pending.approvers:
            log.warning("approval.refused_presser", approval=rid, user=user)
            return PressAnswer("You are not an approver for this request.", private=True)
        if pending.once_only and action in (SESSION, ALWAYS):
            return PressAnswer(
                "This call can only be approved once: it runs as root, so it is asked every time.",
                private=True,
            )
        if action == DENY:
            decision = ApprovalDecision(False, user, "denied")
        elif action == SESSION:
            decision = ApprovalDecision(True, user, self._grant_session(pending, user))
        elif action == ALWAYS:
            if self.always_allow is None:
                return PressAnswer(
                    "Always-allow is not available here; approve once instead.", private=True
                )
            try:
                rule = self.always_allow(pending.tool, pending.args, user)
            except (ValueError, OSError) as exc:
                return PressAnswer(f"Could not add an always-allow rule: {exc}", private=True)
            host = fetch_host(pending.tool, pending.args)
            decision = ApprovalDecision(
                True,
                user,
                f"always allowed{f' for {host}' if host else ''} (rule {rule}; /policy to revoke)",
            )
        else:
            decision = ApprovalDecision(True, user, "approved once")
        won = await claim_question(self.shared, APPROVAL, rid)
        if won is None:  # the cluster's store is away: still pending, decided on a later press
            return PressAnswer(UNREACHABLE, private=True)
        if not won:  # expired by a worker that took it for this one's death: the task stops
            decision = ApprovalDecision(False, "restart", ORPHANED_REASON)
        await self._finish(rid, decision)
        if not won:
            return PressAnswer(f"Expired: {ORPHANED_REASON}.", private=True)
        return PressAnswer(f"{'Approved' if decision.approved else 'Denied'}.", decided=True)

    def may_decide(self, record: dict[str, Any], user: str) -> bool:
        """Whether `user` may decide the stored request `record` (its approvers, else
        whoever asked): a request taken over from a worker that died."""
        approvers = record.get("approvers") or [record.get("asked_by")]
        return user in {str(a) for a in approvers}

    async def orphaned(self, record: dict[str, Any], channel: Channel) -> PressAnswer:
        """A press of a request whose worker died with its task (in a cluster, taken over
        through the shared store): nothing can run it any more, so it is expired, its
        record and message say why, and so does the answer to the presser."""
        rid = str(record["id"])
        self._decided[rid] = ApprovalDecision(False, "restart", ORPHANED_REASON)
        record.update(
            status="expired",
            decided_by="restart",
            reason=ORPHANED_REASON,
            decided_at=self.clock.now(),
        )
        try:
            await self.store.save(record)
        except OSError:
            log.exception("approval.store_failed", approval=rid)
        if record.get("message_id"):
            ref = MessageRef(
                channel.name, str(record.get("conversation") or ""), str(record["message_id"])
            )
            text = str(record.get("text") or "").strip()
            note = f"Expired: {ORPHANED_REASON}."
            try:
                await channel.edit(ref, f"{text}\n\n{note}" if text else note, buttons=[])
            except Exception:
                log.warning("approval.orphan_edit_failed", approval=rid, exc_info=True)
        log.info("approval.orphaned", approval=rid, channel=channel.name)
        return PressAnswer(f"Expired: {ORPHANED_REASON}.", private=True, decided=True)

    def _grant_session(self, pending: _Pending, user: str) -> str:
        """Keep the session grant a press of "Approve for this session" gives `user` (the
        presser: later identical calls *they* ask in this conversation); returns the
        reason shown on the decided request."""
        host = fetch_host(pending.tool, pending.args)
        reason = f"approved for this session{f' for {host}' if host else ''}"
        if pending.pin is None:
            return "approved once (a file it reads cannot be checked, so no session grant)"
        conversation = f"{pending.channel.name}:{pending.request.conversation}"
        self._grants.add(_grant_key(conversation, user, pending.tool, pending.args, pending.pin))
        asker = pending.request.asked_by
        log.info(
            "approval.session_granted",
            tool=pending.tool,
            conversation=pending.request.conversation,
            to=user,
            asked_by=asker,
        )
        if user != asker:
            return f"{reason}, for calls {user} asks; {asker}'s next one is asked again"
        return reason

    async def _finish(self, rid: str, decision: ApprovalDecision) -> None:
        pending = self._pending.pop(rid, None)
        if pending is None:
            return
        self._decided[rid] = decision
        try:
            await self._record_and_show(rid, pending, decision)
        finally:
            # The task goes on only once the decision is saved and shown: its answer can
            # no longer overtake the "Denied by …" edit (it used to, once episodes were
            # written after the reply, core/persist.py).
            pending.waiter.wake(decision)

    async def _record_and_show(
        self, rid: str, pending: _Pending, decision: ApprovalDecision
    ) -> None:
        status = (
            "approved"
            if decision.approved
            else ("expired" if decision.by in ("expiry", "restart") else "denied")
        )
        pending.record.update(
            status=status,
            decided_by=decision.by,
            reason=decision.reason,
            decided_at=self.clock.now(),
        )
        try:
            await self.store.save(pending.record)
        except OSError:
            log.exception("approval.store_failed", approval=rid)
        log.info(
            "approval.decided",
            approval=rid,
            approved=decision.approved,
            by=decision.by,
            reason=decision.reason,
        )
        if pending.ref is None and pending.delivery is not None:
            # A press can beat the post's return: the web chat shows the message before
            # it stores it, and a platform may deliver the press first. Without the id
            # the edit was lost and the decided buttons stayed on screen.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(pending.delivery), IN_FLIGHT_GRACE)
        if pending.ref is None:
            return
        if decision.by in ("expiry", "restart"):
            outcome = f"Expired: denied ({decision.reason})"
        elif decision.approved:
            outcome = f"✓ Approved by {decision.by} ({decision.reason})"
        else:
            outcome = f"✗ Denied by {decision.by}"
        try:
            await pending.channel.edit(
                pending.ref, f"{pending.request.text()}\n\n{outcome}", buttons=[]
            )
        except Exception:
            log.exception("approval.edit_failed", approval=rid)
