"""Google Chat's refusals as the channel layer's `DeliveryError`, and the hint a person
reads for each.

Why here: the REST calls answer with Google's ``{"error": {code, message, status}}``
shape; whether a failure is worth retrying (429 ``RESOURCE_EXHAUSTED`` with its
``google.rpc.RetryInfo`` delay, a 5xx) or needs a person to fix something (the app is
not in the space, the API is not configured) is decided once, here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from google.auth.exceptions import GoogleAuthError, RefreshError, TransportError

from adapters.runtime import json_object
from core.events import DeliveryError

#: Where a person reads how to set the app up.
SEE = "(see docs/platforms/googlechat.md)"

_HINTS = {
    "PERMISSION_DENIED": "the app is not a member of that space, or the Google Chat API is "
    "not enabled/configured for the service account's project",
    "NOT_FOUND": "the space or message does not exist or the app cannot see it (or, for "
    "every call, the Chat app is not configured: Google Chat API → Configuration)",
    "INVALID_ARGUMENT": "Google Chat refused the message",
    "UNAUTHENTICATED": "the access token was refused",
    "FAILED_PRECONDITION": "Google Chat refused the message in this state",
}


def _retry_delay(error: Mapping[str, Any], headers: Mapping[str, str]) -> float | None:
    """Google's hint: a ``google.rpc.RetryInfo`` detail (``"retryDelay": "2s"``), or a
    Retry-After header."""
    for detail in error.get("details") or []:
        delay = json_object(detail).get("retryDelay")
        if isinstance(delay, str) and delay.endswith("s"):
            with contextlib.suppress(ValueError):
                return float(delay[:-1])
    with contextlib.suppress(TypeError, ValueError):
        return float(headers.get("Retry-After", ""))
    return None


def delivery_error(what: str, status: int, body: Any, headers: Mapping[str, str]) -> DeliveryError:
    """A refused REST call (Google's ``{"error": {code, message, status}}``) → `DeliveryError`."""
    error = json_object(json_object(body).get("error"))
    code = str(error.get("status") or "")
    message = str(error.get("message") or "")[:200]
    if status == 429 or code == "RESOURCE_EXHAUSTED":
        retry_after = _retry_delay(error, headers)
        return DeliveryError(
            f"Google Chat {what} was rate-limited (HTTP 429 RESOURCE_EXHAUSTED, retry after "
            f"{retry_after})",
            retry_after=retry_after,
        )
    if status >= 500:
        return DeliveryError(f"Google Chat {what} failed on Google's side: HTTP {status} {code}")
    hint = _HINTS.get(code)
    text = f"Google Chat {what} refused: HTTP {status} {code} {message}".rstrip()
    return DeliveryError(text + (f": {hint}" if hint else ""), transient=False)


def token_refused(what: str) -> DeliveryError:
    """Google refused the access token of a REST call (401): transient, since the next
    try asks for a fresh token."""
    return DeliveryError(f"Google Chat {what}: the access token was refused (401)")


def auth_failure(exc: GoogleAuthError, uri: str, account: str) -> tuple[str, bool]:
    """Why the service account got no access token, and whether trying again may help
    (the token endpoint unreachable) or a person must fix the key (refused)."""
    if isinstance(exc, TransportError) or (isinstance(exc, RefreshError) and exc.retryable):
        return f"cannot obtain an access token from {uri}: {exc}", True
    return (
        f"the service account {account} was refused at {uri}: {exc}. Check "
        f"STEWARD_GOOGLECHAT_CREDENTIALS (a deleted or disabled key?) {SEE}",
        False,
    )
