"""Slack: Socket Mode (default) or HTTP Events mode, through slack_bolt's AsyncApp.

Why this shape: the adapter is thin. Inbound it verifies (v0
signature in HTTP mode; Socket Mode needs none: the adapter opened the socket
itself with the app token), parses Events API / interactivity / slash-command
payloads into `Message`, `ButtonPress`, and hands them to the dispatcher. Outbound
it renders text and Block Kit buttons. It never retries, splits or converts
Markdown: the channel layer does that once for every platform, and gives us text
that is already Slack mrkdwn.

Inbound, what counts as talking to Steward:

* ``app_mention`` in a channel: the bot's ``<@U…>`` is removed from the text, and the
  reply thread is the message's thread (or the message itself, so answers stay in a
  thread instead of flooding the channel);
* ``message`` in a DM (``channel_type: im``); a thread is kept only if the person
  wrote in one;
* a press on a button we rendered (``action_id`` ``steward_<i>``): acknowledged at
  once (Slack wants an ack within 3 s) and dispatched in the background;
* the ``/steward`` slash command: ``/steward rules list`` becomes ``/rules list``;
* a person's edit or deletion (``message`` subtypes ``message_changed`` /
  ``message_deleted``) of a message they sent Steward (a DM, or one mentioning the
  bot): a `Retracted` carrying the original's ``ts`` as ``sent_at``, only a signal for
  proactive help. Edits that leave the text alone (link unfurls, attachments) are not
  edits by the person and are ignored.

Anything written by a bot, by Steward itself, or carrying another subtype (joins,
bot_message, …) is ignored: our own replies (and our own edits of them) come back as
``message`` events and must never turn into input.

Modes: Socket Mode when an app-level token (``xapp-``) is given, else HTTP mode,
which mounts ``POST /webhooks/slack`` (and the older ``/slack/events``) on Steward's
aiohttp server through the shared webhook intake (events, interactivity and slash
commands all point there). A request Slack retries, or one replayed within the
signature's 5-minute window, runs once.

Outbound attachments are real files: one external upload per message, into the same
conversation and thread, each caption as the file's title.

The parts:
- `channel.py`: `SlackChannel`, the adapter (lifecycle, the Socket Mode client that
  reports (re)connects and fatal auth, the HTTP route, the delivery calls);
- `inbound.py`: the v0 signature check and the payload parsers;
- `render.py`: Block Kit and the upload's file list;
- `errors.py`: Slack's errors as `DeliveryError`.
"""

from __future__ import annotations

from adapters.slack.channel import DEFAULT_API_URL, LEGACY_HTTP_PATH, Mode, SlackChannel
from adapters.slack.errors import delivery_error
from adapters.slack.inbound import (
    ACTION_ID,
    SIGNATURE_WINDOW,
    SLASH_COMMAND,
    parse_action,
    parse_command,
    parse_event,
    parse_retraction,
    strip_mention,
    verify,
)
from adapters.slack.render import escape_mrkdwn, file_uploads, render_blocks, render_button

__all__ = [
    "ACTION_ID",
    "DEFAULT_API_URL",
    "LEGACY_HTTP_PATH",
    "SIGNATURE_WINDOW",
    "SLASH_COMMAND",
    "Mode",
    "SlackChannel",
    "delivery_error",
    "escape_mrkdwn",
    "file_uploads",
    "parse_action",
    "parse_command",
    "parse_event",
    "parse_retraction",
    "render_blocks",
    "render_button",
    "strip_mention",
    "verify",
]
