"""`MattermostChannel`: the bot account's lifecycle, its websocket session loop, delivery
over REST and the button-press route.

Inbound: one websocket (``<url>/api/v4/websocket``): ``authentication_challenge`` with
the bot token, then the server's ``hello``: only then is the channel ``connected``.
Events become Steward's through `adapters.mattermost.inbound`. Direct (and group)
messages belong to no team in Mattermost, so their `space` is the first of the bot's
teams the sender is a member of, asked of the server and cached: ``space:<team id>``
access rules then hold in DMs without guessing. The bot's own posts come back as
``posted`` events too: they are never input, but they prove events arrive (the
registry's ``echoes=True``: the shared deaf check).

The websocket is watched with ping frames (aiohttp's ``heartbeat``: a connection that
stops answering is closed) and reconnected with `core.backoff.Backoff`, capped well
under 30 s. Every reconnect is a fresh authenticated session (the server's own
resumption needs the upgrade itself authenticated); the posts made meanwhile in the
channels active recently are then fetched (``GET /channels/{id}/posts?since=``) and go
through the same checks. Post ids already handled are remembered in a `Recent`, so a
caught-up, replayed or duplicated post never runs twice. Before reconnecting after a
failure the token is checked (``GET /users/me``): a revoked token makes the channel
``down`` with the reason, instead of a silent loop.

Button presses: ``POST /webhooks/mattermost`` is an `adapters.webhook.Webhook` (verify
the context's HMAC, parse, answer 200 ``{}`` at once, dispatch in the background, a
replayed press once); errors keep Mattermost's shape ``{"error": {"message": …}}``,
which it shows the presser. The decision then edits the post (``PUT
/posts/{id}/patch``) to the outcome and who decided. A stranger's press gets an
ephemeral post. Without a public URL Mattermost could not reach Steward, so buttons
are off (the channel layer then offers ``/approve ID`` text instead) and the start says
why. The signing key is the channel store's ``mattermost_actions.key``.

Files: uploaded (``POST /files``) before the post that carries them; a file over the
server's ``MaxFileSize`` (asked once, ``GET /config/client``) or refused by it (413, or
attachments turned off) becomes a line of text in the post instead, never a silent
drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import structlog
from aiohttp import web

from adapters.base import ChannelDefaults, with_attachments
from adapters.mattermost.errors import SEE, delivery_error, status_of
from adapters.mattermost.inbound import (
    NAME,
    loads,
    parse_delivery,
    parse_posted,
    parse_retraction,
    press_verifier,
    raw_text,
)
from adapters.mattermost.render import (
    DEFAULT_MAX_FILE_SIZE,
    MAX_POST,
    batches,
    post_body,
    render_actions,
    upload_form,
    with_captions,
)
from adapters.runtime import Health, Inflight, json_object
from adapters.webhook import Webhook
from core.backoff import Backoff
from core.events import (
    Attachment,
    Button,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    MessageRef,
)
from core.recent import Recent
from memory.channel_store import ChannelStore

log = structlog.get_logger("adapters.mattermost")

WEBHOOK_PATH = f"/webhooks/{NAME}"
API = "/api/v4"
#: The button-signing key in the channel store: ``<data dir>/secrets/<KEY_FILE>``. It is
#: deliberately *not* derived from the bot token: whoever holds the token can post as
#: the bot, but must not be able to forge a press (and so approve) as an admin.
KEY_FILE = "mattermost_actions.key"
#: A websocket session that lasted this long resets the reconnect backoff.
STABLE_AFTER = 10.0
#: After a reconnect, posts from this long before the last event heard are fetched
#: again (clock skew between Steward and the server); handled ones are skipped.
CATCH_UP_OVERLAP_MS = 30_000
#: How many recently active channels are caught up after a reconnect.
CATCH_UP_CHANNELS = 50
#: Seconds a person's team (their `space` in direct messages) is remembered.
TEAM_TTL = 300.0


def _error_body(message: str) -> Mapping[str, Any]:
    """Mattermost shows the presser ``error.message`` of a refused press."""
    return {"error": {"message": message}}


class MattermostChannel(ChannelDefaults):
    """Steward in Mattermost: one bot account, websocket in, REST out."""

    name = NAME

    def __init__(
        self,
        *,
        url: str,
        token: str,
        public_url: str = "",
        store: ChannelStore | None = None,
        key: bytes | None = None,
        ping_interval: float = 20.0,
        hello_timeout: float = 10.0,
        start_timeout: float = 10.0,
        timeout: float = 30.0,
        backoff: Backoff | None = None,
    ) -> None:
        """Check the configuration; nothing is sent to Mattermost yet.

        ``public_url``: Steward's public base; presses come back to its
        ``/webhooks/mattermost`` (empty: no buttons). ``store``: keeps the button-signing
        key (default: nowhere, a new key every start); ``key``: that key, given instead.
        ``ping_interval``: websocket ping frames, which is also how soon a silently dead
        connection is noticed.
        """
        url = url.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"STEWARD_MATTERMOST_URL must be the server's base URL, like "
                f"https://chat.example.com (got {url!r}; {SEE})"
            )
        if not token.strip():
            raise ValueError(
                f"STEWARD_MATTERMOST_TOKEN is not set: create a bot account and an access "
                f"token for it ({SEE})"
            )
        self.url = url
        self.api = url + API
        self.ws_url = urlunsplit(
            (
                "wss" if parts.scheme == "https" else "ws",
                parts.netloc,
                parts.path + API + "/websocket",
                "",
                "",
            )
        )
        self._token = token.strip()
        public = public_url.strip().rstrip("/")
        self.action_url = public + WEBHOOK_PATH if public else ""
        self.capabilities = Capabilities(
            buttons=bool(self.action_url),
            edit=True,
            typing=True,
            threads=True,
            max_length=MAX_POST,
            max_buttons=5,
            max_label_length=75,
        )
        self.health = Health(NAME)
        self._store = store or ChannelStore.nowhere(NAME)
        self._key = key
        self._ping = ping_interval
        self._hello_timeout = hello_timeout
        self._start_timeout = start_timeout
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._backoff = backoff or Backoff(1.0, 20.0)
        self._session: aiohttp.ClientSession | None = None
        self._dispatch: Dispatch | None = None
        self._inflight = Inflight(NAME)
        self._loop_task: asyncio.Task[None] | None = None
        self._connected: asyncio.Event | None = None
        self.bot_id = ""
        self.bot_username = ""
        self.is_bot = False
        #: post id -> (author, text) of posts taken as input: dedup and retractions.
        self._delivered: Recent[str, tuple[str, str]] = Recent(4096)
        #: Retractions already reported (a replayed event must not count twice).
        self._retracted: Recent[str, None] = Recent(1024)
        #: The bot's teams (None: not asked yet; asked again after every reconnect).
        self._bot_teams: list[str] | None = None
        #: user id -> (when asked, the team used as their `space` in DMs).
        self._member_of: Recent[str, tuple[float, str | None]] = Recent(4096)
        self._lookups: dict[str, asyncio.Task[str | None]] = {}
        #: channel id -> its type (D, G, O, P), most recent last: where to catch up.
        self._channel_types: Recent[str, str] = Recent(CATCH_UP_CHANNELS)
        #: Wall time (ms) of the last websocket event: where a catch-up starts.
        self._last_frame_ms: int | None = None
        #: channel id -> team id, from ``posted`` events (``post_edited`` carries no team).
        self._teams: Recent[str, str] = Recent(1024)
        #: Posts that carry (or carried) buttons: their edits must replace the props.
        self._with_buttons: Recent[str, None] = Recent(1024)
        #: The server's ``MaxFileSize`` (None: not asked yet).
        self._max_file_size: int | None = None
        self.webhook = Webhook(
            NAME,
            verify=press_verifier(lambda: self._key),
            parse=parse_delivery,
            ready=self._ready_for_presses,
            inflight=self._inflight,
            health=self.health,
            error_body=_error_body,
        )

    @classmethod
    def from_settings(
        cls, cfg: Mapping[str, str], settings: Any, store: ChannelStore | None = None
    ) -> MattermostChannel:
        """The adapter from its registry settings (config/platforms.py) and the store that
        keeps its button-signing key."""
        return cls(
            url=cfg["url"],
            token=cfg["token"],
            public_url=str(getattr(settings, "public_url", "") or ""),
            store=store,
        )

    # ------------------------------------------------------------------ lifecycle

    def add_routes(self, app: web.Application) -> None:
        """``POST /webhooks/mattermost``: where Mattermost sends button presses."""
        app.router.add_post(WEBHOOK_PATH, self.webhook.handle)

    async def start(self, dispatch: Dispatch) -> None:
        """Learn who the bot is, then open the websocket (kept open in the background).

        Raises `DeliveryError` (not transient) when the token is refused: the channel is
        then ``down``. An unreachable server is retried in the background after
        ``start_timeout``.
        """
        self._dispatch = dispatch
        self.health.starting("connecting")
        if self._key is None and self.action_url:
            self._key = await self._store.key(KEY_FILE)
        if not self.action_url:
            log.warning(
                "mattermost.no_buttons",
                channel=NAME,
                detail="STEWARD_PUBLIC_URL is not set: Mattermost cannot reach "
                "/webhooks/mattermost, so approvals are offered as /approve commands",
            )
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            await self._whoami()
        except DeliveryError as exc:
            if not exc.transient:
                self.health.down(str(exc))
                await self._close_session()
                self._dispatch = None
                raise
            log.warning("mattermost.unreachable", channel=NAME, error=str(exc))
        self._connected = asyncio.Event()
        self._loop_task = asyncio.get_running_loop().create_task(
            self._run(), name="mattermost:websocket"
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._start_timeout):
                await self._connected.wait()
        if self.health.state != "connected":
            log.warning("mattermost.start_slow", channel=NAME, detail=self.health.detail)

    async def stop(self) -> None:
        """Close the websocket, cancel in-flight dispatches; safe to call twice."""
        self._dispatch = None
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._inflight.cancel_all()
        lookups = list(self._lookups.values())
        for lookup in lookups:
            lookup.cancel()
        await asyncio.gather(*lookups, return_exceptions=True)
        await self._close_session()
        if self.health.state != "stopped":
            self.health.stopped()
            log.info("mattermost.stopped", channel=NAME)

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def check_credentials(self) -> str:
        """For `steward doctor`: ``bot @name (id)`` from ``GET /users/me``, or why not."""
        own = self._session is None
        if own:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            me = await self._whoami()
        finally:
            if own:
                await self._close_session()
        kind = "bot" if me.get("is_bot") else "user (not a bot account)"
        return f"{kind} @{me.get('username', '?')} ({me.get('id', '?')})"

    # ------------------------------------------------------------------ REST

    async def _request(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        *,
        form: aiohttp.FormData | None = None,
    ) -> dict[str, Any]:
        """One REST call answering an object; every failure becomes `DeliveryError`."""
        data = await self._call(method, path, what, body, form=form)
        return data if isinstance(data, dict) else {}

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        *,
        form: aiohttp.FormData | None = None,
        missing_ok: bool = False,
    ) -> Any:
        """One REST call (a JSON `body`, or a multipart `form`), every failure translated
        into `DeliveryError`. ``missing_ok``: a 403/404 answers None (a lookup whose "no"
        is an answer, not an error)."""
        if self._session is None:
            raise DeliveryError(f"Mattermost {what}: the channel is not started")
        headers = {"Authorization": f"Bearer {self._token}"}
        payload: dict[str, Any] = {"data": form} if form is not None else {"json": body}
        try:
            async with self._session.request(
                method, self.api + path, headers=headers, **payload
            ) as resp:
                raw = await resp.read()
                if missing_ok and resp.status in (403, 404):
                    return None
                if resp.status >= 400:
                    err = delivery_error(what, resp.status, resp.headers, raw)
                    if resp.status == 401:
                        self.health.down(str(err))
                    log.warning(
                        "mattermost.delivery_failed",
                        channel=NAME,
                        what=what,
                        status=resp.status,
                        error=str(err),
                        retry_after=err.retry_after,
                    )
                    raise err
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DeliveryError(
                f"Mattermost {what}: could not reach {self.url}: {type(exc).__name__} {exc}"
            ) from exc
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            return {}

    async def _whoami(self) -> dict[str, Any]:
        try:
            me = await self._request("GET", "/users/me", "users/me")
        except DeliveryError as exc:
            status = status_of(exc)
            if exc.transient or status == 401:
                raise
            raise DeliveryError(
                f"{self.api}/users/me answered HTTP {status}: is STEWARD_MATTERMOST_URL the "
                f"server's base URL, as people open it? ({SEE})",
                transient=False,
            ) from exc
        self.bot_id = str(me.get("id") or "")
        self.bot_username = str(me.get("username") or "")
        self.is_bot = bool(me.get("is_bot"))
        log.info("mattermost.identity", channel=NAME, bot_user=self.bot_id)
        return me

    # ------------------------------------------------------------------ outbound

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """``POST /posts``; the text is already Mattermost Markdown (split by the channel
        layer), with one button per choice under it (a Mattermost message attachment's
        actions).

        Files are uploaded first (``POST /files``, one each) and go with the post as
        ``file_ids``, with their captions as lines of its text: `FILES_PER_POST` a post,
        the rest in further posts in the same place (the first one, with the text and the
        buttons, is the one returned and later edited). A file the server will not take
        (over its ``MaxFileSize``, 413, attachments turned off) is a line of the text
        instead. A transient failure of any of it is raised: the channel layer retries the
        whole message."""
        props = {"attachments": self._attachments(conversation, list(buttons))} if buttons else None
        uploaded: list[tuple[str, Attachment]] = []
        refused: list[Attachment] = []
        for attachment in attachments:
            file_id = await self._upload(conversation, attachment)
            if file_id is None:
                refused.append(attachment)
            else:
                uploaded.append((file_id, attachment))
        refs: list[MessageRef] = []
        for group in batches(uploaded):
            files = [a for _, a in group]
            if refs:  # a further post: only its files and their captions
                message, extra = with_captions("", files), None
            else:
                message, extra = with_attachments(with_captions(text, files), refused), props
            refs.append(
                await self._post(
                    conversation, message, thread, extra, [file_id for file_id, _ in group]
                )
            )
        return refs[0]  # batches() always makes a first post

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """``PUT /posts/{id}/patch``. Props are replaced only when buttons are involved
        (new ones, ``[]`` to remove them, or a post that had some), so editing a status
        post leaves the server's own props alone."""
        body: dict[str, Any] = {"message": text}
        if buttons is not None or ref.id in self._with_buttons:
            props: dict[str, Any] = {
                "attachments": self._attachments(ref.conversation, buttons or [])
            }
            if self.is_bot:  # props are replaced whole: keep the server's bot mark
                props["from_bot"] = "true"
            body["props"] = props
        await self._request("PUT", f"/posts/{ref.id}/patch", "posts/patch", body)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """``POST /posts/ephemeral``: only `user` sees it (until they reload)."""
        body = {"user_id": user, "post": {"channel_id": conversation, "message": text}}
        await self._request("POST", "/posts/ephemeral", "posts/ephemeral", body)

    async def typing(self, conversation: str) -> None:
        """``POST /users/{bot}/typing``: "Steward is typing…" for a few seconds."""
        who = self.bot_id or "me"
        await self._request("POST", f"/users/{who}/typing", "typing", {"channel_id": conversation})

    def _attachments(self, conversation: str, buttons: list[Button]) -> list[dict[str, Any]]:
        if not buttons:
            return []
        if self._key is None or not self.action_url:
            raise DeliveryError(
                "Mattermost buttons need STEWARD_PUBLIC_URL (and a started channel)",
                transient=False,
            )
        return [{"actions": render_actions(buttons, conversation, self.action_url, self._key)}]

    async def _post(
        self,
        conversation: str,
        text: str,
        thread: str | None,
        props: dict[str, Any] | None,
        file_ids: list[str],
    ) -> MessageRef:
        body = post_body(conversation, text, thread=thread, props=props, file_ids=file_ids)
        data = await self._request("POST", "/posts", "posts", body)
        post_id = str(data.get("id") or "")
        if props:
            self._with_buttons.put(post_id, None)
        return MessageRef(channel=NAME, conversation=conversation, id=post_id, thread=thread)

    async def _upload(self, conversation: str, attachment: Attachment) -> str | None:
        """``POST /files``: the new file's id, or None when the server will not take it (a
        line of text then says so). Transient failures and a refused token are raised."""
        size, limit = len(attachment.data), await self._file_limit()
        if size > limit:
            log.info(
                "mattermost.file_too_large",
                channel=NAME,
                name=attachment.name,
                size=size,
                limit=limit,
            )
            return None
        try:
            data = await self._request(
                "POST", "/files", "files", form=upload_form(conversation, attachment)
            )
        except DeliveryError as exc:
            if exc.transient or status_of(exc) == 401:
                raise
            return None  # 413, attachments off, …: logged as mattermost.delivery_failed
        infos = data.get("file_infos")
        info = infos[0] if isinstance(infos, list) and infos else None
        if not isinstance(info, dict) or not info.get("id"):
            log.warning("mattermost.file_without_id", channel=NAME, name=attachment.name)
            return None
        return str(info["id"])

    async def _file_limit(self) -> int:
        """The server's ``MaxFileSize`` (``GET /config/client``), asked once; its default
        while the server cannot say."""
        if self._max_file_size is None:
            try:
                config = await self._request("GET", "/config/client?format=old", "config/client")
                self._max_file_size = int(config.get("MaxFileSize") or DEFAULT_MAX_FILE_SIZE)
            except (DeliveryError, ValueError):
                return DEFAULT_MAX_FILE_SIZE
        return self._max_file_size

    # ------------------------------------------------------------------ button presses

    def _ready_for_presses(self) -> Dispatch | None:
        """The Webhook's `ready`: presses are taken while the channel runs (else 503, and
        Mattermost shows the presser an error)."""
        return self._dispatch_press if self._dispatch is not None else None

    async def _dispatch_press(self, event: Inbound) -> None:
        """A verified press, in the Webhook's background task: from a DM it gets the
        presser's team as its `space` (as messages do), then goes to Steward."""
        dispatch = self._dispatch
        if dispatch is None:
            return
        if event.space is None:
            team = await self._team_of(event.user)
            if team is not None:
                event = dataclasses.replace(event, space=team)
        log.debug("mattermost.press", channel=NAME, conversation=event.conversation)
        await dispatch(event)

    # ------------------------------------------------------------------ websocket

    async def _run(self) -> None:
        """Keep a websocket open for as long as the channel runs."""
        while True:
            try:
                if not self.bot_id:
                    await self._whoami()
                reason = await self._session_once()
            except asyncio.CancelledError:
                raise
            except DeliveryError as exc:
                if not exc.transient:  # the token: retrying soon cannot help
                    self.health.down(str(exc))
                    await self._backoff.wait(self._backoff.cap)
                    continue
                reason = str(exc)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.health.lost(f"websocket: {reason}")
            await self._backoff.wait()
            # The server refuses a bad token by closing the socket without a word: ask
            # REST, which says 401 (and marks the channel down with the reason).
            with contextlib.suppress(DeliveryError):
                await self._whoami()

    async def _session_once(self) -> str:
        """One websocket session: authenticate, wait for ``hello``, read events until it
        closes. Returns why it ended."""
        assert self._session is not None
        async with self._session.ws_connect(
            self.ws_url,
            heartbeat=self._ping,
            autoping=True,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
        ) as ws:
            try:
                await ws.send_json(
                    {"seq": 1, "action": "authentication_challenge", "data": {"token": self._token}}
                )
                hello = False
                connected_at = time.monotonic()
                async with asyncio.timeout(self._hello_timeout) as deadline:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            continue
                        frame = loads(msg.data)
                        if not isinstance(frame, dict):
                            continue
                        if frame.get("event") == "hello":
                            hello = True
                            deadline.reschedule(None)
                            self._bot_teams = None  # it may have joined or left teams
                            if self._last_frame_ms is not None:  # a reconnect
                                since = self._last_frame_ms - CATCH_UP_OVERLAP_MS
                                self._inflight.run(self._catch_up(since), "catch_up")
                            connected_at = time.monotonic()
                            self.health.up("websocket")
                            if self._connected is not None:
                                self._connected.set()
                            self.health.heard()
                            continue
                        if hello:
                            self._on_frame(frame)
                if not hello:
                    raise ConnectionResetError(f"closed before hello (code {ws.close_code})")
                return f"closed by the server (code {ws.close_code})"
            finally:
                if hello and time.monotonic() - connected_at >= STABLE_AFTER:
                    self._backoff.reset()  # a server that drops at once is not hammered

    def _on_frame(self, frame: dict[str, Any]) -> None:
        if "event" not in frame:
            return  # a reply to one of our actions ({"status": "OK", "seq_reply": …})
        self.health.heard()  # our own posts' echo included: the deaf check relies on it
        self._last_frame_ms = int(time.time() * 1000)
        kind = frame.get("event")
        if kind == "posted":
            self._on_posted(frame)
        elif kind in ("post_edited", "post_deleted"):
            retracted = parse_retraction(
                frame, self.bot_id, self.bot_username, self._delivered, NAME
            )
            if retracted is None:
                return
            if retracted.space is None and retracted.conversation in self._teams:
                retracted = dataclasses.replace(
                    retracted, space=self._teams.get(retracted.conversation)
                )
            post = loads((frame.get("data") or {}).get("post")) or {}
            once = f"{retracted.message_id}:{retracted.kind}:{post.get('edit_at') or ''}"
            if self._retracted.first_time(once, None):
                if retracted.kind == "edited":
                    self._delivered.put(
                        retracted.message_id, (retracted.user, str(post.get("message") or ""))
                    )
                self._deliver(retracted)

    def _on_posted(self, frame: Mapping[str, Any]) -> bool:
        """A ``posted`` event (live or caught up); True when it was dispatched."""
        data = json_object(frame.get("data"))
        where = (frame.get("broadcast") or {}).get("channel_id")
        if isinstance(where, str) and where:
            if data.get("team_id"):
                self._teams.put(where, str(data["team_id"]))
            if data.get("channel_type"):
                self._channel_types.put(where, str(data["channel_type"]))
        message = parse_posted(frame, self.bot_id, self.bot_username, NAME)
        if message is None or not self._delivered.first_time(
            message.id, (message.user, raw_text(frame))
        ):
            return False
        self._deliver(message)
        return True

    async def _catch_up(self, since_ms: int) -> None:
        """After a reconnect: the posts made while the websocket was down, in the channels
        seen recently (``GET /channels/{id}/posts?since=``), through the same checks as
        live ones. What was already handled is skipped (post ids are remembered), so the
        overlap kept for clock skew never runs anything twice."""
        found = 0
        for cid, kind in [(c, self._channel_types[c]) for c in self._channel_types]:
            try:
                data = await self._request(
                    "GET", f"/channels/{cid}/posts?since={since_ms}", "channels/posts"
                )
            except DeliveryError as exc:
                log.warning("mattermost.catch_up_failed", channel=NAME, error=str(exc))
                continue
            posts = json_object(data.get("posts"))
            missed = sorted(
                (
                    p
                    for p in posts.values()
                    if isinstance(p, dict)
                    and not p.get("delete_at")
                    and int(p.get("create_at") or 0) >= since_ms
                ),
                key=lambda p: int(p.get("create_at") or 0),
            )
            for post in missed:
                frame = {
                    "event": "posted",
                    "data": {
                        "channel_type": kind,
                        "team_id": self._teams.get(cid) or "",
                        "post": post,
                    },
                    "broadcast": {"channel_id": cid},
                }
                found += self._on_posted(frame)
        log.info("mattermost.caught_up", channel=NAME, dispatched=found)

    def _deliver(self, event: Inbound) -> None:
        if self._dispatch is None:
            log.warning("mattermost.not_started", channel=NAME, kind=type(event).__name__)
            return
        if event.space is None:  # a direct or group message: Mattermost names no team
            self._inflight.run(self._deliver_in_team(self._dispatch, event), "team")
        else:
            self._inflight.spawn(self._dispatch, event)

    async def _deliver_in_team(self, dispatch: Dispatch, event: Inbound) -> None:
        """Dispatch with the sender's team as `space`, so ``space:<team id>`` access rules
        hold in direct messages too (Mattermost's DMs belong to no team)."""
        team = await self._team_of(event.user)
        if team is not None:
            event = dataclasses.replace(event, space=team)
        self._inflight.spawn(dispatch, event)

    async def _team_of(self, user: str) -> str | None:
        """The first of the bot's teams `user` belongs to (None: none, or unknown now).

        Asked of the server (``GET /teams/{team}/members/{user}``), never guessed, and
        remembered for `TEAM_TTL` seconds. Concurrent messages of one person share one
        lookup, which also keeps them in order."""
        cached = self._member_of.get(user)
        if cached is not None and time.monotonic() - cached[0] < TEAM_TTL:
            return cached[1]
        task = self._lookups.get(user)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._lookup_team(user))
            self._lookups[user] = task
            task.add_done_callback(lambda _t: self._lookups.pop(user, None))
        return await asyncio.shield(task)

    async def _lookup_team(self, user: str) -> str | None:
        try:
            if self._bot_teams is None:
                teams = await self._call("GET", "/users/me/teams", "users/me/teams")
                self._bot_teams = [
                    str(t["id"]) for t in teams or [] if isinstance(t, dict) and t.get("id")
                ]
            found = None
            for team in self._bot_teams:
                member = await self._call(
                    "GET", f"/teams/{team}/members/{user}", "teams/members", missing_ok=True
                )
                if isinstance(member, dict) and not member.get("delete_at"):
                    found = team
                    break
        except DeliveryError as exc:  # fail closed: only rules naming the person apply
            log.warning("mattermost.team_lookup_failed", channel=NAME, error=str(exc))
            return None
        self._member_of.put(user, (time.monotonic(), found))
        return found
