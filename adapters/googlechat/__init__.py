"""Google Chat: Steward as an HTTP endpoint Chat app at ``/webhooks/googlechat``.

Webhook in (bearer JWT from Google, verified before parsing), REST out with a service
account, cardsV2 buttons whose press is answered with the updated card, attachments
as cards of files Steward publishes under ``public_url``.

The parts:
- `inbound.py`: the bearer-token verifier and the interaction events → `Message`,
  `ButtonPress`;
- `render.py`: Chat's text dialect, button and attachment cards, message bodies;
- `errors.py`: Google's refusals as `DeliveryError`, with hints;
- `channel.py`: `GoogleChatChannel` (token keeper, REST calls, the webhook wiring,
  the synchronous answer to a press).
"""

from __future__ import annotations

from adapters.googlechat.channel import (
    DEFAULT_API_URL,
    SCOPES,
    WEBHOOK_PATH,
    GoogleChatChannel,
    load_credentials,
)
from adapters.googlechat.errors import delivery_error
from adapters.googlechat.inbound import (
    CHAT_ISSUER,
    NAME,
    ChatTokenVerifier,
    is_direct,
    parse_event,
    parse_message,
    parse_press,
    shape_problem,
)
from adapters.googlechat.render import (
    PRESS_FUNCTION,
    PRESS_PARAMETER,
    attachment_card,
    introduction,
    message_body,
    render_button,
    render_cards,
    to_gchat,
)

__all__ = [
    "CHAT_ISSUER",
    "DEFAULT_API_URL",
    "NAME",
    "PRESS_FUNCTION",
    "PRESS_PARAMETER",
    "SCOPES",
    "WEBHOOK_PATH",
    "ChatTokenVerifier",
    "GoogleChatChannel",
    "attachment_card",
    "delivery_error",
    "introduction",
    "is_direct",
    "load_credentials",
    "message_body",
    "parse_event",
    "parse_message",
    "parse_press",
    "render_button",
    "render_cards",
    "shape_problem",
    "to_gchat",
]
