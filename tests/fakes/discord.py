"""A fake Discord speaking the real wire protocol to the unmodified discord.py.

Why a wire-level fake: the adapter's risky parts are exactly the ones an
in-process mock would hide — the gateway handshake (HELLO, heartbeats, IDENTIFY
with the MESSAGE_CONTENT intent, READY, RESUME after a drop), the shapes
discord.py insists on (a DM MESSAGE_CREATE without ``guild_id``, fully populated
users, members, guilds and messages), how it reacts to a 429 (``Via`` header +
JSON ``retry_after``) and interaction callbacks that must arrive within 3 s.

One aiohttp app on 127.0.0.1 (ephemeral port) serves both:

* REST under ``/api/v10`` (point ``discord.http.Route.BASE`` at :attr:`api_url`);
  every response is JSON with ``Content-Type`` exactly ``application/json``
  (discord.py compares the header verbatim);
* the gateway at ``/gw`` (point ``DiscordWebSocket.DEFAULT_GATEWAY`` at
  :attr:`gateway_url`); READY's ``resume_gateway_url`` is ``/gw-resume`` on the same
  server, so a test can see that a reconnect really resumed. Frames are text; the
  ``compress`` query parameter is ignored (discord.py parses ``str`` frames as is).

Messages with files arrive as discord.py sends them: a multipart form with the JSON
body in ``payload_json`` (its ``attachments`` list gives each file's index, name and
``description``) and each file in ``files[n]``. The fake checks Discord's limits (10
files, 10 MiB per request for a server without boosts: 400 / 413 as Discord answers),
stores the attachment objects on the message (as discord.py parses them) and records
every file with its bytes in :attr:`uploads`.

Test controls: :meth:`dm_message`, :meth:`guild_message`, :meth:`edit_message`,
:meth:`embed_update`, :meth:`delete_message` (MESSAGE_UPDATE / MESSAGE_DELETE as the
gateway sends them), :meth:`press_button`, :meth:`slash_command`, :meth:`dispatch`
(any raw event), :meth:`drop`, :meth:`rate_limit_next`, :meth:`fail_next`,
:attr:`close_on_identify`, and the records :attr:`requests`, :attr:`identifies`,
:attr:`resumes`, :attr:`callbacks`, :attr:`uploads`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import mimetypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

__all__ = [
    "ALICE",
    "APP_ID",
    "BOB",
    "BOT_ID",
    "BOT_ROLE",
    "GROUP",
    "GUILD",
    "OTHER_BOT",
    "THREAD",
    "TOKEN",
    "Callback",
    "FakeDiscord",
    "Recorded",
    "SentFile",
]

TOKEN = "fake-bot-token"
BOT_ID = "1000"
#: A bot's application id is its user id on Discord.
APP_ID = BOT_ID
ALICE = "2000"
BOB = "2001"
OTHER_BOT = "2999"
GUILD = "5000"
GROUP = "3000"
THREAD = "3100"
BOT_ROLE = "5001"
#: DM channel id per user (the bot's DM with that user).
DM_BASE = 4000
MESSAGE_CONTENT = 1 << 15
TS = "2024-01-01T00:00:00.000000+00:00"
#: Discord's limits on files: per message, and bytes per request (no boosts).
MAX_FILES = 10
MAX_UPLOAD_BYTES = 10 * 1024 * 1024
#: The parsed JSON body (``payload_json`` of a multipart request), read once by the
#: recording middleware, and the files of a multipart request.
BODY: web.RequestKey[Any] = web.RequestKey("body", object)
FILES: web.RequestKey[list[SentFile]] = web.RequestKey("files", list)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # Exactly "application/json": web.json_response adds "; charset=utf-8", with which
    # discord.py's json_or_text returns a str and then fails on ['id'].
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class SentFile:
    """One file of a multipart message as the fake received it."""

    #: Its form field, ``files[n]``.
    field: str
    filename: str
    data: bytes
    #: From the ``attachments`` entry of ``payload_json`` with the same index.
    description: str | None = None
    #: Where it was posted, once the message exists.
    channel_id: str = ""
    message_id: str = ""

    @property
    def index(self) -> int:
        return int(self.field.removeprefix("files[").removesuffix("]"))

    @property
    def content_type(self) -> str:
        return mimetypes.guess_type(self.filename)[0] or "application/octet-stream"


@dataclass
class Recorded:
    """One REST request as the fake received it (path without ``/api/v10``)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    authorization: str | None
    at: float
    #: The files of a multipart request.
    files: list[SentFile] = field(default_factory=list)


@dataclass
class Callback:
    """One interaction callback: its response type and how long after the event it came."""

    interaction_id: str
    type: int
    body: dict[str, Any]
    latency: float


@dataclass
class _Session:
    id: str
    seq: int = 0


@dataclass
class _Conn:
    ws: web.WebSocketResponse
    path: str
    session: _Session | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class FakeDiscord:
    """The fake platform; use as ``async with FakeDiscord() as fake:``."""

    def __init__(
        self,
        *,
        token: str = TOKEN,
        heartbeat_interval: float = 0.5,
        message_content_enabled: bool = True,
        echo_own_messages: bool = True,
    ) -> None:
        self.token = token
        self.heartbeat_interval = heartbeat_interval
        #: False mimics a bot whose MESSAGE CONTENT intent is off in the developer portal:
        #: an IDENTIFY asking for it is closed with 4014.
        self.message_content_enabled = message_content_enabled
        #: Like Discord, send a MESSAGE_CREATE for every message the bot posts (not for
        #: ephemeral ones): the adapter must not take its own replies as inbound.
        self.echo_own_messages = echo_own_messages
        #: Close code to answer the next IDENTIFY with (e.g. 4004), then cleared.
        self.close_on_identify: int | None = None
        self.requests: list[Recorded] = []
        self.identifies: list[dict[str, Any]] = []
        self._identified = asyncio.Event()
        self.resumes: list[dict[str, Any]] = []
        #: Path of every gateway connection, in order ("/gw", then "/gw-resume", …).
        self.gateway_paths: list[str] = []
        self.callbacks: list[Callback] = []
        #: Every message the bot posted or a user "wrote", by id (edits applied).
        self.messages: dict[str, dict[str, Any]] = {}
        #: Ids of messages the bot created, in order (channel posts and followups).
        self.bot_messages: list[str] = []
        #: Every message edit: (message id, body).
        self.edits: list[tuple[str, dict[str, Any]]] = []
        #: Followups sent through interaction webhooks: (interaction token, body).
        self.followups: list[tuple[str, dict[str, Any]]] = []
        self.commands: list[dict[str, Any]] = []
        #: Every file the bot sent with a message (channel posts and followups), in order.
        self.uploads: list[SentFile] = []
        self.threads: dict[str, str] = {THREAD: GROUP}
        self._ids = itertools.count(9000)
        self._sessions = itertools.count(1)
        #: interaction id -> (monotonic time it was sent, its token)
        self._interaction_sent: dict[str, tuple[float, str]] = {}
        #: interaction token -> the INTERACTION_CREATE payload (for followups)
        self._interactions: dict[str, dict[str, Any]] = {}
        self._rate_limits: list[float] = []
        self._failures: list[int] = []
        self._conn: _Conn | None = None
        self._conns: set[web.WebSocketResponse] = set()
        self._last_session: _Session | None = None
        self._request_waiters: list[
            tuple[Callable[[Recorded], bool], asyncio.Future[Recorded]]
        ] = []
        self._echoes: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> FakeDiscord:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        # Room above Discord's own limit, so that the fake answers it as Discord does.
        app = web.Application(middlewares=[self._record], client_max_size=4 * MAX_UPLOAD_BYTES)
        api = "/api/v10"
        r = app.router
        r.add_get("/gw", self._gateway)
        r.add_get("/gw-resume", self._gateway)
        r.add_get(f"{api}/users/@me", self._me)
        r.add_get(f"{api}/oauth2/applications/@me", self._app_info)
        r.add_post(f"{api}/users/@me/channels", self._open_dm)
        r.add_put(f"{api}/applications/{{app}}/commands", self._put_commands)
        r.add_post(f"{api}/channels/{{cid}}/messages", self._create_message)
        r.add_patch(f"{api}/channels/{{cid}}/messages/{{mid}}", self._edit_message)
        r.add_post(f"{api}/channels/{{cid}}/typing", self._typing)
        r.add_post(f"{api}/interactions/{{iid}}/{{itoken}}/callback", self._callback)
        r.add_post(f"{api}/webhooks/{{app}}/{{itoken}}", self._followup)
        r.add_patch(f"{api}/webhooks/{{app}}/{{itoken}}/messages/{{mid}}", self._followup_edit)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await asyncio.gather(*self._echoes, return_exceptions=True)
        for ws in list(self._conns):
            await ws.close(code=1001, message=b"fake shutting down")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gw"

    # ------------------------------------------------------------------ objects

    @staticmethod
    def user(uid: str, *, bot: bool = False) -> dict[str, Any]:
        """A full user object (discord.py reads username, discriminator, avatar, …)."""
        names = {BOT_ID: "steward", ALICE: "alice", BOB: "bob", OTHER_BOT: "otherbot"}
        name = names.get(uid, f"user{uid}")
        return {
            "id": uid,
            "username": name,
            "discriminator": "0",
            "global_name": name.capitalize(),
            "avatar": None,
            "bot": bot or uid in (BOT_ID, OTHER_BOT),
            "public_flags": 0,
        }

    @staticmethod
    def member(uid: str | None = None, *, interaction: bool = False) -> dict[str, Any]:
        """A guild member; MESSAGE_CREATE carries it without ``user``, GUILD_CREATE with
        ``user``, interactions with ``user`` and the member's channel ``permissions``."""
        data: dict[str, Any] = {
            "roles": [],
            "joined_at": TS,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "nick": None,
            "avatar": None,
            "premium_since": None,
            "pending": False,
            "communication_disabled_until": None,
        }
        if uid is not None:
            data["user"] = FakeDiscord.user(uid)
        if interaction:
            data["permissions"] = "2248473465835073"
        return data

    @staticmethod
    def dm_channel(uid: str) -> str:
        return str(DM_BASE + int(uid) % 1000)

    def _channel_object(self, cid: str) -> dict[str, Any]:
        if cid in self.threads:
            return {
                "id": cid,
                "type": 11,
                "guild_id": GUILD,
                "parent_id": self.threads[cid],
                "owner_id": ALICE,
                "name": f"thread {cid}",
                "last_message_id": None,
                "rate_limit_per_user": 0,
                "message_count": 0,
                "member_count": 1,
                "flags": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": TS,
                    "locked": False,
                },
            }
        if cid == GROUP:
            return {
                "id": GROUP,
                "type": 0,
                "guild_id": GUILD,
                "name": "general",
                "position": 0,
                "permission_overwrites": [],
                "parent_id": None,
                "topic": None,
                "nsfw": False,
                "rate_limit_per_user": 0,
                "last_message_id": None,
                "flags": 0,
            }
        return {"id": cid, "type": 1, "last_message_id": None, "flags": 0}

    def _guild(self) -> dict[str, Any]:
        channel = self._channel_object(GROUP)
        del channel["guild_id"]
        threads = [self._channel_object(t) for t in self.threads]
        return {
            "id": GUILD,
            "name": "Team",
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "owner_id": ALICE,
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "roles": [
                {
                    "id": GUILD,
                    "name": "@everyone",
                    "permissions": "2248473465835073",
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                    "flags": 0,
                },
                {
                    # The role Discord creates for a bot when it joins ("integration").
                    "id": BOT_ROLE,
                    "name": "Steward",
                    "permissions": "2048",
                    "position": 1,
                    "color": 0,
                    "hoist": False,
                    "managed": True,
                    "mentionable": True,
                    "flags": 0,
                    "tags": {"bot_id": BOT_ID},
                },
            ],
            "emojis": [],
            "stickers": [],
            "features": [],
            "mfa_level": 0,
            "application_id": None,
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "vanity_url_code": None,
            "description": None,
            "banner": None,
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "public_updates_channel_id": None,
            "nsfw_level": 0,
            "premium_progress_bar_enabled": False,
            "joined_at": TS,
            "large": False,
            "unavailable": False,
            "member_count": 3,
            "voice_states": [],
            "members": [self.member(BOT_ID)],
            "channels": [channel],
            "threads": threads,
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }

    def _message(
        self,
        cid: str,
        author: dict[str, Any],
        content: str,
        *,
        mid: str | None = None,
        mentions: list[dict[str, Any]] | None = None,
        components: list[dict[str, Any]] | None = None,
        flags: int = 0,
    ) -> dict[str, Any]:
        return {
            "id": mid or self.snowflake(),
            "channel_id": cid,
            "author": author,
            "content": content,
            "timestamp": _now(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": mentions or [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 0,
            "flags": flags,
            "components": components or [],
        }

    def snowflake(self) -> str:
        return str(next(self._ids))

    # ------------------------------------------------------------------ test controls

    def rate_limit_next(self, seconds: float) -> None:
        """The next message send (a channel message POST or an interaction followup)
        answers 429 with this ``retry_after`` (typing and callbacks are not affected)."""
        self._rate_limits.append(seconds)

    def fail_next(self, status: int) -> None:
        """The next REST call (other than login) answers ``status`` with a Discord error."""
        self._failures.append(status)

    async def wait_ready(self, within: float = 5.0) -> None:
        """Until a gateway session is identified or resumed on the current socket."""
        deadline = time.monotonic() + within
        while True:
            conn = self._conn
            if conn is not None and conn.ready.is_set() and not conn.ws.closed:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("no ready gateway session on the fake")
            await asyncio.sleep(0.01)

    async def wait_identifies(self, count: int, within: float = 10.0) -> None:
        """Until the client has sent ``count`` IDENTIFYs in all (i.e. opened a new session)."""
        async with asyncio.timeout(within):
            while len(self.identifies) < count:
                self._identified.clear()
                await self._identified.wait()

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send one DISPATCH (op 0) event with the next sequence number."""
        await self.wait_ready()
        conn = self._conn
        assert conn is not None and conn.session is not None
        await self._send_event(conn, event, data)

    async def dm_message(
        self, text: str, *, user: str = ALICE, bot: bool = False
    ) -> dict[str, Any]:
        """A person writes to the bot in a DM. No ``guild_id`` key at all (``null`` breaks
        discord.py's channel lookup with ``int(None)``)."""
        data = self._message(self.dm_channel(user), self.user(user, bot=bot), text)
        self.messages[data["id"]] = data
        await self.dispatch("MESSAGE_CREATE", data)
        return data

    async def guild_message(
        self,
        text: str,
        *,
        user: str = ALICE,
        mention: bool = True,
        thread: str | None = None,
        bot: bool = False,
        role_mention: bool = False,
    ) -> dict[str, Any]:
        """A person writes in the guild channel (or a thread of it), optionally @-mentioning
        the bot the way the Discord client does: ``<@id>`` in content plus ``mentions``
        (or, with ``role_mention``, the bot's managed role: ``<@&role>`` + ``mention_roles``)."""
        cid = GROUP
        if thread is not None:
            await self.ensure_thread(thread)
            cid = thread
        mentions: list[dict[str, Any]] = []
        content = text
        if role_mention:
            content = f"<@&{BOT_ROLE}> {text}"
        elif mention:
            content = f"<@{BOT_ID}> {text}"
            mentions = [{**self.user(BOT_ID), "member": self.member()}]
        data = self._message(cid, self.user(user, bot=bot), content, mentions=mentions)
        if role_mention:
            data["mention_roles"] = [BOT_ROLE]
        data["guild_id"] = GUILD
        data["member"] = self.member()
        self.messages[data["id"]] = data
        await self.dispatch("MESSAGE_CREATE", data)
        return data

    async def edit_message(self, mid: str, text: str) -> dict[str, Any]:
        """The author edits message ``mid``: MESSAGE_UPDATE with the full message (as the
        gateway sends since 2024, and discord.py 2.7 builds a Message from it) and a set
        ``edited_timestamp``."""
        message = self.messages[mid]
        message["content"] = text
        message["edited_timestamp"] = _now()
        await self.dispatch("MESSAGE_UPDATE", self._update_payload(message))
        return message

    async def embed_update(self, mid: str) -> dict[str, Any]:
        """A link preview resolves on message ``mid``: MESSAGE_UPDATE with ``embeds`` and the
        ``edited_timestamp`` untouched (the author did not edit anything)."""
        message = self.messages[mid]
        message["embeds"] = [{"type": "link", "url": "https://example.test", "title": "Example"}]
        await self.dispatch("MESSAGE_UPDATE", self._update_payload(message))
        return message

    async def delete_message(self, mid: str) -> None:
        """Message ``mid`` is deleted: MESSAGE_DELETE carries only ids, never the author."""
        message = self.messages.pop(mid)
        data = {"id": mid, "channel_id": message["channel_id"]}
        if "guild_id" in message:
            data["guild_id"] = message["guild_id"]
        await self.dispatch("MESSAGE_DELETE", data)

    def _update_payload(self, message: dict[str, Any]) -> dict[str, Any]:
        if "guild_id" in message:
            return {**message, "member": self.member()}
        return dict(message)

    async def ensure_thread(self, thread: str) -> None:
        """Create a thread under the group channel (THREAD_CREATE) if it does not exist."""
        if thread in self.threads:
            return
        self.threads[thread] = GROUP
        await self.dispatch(
            "THREAD_CREATE", {**self._channel_object(thread), "newly_created": True}
        )

    def _interaction_base(self, itype: int, cid: str, user: str) -> dict[str, Any]:
        iid = self.snowflake()
        data: dict[str, Any] = {
            "id": iid,
            "application_id": APP_ID,
            "type": itype,
            "token": f"itok-{iid}",
            "version": 1,
            "channel_id": cid,
            "channel": self._channel_object(cid),
            "locale": "en-US",
            "app_permissions": "2248473465835073",
            "entitlements": [],
            "authorizing_integration_owners": {"0": GUILD} if cid != self.dm_channel(user) else {},
            "attachment_size_limit": 8388608,
        }
        if cid == GROUP or cid in self.threads:
            data["guild_id"] = GUILD
            data["guild_locale"] = "en-US"
            data["member"] = self.member(user, interaction=True)
            data["context"] = 0
        else:
            data["user"] = self.user(user)
            data["context"] = 1
        return data

    async def press_button(self, message_id: str, custom_id: str, *, user: str = ALICE) -> str:
        """A person presses the button ``custom_id`` on message ``message_id`` (type 3);
        returns the interaction id."""
        message = self.messages[message_id]
        cid = message["channel_id"]
        data = self._interaction_base(3, cid, user)
        data["message"] = message
        data["data"] = {"custom_id": custom_id, "component_type": 2}
        await self.dispatch("INTERACTION_CREATE", data)
        return str(data["id"])

    async def slash_command(
        self,
        name: str,
        options: dict[str, str] | None = None,
        *,
        user: str = ALICE,
        channel: str | None = None,
    ) -> str:
        """A person runs ``/name`` (type 2, chat input) in ``channel`` (default: their DM)."""
        cid = channel or self.dm_channel(user)
        data = self._interaction_base(2, cid, user)
        command = next((c for c in self.commands if c["name"] == name), None)
        data["data"] = {
            "id": command["id"] if command else self.snowflake(),
            "name": name,
            "type": 1,
            "options": [{"name": k, "type": 3, "value": v} for k, v in (options or {}).items()],
        }
        await self.dispatch("INTERACTION_CREATE", data)
        return str(data["id"])

    async def drop(self, code: int = 4000) -> None:
        """Close the gateway socket the way a Discord edge node does; the client must resume."""
        conn = self._conn
        assert conn is not None, "no gateway connection to drop"
        conn.ready.clear()
        await conn.ws.close(code=code, message=b"fake drop")

    async def wait_for_request(
        self, method: str, path_contains: str, *, within: float = 5.0
    ) -> Recorded:
        """The first recorded (or next) REST request matching method and path fragment."""

        def match(r: Recorded) -> bool:
            return r.method == method and path_contains in r.path

        for r in self.requests:
            if match(r):
                return r
        fut: asyncio.Future[Recorded] = asyncio.get_running_loop().create_future()
        self._request_waiters.append((match, fut))
        return await asyncio.wait_for(fut, within)

    def requests_to(self, method: str, path_contains: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and path_contains in r.path]

    # ------------------------------------------------------------------ REST

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        body: Any = None
        files: list[SentFile] = []
        if request.content_type == "multipart/form-data":
            body, files = await self._multipart(request)
        elif request.can_read_body:
            raw = await request.read()
            body = json.loads(raw) if raw else None
        rec = Recorded(
            method=request.method,
            path=request.path.removeprefix("/api/v10"),
            query=dict(request.query),
            body=body,
            authorization=request.headers.get("Authorization"),
            at=time.monotonic(),
            files=files,
        )
        request[BODY] = body
        request[FILES] = files
        self.requests.append(rec)
        for match, fut in list(self._request_waiters):
            if not fut.done() and match(rec):
                fut.set_result(rec)
                self._request_waiters.remove((match, fut))
        login = rec.path in ("/users/@me", "/oauth2/applications/@me")
        # Interaction callbacks and webhook followups carry their token in the path
        # and no Authorization header, like on Discord.
        tokenless = rec.path.startswith(("/interactions/", "/webhooks/"))
        if not tokenless and rec.authorization != f"Bot {self.token}":
            return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        sends_message = rec.method == "POST" and (
            rec.path.endswith("/messages") or rec.path.startswith("/webhooks/")
        )
        if sends_message and self._rate_limits:
            seconds = self._rate_limits.pop(0)
            return _json(
                {"message": "You are being rate limited.", "retry_after": seconds, "global": False},
                status=429,
                headers={
                    "Via": "1.1 google",
                    "Retry-After": str(max(1, round(seconds))),
                    "X-RateLimit-Scope": "user",
                },
            )
        if not login and self._failures:
            status = self._failures.pop(0)
            return _json({"message": f"fake failure {status}", "code": 0}, status=status)
        if len(files) > MAX_FILES:
            return _json(
                {
                    "message": "Invalid Form Body",
                    "code": 50035,
                    "errors": {"files": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH"}]}},
                },
                status=400,
            )
        if sum(len(f.data) for f in files) > MAX_UPLOAD_BYTES:
            return _json({"message": "Request entity too large", "code": 40005}, status=413)
        return await handler(request)

    @staticmethod
    async def _multipart(request: web.Request) -> tuple[Any, list[SentFile]]:
        """``payload_json`` and the ``files[n]`` of a multipart message, each file's
        description taken from the ``attachments`` entry with its index."""
        form = await request.post()
        body = json.loads(str(form["payload_json"]))
        described = {str(a.get("id")): a.get("description") for a in body.get("attachments") or []}
        files = [
            SentFile(name, value.filename, value.file.read(), described.get(name[6:-1]))
            for name, value in form.items()
            if isinstance(value, web.FileField)
        ]
        return body, files

    async def _me(self, request: web.Request) -> web.Response:
        return _json({**self.user(BOT_ID), "verified": True, "flags": 0, "mfa_enabled": False})

    async def _app_info(self, request: web.Request) -> web.Response:
        return _json(
            {
                "id": APP_ID,
                "name": "Steward",
                "description": "",
                "icon": None,
                "bot_public": False,
                "bot_require_code_grant": False,
                "owner": self.user(ALICE),
                "verify_key": "00" * 32,
                "flags": 0,
                "bot": self.user(BOT_ID),
                "team": None,
                "interactions_endpoint_url": None,
            }
        )

    async def _open_dm(self, request: web.Request) -> web.Response:
        uid = str(request[BODY]["recipient_id"])
        return _json(
            {
                "id": self.dm_channel(uid),
                "type": 1,
                "last_message_id": None,
                "flags": 0,
                "recipients": [self.user(uid)],
            }
        )

    async def _put_commands(self, request: web.Request) -> web.Response:
        out = []
        for cmd in request[BODY]:
            out.append(
                {
                    "id": self.snowflake(),
                    "application_id": APP_ID,
                    "version": self.snowflake(),
                    "type": cmd.get("type", 1),
                    "name": cmd["name"],
                    "description": cmd.get("description", ""),
                    "options": cmd.get("options", []),
                    "default_member_permissions": cmd.get("default_member_permissions"),
                    "dm_permission": cmd.get("dm_permission", True),
                    "nsfw": cmd.get("nsfw", False),
                    "integration_types": cmd.get("integration_types", [0]),
                    "contexts": cmd.get("contexts"),
                }
            )
        self.commands = out
        return _json(out)

    def _attachment(self, cid: str, file: SentFile) -> dict[str, Any]:
        """The attachment object Discord returns for an uploaded file."""
        aid = self.snowflake()
        url = f"http://127.0.0.1:{self.port}/attachments/{cid}/{aid}/{file.filename}"
        data: dict[str, Any] = {
            "id": aid,
            "filename": file.filename,
            "size": len(file.data),
            "url": url,
            "proxy_url": url,
            "content_type": file.content_type,
        }
        if file.description is not None:
            data["description"] = file.description
        return data

    def _store_bot_message(
        self,
        cid: str,
        body: dict[str, Any],
        *,
        flags: int = 0,
        files: list[SentFile] | None = None,
    ) -> dict[str, Any]:
        data = self._message(
            cid,
            self.user(BOT_ID),
            body.get("content") or "",
            components=body.get("components") or [],
            flags=flags,
        )
        for file in sorted(files or [], key=lambda f: f.index):
            data["attachments"].append(self._attachment(cid, file))
            file.channel_id, file.message_id = cid, data["id"]
            self.uploads.append(file)
        if cid == GROUP or cid in self.threads:
            data["guild_id"] = GUILD
        self.messages[data["id"]] = data
        self.bot_messages.append(data["id"])
        conn = self._conn
        ready = conn is not None and conn.ready.is_set() and not conn.ws.closed
        if self.echo_own_messages and not flags & 64 and ready and conn is not None:
            echo = {**data, "member": self.member()} if "guild_id" in data else dict(data)
            task = asyncio.create_task(self._send_quietly(conn, "MESSAGE_CREATE", echo))
            self._echoes.add(task)
            task.add_done_callback(self._echoes.discard)
        return data

    async def _create_message(self, request: web.Request) -> web.Response:
        cid = request.match_info["cid"]
        return _json(self._store_bot_message(cid, request[BODY], files=request[FILES]))

    def _apply_edit(self, mid: str, body: dict[str, Any]) -> web.Response:
        message = self.messages.get(mid)
        if message is None:
            return _json({"message": "Unknown Message", "code": 10008}, status=404)
        if "content" in body:
            message["content"] = body["content"] or ""
        if "components" in body:
            message["components"] = body["components"] or []
        message["edited_timestamp"] = _now()
        self.edits.append((mid, body))
        if not message.get("flags", 0) & 64:  # Discord reports the bot's own edits too
            self._echo("MESSAGE_UPDATE", message)
        return _json(message)

    def _echo(self, event: str, data: dict[str, Any]) -> None:
        conn = self._conn
        ready = conn is not None and conn.ready.is_set() and not conn.ws.closed
        if not (self.echo_own_messages and ready and conn is not None):
            return
        echo = {**data, "member": self.member()} if "guild_id" in data else dict(data)
        task = asyncio.create_task(self._send_quietly(conn, event, echo))
        self._echoes.add(task)
        task.add_done_callback(self._echoes.discard)

    async def _edit_message(self, request: web.Request) -> web.Response:
        return self._apply_edit(request.match_info["mid"], request[BODY])

    async def _typing(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def _callback(self, request: web.Request) -> web.Response:
        iid = request.match_info["iid"]
        sent_at, token = self._interaction_sent.get(iid, (time.monotonic(), ""))
        if request.match_info["itoken"] != token:
            return _json({"message": "Invalid interaction token", "code": 10062}, status=404)
        body = request[BODY]
        self.callbacks.append(Callback(iid, body["type"], body, time.monotonic() - sent_at))
        return _json(
            {
                "interaction": {
                    "id": iid,
                    "type": self._interactions[token]["type"],
                    "activity_instance_id": None,
                    "response_message_id": None,
                    "response_message_loading": body["type"] == 5,
                    "response_message_ephemeral": bool(
                        (body.get("data") or {}).get("flags", 0) & 64
                    ),
                },
                "resource": {"type": body["type"]},
            }
        )

    async def _followup(self, request: web.Request) -> web.Response:
        token = request.match_info["itoken"]
        interaction = self._interactions.get(token)
        if interaction is None:
            return _json({"message": "Unknown Webhook", "code": 10015}, status=404)
        body = request[BODY]
        self.followups.append((token, body))
        flags = int(body.get("flags") or 0)
        data = self._store_bot_message(
            str(interaction["channel_id"]), body, flags=flags, files=request[FILES]
        )
        data["webhook_id"] = APP_ID
        user = interaction.get("user") or interaction["member"]["user"]
        data["interaction_metadata"] = {
            "id": interaction["id"],
            "type": interaction["type"],
            "user": user,
            "authorizing_integration_owners": interaction["authorizing_integration_owners"],
        }
        return _json(data)

    async def _followup_edit(self, request: web.Request) -> web.Response:
        return self._apply_edit(request.match_info["mid"], request[BODY])

    # ------------------------------------------------------------------ gateway

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.gateway_paths.append(request.path)
        conn = _Conn(ws=ws, path=request.path)
        self._conn = conn
        self._conns.add(ws)
        try:
            await ws.send_str(
                json.dumps({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval * 1000}})
            )
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                op, d = frame.get("op"), frame.get("d")
                if op == 1:
                    await ws.send_str(json.dumps({"op": 11}))
                elif op == 2:
                    await self._identify(conn, d)
                elif op == 6:
                    await self._resume(conn, d)
        finally:
            self._conns.discard(ws)
            conn.ready.clear()
        return ws

    async def _identify(self, conn: _Conn, d: dict[str, Any]) -> None:
        self.identifies.append(d)
        self._identified.set()
        code = self.close_on_identify
        self.close_on_identify = None
        if code is None and d.get("token") != self.token:
            code = 4004
        if (
            code is None
            and d.get("intents", 0) & MESSAGE_CONTENT
            and not self.message_content_enabled
        ):
            code = 4014
        if code is not None:
            reasons = {4004: b"Authentication failed.", 4014: b"Disallowed intent(s)."}
            await conn.ws.close(code=code, message=reasons.get(code, b"closed"))
            return
        session = _Session(id=f"sess-{next(self._sessions)}")
        conn.session = session
        self._last_session = session
        ready = {
            "v": 10,
            "user": {**self.user(BOT_ID), "verified": True, "flags": 0, "mfa_enabled": False},
            "guilds": [{"id": GUILD, "unavailable": True}],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": f"ws://127.0.0.1:{self.port}/gw-resume",
            "application": {"id": APP_ID, "flags": 0},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "geo_ordered_rtc_regions": [],
            "guild_join_requests": [],
            "shard": [0, 1],
        }
        await self._send_event(conn, "READY", ready)
        await self._send_event(conn, "GUILD_CREATE", self._guild())
        conn.ready.set()

    async def _resume(self, conn: _Conn, d: dict[str, Any]) -> None:
        self.resumes.append(d)
        last = self._last_session
        if d.get("token") != self.token or last is None or d.get("session_id") != last.id:
            await conn.ws.send_str(json.dumps({"op": 9, "d": False}))
            return
        conn.session = last
        await self._send_event(conn, "RESUMED", {})
        conn.ready.set()

    async def _send_quietly(self, conn: _Conn, event: str, data: dict[str, Any]) -> None:
        # An echo racing a drop is lost, as it would be on Discord before a RESUME replay.
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._send_event(conn, event, data)

    async def _send_event(self, conn: _Conn, event: str, data: dict[str, Any]) -> None:
        assert conn.session is not None
        conn.session.seq += 1
        if event == "INTERACTION_CREATE":
            self._interactions[str(data["token"])] = data
            # The 3-second clock starts when the event leaves, not when it was built.
            self._interaction_sent[str(data["id"])] = (time.monotonic(), str(data["token"]))
        frame = {"op": 0, "s": conn.session.seq, "t": event, "d": data}
        await conn.ws.send_str(json.dumps(frame))
