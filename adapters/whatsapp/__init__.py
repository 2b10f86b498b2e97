"""WhatsApp Business Cloud API adapter: signed webhooks in, Graph API calls out.

Client library: plain **httpx**, not pywa. The Cloud API is a handful of JSON calls
(`POST /<phone id>/messages`, `POST /<phone id>/media`, `GET /<phone id>`), while pywa
hard-codes `https://graph.facebook.com/v<version>` as its base (reaching a proxy or a
test fake would need a host-rewriting transport or a private attribute), brings its
own web server layer we don't use (the webhook is a route on `steward run`'s one
aiohttp server) and its own update dispatch we would have to route around. With httpx
the base URL is a setting (`STEWARD_WHATSAPP_API_URL`), the Graph version is pinned in
`GRAPH_API_VERSION`, and errors are mapped straight from Graph's error body.

The package:

- `channel` — lifecycle, liveness probe, delivery across the 24-hour window (held
  messages in the channel's store), attachments, the webhook wiring;
- `inbound` — the signature check, Meta's verification GET, and deliveries parsed
  into `Message` / `ButtonPress`;
- `render` — WhatsApp's dialect, reply buttons, media and template payloads;
- `errors` — Graph's error body → `DeliveryError`.
"""

from adapters.whatsapp.channel import (
    DEFAULT_API_URL,
    GRAPH_API_VERSION,
    MEDIA_KEEP,
    STATE_DOCUMENT,
    WEBHOOK_PATH,
    WINDOW_SECONDS,
    WhatsAppChannel,
    WindowState,
)
from adapters.whatsapp.errors import GraphError, graph_error
from adapters.whatsapp.inbound import parse_update, signature_ok
from adapters.whatsapp.render import (
    MAX_DOCUMENT_BYTES,
    MAX_IMAGE_BYTES,
    fit_buttons,
    to_whatsapp,
)

__all__ = [
    "DEFAULT_API_URL",
    "GRAPH_API_VERSION",
    "MAX_DOCUMENT_BYTES",
    "MAX_IMAGE_BYTES",
    "MEDIA_KEEP",
    "STATE_DOCUMENT",
    "WEBHOOK_PATH",
    "WINDOW_SECONDS",
    "GraphError",
    "WhatsAppChannel",
    "WindowState",
    "fit_buttons",
    "graph_error",
    "parse_update",
    "signature_ok",
    "to_whatsapp",
]
