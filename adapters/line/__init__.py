"""LINE: signed webhooks in, the Messaging API out, through line-bot-sdk v3 (`linebot.v3`).

Why this library: it is LINE's own SDK and already a dependency; its async client
(`AsyncApiClient`, aiohttp underneath) keeps Steward async all the way, its
`Configuration(host=…)` points every endpoint at STEWARD_LINE_API_URL (proxies, the
test fake) and its models render the Flex bubbles and picture messages.

What LINE is like, and what the adapter does about it:

* Webhook only. `POST /webhooks/line` checks ``x-line-signature`` before anything is
  parsed: unsigned or wrongly signed → 401, nothing reaches the model. A verified
  body is answered 200 at once and its events run in the background; an event whose
  ``webhookEventId`` was already handled (LINE redelivers) runs once. The console's
  "Verify" button sends ``{"events": []}`` and gets its 200.
* No edit, no delete, no upload. An edit is a new message, progress is LINE's loading
  animation, and attachments are fetched by LINE from Steward's ``public_url``
  (pictures as picture messages, other files as links).
* Reply tokens are single-use and short-lived: the first answer replies, the rest push.
* Liveness is the last verified webhook (``deaf`` after ``deaf_after`` seconds).

The SDK's package ``__init__`` files import every model it has (~30 MB resident);
this adapter uses a dozen, so they are deferred (core/lazy_package.py) before any
module of this package imports the SDK.

The parts:
- `inbound.py`: the signature check and the webhook's events as `Message` / `ButtonPress`;
- `render.py`: plain text, Flex buttons, attachments as LINE messages, the 5-per-call limit;
- `errors.py`: LINE's errors as `DeliveryError`, and the hints a person reads;
- `channel.py`: `LineChannel`, the adapter (lifecycle, webhook, delivery, liveness).
"""

from __future__ import annotations

from core.lazy_package import defer_init

defer_init(
    "linebot",
    "linebot.v3",
    "linebot.v3.messaging",
    "linebot.v3.messaging.models",
    "linebot.v3.webhooks",
)

from adapters.line.channel import (
    DEFAULT_API_URL,
    DEFAULT_DEAF_AFTER,
    WEBHOOK_PATH,
    LineChannel,
)
from adapters.line.errors import delivery_error, is_quota_exhausted
from adapters.line.inbound import check_signature, parse_event, signature_for, valid_signature
from adapters.line.render import (
    alt_text,
    attachment_messages,
    render_buttons,
    text_messages,
    to_line_text,
    utf16_len,
)

__all__ = [
    "DEFAULT_API_URL",
    "DEFAULT_DEAF_AFTER",
    "WEBHOOK_PATH",
    "LineChannel",
    "alt_text",
    "attachment_messages",
    "check_signature",
    "delivery_error",
    "is_quota_exhausted",
    "parse_event",
    "render_buttons",
    "signature_for",
    "text_messages",
    "to_line_text",
    "utf16_len",
    "valid_signature",
]
