"""A fake Mattermost server on 127.0.0.1 speaking the REST API v4 and the websocket.

Why: the Mattermost adapter must be tested over real HTTP and a real websocket,
exactly as it talks to a Mattermost server (Bearer token, Mattermost's error JSON,
``text/plain`` 429s with ``X-RateLimit-Reset``, the websocket's authentication
challenge / ``hello`` / events whose ``post`` is a JSON string, button presses POSTed
by the *server* to the integration URL), with no network and no patched Steward code.
Facts it follows (checked against the Mattermost server's source): integrations are
stripped from posts in every answer and event; action ids must be alphanumeric (any
other id's press route 404s and never reaches the bot); a press request is unsigned;
its answer's ``update`` replaces the post's message (and its props when given); a bad
websocket token is answered by closing the socket; an upload is multipart (a
``channel_id`` field, ``files`` parts with their file names), answered 201 with
``file_infos``, 413 over ``MaxFileSize`` (its type comes from the name's extension); a
post's ``file_ids`` that are not the poster's unattached files of that channel are
dropped, and more ids than 300 characters of JSON hold are refused.

What it serves::

    GET  /api/v4/users/me                 the bot
    POST /api/v4/posts                    201, broadcast as ``posted`` (the bot's own too);
                                          ``file_ids`` attach uploaded files
    POST /api/v4/files                    multipart upload: 201 ``file_infos``, 413 too large
    GET  /api/v4/config/client            ``?format=old``: ``MaxFileSize``
    PUT  /api/v4/posts/{id}/patch         broadcast as ``post_edited``
    POST /api/v4/posts/ephemeral          only the named user sees it (not broadcast)
    POST /api/v4/users/{id}/typing
    GET  /api/v4/users/me/teams           the bot's team
    GET  /api/v4/teams/{id}/members/{id}  404 for a non-member
    GET  /api/v4/channels/{id}/posts      ?since=<ms> (catching up after a reconnect)
    GET  /api/v4/websocket                authentication_challenge → OK → hello → events

What a test drives: :meth:`user_post`, :meth:`user_edit`, :meth:`user_delete`,
:meth:`press`, :meth:`post_to_integration` (a raw press), :meth:`drop`,
:meth:`freeze` (a connection that stops answering), :meth:`rate_limit_next`,
:meth:`fail_next`, :meth:`revoke_token`, :attr:`max_file_size`; what it reads:
:attr:`posts`, :attr:`bot_posts`, :attr:`edits`, :attr:`presses`, :attr:`requests`,
:attr:`typing`, :attr:`files` (every upload, bytes and names) and :meth:`attached`.
For sync tests (``steward run`` in a subprocess) it runs on its own thread:
:meth:`start_in_thread` and :meth:`call`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import mimetypes
import re
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from aiohttp import WSMsgType, web

T = TypeVar("T")

TOKEN = "mmbottoken0000000000000000"
#: ``FileSettings.MaxFileSize``'s default.
MAX_FILE_SIZE = 100 * 1024 * 1024
#: ``model.PostFileidsMaxRunes``: the JSON array of a post's file ids, at most.
FILE_IDS_MAX_RUNES = 300
TEAM = "team0000000000000000000acme"[:26]
_ALNUM = re.compile(r"^[A-Za-z0-9]+$")


def _user(uid: str, username: str, *, bot: bool = False) -> dict[str, Any]:
    return {"id": uid, "username": username, "is_bot": bot, "roles": "system_user"}


BOT = _user("bot00000000000000000000000", "steward", bot=True)
ALICE = _user("alice000000000000000000000", "alice")
MALLORY = _user("mallory0000000000000000000"[:26], "mallory")


def _dm_name(a: str, b: str) -> str:
    """A DM channel's name: both user ids, sorted, joined by ``__``."""
    return "__".join(sorted((a, b)))


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(data).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def _error(status: int, error_id: str, message: str) -> web.Response:
    """Mattermost's AppError shape."""
    return _json(
        {
            "id": error_id,
            "message": message,
            "detailed_error": "",
            "request_id": "req" + str(int(time.time() * 1000)),
            "status_code": status,
        },
        status,
    )


def public_view(post: dict[str, Any]) -> dict[str, Any]:
    """A post as the server shows it: every action's ``integration`` removed."""
    view = json.loads(json.dumps(post))
    for attachment in (view.get("props") or {}).get("attachments") or []:
        for action in attachment.get("actions") or []:
            action.pop("integration", None)
    return view


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    status: int


@dataclass
class Press:
    """One press the server POSTed to an integration URL, and what it got back."""

    post_id: str
    user_id: str
    body: dict[str, Any]
    status: int
    answer: Any
    #: Seconds from sending the request to the answer.
    latency: float


@dataclass
class StoredFile:
    """One uploaded file, as the server keeps it."""

    id: str
    channel_id: str
    creator: str
    name: str
    data: bytes
    #: From the name's extension, as the server decides it (not the part's header).
    mime: str
    #: The ``Content-Type`` of the multipart part, as sent.
    content_type: str
    #: The post it is attached to ("" until a post names it in ``file_ids``).
    post_id: str = ""

    def info(self) -> dict[str, Any]:
        """The ``FileInfo`` the server answers with."""
        extension = self.name.rpartition(".")[2].lower() if "." in self.name else ""
        return {
            "id": self.id,
            "user_id": self.creator,
            "channel_id": self.channel_id,
            "post_id": self.post_id,
            "create_at": int(time.time() * 1000),
            "update_at": 0,
            "delete_at": 0,
            "name": self.name,
            "extension": extension,
            "size": len(self.data),
            "mime_type": self.mime,
            "has_preview_image": self.mime.startswith("image/"),
        }


@dataclass
class _Failure:
    status: int
    seconds: float = 0.0


@dataclass
class _Conn:
    ws: web.WebSocketResponse
    seq: itertools.count = field(default_factory=lambda: itertools.count(1))
    frozen: bool = False


class FakeMattermost:
    """An aiohttp server playing a Mattermost server with one team, a bot and two people."""

    def __init__(self, *, token: str = TOKEN) -> None:
        self.token = token
        self.revoked = False
        #: While True, websocket upgrades answer 503 (REST still works).
        self.refuse_websocket = False
        self.url = ""
        self.bot = BOT
        self.users = {u["id"]: u for u in (BOT, ALICE, MALLORY)}
        self.channels: dict[str, dict[str, Any]] = {}
        self.members: dict[str, set[str]] = {}
        self.dm_alice = self._channel("dmalice0000000000000000000"[:26], "D", (BOT, ALICE))
        self.dm_mallory = self._channel("dmmallory00000000000000000"[:26], "D", (BOT, MALLORY))
        self.town = self._channel(
            "town00000000000000000000000"[:26],
            "O",
            (BOT, ALICE, MALLORY),
            name="town-square",
            display="Town Square",
        )
        #: Who is in the one team (GET /teams/{team}/members/{user} answers 404 for others).
        self.team_members = {BOT["id"], ALICE["id"], MALLORY["id"]}
        #: Every post by id (people's and the bot's, ephemeral ones too), full: integrations
        #: kept, updates applied.
        self.posts: dict[str, dict[str, Any]] = {}
        #: Ids of what the bot posted (ephemeral included), in order.
        self.bot_posts: list[str] = []
        #: post id -> the user an ephemeral post was shown to.
        self.ephemeral_to: dict[str, str] = {}
        #: Every patch body the bot sent, as (post id, body).
        self.edits: list[tuple[str, dict[str, Any]]] = []
        self.presses: list[Press] = []
        self.typing: list[dict[str, Any]] = []
        self.requests: list[Recorded] = []
        #: Every uploaded file by id, in upload order (attached to a post or not).
        self.files: dict[str, StoredFile] = {}
        #: ``FileSettings.MaxFileSize``: a larger file part is answered 413.
        self.max_file_size = MAX_FILE_SIZE
        #: What ``GET /config/client`` says ``MaxFileSize`` is (None: the real one).
        self.reported_max_file_size: int | None = None
        #: ``FileSettings.EnableFileAttachments``: False answers every upload 403.
        self.file_attachments = True
        #: Websocket connections that completed the authentication challenge.
        self.connections = 0
        self._conns: list[_Conn] = []
        self._failures: dict[str, list[_Failure]] = {}
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _channel(
        self,
        cid: str,
        kind: str,
        members: tuple[dict[str, Any], ...],
        *,
        name: str = "",
        display: str = "",
    ) -> str:
        ids = [m["id"] for m in members]
        self.channels[cid] = {
            "id": cid,
            "type": kind,
            "name": name or _dm_name(ids[0], ids[1]),
            "display_name": display or "",
            "team_id": "" if kind in ("D", "G") else TEAM,
        }
        self.members[cid] = set(ids)
        return cid

    def new_id(self, prefix: str = "p") -> str:
        """A 26-character id like Mattermost's."""
        n = str(next(self._ids))
        return (prefix + "0" * 26)[: 26 - len(n)] + n

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FakeMattermost:
        app = web.Application()
        app.router.add_get("/api/v4/users/me", self._me)
        app.router.add_post("/api/v4/posts", self._create_post)
        app.router.add_post("/api/v4/posts/ephemeral", self._ephemeral)
        app.router.add_post("/api/v4/files", self._upload)
        app.router.add_get("/api/v4/config/client", self._client_config)
        app.router.add_put("/api/v4/posts/{post_id}/patch", self._patch)
        app.router.add_post("/api/v4/users/{user_id}/typing", self._typing)
        app.router.add_get("/api/v4/users/me/teams", self._my_teams)
        app.router.add_get("/api/v4/teams/{team_id}/members/{user_id}", self._team_member)
        app.router.add_get("/api/v4/channels/{channel_id}/posts", self._channel_posts)
        app.router.add_get("/api/v4/websocket", self._websocket)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        await self.drop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeMattermost:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> None:
        """Serve from a daemon thread with its own loop (for tests that block on a process)."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="fake-mattermost", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake Mattermost did not start")

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the fake's thread (see start_in_thread) and wait for it."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop_thread(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    # ------------------------------------------------------------------ scripting

    def rate_limit_next(self, seconds: float, route: str = "posts") -> None:
        """The next call of ``route`` (posts, patch, ephemeral, typing, me) answers 429."""
        self._failures.setdefault(route, []).append(_Failure(429, seconds))

    def fail_next(self, status: int = 500, route: str = "posts") -> None:
        self._failures.setdefault(route, []).append(_Failure(status))

    def revoke_token(self) -> None:
        """Every later request with the bot token gets 401; the websocket refuses it."""
        self.revoked = True

    async def drop(self) -> None:
        """Close every websocket (a server restart, a proxy timing out)."""
        conns, self._conns = self._conns, []
        for conn in conns:
            await conn.ws.close(code=1001, message=b"going away")

    def freeze(self) -> None:
        """Every open websocket goes silent: no events, no pongs (a dead NAT entry)."""
        for conn in self._conns:
            conn.frozen = True

    # ------------------------------------------------------------------ people

    def _mentions(self, channel_id: str, author: str, message: str) -> list[str]:
        kind = self.channels[channel_id]["type"]
        out = []
        for uid in self.members[channel_id]:
            if uid == author:
                continue
            name = self.users[uid]["username"]
            if kind == "D" or re.search(rf"@{re.escape(name)}\b", message, re.I):
                out.append(uid)
        return sorted(out)

    async def user_post(
        self, user: str, channel_id: str, message: str, *, root_id: str = ""
    ) -> dict[str, Any]:
        """A person posts; the bot's websocket gets ``posted``. Returns the post."""
        now = int(time.time() * 1000)
        post: dict[str, Any] = {
            "id": self.new_id("p"),
            "create_at": now,
            "update_at": now,
            "edit_at": 0,
            "delete_at": 0,
            "user_id": user,
            "channel_id": channel_id,
            "root_id": root_id,
            "original_id": "",
            "message": message,
            "type": "",
            "props": {},
            "hashtags": "",
            "pending_post_id": "",
            "metadata": {},
        }
        self.posts[post["id"]] = post
        await self._posted(post, self._mentions(channel_id, user, message))
        return post

    async def user_edit(self, post_id: str, message: str) -> None:
        post = self.posts[post_id]
        now = int(time.time() * 1000)
        post.update(message=message, edit_at=now, update_at=now)
        await self._broadcast(
            post["channel_id"], "post_edited", {"post": json.dumps(public_view(post))}
        )

    async def user_delete(self, post_id: str) -> None:
        post = self.posts[post_id]
        post["delete_at"] = int(time.time() * 1000)
        await self._broadcast(
            post["channel_id"],
            "post_deleted",
            {"post": json.dumps(public_view(post)), "delete_by": post["user_id"]},
        )

    def action(self, post_id: str, value: str) -> dict[str, Any]:
        """The stored action (integration included) whose context value is ``value``."""
        for attachment in (self.posts[post_id].get("props") or {}).get("attachments") or []:
            for action in attachment.get("actions") or []:
                context = (action.get("integration") or {}).get("context") or {}
                if context.get("value") == value or action.get("id") == value:
                    return action
        raise KeyError(f"no button {value!r} on post {post_id}")

    async def press(
        self, post_id: str, value: str, user: str, *, context: dict[str, Any] | None = None
    ) -> Press:
        """A person presses a button: the server POSTs the press to the action's
        integration URL, as Mattermost does, and applies an ``update`` answer.

        ``context``: replace the stored context (a tampered press). Channel membership is
        not enforced (the contract suite's stranger presses in another person's DM, which
        a real server would stop before Steward; the adapter must refuse either way)."""
        action = self.action(post_id, value)
        if not _ALNUM.match(str(action.get("id", ""))):
            raise LookupError("a real server 404s presses of a non-alphanumeric action id")
        integration = action["integration"]
        post = self.posts[post_id]
        channel = self.channels[post["channel_id"]]
        body = {
            "user_id": user,
            "user_name": self.users[user]["username"],
            "channel_id": post["channel_id"],
            "channel_name": channel["name"],
            "team_id": channel["team_id"],
            "team_domain": "acme" if channel["team_id"] else "",
            "post_id": post_id,
            "trigger_id": "trigger" + self.new_id("t"),
            "type": "",
            "data_source": "",
            "context": integration.get("context") if context is None else context,
        }
        return await self.post_to_integration(integration["url"], body, post_id=post_id)

    async def post_to_integration(
        self, url: str, body: dict[str, Any] | bytes, *, post_id: str = ""
    ) -> Press:
        """POST one press request to ``url`` exactly as the server does (no signature).
        ``body`` as bytes: sent as they are (a replayed capture, a malformed request)."""
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "Mattermost-Bot/1.1",
        }
        t0 = time.monotonic()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.post(
                url,
                data=body if isinstance(body, bytes) else json.dumps(body).encode(),
                headers=headers,
            ) as resp,
        ):
            raw = await resp.read()
            status = resp.status
        latency = time.monotonic() - t0
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = None
        sent = body if isinstance(body, dict) else {}
        press = Press(post_id, str(sent.get("user_id")), sent, status, answer, latency)
        self.presses.append(press)
        if status == 200 and isinstance(answer, dict) and post_id in self.posts:
            update = answer.get("update")
            if isinstance(update, dict):
                post = self.posts[post_id]
                post["message"] = str(update.get("message") or "")
                if "props" in update:
                    post["props"] = update["props"]
                await self._broadcast(
                    post["channel_id"], "post_edited", {"post": json.dumps(public_view(post))}
                )
        return press

    # ------------------------------------------------------------------ reading

    def bot_messages(self) -> list[dict[str, Any]]:
        return [self.posts[i] for i in self.bot_posts]

    def attached(self) -> list[StoredFile]:
        """The files the bot's posts carry, in the order of the posts and their ids."""
        return [
            self.files[file_id]
            for post in self.bot_messages()
            for file_id in post.get("file_ids") or []
        ]

    # ------------------------------------------------------------------ REST

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}" and not self.revoked

    def _refusal(self, request: web.Request, route: str) -> web.Response | None:
        if not self._authorized(request):
            return _error(
                401,
                "api.context.session_expired.app_error",
                "Invalid or expired session, please login again.",
            )
        failures = self._failures.get(route)
        if failures:
            failure = failures.pop(0)
            if failure.status == 429:
                wait = str(max(1, math.ceil(failure.seconds)))
                return web.Response(
                    status=429,
                    text="limit exceeded\n",
                    headers={
                        "X-RateLimit-Limit": "10",
                        "X-RateLimit-Remaining": "0",
                        "X-RateLimit-Reset": wait,
                        "Retry-After": wait,
                    },
                )
            return _error(failure.status, "app.internal.app_error", "We encountered an error.")
        return None

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except ValueError:
            return None

    def _record(self, request: web.Request, body: Any, response: web.Response) -> web.Response:
        self.requests.append(Recorded(request.method, request.path, body, response.status))
        return response

    async def _me(self, request: web.Request) -> web.Response:
        return self._record(request, None, self._refusal(request, "me") or _json(self.bot))

    async def _create_post(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        refused = self._refusal(request, "posts")
        if refused:
            return self._record(request, body, refused)
        if not isinstance(body, dict):
            return self._record(
                request,
                body,
                _error(
                    400,
                    "api.context.invalid_body_param.app_error",
                    "Invalid or missing post in request body.",
                ),
            )
        response = await self._new_bot_post(body)
        return self._record(request, body, response)

    async def _new_bot_post(self, body: dict[str, Any]) -> web.Response:
        channel_id = str(body.get("channel_id") or "")
        if channel_id not in self.channels:
            return _error(
                404, "app.channel.get.existing.app_error", "Unable to find the existing channel."
            )
        if BOT["id"] not in self.members[channel_id]:
            return _error(
                403,
                "api.context.permissions.app_error",
                "You do not have the appropriate permissions.",
            )
        message = str(body.get("message") or "")
        if len(message) > 16383:
            return _error(
                400,
                "model.post.is_valid.message_length.app_error",
                "Invalid Message property length.",
            )
        root = str(body.get("root_id") or "")
        if root and root not in self.posts:
            return _error(
                400, "api.post.create_post.root_id.app_error", "Invalid RootId parameter."
            )
        file_ids = body.get("file_ids") or []
        if not isinstance(file_ids, list) or len(json.dumps(file_ids)) > FILE_IDS_MAX_RUNES:
            return _error(400, "model.post.is_valid.file_ids.app_error", "Invalid file ids.")
        now = int(time.time() * 1000)
        props = dict(body.get("props") or {})
        props["from_bot"] = "true"
        post_id = self.new_id("b")
        # The server attaches only the poster's own unattached files of this channel, and
        # drops the other ids without failing the post.
        files = [
            self.files[str(fid)]
            for fid in file_ids
            if str(fid) in self.files
            and self.files[str(fid)].creator == BOT["id"]
            and self.files[str(fid)].channel_id == channel_id
            and not self.files[str(fid)].post_id
        ]
        for stored in files:
            stored.post_id = post_id
        post = {
            "id": post_id,
            "create_at": now,
            "update_at": now,
            "edit_at": 0,
            "delete_at": 0,
            "user_id": BOT["id"],
            "channel_id": channel_id,
            "root_id": root,
            "message": message,
            "type": "",
            "props": props,
            "file_ids": [f.id for f in files],
            "metadata": {"files": [f.info() for f in files]} if files else {},
        }
        self.posts[post["id"]] = post
        self.bot_posts.append(post["id"])
        await self._posted(post, self._mentions(channel_id, BOT["id"], message))
        return _json(public_view(post), 201)

    async def _patch(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        refused = self._refusal(request, "patch")
        if refused:
            return self._record(request, body, refused)
        post = self.posts.get(request.match_info["post_id"])
        if post is None or post.get("delete_at"):
            return self._record(
                request, body, _error(404, "app.post.get.app_error", "Unable to get the post.")
            )
        if post["user_id"] != BOT["id"] or not isinstance(body, dict):
            return self._record(
                request,
                body,
                _error(
                    403,
                    "api.context.permissions.app_error",
                    "You do not have the appropriate permissions.",
                ),
            )
        if "message" in body:
            if len(str(body["message"])) > 16383:
                return self._record(
                    request,
                    body,
                    _error(
                        400,
                        "model.post.is_valid.message_length.app_error",
                        "Invalid Message property length.",
                    ),
                )
            post["message"] = str(body["message"])
        if isinstance(body.get("props"), dict):
            post["props"] = body["props"]
        now = int(time.time() * 1000)
        post.update(edit_at=now, update_at=now)
        self.edits.append((post["id"], body))
        await self._broadcast(
            post["channel_id"], "post_edited", {"post": json.dumps(public_view(post))}
        )
        return self._record(request, body, _json(public_view(post)))

    async def _ephemeral(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        refused = self._refusal(request, "ephemeral")
        if refused:
            return self._record(request, body, refused)
        post = (body or {}).get("post") if isinstance(body, dict) else None
        user = (body or {}).get("user_id") if isinstance(body, dict) else None
        if (
            not isinstance(post, dict)
            or not isinstance(user, str)
            or post.get("channel_id") not in self.channels
        ):
            return self._record(
                request,
                body,
                _error(400, "api.context.invalid_body_param.app_error", "Invalid post."),
            )
        now = int(time.time() * 1000)
        stored = {
            "id": self.new_id("e"),
            "create_at": now,
            "user_id": BOT["id"],
            "channel_id": post["channel_id"],
            "root_id": "",
            "message": str(post.get("message") or ""),
            "type": "system_ephemeral",
            "props": {},
        }
        self.posts[stored["id"]] = stored
        self.bot_posts.append(stored["id"])
        self.ephemeral_to[stored["id"]] = user
        return self._record(request, body, _json(stored, 201))

    async def _upload(self, request: web.Request) -> web.Response:
        """``POST /files``, multipart: ``channel_id``, then one ``files`` part per file."""
        refused = self._refusal(request, "files")
        if refused:
            return self._record(request, None, refused)
        if not self.file_attachments:
            return self._record(
                request,
                None,
                _error(
                    403,
                    "api.file.attachments.disabled.app_error",
                    "File attachments have been disabled on this server.",
                ),
            )
        if not request.content_type.startswith("multipart/"):
            return self._record(
                request,
                None,
                _error(400, "api.file.upload_file.read_request.app_error", "Not multipart."),
            )
        channel_id = ""
        parts: list[tuple[str, str, bytes]] = []
        order: list[str] = []  # the parts' names as they came (channel_id should lead)
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, aiohttp.BodyPartReader) or not part.name:
                continue
            order.append(part.name)
            if part.filename is None:  # a form field
                value = (await part.read()).decode()
                if part.name != "channel_id":
                    return self._record(
                        request,
                        None,
                        _error(
                            400,
                            "api.context.invalid_body_param.app_error",
                            f"Invalid or missing {part.name} in request body.",
                        ),
                    )
                channel_id = value
                continue
            data = await part.read()
            if len(data) > self.max_file_size:
                return self._record(
                    request,
                    {"parts": order, "channel_id": channel_id, "files": [part.filename]},
                    _error(
                        413,
                        "api.file.upload_file.too_large_detailed.app_error",
                        f"Unable to upload file {part.filename}. {len(data)} bytes exceeds "
                        f"the maximum allowed {self.max_file_size} bytes.",
                    ),
                )
            content_type = part.headers.get("Content-Type", "")
            parts.append((part.filename, content_type, data))
        record = {
            "parts": order,
            "channel_id": channel_id,
            "files": [name for name, _, _ in parts],
            "types": [content_type for _, content_type, _ in parts],
        }
        if channel_id not in self.channels or BOT["id"] not in self.members[channel_id]:
            return self._record(
                request,
                record,
                _error(
                    403,
                    "api.context.permissions.app_error",
                    "You do not have the appropriate permissions.",
                ),
            )
        infos = []
        for name, content_type, data in parts:
            stored = StoredFile(
                id=self.new_id("f"),
                channel_id=channel_id,
                creator=BOT["id"],
                name=name,
                data=data,
                mime=mimetypes.guess_type(name)[0] or "application/octet-stream",
                content_type=content_type,
            )
            self.files[stored.id] = stored
            infos.append(stored.info())
        return self._record(request, record, _json({"file_infos": infos, "client_ids": []}, 201))

    async def _client_config(self, request: web.Request) -> web.Response:
        """``GET /config/client?format=old``: what clients may know of the config."""
        refused = self._refusal(request, "config")
        if refused:
            return self._record(request, None, refused)
        size = self.reported_max_file_size or self.max_file_size
        config = {
            "Version": "10.5.0",
            "EnableFileAttachments": str(self.file_attachments).lower(),
            "MaxFileSize": str(size),
            "MaxPostSize": "16383",
        }
        return self._record(request, None, _json(config))

    async def _my_teams(self, request: web.Request) -> web.Response:
        refused = self._refusal(request, "teams")
        team = {"id": TEAM, "name": "acme", "display_name": "Acme", "type": "I"}
        return self._record(request, None, refused or _json([team]))

    async def _team_member(self, request: web.Request) -> web.Response:
        refused = self._refusal(request, "teams")
        if refused:
            return self._record(request, None, refused)
        team, user = request.match_info["team_id"], request.match_info["user_id"]
        if team != TEAM or user not in self.team_members:
            return self._record(
                request,
                None,
                _error(404, "app.team.get_member.missing.app_error", "No team member found."),
            )
        member = {"team_id": team, "user_id": user, "roles": "team_user", "delete_at": 0}
        return self._record(request, None, _json(member))

    async def _channel_posts(self, request: web.Request) -> web.Response:
        """``?since=<ms>``: every post of the channel created or changed since then."""
        refused = self._refusal(request, "channel_posts")
        if refused:
            return self._record(request, None, refused)
        cid = request.match_info["channel_id"]
        if cid not in self.channels or BOT["id"] not in self.members[cid]:
            return self._record(
                request,
                None,
                _error(403, "api.context.permissions.app_error", "You do not have permission."),
            )
        since = int(request.query.get("since", "0") or 0)
        posts = [
            p
            for p in self.posts.values()
            if p["channel_id"] == cid
            and p["id"] not in self.ephemeral_to
            and max(p.get("update_at", 0), p.get("create_at", 0), p.get("delete_at", 0)) >= since
        ]
        posts.sort(key=lambda p: p["create_at"], reverse=True)
        answer = {
            "order": [p["id"] for p in posts],
            "posts": {p["id"]: public_view(p) for p in posts},
            "next_post_id": "",
            "prev_post_id": "",
        }
        return self._record(request, None, _json(answer))

    async def _typing(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        refused = self._refusal(request, "typing")
        if refused:
            return self._record(request, body, refused)
        self.typing.append({"user_id": request.match_info["user_id"], **(body or {})})
        return self._record(request, body, _json({"status": "OK"}))

    # ------------------------------------------------------------------ websocket

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if self.refuse_websocket:  # the server is down for the websocket (a proxy restart)
            return _error(503, "api.websocket.unavailable", "Service unavailable.")
        ws = web.WebSocketResponse(autoping=False)  # pongs by hand: freeze() stops them
        await ws.prepare(request)
        conn = _Conn(ws)
        try:
            async with asyncio.timeout(5):  # the server's wait for the challenge
                first = await ws.receive()
            frame = json.loads(first.data) if first.type == WSMsgType.TEXT else None
        except (TimeoutError, ValueError):
            frame = None
        data = frame.get("data") if isinstance(frame, dict) else None
        if (
            not isinstance(frame, dict)
            or frame.get("action") != "authentication_challenge"
            or not isinstance(data, dict)
            or data.get("token") != self.token
            or self.revoked
        ):
            await ws.close()  # a refused token: closed without a word
            return ws
        await ws.send_json({"status": "OK", "seq_reply": frame.get("seq", 1)})
        self.connections += 1
        await ws.send_json(
            {
                "event": "hello",
                "data": {"server_version": "10.5.0.fake", "connection_id": self.new_id("c")},
                "broadcast": {
                    "omit_users": None,
                    "user_id": BOT["id"],
                    "channel_id": "",
                    "team_id": "",
                },
                "seq": 0,
            }
        )
        self._conns.append(conn)
        try:
            async for msg in ws:
                if conn.frozen:
                    continue
                if msg.type == WSMsgType.PING:
                    await ws.pong(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    try:
                        action = json.loads(msg.data)
                    except ValueError:
                        break  # a non-JSON frame closes the connection
                    await ws.send_json({"status": "OK", "seq_reply": action.get("seq", 0)})
        finally:
            if conn in self._conns:
                self._conns.remove(conn)
        return ws

    async def send_frame(self, frame: dict[str, Any]) -> None:
        """Push a recorded event frame (its ``seq`` renumbered) to every open websocket."""
        for conn in list(self._conns):
            if not conn.frozen and not conn.ws.closed:
                await conn.ws.send_json({**frame, "seq": next(conn.seq)})

    async def repost(self, post_id: str) -> None:
        """Deliver a post's ``posted`` event again (a server replaying after a resume)."""
        post = self.posts[post_id]
        await self._posted(
            post, self._mentions(post["channel_id"], post["user_id"], post["message"])
        )

    async def _posted(self, post: dict[str, Any], mentions: list[str]) -> None:
        channel = self.channels[post["channel_id"]]
        data: dict[str, Any] = {
            "channel_display_name": channel["display_name"]
            or f"@{self.users[post['user_id']]['username']}",
            "channel_name": channel["name"],
            "channel_type": channel["type"],
            "post": json.dumps(public_view(post)),
            "sender_name": f"@{self.users[post['user_id']]['username']}",
            "set_online": True,
            "team_id": channel["team_id"],
        }
        if mentions:
            data["mentions"] = json.dumps(mentions)
        await self._broadcast(post["channel_id"], "posted", data)

    async def _broadcast(self, channel_id: str, event: str, data: dict[str, Any]) -> None:
        if BOT["id"] not in self.members.get(channel_id, set()):
            return
        for conn in list(self._conns):
            if conn.frozen or conn.ws.closed:
                continue
            frame = {
                "event": event,
                "data": data,
                "broadcast": {
                    "omit_users": None,
                    "user_id": "",
                    "channel_id": channel_id,
                    "team_id": "",
                },
                "seq": next(conn.seq),
            }
            try:
                await conn.ws.send_json(frame)
            except (ConnectionError, RuntimeError):
                continue
