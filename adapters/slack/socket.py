"""Socket Mode glue: the SDK's client and Bolt's handler, made to tell the adapter when
the socket (re)connects or fails for good (adapters/slack/channel.py `SlackChannel`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.aiohttp import SocketModeClient

from adapters.slack.outbound import _FATAL_AUTH, _error_code

if TYPE_CHECKING:
    from adapters.slack.channel import SlackChannel


class _SocketClient(SocketModeClient):
    """The SDK's aiohttp Socket Mode client, telling the adapter when it (re)connects.

    Why a subclass: the SDK reconnects on its own (after a close frame, a
    ``disconnect`` message or failed pings) but reports it to nobody, and retries
    forever even when the app token is simply wrong. Every (re)connection starts
    with ``apps.connections.open``, so that is where we hook: the adapter's health
    goes to ``reconnecting``, and a fatal auth error stops the loop and marks the
    channel ``down`` instead of hammering Slack.
    """

    def __init__(self, *, owner: SlackChannel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._owner = owner

    async def issue_new_wss_url(self) -> str:
        self._owner._socket_connecting()
        try:
            url = await super().issue_new_wss_url()
        except SlackApiError as exc:
            if _error_code(exc) in _FATAL_AUTH:
                self.closed = True  # ends the SDK's connect/receive loops: retrying cannot help
                self.auto_reconnect_enabled = False
            self._owner._socket_failed(exc)
            raise
        except Exception as exc:
            self._owner._socket_failed(exc)
            raise
        return url


class _SocketHandler(AsyncSocketModeHandler):
    """Bolt's aiohttp Socket Mode handler, running on our `_SocketClient`.

    Its ``__init__`` is skipped on purpose: it would build a second client (an
    aiohttp session plus a background task) only to have it replaced. ``handle``
    (envelope → Bolt → ack) is the SDK's own.
    """

    def __init__(self, app: AsyncApp, client: _SocketClient) -> None:
        self.app = app
        self.app_token = client.app_token
        self.client = client
        client.socket_mode_request_listeners.append(self.handle)  # type: ignore[arg-type]
