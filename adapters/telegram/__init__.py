"""Telegram: long polling (default) or a webhook, inline keyboards, HTML answers,
photos and documents.

The adapter speaks the Bot API through python-telegram-bot 22's ``Bot`` (not its
``Application``): its own getUpdates loop so that every failure shows in health, or
``POST /webhooks/telegram`` through Steward's one webhook intake. Each update is
handled once, however often it arrives.

The parts:
- `channel.py`: `TelegramChannel`, its lifecycle, polling loop, webhook wiring and
  delivery;
- `inbound.py`: the webhook's secret token, and updates as Steward's events;
- `render.py`: Markdown as Telegram HTML, inline keyboards, attachments as uploads;
- `errors.py`: Bot API errors as `DeliveryError`, and the hints a person reads.
"""

from __future__ import annotations

from adapters.telegram.channel import WEBHOOK_PATH, TelegramChannel
from adapters.telegram.errors import delivery_error
from adapters.telegram.inbound import SECRET_HEADER, Me, parse_update
from adapters.telegram.render import to_html

__all__ = [
    "SECRET_HEADER",
    "WEBHOOK_PATH",
    "Me",
    "TelegramChannel",
    "delivery_error",
    "parse_update",
    "to_html",
]
