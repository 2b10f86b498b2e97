"""LINE's failures as the channel layer's `DeliveryError`, and the hints a person reads.

LINE answers an error with ``{"message": …, "details": [{"property", "message"}]}``
and a 4xx/5xx status (line-bot-sdk raises it as ``ApiException``). 429 rate limits
and 5xx are transient (LINE sends no Retry-After, so the hint is one second: its
limits are per second); a 429 for the monthly message quota is not (retrying can't
help until the plan changes or the month ends), so the channel layer keeps the
message in the undelivered store.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from linebot.v3.messaging import ApiException

from core.events import DeliveryError

#: LINE sends no Retry-After with a 429; its rate limits are per second.
RATE_LIMIT_PAUSE = 1.0

#: Logged once when attachments go out as text lines because LINE cannot fetch them.
PUBLIC_URL_HINT = (
    "set public_url so LINE can fetch attachments (STEWARD_PUBLIC_URL: an https address "
    "LINE can reach; see docs/platforms/line.md#attachments)"
)


def missing_credential(which: str) -> str:
    """Said at start when the channel secret or the access token is not set."""
    return (
        f"STEWARD_LINE_CHANNEL_{which} is not set: LINE needs both the channel "
        "secret (to check webhooks) and the channel access token (to answer) "
        "(see docs/platforms/line.md)"
    )


def error_body(exc: ApiException) -> dict[str, Any]:
    """LINE's JSON error body of `exc` ({} when there is none)."""
    try:
        data = json.loads(exc.body or b"{}")
    except (ValueError, TypeError):
        return {}
    return data if isinstance(data, dict) else {}


def _error_text(exc: ApiException) -> str:
    data = error_body(exc)
    message = str(data.get("message") or exc.reason or "")
    details = [
        f"{d.get('property', '')}: {d.get('message', '')}".strip(": ")
        for d in data.get("details") or []
        if isinstance(d, dict)
    ]
    return message + (f" ({'; '.join(details)})" if details else "")


def is_quota_exhausted(exc: ApiException) -> bool:
    """The 429 LINE answers when the monthly message quota is used up."""
    return exc.status == 429 and "monthly limit" in _error_text(exc).lower()


def delivery_error(what: str, exc: BaseException) -> DeliveryError:
    """An SDK or network error → the channel layer's `DeliveryError`, saying what to do."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        text = _error_text(exc)
        if status == 429 and is_quota_exhausted(exc):
            return DeliveryError(
                f"LINE refused {what}: the monthly message quota is used up ({text}). "
                "Messages are kept in the undelivered store until the plan allows more "
                "(LINE Official Account Manager → plan)",
                transient=False,
            )
        if status == 429:
            headers = exc.headers or {}
            try:
                retry_after = float(headers.get("Retry-After", ""))
            except (TypeError, ValueError):
                retry_after = RATE_LIMIT_PAUSE
            return DeliveryError(
                f"LINE {what} was rate-limited (HTTP 429: {text})", retry_after=retry_after
            )
        if status == 0 or status >= 500:
            return DeliveryError(f"LINE {what} failed on LINE's side: HTTP {status} {text}")
        if status == 401:
            return DeliveryError(
                f"LINE refused the channel access token ({text}): check "
                "STEWARD_LINE_CHANNEL_TOKEN (a long-lived token; see docs/platforms/line.md)",
                transient=False,
            )
        if status == 403:
            return DeliveryError(
                f"LINE {what} is not allowed for this channel ({text})", transient=False
            )
        return DeliveryError(f"LINE refused {what}: HTTP {status} {text}", transient=False)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return DeliveryError(f"LINE {what}: could not reach LINE: {type(exc).__name__} {exc}")
    return DeliveryError(f"LINE {what} failed: {type(exc).__name__}: {exc}", transient=False)
