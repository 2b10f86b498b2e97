"""`RemoteChannel`: a worker's stand-in for a platform adapter that lives on a gateway.

Why an adapter-shaped object (not a special path in the dispatcher): the worker's App
wraps it in the usual Outbox (bot/channels.py), so formatting, splitting, retries,
order per conversation and kept-undelivered messages work exactly as in one process;
only the last step, the adapter's raw call, crosses NATS to a gateway that holds the
platform's connection (bot/cluster/gateway.py).

Every call carries an idempotency key: the event being handled (a contextvar set by
the worker around the dispatch, inherited by the task it starts) plus a digest of the
call and how many identical calls of that event already succeeded. A call retried
after a timeout (the gateway may have posted it) repeats its key, and the gateway
answers with the stored result instead of posting twice.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from bot.cluster import codec
from bot.cluster.nats import Names
from core.events import (
    Attachment,
    Button,
    Capabilities,
    DeliveryError,
    Dispatch,
    MessageRef,
    Progress,
)
from core.recent import Recent

log = structlog.get_logger("steward.cluster")

#: Seconds a worker waits for a gateway to answer one outbound call. A timeout is a
#: transient delivery error: the Outbox retries (with the same key) and tells the person.
CALL_TIMEOUT = 20.0
#: Operations whose result a gateway stores by key (the others are harmless to repeat).
STORED_OPS = frozenset({"send", "edit", "send_private"})


class OutboundKeys:
    """The idempotency keys of one event's outbound calls (see the module docstring)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self._done: Recent[str, int] = Recent(4096)

    def key(self, op: str, args: dict[str, Any]) -> tuple[str, str]:
        digest = hashlib.sha256(
            json.dumps([op, args], sort_keys=True, ensure_ascii=False).encode()
        ).hexdigest()[:16]
        return f"{self.base}:{digest}:{self._done.get(digest) or 0}", digest

    def succeeded(self, digest: str) -> None:
        self._done.put(digest, (self._done.get(digest) or 0) + 1)


#: The event being handled here, for the calls its task makes.
CURRENT: contextvars.ContextVar[OutboundKeys | None] = contextvars.ContextVar(
    "steward_cluster_event", default=None
)
#: Calls made outside any event (a schedule firing, recovery at start): this process's.
_PROCESS = OutboundKeys(f"proc-{uuid.uuid4().hex[:12]}")


class RemoteChannel:
    """A platform's adapter on the worker side: same name and capabilities as the real
    one, every raw call answered by a gateway."""

    def __init__(
        self,
        name: str,
        capabilities: Capabilities,
        *,
        nc: Any,
        names: Names,
        to_dialect: Callable[[str], str] | None = None,
        timeout: float = CALL_TIMEOUT,
    ) -> None:
        self.name = name
        self.capabilities = capabilities
        if to_dialect is not None:  # the Outbox prefers the adapter's own converter
            self.to_dialect = to_dialect
        self.nc = nc
        self.names = names
        self.timeout = timeout
        self.dispatch: Dispatch | None = None
        #: The web chat only: which gateway each conversation's browser is connected to.
        self.origins: Recent[str, str] = Recent(4096)
        self._last_origin = ""

    def learn_origin(self, conversation: str, gateway: str) -> None:
        if gateway:
            self.origins.put(conversation, gateway)
            self._last_origin = gateway

    async def start(self, dispatch: Dispatch) -> None:
        """Nothing to connect: the gateways hold the platform; the worker feeds events
        to `dispatch` itself (bot/cluster/worker.py)."""
        self.dispatch = dispatch

    async def stop(self) -> None:
        self.dispatch = None

    # ── the adapter's raw calls ──────────────────────────────────────────────
    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        result = await self._call(
            "send",
            {
                "conversation": conversation,
                "text": text,
                "thread": thread,
                "buttons": [codec.button_to_json(b) for b in buttons],
                "attachments": [codec.attachment_to_json(a) for a in attachments],
            },
            conversation,
        )
        ref = codec.ref_from_json(result)
        if ref is None:
            raise DeliveryError(f"{self.name}: the gateway answered a send without a message")
        return ref

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        await self._call(
            "edit",
            {
                "ref": codec.ref_to_json(ref),
                "text": text,
                "buttons": None if buttons is None else [codec.button_to_json(b) for b in buttons],
            },
            ref.conversation,
        )

    async def typing(self, conversation: str) -> None:
        await self._call("typing", {"conversation": conversation}, conversation)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        await self._call(
            "send_private", {"conversation": conversation, "user": user, "text": text}, conversation
        )

    async def progress(self, conversation: str, event: Progress) -> None:
        await self._call(
            "progress",
            {"conversation": conversation, "event": dataclasses.asdict(event)},
            conversation,
        )

    async def _call(self, op: str, args: dict[str, Any], conversation: str) -> Any:
        from nats.errors import Error as NatsError
        from nats.errors import MaxPayloadError, NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        keys = CURRENT.get() or _PROCESS
        key, digest = keys.key(op, args)
        gateway = self.origins.get(conversation) or self._last_origin
        subject = self.names.out(self.name, gateway)
        try:
            reply = await self.nc.request(
                subject, codec.encode_call(op, args, key), timeout=self.timeout
            )
        except MaxPayloadError:
            raise DeliveryError(
                f"{self.name}: this message (with its files) is larger than the NATS "
                "server's max_payload; raise max_payload in the NATS server's config",
                transient=False,
            ) from None
        except NoRespondersError:
            raise DeliveryError(
                f"{self.name}: no gateway is serving this platform right now (is a "
                "`steward run --role gateway` with it configured running?)"
            ) from None
        except (NatsTimeout, TimeoutError):
            raise DeliveryError(
                f"{self.name}: no gateway answered within {self.timeout:g}s"
            ) from None
        except NatsError as exc:  # the connection is down or reconnecting
            raise DeliveryError(f"{self.name}: NATS is not reachable now ({exc})") from None
        answer = codec.decode_reply(reply.data)
        if not answer["ok"]:
            raise DeliveryError(
                str(answer.get("error") or "delivery failed on the gateway"),
                retry_after=answer.get("retry_after"),
                transient=bool(answer.get("transient", True)),
            )
        if op in STORED_OPS:
            keys.succeeded(digest)
        return answer.get("result")
