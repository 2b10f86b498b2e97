"""Telegram's refusals as Steward's `DeliveryError`, and the hints a person reads.

python-telegram-bot chooses the exception by the Bot API's HTTP status (400
BadRequest, 401/404 InvalidToken, 403 Forbidden, 409 Conflict, a ``retry_after``
parameter RetryAfter, anything else NetworkError) and rewrites Telegram's text
("Bad Request: X" becomes "X", capitalised), so texts are matched loosely here.
Each becomes a `DeliveryError` the channel layer knows what to do with: transient
(retried with backoff, after Telegram's ``retry_after`` when it gave one) or not
(kept as undelivered, with what a person must fix).
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.warnings import PTBDeprecationWarning

from core.events import DeliveryError

# PTB 22 warns, while building its own RetryAfter, that `retry_after` will become a
# timedelta; `retry_after_of` reads both forms, so the warning says nothing to us.
warnings.filterwarnings("ignore", r".*`retry_after`", PTBDeprecationWarning)

T = TypeVar("T")

TOKEN_REFUSED = (
    "Telegram refused STEWARD_TELEGRAM_TOKEN (401/404): copy the token BotFather gave you "
    "(/mybots → your bot → API Token) into STEWARD_TELEGRAM_TOKEN"
)
#: What to do when two Stewards want one bot, the end of both hints below.
_ONE_POLLER = (
    "Stop the other one, or give each Steward its own bot from BotFather; where two copies "
    "overlap on purpose (a platform that starts the new one before stopping the old), use "
    "webhook mode (STEWARD_TELEGRAM_WEBHOOK_URL), where Telegram delivers each update to one URL"
)
CONFLICT_HINT = (
    "Another Steward is polling this Telegram bot (somewhere else: Telegram answered 409 "
    "Conflict, another instance is polling with this token; or another program uses the "
    "same bot). Standing by: polling again after a growing wait, up to a minute. " + _ONE_POLLER
)


def lease_hint(pid: int | None, about: str = "") -> str:
    """The second Steward on this machine: who polls, and that this one stands by."""
    who = f"pid {pid} on this machine" if pid is not None else "a process on this machine"
    if about:
        who += f", {about}"
    return (
        f"Another Steward is polling this Telegram bot ({who}). Standing by: this one "
        f"takes over when it stops. {_ONE_POLLER}"
    )


WEBHOOK_ACTIVE_HINT = (
    "409 Conflict on getUpdates: a webhook is set for this bot (by another program?) and "
    "Telegram refuses polling while it is; Steward deleted it at start, so something set it "
    "again. Stop the other program, or use webhook mode (STEWARD_TELEGRAM_WEBHOOK_URL)"
)


def _seconds(value: int | float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def retry_after_of(exc: RetryAfter) -> float:
    with warnings.catch_warnings():  # PTB 22 warns that the int will become a timedelta
        warnings.simplefilter("ignore")
        return _seconds(exc.retry_after)


def says(exc: BaseException, *phrases: str) -> bool:
    """PTB rewrites server texts ("Bad Request: X" → "X", capitalised): match loosely."""
    text = str(exc).lower()
    return any(p in text for p in phrases)


def delivery_error(what: str, exc: BaseException) -> DeliveryError | None:
    """A PTB/network error as `DeliveryError`; None for anything else (a bug)."""
    if isinstance(exc, RetryAfter):
        seconds = retry_after_of(exc)
        return DeliveryError(
            f"Telegram {what}: flood control, retry after {seconds:g}s", retry_after=seconds
        )
    if isinstance(exc, InvalidToken):
        return DeliveryError(TOKEN_REFUSED, transient=False)
    if isinstance(exc, ChatMigrated):
        return DeliveryError(
            f"Telegram {what}: the group became a supergroup with id {exc.new_chat_id}; "
            "update access lists that name the old id",
            transient=False,
        )
    if isinstance(exc, Forbidden):
        return DeliveryError(
            f"Telegram {what}: {exc} (the person blocked the bot, never started a chat "
            "with it, or it was removed from the group)",
            transient=False,
        )
    if isinstance(exc, BadRequest | EndPointNotFound | Conflict):
        return DeliveryError(f"Telegram {what}: {exc}", transient=False)
    if isinstance(exc, NetworkError):  # timeouts, connection errors, 5xx
        # 413: an upload over what the Bot API takes; sending it again cannot help.
        too_large = says(exc, "request entity too large", "(413)")
        return DeliveryError(f"Telegram {what}: {exc}", transient=not too_large)
    if isinstance(exc, TelegramError):
        return DeliveryError(f"Telegram {what}: {exc}", transient=False)
    return None


async def guard(what: str, call: Awaitable[T]) -> T:
    """`call`'s result, or its PTB/network error raised as `DeliveryError`."""
    try:
        return await call
    except Exception as exc:
        err = delivery_error(what, exc)
        if err is None:
            raise
        raise err from exc


def formatting_refused(exc: BaseException) -> bool:
    """Telegram could not parse the HTML: the same text goes again without formatting."""
    return isinstance(exc, BadRequest) and says(
        exc, "can't parse entities", "can't find end tag", "unsupported start"
    )


def refused_as_photo(exc: BaseException) -> bool:
    """sendPhoto refused the picture itself (over 10 MB, width + height over 10,000, a
    side ratio over 20, a format Telegram cannot process): it goes as a document."""
    return isinstance(exc, BadRequest) and says(
        exc, "photo", "image_process_failed", "dimensions", "too big", "file is too"
    )
