"""Graph API refusals → `DeliveryError`, which the channel layer retries or reports.

Why here, in one place: Graph answers every failure with the same body
(`{"error": {"message", "type", "code", "error_data": {"details"}}}`) and the code,
not the HTTP status, says what happened. Rate limits name their wait only by their
code (Graph sends no Retry-After for most of them), a refused token must say which
setting to fix, and error 131047 (the 24-hour window is closed) is not a failure
at all but the signal to hold the message for the person's next one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from core.events import DeliveryError

#: Graph error codes (developers.facebook.com → WhatsApp → error codes).
TOKEN_ERRORS = {190}  # expired / invalid access token
WINDOW_CLOSED = 131047  # re-engagement: more than 24 h since the person's last message
#: Rate limits and how long the limit itself says to wait when no header tells.
RATE_LIMITS = {
    130429: 1.0,  # throughput per number (messages per second)
    131056: 6.0,  # pair rate: about one message per 6 s to the same person
    4: 60.0,  # app-level call limit
    80007: 60.0,  # WhatsApp Business Account rate limit
}
TRANSIENT_CODES = {1, 2, 131000, 131016, 133004}  # unknown / service unavailable

#: What a person does about a refused token.
TOKEN_HINT = (
    "the access token was refused; set a valid system-user token in "
    "STEWARD_WHATSAPP_TOKEN (see docs/platforms/whatsapp.md)"
)


class GraphError(DeliveryError):
    """A Graph API refusal, with its error code (0 when the body had none)."""

    def __init__(
        self,
        message: str,
        *,
        code: int = 0,
        status: int = 0,
        retry_after: float | None = None,
        transient: bool = True,
    ) -> None:
        super().__init__(message, retry_after=retry_after, transient=transient)
        self.code = code
        self.status = status


def graph_error(status: int, body: Any, headers: Mapping[str, str]) -> GraphError:
    """Map a non-2xx Graph answer to a `DeliveryError` the channel layer acts on:
    rate limits carry a retry hint, 5xx and "temporarily unavailable" are transient,
    everything else (bad token, bad parameter) is reported at once."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    raw_code = err.get("code")
    code = raw_code if isinstance(raw_code, int) else 0
    message = str(err.get("message") or f"HTTP {status}")
    data = err.get("error_data")
    details = data.get("details") if isinstance(data, dict) else None
    text = f"WhatsApp API error {code or status}: {message}" + (f" ({details})" if details else "")
    header = headers.get("Retry-After", "")
    hinted = float(header) if re.fullmatch(r"\d+(\.\d+)?", header.strip()) else None
    if status == 429 or code in RATE_LIMITS:
        wait = hinted if hinted is not None else RATE_LIMITS.get(code, 1.0)
        return GraphError(text, code=code, status=status, retry_after=wait)
    if code in TOKEN_ERRORS:
        return GraphError(f"{text}: {TOKEN_HINT}", code=code, status=status, transient=False)
    if status >= 500 or code in TRANSIENT_CODES:
        return GraphError(text, code=code, status=status, retry_after=hinted)
    return GraphError(text, code=code, status=status, transient=False)


def unreachable(exc: Exception) -> GraphError:
    """Graph could not be reached at all (DNS, refused, reset, timeout): transient."""
    return GraphError(f"WhatsApp API unreachable: {type(exc).__name__}: {exc}")
