"""Discord: the gateway in, REST out, message components for buttons.

discord.py's ``Client`` owns the gateway (heartbeats, zlib, sequence numbers,
RESUME after a drop, the guild/channel cache that tells a DM from a thread); this
module only turns its events into `Message` / `ButtonPress` and renders outbound
messages as Discord JSON. Outbound payloads are built here (not through
``discord.ui.View``) so that the exact JSON Discord receives is ours and can be
golden-tested, and so that no per-message view objects accumulate in the SDK.

Conversations: a conversation is the Discord channel a message was written in.
A thread is a channel of its own on Discord, so a message in a thread has
``conversation == thread == <thread id>``: replies, typing, `/cancel` and even a
caller that forgets ``thread=`` all stay in the thread. Guild messages reach
Steward only when they @-mention the bot (the mention is stripped); DMs always do.
Bots, webhooks and the bot itself are ignored, so our own replies never come back
as inbound.

Edits and deletions (gateway ``MESSAGE_UPDATE`` / ``MESSAGE_DELETE``, delivered under
the same GUILD_MESSAGES / DIRECT_MESSAGES intents as new messages) of a person's
message to Steward become `Retracted`, ``sent_at`` from the message's snowflake: a
signal for proactive help only. discord.py's message cache is off (``max_messages=None``)
so its raw delete event never names the author: the adapter remembers the authors of
the last messages it delivered and skips a deletion it cannot attribute. An update
without ``edited_timestamp`` (an embed or link preview resolving) is not an edit.

Traps found in discord.py 2.7.1 (and handled here):

* **429s and 5xx never reach a caller by default.** ``HTTPClient.request`` sleeps
  ``retry_after`` and retries a 429 up to five times, and retries 500/502/504/524
  with 1+3+5+7+9 s sleeps; the interaction webhook adapter does the same with no
  limit option at all. ``max_ratelimit_timeout`` cannot help: it is clamped to
  at least 30 s, so a 2-second 429 is still slept on inside the SDK. Retrying is
  the channel layer's job (bot/channels.py), so the adapter passes a public
  ``http_trace`` whose ``on_request_end`` raises `_Refused` for any 429/5xx before
  discord.py looks at the status: one request, one `DeliveryError` (with
  Discord's JSON ``retry_after``), no hidden sleeps.
* A 429 without a ``Via`` header is a Cloudflare ban, not a rate limit.
* A gateway event discord.py cannot parse raises out of ``Client.connect`` and
  ends the connection loop; the adapter restarts it (new session) with backoff.
* ``Client.run`` installs signal handlers and owns the loop, so the adapter uses
  ``login`` + ``connect`` in a task; ``_set_api_version`` would rewrite the
  REST base back to discord.com, so it is never called.
* REST and gateway URLs are process-global class attributes
  (``discord.http.Route.BASE``, ``DiscordWebSocket.DEFAULT_GATEWAY``): one API
  URL per process. Reconnects use READY's ``resume_gateway_url``.

Slash commands `/rules`, `/approve`, `/deny`, `/pause` are registered globally at
start (one bulk PUT). Their interaction is deferred at once ("thinking…") and the
next reply sent to that conversation becomes the command's answer.

Attachments are files of the message itself (multipart, as discord.py sends them): up
to 10 per message and 10 MB together (Discord's limit for a bot in a server without
boosts); each caption is the file's description (shown under an image) or, for other
files, a line of the text. What does not fit gets a line saying it was not sent.

The parts:
- `channel.py`: `DiscordChannel`, the adapter, and discord.py's ``Client`` with its
  events routed to it;
- `inbound.py`: gateway messages, edits, deletions and interactions as Steward's events;
- `render.py`: messages, buttons and files as Discord's request;
- `errors.py`: the 429/5xx trace hook and errors as `DeliveryError`.
"""

from __future__ import annotations

from adapters.discord.channel import (
    AUTH_FAILED,
    DISCORD_API_URL,
    DISCORD_GATEWAY_URL,
    INTENT_HINT,
    INTERACTION_TTL,
    DiscordChannel,
)
from adapters.discord.errors import TOKEN_REFUSED, delivery_error
from adapters.discord.inbound import parse_message, parse_press
from adapters.discord.render import (
    BUTTON_STYLES,
    BUTTONS_PER_ROW,
    EPHEMERAL,
    MAX_BUTTONS,
    MAX_CUSTOM_ID,
    MAX_FILES,
    MAX_LABEL,
    MAX_UPLOAD_BYTES,
    NO_PINGS,
    fit_files,
    message_payload,
    render_buttons,
    text_with_files,
)

__all__ = [
    "AUTH_FAILED",
    "BUTTONS_PER_ROW",
    "BUTTON_STYLES",
    "DISCORD_API_URL",
    "DISCORD_GATEWAY_URL",
    "EPHEMERAL",
    "INTENT_HINT",
    "INTERACTION_TTL",
    "MAX_BUTTONS",
    "MAX_CUSTOM_ID",
    "MAX_FILES",
    "MAX_LABEL",
    "MAX_UPLOAD_BYTES",
    "NO_PINGS",
    "TOKEN_REFUSED",
    "DiscordChannel",
    "delivery_error",
    "fit_files",
    "message_payload",
    "parse_message",
    "parse_press",
    "render_buttons",
    "text_with_files",
]
