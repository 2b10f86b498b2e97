"""The dashboard's controls on a cluster gateway, carried out by the workers.

Why over NATS: a gateway has no App. An approval waits in the memory of the worker
running its task, so the press goes to one worker (`approval_unheld` on the `any`
subject), which decides it if its task waits there, else asks the shared store
(the `questions` table) whether the worker holding it lives: if that worker is gone
(it died with the task), the approval is expired at once as a chat press would expire
it (bot/cluster/handover.py): its record and chat message say so, and so does the
page; if it lives, the press goes on to every worker (`<cluster>.dashboard.holder`),
the one holding it answers and the others stay silent. A goal or rule action changes
shared files that any worker can write (its change reaches the others through the
shared memory), so it goes to one worker (`<cluster>.dashboard.any`, queue group
`workers`). Each is done as the dashboard of one process does it, as the owner, and its
answer (status and JSON body) is the one the page gets.

The emergency stop is both: every goal stopped by one worker (as `/goal stop` typed
anywhere), and every worker asked to cancel the tasks it runs, their answers gathered
for up to GATHER_WITHIN seconds (or until every worker the gateway knows has answered).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import structlog

from bot.cluster.handover import Taken
from bot.cluster.nats import Names
from core.open_questions import UNREACHABLE

log = structlog.get_logger("steward.cluster.controls")

#: Who acts from the dashboard: the owner, as in one process (bot/dashboard).
OWNER = "owner"
#: How long the gateway waits for a worker's answer (seconds).
ANSWER_WITHIN = 10.0
#: How long a worker waits for the worker holding an approval (the others never
#: answer): only for a holder the shared store says is alive, or does not know.
HOLDER_WITHIN = 3.0
#: How long the emergency stop gathers the workers' answers at most.
GATHER_WITHIN = 3.0


def subject(names: Names, scope: str) -> str:
    return f"{names.cluster}.dashboard.{scope}"


class WorkerControls:
    """A worker's side: answers the gateways' control requests on its App."""

    def __init__(self, nc: Any, names: Names, app: Any, handover: Any = None) -> None:
        self.nc = nc
        self.names = names
        self.app = app
        #: Takes over the questions of dead workers (bot/cluster/handover.py): an
        #: approval pressed on the page whose worker is gone is expired through it.
        self.handover = handover
        self._subs: list[Any] = []

    async def start(self) -> None:
        self._subs = [
            await self.nc.subscribe(subject(self.names, "holder"), cb=self._on_holder),
            await self.nc.subscribe(subject(self.names, "any"), queue="workers", cb=self._on_any),
        ]

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs = []

    async def _on_holder(self, msg: Any) -> None:
        body = _decoded(msg)
        if body.get("op") == "cancel_all":
            await _respond(msg, 200, {"ok": True, "tasks_cancelled": self._cancel_all()})
            return
        rid = str(body.get("id", ""))
        if body.get("op") != "approval" or not self.app.approvals.is_pending(rid):
            return  # another worker holds it (or none: the gateway says so)
        await _respond(msg, *await self._decide(rid, str(body.get("action", ""))))

    async def _decide(self, rid: str, action: str) -> tuple[int, dict[str, Any]]:
        """The owner's press of an approval waiting here, as the page of one process
        makes it."""
        try:
            answer = await self.app.approvals.press(f"{action}:{rid}", OWNER, owner=True)
            reply = (200 if answer.decided else 409, {"ok": answer.decided, "text": answer.text})
        except Exception as exc:
            log.exception("cluster.dashboard_control_failed", op="approval")
            reply = (500, {"ok": False, "error": f"the worker failed: {exc}"})
        log.info("dashboard.approval", approval=rid, action=action, status=reply[0])
        return reply

    async def _unheld(self, rid: str, action: str) -> tuple[int, dict[str, Any]]:
        """An approval pressed on the page: decided here if its task waits here; expired
        at once if the shared store says its worker is gone (as a chat press does:
        bot/cluster/handover.py); passed on to its worker if that one lives; else what
        is known of it."""
        if self.app.approvals.is_pending(rid):  # its task waits here
            return await self._decide(rid, action)
        if self.handover is None:
            return await self._holder_or_stored(rid, action)
        try:
            pressed = await self.handover.owner_press(rid)
        except Exception as exc:  # the store away: nothing decided
            log.warning("cluster.question_takeover_failed", error=str(exc)[:200])
            return 503, _text(UNREACHABLE)
        if pressed.taken is Taken.ANSWERED:
            log.info("dashboard.approval", approval=rid, action=action, status="expired")
            return 200, {"ok": False, "decided": True, "status": "expired", "text": pressed.text}
        if pressed.taken is Taken.LIVE:  # its worker lives: the press goes to it
            reply = await self._ask_holder(rid, action)
            if reply is not None:
                return reply
            who = f"Worker {pressed.owner!r}" if pressed.owner else "Its worker"
            return 409, _text(
                f"{who} holds approval {rid[:80]!r} but did not answer: try again in a moment."
            )
        if pressed.text:
            return 409, _text(pressed.text)
        return await self._holder_or_stored(rid, action)

    async def _holder_or_stored(self, rid: str, action: str) -> tuple[int, dict[str, Any]]:
        """An approval the shared store has no open question for: decided, unknown, or
        (its record still pending) asked while the store was away, so only its worker's
        memory holds it: that worker is asked, the only case left that waits for a
        holder that may not answer."""
        pending, text = await self._stored(rid)
        if pending:
            reply = await self._ask_holder(rid, action)
            if reply is not None:
                return reply
        return 409, _text(text)

    async def _ask_holder(self, rid: str, action: str) -> tuple[int, dict[str, Any]] | None:
        from nats.errors import Error as NatsError

        data = json.dumps({"op": "approval", "id": rid, "action": action}).encode()
        try:
            reply = await self.nc.request(
                subject(self.names, "holder"), data, timeout=HOLDER_WITHIN
            )
            status, body = json.loads(reply.data)
            return int(status), dict(body)
        except (NatsError, TimeoutError, ValueError, TypeError):
            return None

    async def _stored(self, rid: str) -> tuple[bool, str]:
        """What the shared approval records say of `rid`, no worker holding it: whether
        it is still pending, and the text for the page: decided (by whom), or not known
        (as one process answers a press of an unknown id)."""
        store = self.app.approvals.store

        def read() -> dict[str, Any] | None:
            path = store.path(rid)
            if not path.is_file():
                return None
            meta, _body = store.records.read(path)
            return dict(meta)

        try:
            record = await asyncio.to_thread(read)
        except (OSError, ValueError):
            record = None
        if record is None:
            return False, f"No pending approval with id {rid[:80]!r}."
        status = str(record.get("status") or "")
        if status == "pending":
            return True, _unheld_text(rid)
        by = str(record.get("decided_by") or "")
        if status == "expired" or by in ("expiry", "restart"):
            return False, "Already expired."
        return False, f"Already {status}" + (f" by {by}." if by else ".")

    def _cancel_all(self) -> int:
        """Cancel every task running here (the emergency stop's part on each worker)."""
        cancelled = 0
        for task in list(self.app.activity.running.values()):
            if self.app.conversations.cancel(f"{task.channel}:{task.conversation}"):
                cancelled += 1
        log.warning("dashboard.emergency_stop", tasks=cancelled)
        return cancelled

    async def _on_any(self, msg: Any) -> None:
        body = _decoded(msg)
        try:
            reply = await self._act(body)
        except Exception as exc:
            log.exception("cluster.dashboard_control_failed", op=body.get("op"))
            reply = (500, {"ok": False, "error": f"the worker failed: {exc}"})
        await _respond(msg, *reply)

    async def _act(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from bot.commands.rules import Caller
        from bot.dashboard.goals import goal_json

        op, ident, action = body.get("op"), str(body.get("id", "")), str(body.get("action", ""))
        if op == "approval_unheld":
            return await self._unheld(ident, action)
        if op == "goal":
            goals = getattr(self.app, "goals", None)
            if goals is None or action not in ("pause", "resume", "stop"):
                return 409, {"ok": False, "error": "Goals are not enabled."}
            if await goals.view(ident) is None:
                return 404, {"ok": False, "error": f"No goal {ident[:80]!r}."}
            view = await getattr(goals, action)(ident, OWNER)
            return 200, {"ok": True, "goal": goal_json(view)}
        if op == "stop_goals":
            goals = getattr(self.app, "goals", None)
            stopped = [v.id for v in await goals.stop_all(OWNER)] if goals is not None else []
            return 200, {"ok": True, "goals_stopped": stopped}
        if op == "rule":
            commands = self.app.dispatcher.rules_commands
            if commands is None:
                return 409, {"ok": False, "error": "Rules are not available in this Steward."}
            text, ok = await commands.execute(f"{action} {ident}", Caller(OWNER, may_change=True))
            return (200 if ok else 409), {"ok": ok, "text": text}
        return 400, {"ok": False, "error": f"unknown control {op!r}"}


class GatewayControls:
    """A gateway's side: sends a control to the workers and returns their answer."""

    def __init__(self, nc: Any, names: Names, *, within: float = ANSWER_WITHIN) -> None:
        self.nc = nc
        self.names = names
        self.within = within

    async def __call__(self, op: str, ident: str, action: str) -> tuple[int, dict[str, Any]]:
        from nats.errors import Error as NatsError
        from nats.errors import NoRespondersError

        if op == "approval":
            # One worker decides it: its own, else after asking the shared store whether
            # the worker holding it lives (expired at once if not, no wait for an
            # answer that cannot come; passed on to the holder if so).
            op = "approval_unheld"
        data = json.dumps({"op": op, "id": ident, "action": action}).encode()
        try:
            reply = await self.nc.request(subject(self.names, "any"), data, timeout=self.within)
        except (NoRespondersError, TimeoutError, NatsError) as exc:
            return 503, {"ok": False, "error": f"No worker answered ({type(exc).__name__})."}
        try:
            status, body = json.loads(reply.data)
            return int(status), dict(body)
        except (ValueError, TypeError):
            return 502, {"ok": False, "error": "A worker's answer could not be read."}

    async def emergency_stop(self, workers: int) -> tuple[int, dict[str, Any]]:
        """Every goal stopped, every running task of every worker cancelled; `workers`:
        how many answers to wait for (the workers the gateway knows to be up)."""
        status, goals = await self("stop_goals", "", "")
        if status != 200:
            return status, goals
        answers = await self._gather({"op": "cancel_all"}, workers)
        cancelled = sum(int(body.get("tasks_cancelled", 0)) for body in answers)
        return 200, {
            "ok": True,
            "goals_stopped": goals.get("goals_stopped", []),
            "tasks_cancelled": cancelled,
            "workers": len(answers),
        }

    async def _gather(self, body: dict[str, Any], expected: int) -> list[dict[str, Any]]:
        """Every worker's answer to `body` on the holder subject, until `expected` came
        or GATHER_WITHIN passed."""
        inbox = self.nc.new_inbox()
        answers: list[dict[str, Any]] = []
        enough = asyncio.Event()

        async def on_answer(msg: Any) -> None:
            with contextlib.suppress(ValueError, TypeError):
                _status, answer = json.loads(msg.data)
                answers.append(dict(answer))
            if len(answers) >= expected:
                enough.set()

        sub = await self.nc.subscribe(inbox, cb=on_answer)
        try:
            await self.nc.publish(
                subject(self.names, "holder"), json.dumps(body).encode(), reply=inbox
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(enough.wait(), GATHER_WITHIN)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return answers


def _unheld_text(rid: str) -> str:
    return (
        f"No worker is waiting for approval {rid[:80]!r}: it was decided, it expired, or "
        "the worker running its task stopped."
    )


def _text(text: str) -> dict[str, Any]:
    """A control's answer the page shows (`text`) and an API caller reads (`error`)."""
    return {"ok": False, "text": text, "error": text}


def _decoded(msg: Any) -> dict[str, Any]:
    try:
        body = json.loads(msg.data)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def _respond(msg: Any, status: int, body: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):  # the gateway gave up waiting: nothing to tell
        await msg.respond(json.dumps([status, body]).encode())
