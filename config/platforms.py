"""The platform registry: everything the rest of Steward knows about a chat platform.

Why one table at the bottom layer: settings, their defaults file, access control, the
doctor, the HTTP server and the contract suite all need the list of platforms and
each one's keys. Before, each of them named the platforms itself, so adding one
touched a dozen files. Now a platform is its adapter module, its fake, one entry
here and its page docs/platforms/<name>.md; everything else reads this table.

The entry holds only facts (names, settings keys, the dialect's name, where the
adapter class lives), so this module imports nothing above `config`. The adapter
class is imported by name when a platform is configured (bot/channels.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Key:
    """One setting of a platform: `<platform>_<name>` in steward.toml,
    `STEWARD_<PLATFORM>_<NAME>` in the environment."""

    name: str
    doc: str
    #: Kept out of reprs and logs (tokens, signing secrets).
    secret: bool = False
    #: Setting it turns the platform on (at least one such key must be set).
    enables: bool = False


@dataclass(frozen=True)
class PlatformConfig(Mapping[str, str]):
    """One platform's settings, by their short names (`cfg.bot_token`)."""

    platform: str
    # Shadows Mapping.values(): `cfg.values` is the raw mapping (iterate `cfg.values.values()`).
    values: Mapping[str, str]  # type: ignore[assignment]

    def __getitem__(self, key: str) -> str:
        return self.values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __getattr__(self, key: str) -> str:
        try:
            return self.values[key]
        except KeyError:
            raise AttributeError(f"{self.platform} has no setting `{key}`") from None

    def __repr__(self) -> str:  # secrets never in a repr
        return f"PlatformConfig({self.platform!r}, keys={sorted(self.values)})"


def _no_problems(cfg: PlatformConfig) -> list[str]:
    return []


@dataclass(frozen=True)
class PlatformSpec:
    """A chat platform: its name, settings, Markdown dialect and adapter."""

    name: str
    #: For people: "Google Chat", and the title of its page docs/platforms/<name>.md.
    title: str
    #: `module:Class` of the adapter; the class has `from_settings(cfg, settings, store)`.
    adapter: str
    #: A converter name in core.formatting.DIALECTS, unless the adapter class has its
    #: own `to_dialect(markdown) -> str`.
    dialect: str = "markdown"
    keys: tuple[Key, ...] = ()
    #: Half-configured set-ups a person must fix, worded with the env names.
    problems: Callable[[PlatformConfig], list[str]] = _no_problems
    #: The platform shows the bot's own messages back to it as events (used to tell
    #: "alive but deaf"); a platform that doesn't needs its own liveness signal.
    echoes: bool = False
    #: Receives on `/webhooks/<name>` of `steward run`'s HTTP server (always, or when
    #: configured so: the adapter's `add_routes` decides).
    webhook: bool = False
    #: Aliases kept working for set-ups made before `/webhooks/<name>` (e.g. /slack/events).
    legacy_paths: tuple[str, ...] = field(default_factory=tuple)

    def setting(self, key: str) -> str:
        """The flat settings key: `slack_bot_token`."""
        return f"{self.name}_{key}"

    def env(self, key: str) -> str:
        return f"STEWARD_{self.name.upper()}_{key.upper()}"

    @property
    def webhook_path(self) -> str:
        return f"/webhooks/{self.name}"

    def all_keys(self) -> tuple[Key, ...]:
        """Its own keys plus the access lists every platform has."""
        return (*self.keys, *ACCESS_KEYS)

    def config(self, settings: Any) -> PlatformConfig:
        return PlatformConfig(
            self.name,
            {k.name: str(getattr(settings, self.setting(k.name))) for k in self.all_keys()},
        )

    def configured(self, settings: Any) -> bool:
        return any(
            str(getattr(settings, self.setting(k.name), "")).strip() for k in self.keys if k.enables
        )


ACCESS_KEYS = (
    Key(
        "allowed_users",
        "who may talk to Steward (docs/platforms/README.md#who-may-talk-to-steward)",
    ),
    Key("admins", "who may confirm pairing codes and change policy and rules"),
)


def _slack_problems(cfg: PlatformConfig) -> list[str]:
    problems = []
    if (cfg.app_token or cfg.signing_secret) and not cfg.bot_token:
        problems.append(
            "STEWARD_SLACK_APP_TOKEN or STEWARD_SLACK_SIGNING_SECRET is set but "
            "STEWARD_SLACK_BOT_TOKEN is not: Slack needs the bot token (xoxb-…) in both "
            "Socket Mode and HTTP mode (see docs/platforms/slack.md)."
        )
    if cfg.bot_token and not (cfg.app_token or cfg.signing_secret):
        problems.append(
            "STEWARD_SLACK_BOT_TOKEN is set but neither STEWARD_SLACK_APP_TOKEN (Socket Mode) "
            "nor STEWARD_SLACK_SIGNING_SECRET (HTTP mode) is: Steward can send but not "
            "receive (see docs/platforms/slack.md)."
        )
    return problems


def _telegram_problems(cfg: PlatformConfig) -> list[str]:
    """Half-configured webhook mode (long polling needs only the token)."""
    problems = []
    url, secret = cfg.webhook_url.strip(), cfg.webhook_secret.strip()
    if url and not secret:
        problems.append(
            "STEWARD_TELEGRAM_WEBHOOK_URL is set but STEWARD_TELEGRAM_WEBHOOK_SECRET is not: "
            "webhook mode needs a secret so that only Telegram can post updates "
            "(see docs/platforms/telegram.md#webhook-mode)."
        )
    if secret and not url:
        problems.append(
            "STEWARD_TELEGRAM_WEBHOOK_SECRET is set but STEWARD_TELEGRAM_WEBHOOK_URL is not: "
            "Steward would long-poll and never use the secret "
            "(see docs/platforms/telegram.md#webhook-mode)."
        )
    if secret and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
        problems.append(
            "STEWARD_TELEGRAM_WEBHOOK_SECRET may only hold A-Z, a-z, 0-9, _ and - (1-256 "
            "characters): Telegram refuses any other secret "
            "(see docs/platforms/telegram.md#webhook-mode)."
        )
    return problems


def needs(platform: str, *pairs: tuple[str, str]) -> Callable[[PlatformConfig], list[str]]:
    """A `problems` check: each (key, why) must be set once the platform is on."""

    def check(cfg: PlatformConfig) -> list[str]:
        prefix = f"STEWARD_{platform.upper()}_"
        return [
            f"{prefix}{key.upper()} is not set: {why} (see docs/platforms/{platform}.md)."
            for key, why in pairs
            if not cfg[key].strip()
        ]

    return check


PLATFORMS: tuple[PlatformSpec, ...] = (
    PlatformSpec(
        "slack",
        "Slack",
        "adapters.slack:SlackChannel",
        dialect="slack",
        keys=(
            Key("bot_token", "bot token (xoxb-…), needed in both modes", secret=True, enables=True),
            Key("app_token", "app-level token (xapp-…): Socket Mode", secret=True, enables=True),
            Key("signing_secret", "signing secret: HTTP mode", secret=True, enables=True),
            Key("api_url", "Web API base; empty: https://slack.com/api/"),
        ),
        problems=_slack_problems,
        echoes=True,
        webhook=True,
        legacy_paths=("/slack/events",),
    ),
    PlatformSpec(
        "discord",
        "Discord",
        "adapters.discord:DiscordChannel",
        dialect="discord",
        keys=(
            Key("token", "bot token", secret=True, enables=True),
            Key("api_url", "REST base; empty: https://discord.com/api/v10"),
            Key("gateway_url", "gateway base; empty: wss://gateway.discord.gg/"),
        ),
        echoes=True,
    ),
    PlatformSpec(
        "telegram",
        "Telegram",
        "adapters.telegram:TelegramChannel",
        dialect="markdown",  # unused: the adapter's own to_dialect (HTML) wins
        keys=(
            Key("token", "BotFather token", secret=True, enables=True),
            Key(
                "api_url",
                "Bot API base (the token is appended); empty: https://api.telegram.org/bot",
            ),
            Key(
                "webhook_url",
                "public https URL (…/webhooks/telegram): webhook mode instead of long polling",
            ),
            Key("webhook_secret", "X-Telegram-Bot-Api-Secret-Token for webhook mode", secret=True),
        ),
        problems=_telegram_problems,
        # Telegram never shows a bot its own messages: the adapter's liveness signal is
        # the getUpdates round trip instead (adapters/telegram/channel.py).
        echoes=False,
        webhook=True,
    ),
    PlatformSpec(
        "line",
        "LINE",
        "adapters.line:LineChannel",
        dialect="plain",
        keys=(
            Key("channel_secret", "channel secret (signs webhooks)", secret=True, enables=True),
            Key("channel_token", "long-lived channel access token", secret=True, enables=True),
            Key("api_url", "Messaging API host; empty: https://api.line.me"),
            Key(
                "deaf_after",
                "seconds without a verified webhook before LINE counts as deaf; "
                "empty: 86400 (a day); 0: never",
            ),
        ),
        problems=needs(
            "line",
            ("channel_secret", "LINE signs every webhook with it (Basic settings)"),
            ("channel_token", "Steward answers with it (Messaging API → channel access token)"),
        ),
        webhook=True,
    ),
    PlatformSpec(
        "whatsapp",
        "WhatsApp",
        "adapters.whatsapp:WhatsAppChannel",
        dialect="markdown",
        keys=(
            Key("token", "system-user access token", secret=True, enables=True),
            Key("phone_id", "phone number id", enables=True),
            Key("app_secret", "app secret (signs webhooks)", secret=True),
            Key("verify_token", "webhook verification token", secret=True),
            Key("api_url", "Graph API base; empty: https://graph.facebook.com"),
            Key(
                "template",
                "approved template (`name` or `name:language`) that tells a person, outside "
                "the 24-hour window, that a result waits for them; empty: none",
            ),
        ),
        problems=needs(
            "whatsapp",
            ("token", "Steward can't call the Cloud API without the system-user token"),
            ("phone_id", "Steward doesn't know which number to send from"),
            ("app_secret", "webhook deliveries can't be verified, so every one is refused"),
            ("verify_token", "Meta's webhook verification can't succeed"),
        ),
        webhook=True,
    ),
    PlatformSpec(
        "googlechat",
        "Google Chat",
        "adapters.googlechat:GoogleChatChannel",
        # The adapter's own `to_dialect` (Chat's *bold*, _italic_, <url|text>) is used.
        dialect="markdown",
        keys=(
            Key("credentials", "path to the service-account JSON key", enables=True),
            Key("audience", "project number, or the endpoint URL (the app's auth audience)"),
            Key("api_url", "Chat API base; empty: https://chat.googleapis.com"),
            Key(
                "certs_url",
                "x509 certificates inbound tokens are checked against; empty: Google's",
            ),
        ),
        problems=needs(
            "googlechat",
            (
                "audience",
                "inbound requests are verified against it: the project number, or the HTTP "
                "endpoint URL if the app's authentication audience is set to it",
            ),
        ),
        webhook=True,
    ),
    PlatformSpec(
        "mattermost",
        "Mattermost",
        "adapters.mattermost:MattermostChannel",
        dialect="markdown",
        keys=(
            Key("url", "server base, e.g. https://chat.example.com", enables=True),
            Key("token", "bot account access token", secret=True, enables=True),
        ),
        problems=needs(
            "mattermost",
            ("url", "Steward needs the server's base URL, e.g. https://chat.example.com"),
            ("token", "Steward needs the bot account's access token"),
        ),
        # The websocket delivers the bot's own posts back: the shared deaf check applies.
        echoes=True,
        webhook=True,
    ),
)

BY_NAME: dict[str, PlatformSpec] = {p.name: p for p in PLATFORMS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def spec(name: str) -> PlatformSpec | None:
    return BY_NAME.get(name)


def setting_keys() -> dict[str, Key]:
    """Every flat settings key the registry defines, e.g. `slack_bot_token`."""
    return {p.setting(k.name): k for p in PLATFORMS for k in p.all_keys()}
