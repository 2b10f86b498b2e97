"""Discord's failures as the channel layer's `DeliveryError`, with discord.py's own
retries switched off: the trace hook that turns a 429 or 5xx into `_Refused` before
the SDK sleeps on it, and the wording a person reads for each refusal.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp
import discord
import discord.gateway
import discord.http
import structlog

from core.events import (
    DeliveryError,
)

log = structlog.get_logger("adapters.discord")

T = TypeVar("T")

TOKEN_REFUSED = (
    "Discord refused STEWARD_DISCORD_TOKEN (401 Unauthorized): copy the bot token from the "
    "developer portal (Applications → your app → Bot → Reset Token) into STEWARD_DISCORD_TOKEN"
)


class _Refused(aiohttp.ClientResponseError):
    """A 429 or 5xx, raised by our trace hook so that discord.py cannot retry it.

    It subclasses ``aiohttp.ClientError`` on purpose: where discord.py does see it
    (the gateway handshake inside ``Client.connect``), it is handled as a network
    error, i.e. a reconnect with backoff.
    """

    def __init__(
        self,
        request_info: aiohttp.RequestInfo,
        *,
        status: int,
        message: str,
        retry_after: float | None,
        via: bool,
    ) -> None:
        super().__init__(request_info, (), status=status, message=message)
        self.retry_after = retry_after
        self.via = via


async def _stop_sdk_retries(
    session: aiohttp.ClientSession,
    ctx: Any,
    params: aiohttp.TraceRequestEndParams,
) -> None:
    """Turn a 429/5xx into `_Refused` before discord.py's retry loop sees the status."""
    response = params.response
    status = response.status
    if status != 429 and status < 500:
        return
    retry_after: float | None = None
    if status == 429:
        body: Any = None
        with contextlib.suppress(ValueError, aiohttp.ClientError):
            body = json.loads(await response.read())
        if isinstance(body, dict) and isinstance(body.get("retry_after"), int | float):
            retry_after = float(body["retry_after"])
        else:
            with contextlib.suppress(TypeError, ValueError):
                retry_after = float(response.headers.get("Retry-After", ""))
    raise _Refused(
        response.request_info,
        status=status,
        message=f"{params.method} {params.url.path}: {status} {response.reason or ''}".strip(),
        retry_after=retry_after,
        via=bool(response.headers.get("Via")),
    )


def _trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(_stop_sdk_retries)
    return trace


def delivery_error(what: str, exc: BaseException) -> DeliveryError | None:
    """Translate an SDK/network error into `DeliveryError`; None for anything else (a bug)."""
    if isinstance(exc, _Refused):
        if exc.status == 429:
            if not exc.via:
                return DeliveryError(
                    f"Discord {what}: 429 without a Via header (a Cloudflare block after too "
                    "many invalid requests, not a rate limit)",
                    retry_after=exc.retry_after,
                )
            return DeliveryError(
                f"Discord {what}: rate limited, retry after {exc.retry_after}s",
                retry_after=exc.retry_after,
            )
        return DeliveryError(f"Discord {what}: server error {exc.status}")
    if isinstance(exc, discord.RateLimited):
        return DeliveryError(
            f"Discord {what}: rate limited, retry after {exc.retry_after:.2f}s",
            retry_after=exc.retry_after,
        )
    if isinstance(exc, discord.LoginFailure):
        return DeliveryError(TOKEN_REFUSED, transient=False)
    if isinstance(exc, discord.HTTPException):
        status = exc.status
        detail = f"{exc.code} {exc.text}".strip() if exc.code else exc.text
        if status == 429:
            retry = None
            with contextlib.suppress(TypeError, ValueError):
                retry = float(exc.response.headers.get("Retry-After", ""))
            return DeliveryError(f"Discord {what}: 429 {detail}", retry_after=retry)
        if status >= 500:
            return DeliveryError(f"Discord {what}: server error {status} {detail}")
        hint = {
            401: "the bot token was refused (STEWARD_DISCORD_TOKEN)",
            403: "the bot lacks access or permission there (View Channel, Send Messages; "
            "Attach Files for a message with files)",
            404: "unknown channel, message or interaction",
        }.get(status, "Discord refused the request")
        return DeliveryError(f"Discord {what}: {status} {detail}: {hint}", transient=False)
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return DeliveryError(f"Discord {what}: network error: {exc!r}")
    return None


async def _guard(what: str, call: Awaitable[T]) -> T:
    """Await one SDK call; errors come out as `DeliveryError`, bugs unchanged."""
    try:
        return await call
    except Exception as exc:
        err = delivery_error(what, exc)
        if err is None:
            raise
        raise err from exc


def _snowflake(value: str, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DeliveryError(f"{what} {value!r} is not a Discord id", transient=False) from None
