"""Mattermost: a bot account over the REST API v4 and the websocket, buttons as
interactive message attachments whose presses Steward verifies itself, files uploaded.

Client library: none of Mattermost's. `mattermostdriver` (the usual choice) is
unmaintained since 2022 and synchronous (requests; its websocket helper blocks the
event loop), so the adapter speaks the small part of the protocol it needs with
aiohttp, which Steward already uses: its `ClientSession` for REST (JSON and the
multipart file uploads) and its websocket client for events. One library for both
keeps one connection pool, one set of timeouts and one error type to translate.

Security: Mattermost does not sign the requests it sends to integrations, so every
button carries an HMAC-SHA256 of its value and channel, keyed by 32 random bytes kept
in ``<data dir>/secrets/mattermost_actions.key`` (through the channel store: mode
0600, created on first start). A press without it, with a wrong one or replayed into
another channel is answered 401 and nothing happens.

The parts:
- `inbound.py`: websocket events and press requests → Steward's events; press
  verification for the webhook;
- `render.py`: post bodies, signed buttons, file uploads, captions;
- `errors.py`: Mattermost's error answers as `DeliveryError`;
- `channel.py`: `MattermostChannel`, the adapter (lifecycle, websocket session loop,
  REST delivery, the ``/webhooks/mattermost`` route).
"""

from __future__ import annotations

from adapters.mattermost.channel import (
    API,
    CATCH_UP_CHANNELS,
    KEY_FILE,
    WEBHOOK_PATH,
    MattermostChannel,
)
from adapters.mattermost.errors import delivery_error
from adapters.mattermost.inbound import (
    NAME,
    parse_delivery,
    parse_posted,
    parse_press,
    parse_retraction,
    press_verifier,
    strip_mention,
    verify_press,
)
from adapters.mattermost.render import (
    DEFAULT_MAX_FILE_SIZE,
    FILES_PER_POST,
    MAX_POST,
    post_body,
    render_actions,
    sign,
    with_captions,
)

__all__ = [
    "API",
    "CATCH_UP_CHANNELS",
    "DEFAULT_MAX_FILE_SIZE",
    "FILES_PER_POST",
    "KEY_FILE",
    "MAX_POST",
    "NAME",
    "WEBHOOK_PATH",
    "MattermostChannel",
    "delivery_error",
    "parse_delivery",
    "parse_posted",
    "parse_press",
    "parse_retraction",
    "post_body",
    "press_verifier",
    "render_actions",
    "sign",
    "strip_mention",
    "verify_press",
    "with_captions",
]
