"""Mattermost's error answers as `DeliveryError`, with what a person should do about them.

429 (``text/plain`` "limit exceeded" with ``X-RateLimit-Reset`` in seconds to wait, and
``Retry-After``: not JSON), 5xx and network errors are transient; 400/403/404/413 are
not; 401 (the token) is not either, and the channel marks itself ``down`` with the
reason. Every refusal keeps its HTTP status (`status_of`) for callers that know a
better hint or a better fallback (an upload answered 413 becomes a line of text).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping

from core.events import DeliveryError

#: Where a person reads how to set the channel up.
SEE = "see docs/platforms/mattermost.md"
#: What a person should do about the common refusals, by HTTP status.
_HINTS = {
    400: "Mattermost refused the post",
    403: "the bot may not do that here: add it to the channel (or team) first",
    404: "the channel or post does not exist, or the bot cannot see it",
    413: "the file is larger than the server's MaxFileSize",
}
#: Better hints for some of Mattermost's error ids than their status's.
_ID_HINTS = {
    "api.file.attachments.disabled.app_error": "file sharing is turned off on the server: "
    "System Console → Site Configuration → File Sharing and Downloads",
}


def status_of(exc: BaseException) -> int | None:
    """The HTTP status a `DeliveryError` from `delivery_error` carries (None: no answer)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Mattermost's 429: ``X-RateLimit-Reset`` is seconds to wait; ``Retry-After`` too."""
    for name in ("X-RateLimit-Reset", "Retry-After"):
        raw = headers.get(name)
        if raw:
            with contextlib.suppress(ValueError):
                return max(0.0, float(raw))
    return None


def _error_text(body: bytes) -> tuple[str, str]:
    """The ``message`` of Mattermost's error JSON (else the start of the body) and its
    ``id`` ("" when there is none)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:200], ""
    if isinstance(data, dict):
        error_id = str(data.get("id") or "")
        return str(data.get("message") or error_id)[:300], error_id
    return "", ""


def delivery_error(
    what: str, status: int, headers: Mapping[str, str], body: bytes
) -> DeliveryError:
    """An HTTP error answer → `DeliveryError` (transient or not, with Mattermost's wait)."""
    detail, error_id = _error_text(body)
    if status == 429:
        wait = _retry_after(headers)
        return DeliveryError(
            f"Mattermost {what} was rate-limited (HTTP 429, retry after {wait}s)",
            retry_after=wait,
        )
    if status >= 500:
        return DeliveryError(f"Mattermost {what} failed on the server: HTTP {status} {detail}")
    if status == 401:
        refused = DeliveryError(
            f"Mattermost refused the bot token (HTTP 401: {detail}): it is wrong or was "
            f"revoked; set STEWARD_MATTERMOST_TOKEN to a valid bot access token ({SEE})",
            transient=False,
        )
        refused.status = status  # type: ignore[attr-defined]
        return refused
    hint = _ID_HINTS.get(error_id) or _HINTS.get(status, "")
    text = f"Mattermost {what} refused: HTTP {status} {detail}".rstrip()
    err = DeliveryError(text + (f" ({hint})" if hint else ""), transient=False)
    err.status = status  # type: ignore[attr-defined]  # for callers that know better hints
    return err
