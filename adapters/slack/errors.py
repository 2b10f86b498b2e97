"""Slack's API errors as the channel layer's `DeliveryError`: rate limits and Slack's own
failures transient (with ``Retry-After``), refusals not, each with what a person should do
about it. Also the token refusals no reconnect can fix (`_FATAL_AUTH`), which Socket Mode
uses to stop retrying a wrong app-level token.
"""

from __future__ import annotations

import aiohttp
from slack_sdk.errors import SlackApiError

from core.events import (
    DeliveryError,
)

#: Error codes no retry can fix: the token is wrong, revoked or lacks a permission.
_FATAL_AUTH = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "not_allowed_token_type",
        "missing_scope",
        "no_permission",
        "team_access_not_granted",
        "ekm_access_denied",
    }
)
#: `ok: false` codes Slack documents as temporary.
_TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
#: What a person should do about the common refusals.
_HINTS = {
    "invalid_auth": "check STEWARD_SLACK_BOT_TOKEN (the xoxb-… Bot User OAuth Token)",
    "not_authed": "check STEWARD_SLACK_BOT_TOKEN (the xoxb-… Bot User OAuth Token)",
    "token_revoked": "the app was uninstalled or the token revoked: reinstall it and "
    "update STEWARD_SLACK_BOT_TOKEN",
    "account_inactive": "the app was uninstalled or the token revoked: reinstall it",
    "missing_scope": "add the scope to the app (OAuth & Permissions) and reinstall it",
    "not_in_channel": "Steward is not a member of that channel: /invite @Steward there",
    "channel_not_found": "the channel does not exist or Steward cannot see it: /invite it",
    "is_archived": "the channel is archived",
    "msg_too_long": "the message is longer than Slack accepts",
    "invalid_blocks": "Slack refused the Block Kit layout",
    "message_not_found": "the message to edit no longer exists",
    "cant_update_message": "Steward can only edit its own messages",
    "user_not_in_channel": "that person is not in the channel",
}


def _error_code(exc: SlackApiError) -> str:
    data = getattr(exc.response, "data", None)
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])
    return "unknown_error"


def delivery_error(method: str, exc: BaseException) -> DeliveryError:
    """Translate an SDK/network error into the channel layer's `DeliveryError`."""
    if isinstance(exc, SlackApiError):
        status = getattr(exc.response, "status_code", 200)
        code = _error_code(exc)
        if status == 429 or code == "ratelimited":
            headers = getattr(exc.response, "headers", None) or {}
            retry_after: float | None
            try:
                retry_after = float(headers.get("Retry-After", ""))
            except (TypeError, ValueError):
                retry_after = None
            return DeliveryError(
                f"Slack {method} was rate-limited (HTTP 429, Retry-After {retry_after})",
                retry_after=retry_after,
            )
        if status >= 500 or code in _TRANSIENT_ERRORS:
            return DeliveryError(f"Slack {method} failed on Slack's side: HTTP {status} {code}")
        hint = _HINTS.get(code)
        needed = exc.response.get("needed") if code == "missing_scope" else None
        detail = f" (needed: {needed})" if needed else ""
        text = f"Slack {method} refused: {code}{detail}" + (f": {hint}" if hint else "")
        return DeliveryError(text, transient=False)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return DeliveryError(f"Slack {method}: could not reach Slack: {type(exc).__name__} {exc}")
    return DeliveryError(f"Slack {method} failed: {type(exc).__name__}: {exc}", transient=False)
