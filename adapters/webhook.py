"""One intake for every platform that delivers events over HTTP.

Why: LINE, WhatsApp, Telegram (webhook mode), Google Chat, Mattermost (button
presses) and Slack (HTTP mode) each wrote "read the body, check the signature,
answer 401 or 400, answer 200 at once, work in the background", each a little
differently: different status codes, log lines and size limits. Now a platform
gives two functions and the intake does the rest the same way for all
(slack-bolt's request-verification middleware is the model):

1. **size** — a body over `max_bytes` is refused with 413 before it is read whole;
2. **verify(headers, body)** — the signature, bearer token or verify token; raises
   `Refused` (401 for forged, unsigned or replayed; 503 when it cannot check now);
3. **ready** — a channel that is not started (or is stopping) answers 503, so the
   platform delivers the event again later;
4. **parse(headers, body)** — the platform's payload into a `Delivery`; raises
   `Refused` or `ValueError` / `TypeError` / `KeyError` (400, malformed);
5. **answer** at once; each `Item` runs in the background, once: an item whose
   `key` the intake has already seen (the platform retried, or someone replayed a
   captured request) is skipped with one `webhook.duplicate` line.

Every refusal is one `webhook.refused` log line (channel, reason, status, remote
address) and a JSON body `{"error": …}` (or the platform's own shape).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from adapters.runtime import SPAWNED, Health, Inflight
from core.events import Dispatch, Inbound
from core.recent import Recent

log = structlog.get_logger("steward.webhook")

#: aiohttp's own default request size, and far above any platform's event.
MAX_BYTES = 1024 * 1024


class Refused(Exception):
    """A request the intake answers with `status` and does not act on.

    `reason` is a short word for the log (forged, unsigned, replayed, malformed,
    oversized, unavailable); `message` is what the sender sees."""

    def __init__(self, status: int, reason: str, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.detail = detail


def forged(detail: str = "", message: str = "invalid signature") -> Refused:
    """A request whose signature, token or key does not check out (401)."""
    return Refused(401, "forged", message, detail)


def unsigned(detail: str = "", message: str = "missing signature") -> Refused:
    """A request without the signature or token the platform always sends (401)."""
    return Refused(401, "unsigned", message, detail)


def replayed(detail: str = "", message: str = "stale request") -> Refused:
    """A correctly signed request outside the platform's freshness window (401)."""
    return Refused(401, "replayed", message, detail)


def malformed(detail: str = "", message: str = "malformed request body") -> Refused:
    """A request that verifies but is not an event of the platform (400)."""
    return Refused(400, "malformed", message, detail)


def unavailable(detail: str = "", message: str = "cannot verify requests right now") -> Refused:
    """Verification needs something that is down (Google's keys); try again later (503)."""
    return Refused(503, "unavailable", message, detail)


@dataclass(frozen=True)
class Item:
    """One thing a delivery asks Steward to do, run in the background.

    `key`: the platform's id for it (an event or message id); a second item with the
    same key is a redelivery and is skipped. `event`: handed to Steward's dispatch.
    `before`: platform work that must happen first (save a 24-hour window, answer a
    callback query); it runs in the same background task, before the dispatch."""

    key: str | None = None
    event: Inbound | None = None
    before: Callable[[], Awaitable[None]] | None = None


#: Makes the HTTP answer once the items are running (Google Chat waits for a
#: press's outcome); given the background tasks, in the order of the items.
Answer = Callable[[Sequence[Any]], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Delivery:
    """What one verified request asks for."""

    items: Sequence[Item] = ()
    #: The answer the platform must see (a challenge, a card); `{}` with 200 when None.
    answer: web.StreamResponse | Answer | None = None


Verify = Callable[[Mapping[str, str], bytes], Awaitable[None] | None]
Parse = Callable[[Mapping[str, str], bytes], Awaitable[Delivery] | Delivery]
ErrorBody = Callable[[str], Mapping[str, Any]]


def json_response(data: Mapping[str, Any], status: int = 200) -> web.Response:
    """A JSON answer (compact, as platforms send theirs)."""
    return web.Response(
        status=status,
        body=json.dumps(data, separators=(",", ":")).encode(),
        content_type="application/json",
    )


def _error_body(message: str) -> Mapping[str, Any]:
    return {"error": message}


class Webhook:
    """The request handler of one platform's webhook route (`app.router.add_post(path,
    webhook.handle)`): verify → parse → answer → work in the background."""

    def __init__(
        self,
        channel: str,
        *,
        verify: Verify,
        parse: Parse,
        ready: Callable[[], Dispatch | None],
        inflight: Inflight,
        health: Health,
        max_bytes: int = MAX_BYTES,
        seen: int = 4096,
        error_body: ErrorBody = _error_body,
    ) -> None:
        self.channel = channel
        self._verify = verify
        self._parse = parse
        self._ready = ready
        self._inflight = inflight
        self._health = health
        self.max_bytes = max_bytes
        self._seen: Recent[str, None] = Recent(seen)
        self._error_body = error_body

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The aiohttp handler (a bound coroutine method, as aiohttp wants one)."""
        try:
            body = await self._read(request)
            headers = request.headers
            await _maybe(self._verify(headers, body))
            dispatch = self._ready()
            if dispatch is None:
                raise Refused(503, "not_ready", "Steward is not ready")
            spawned: list[asyncio.Task[None]] = []
            collecting = SPAWNED.set(spawned)  # dispatches an SDK's listener starts itself
            try:
                delivery = await _maybe(self._parse(headers, body))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise malformed(f"{type(exc).__name__}: {exc}"[:200]) from exc
            finally:
                SPAWNED.reset(collecting)
        except Refused as refused:
            self._log_refusal(refused, request)
            return json_response(self._error_body(refused.message), refused.status)
        self._health.heard()
        tasks = [self._start(item, dispatch) for item in delivery.items]
        # How long to wait for the events to be handed over before answering: 0 (one
        # process) answers at once and the work runs after. A cluster gateway's dispatch
        # stores the event in JetStream and says how long to wait for that (its
        # `settle`): a platform told 200 before the event is stored would never send it
        # again if the gateway died. Not stored by then: 503, and the platform sends it
        # again (a copy JetStream drops by its key if the first hand-over ends after all).
        settle = float(getattr(dispatch, "settle", 0.0) or 0.0)
        started = [t for t in tasks if t is not None] + spawned
        if settle > 0 and started:
            _done, waiting = await asyncio.wait(started, timeout=settle)
            if waiting:
                log.warning("webhook.not_stored", channel=self.channel, waiting=len(waiting))
                return json_response(self._error_body("event not stored yet; send it again"), 503)
        answer = delivery.answer
        if answer is None:
            return json_response({})
        if isinstance(answer, web.StreamResponse):
            return answer
        return await answer(tasks)

    async def _read(self, request: web.Request) -> bytes:
        """The raw body, refused (413) when it is longer than `max_bytes`, whether the
        sender declared its length or streams it."""
        declared = request.content_length
        if declared is not None and declared > self.max_bytes:
            raise Refused(413, "oversized", "request body too large", f"{declared} bytes")
        body = bytearray()
        async for chunk in request.content.iter_chunked(64 * 1024):
            body += chunk  # a body arrives in pieces: read to its end, not what is here
            if len(body) > self.max_bytes:
                raise Refused(
                    413, "oversized", "request body too large", f"> {self.max_bytes} bytes"
                )
        return bytes(body)

    def _start(self, item: Item, dispatch: Dispatch) -> Any:
        if item.key is not None and not self._seen.first_time(item.key, None):
            log.info("webhook.duplicate", channel=self.channel, key=item.key)
            return None
        return self._inflight.run(self._work(item, dispatch), "inbound")

    async def _work(self, item: Item, dispatch: Dispatch) -> None:
        if item.before is not None:
            await item.before()
        if item.event is not None:
            await dispatch(item.event)

    def _log_refusal(self, refused: Refused, request: web.Request) -> None:
        level = log.info if refused.status == 503 else log.warning
        level(
            "webhook.refused",
            channel=self.channel,
            reason=refused.reason,
            status=refused.status,
            detail=refused.detail,
            remote=request.remote,
        )


async def _maybe(value: Any) -> Any:
    """`value`, awaited when it is awaitable (verify and parse may be plain functions)."""
    return await value if inspect.isawaitable(value) else value
