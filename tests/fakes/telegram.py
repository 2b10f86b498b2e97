"""A fake Telegram Bot API server on 127.0.0.1 for the unmodified python-telegram-bot.

Why: the Telegram adapter must be tested through PTB 22 exactly as it talks to
api.telegram.org — ``POST /bot<token>/<method>`` with form-encoded bodies (complex
values as JSON strings), the ``{"ok": …}`` envelope, Telegram's own error texts and
status codes — without network and without patching Steward or PTB. The adapter is
pointed here by ``STEWARD_TELEGRAM_API_URL`` (PTB's ``base_url``, token appended).

Methods: getMe · deleteWebhook · setWebhook · getWebhookInfo · getUpdates (offset
confirms, the request is held up to ``timeout`` seconds) · sendMessage · sendPhoto ·
sendDocument · editMessageText · editMessageReplyMarkup · answerCallbackQuery ·
sendChatAction · setMyCommands. Errors as the Bot API gives them: 401 Unauthorized,
404 method not found, 400 "message is too long" / "MESSAGE_TOO_LONG" (edits) /
"message text is empty" / "can't parse entities: …" (HTML checked like Telegram: only
its tags, every tag closed) / "BUTTON_DATA_INVALID" / "message is not modified" /
"query is too old" / "message caption is too long" / "file must be non-empty" /
"PHOTO_INVALID_DIMENSIONS" (width + height over 10,000, or a side ratio over 20) /
"IMAGE_PROCESS_FAILED" (not a picture) / "PHOTO_SAVE_FILE_INVALID" (a photo over
10 MB), 413 for an upload over 50 MB, 409 Conflict (a webhook set, or another poller:
as on Telegram, a getUpdates held open ends with "Conflict: terminated by other
getUpdates request" when a newer one for the same token arrives, so two processes
polling one bot knock each other's polls out; :attr:`conflict` forces it), 429 with
``parameters.retry_after``.

Uploads come as PTB sends them: ``multipart/form-data`` (``HTTPXRequest`` hands httpx
the parameters as form fields and the file as a part named ``photo`` / ``document``
with its file name and media type). Each is recorded in :attr:`uploads` (name,
bytes, caption, chat, topic) and answered with a Message carrying ``photo`` (the
sizes) or ``document``, as Telegram answers.

Drive it with :meth:`user_message`, :meth:`press`, :meth:`edit_user_message` (updates
queued for getUpdates, or POSTed to the webhook with the secret header when one is
set), :meth:`rate_limit_next`, :meth:`fail_next`, :meth:`drop`, :attr:`conflict`,
:meth:`webhook_unreachable` / :meth:`webhook_reachable`; read :attr:`posted` (text
messages and alerts, in order), :attr:`uploads`, :attr:`messages`, :attr:`edits`,
:attr:`answers`, :attr:`requests`. It can run in a thread for `steward run` tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import unescape
from typing import Any

import aiohttp
from aiohttp import web

TOKEN = "123456789:AAtest-token_for-the-fake"
OTHER_TOKEN = "987654321:AAsecond-bot_for-forged-webhooks"
BOT_ID = 123456789
BOT_USERNAME = "steward_test_bot"
ALICE = 1001
BOB = 1002
#: A supergroup with forum topics.
GROUP = -1001234567890
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
#: The Bot API's upload limits: photos, and any file sent by multipart.
MAX_PHOTO_BYTES = 10 * 1024 * 1024
MAX_UPLOAD_BYTES = 50 * 1024 * 1024

_ALLOWED_TAGS = {
    "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre",
    "span", "tg-spoiler", "blockquote", "tg-emoji",
}  # fmt: skip
_ENTITY_TYPE = {
    "b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline",
    "ins": "underline", "s": "strikethrough", "strike": "strikethrough",
    "del": "strikethrough", "a": "text_link", "code": "code", "pre": "pre",
    "span": "spoiler", "tg-spoiler": "spoiler", "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}  # fmt: skip
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)((?:\s+[^<>]*)?)>")
_CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot "
    "instance is running"
)
_WEBHOOK_ACTIVE = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to "
    "delete the webhook first"
)


class ParseError(ValueError):
    pass


def parse_html(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Telegram's HTML parse mode: plain text and entities, or ParseError with the text
    Telegram gives ("Unsupported start tag …", "Can't find end tag …")."""
    out: list[str] = []
    entities: list[dict[str, Any]] = []
    stack: list[tuple[str, int, str]] = []
    pos = 0
    length = 0  # UTF-16 units

    def emit(chunk: str) -> None:
        nonlocal length
        plain = unescape(chunk)
        out.append(plain)
        length += sum(2 if ord(c) > 0xFFFF else 1 for c in plain)

    while True:
        lt = text.find("<", pos)
        if lt < 0:
            emit(text[pos:])
            break
        emit(text[pos:lt])
        m = _TAG.match(text, lt)
        offset = len(text[:lt].encode())
        if m is None:
            raise ParseError(f'Unsupported start tag "" at byte offset {offset}')
        closing, name, attrs = m.group(1), m.group(2).lower(), m.group(3)
        if name not in _ALLOWED_TAGS:
            raise ParseError(f'Unsupported start tag "{name}" at byte offset {offset}')
        if closing:
            if not stack:
                raise ParseError(f"Unexpected end tag at byte offset {offset}")
            open_name, start, open_attrs = stack.pop()
            if open_name != name:
                raise ParseError(
                    f'Unmatched end tag at byte offset {offset}, expected "</{open_name}>", '
                    f'found "</{name}>"'
                )
            if length > start:
                entity: dict[str, Any] = {
                    "type": _ENTITY_TYPE[name],
                    "offset": start,
                    "length": length - start,
                }
                href = re.search(r'href="([^"]*)"', open_attrs)
                if name == "a":
                    if not href:
                        raise ParseError("Can't find end tag corresponding to start tag a")
                    entity["url"] = unescape(href.group(1))
                entities.append(entity)
        else:
            stack.append((name, length, attrs))
        pos = m.end()
    if stack:
        raise ParseError(f'Can\'t find end tag corresponding to start tag "{stack[-1][0]}"')
    return "".join(out), sorted(entities, key=lambda e: (e["offset"], -e["length"]))


def _utf16_len(text: str) -> int:
    return sum(2 if ord(c) > 0xFFFF else 1 for c in text)


@dataclass
class Recorded:
    """One Bot API call as the fake received it (form values decoded)."""

    method: str
    params: dict[str, Any]
    token: str
    at: float
    status: int = 200
    error: str | None = None


@dataclass
class FilePart:
    """A file part of a multipart request, as it arrived."""

    name: str
    data: bytes
    mime: str


@dataclass
class Uploaded:
    """A file the bot sent (``kind`` "photo" or "document"), as the fake received it."""

    kind: str
    chat_id: int
    message_id: int
    name: str
    data: bytes
    mime: str
    caption: str
    thread: int | None = None
    token: str = TOKEN


@dataclass
class Posted:
    """Something the bot showed: a message (``kind="message"``) or a callback alert/toast
    (``kind="alert"``, ``to`` = the presser)."""

    kind: str
    chat_id: int
    message_id: int
    #: The text as the bot sent it (HTML when parse_mode was HTML).
    raw_text: str
    parse_mode: str | None
    buttons: list[tuple[str, str]] = field(default_factory=list)
    thread: int | None = None
    to: int | None = None
    #: Every body sent for it, last = current (edits appended).
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Answer:
    query_id: str
    text: str | None
    show_alert: bool
    latency: float


@dataclass
class _Bot:
    token: str
    id: int
    username: str
    updates: list[dict[str, Any]] = field(default_factory=list)
    webhook_url: str = ""
    webhook_secret: str = ""
    #: What getWebhookInfo reports as the last failed delivery (a test sets it).
    last_error: str = ""
    #: update ids handed out, with the time (for callback answer latency).
    handed: dict[int, float] = field(default_factory=dict)
    #: Telegram cannot reach the webhook: updates wait here (see webhook_unreachable).
    undelivered: list[dict[str, Any]] = field(default_factory=list)
    #: The getUpdates being held open: set when a newer one terminates it (409).
    held: asyncio.Event | None = None


def _ok(result: Any) -> web.Response:
    return web.Response(
        body=json.dumps({"ok": True, "result": result}).encode(),
        headers={"Content-Type": "application/json"},
    )


def _err(status: int, description: str, **parameters: Any) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.Response(
        status=status, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )


def _buttons(markup: Any) -> list[tuple[str, str]]:
    if not isinstance(markup, dict):
        return []
    return [
        (str(b.get("text", "")), str(b.get("callback_data", "")))
        for row in markup.get("inline_keyboard") or []
        for b in row
    ]


class FakeTelegram:
    """The Bot API on 127.0.0.1 with an update queue per bot token."""

    def __init__(self, *, max_hold: float = 30.0) -> None:
        self.max_hold = max_hold
        self.bots: dict[str, _Bot] = {
            TOKEN: _Bot(TOKEN, BOT_ID, BOT_USERNAME),
            OTHER_TOKEN: _Bot(OTHER_TOKEN, 987654321, "other_test_bot"),
        }
        self.requests: list[Recorded] = []
        self.posted: list[Posted] = []
        #: Every photo and document the bot sent, in order.
        self.uploads: list[Uploaded] = []
        #: (chat id, message id) → the message object as Telegram returns it.
        self.messages: dict[tuple[int, int], dict[str, Any]] = {}
        self.edits: list[tuple[int, int, dict[str, Any]]] = []
        self.answers: list[Answer] = []
        self.commands: list[dict[str, Any]] = []
        self.chat_actions: list[dict[str, Any]] = []
        #: Webhook POST results: (status, body text).
        self.webhook_results: list[tuple[int, str]] = []
        #: Another instance polls with the same token: every getUpdates answers 409.
        self.conflict = False
        self._update_ids = itertools.count(100)
        self._message_ids = itertools.count(500)
        self._query_ids = itertools.count(1)
        self._file_ids = itertools.count(1)
        self._rate_limits: list[float] = []
        self._failures: list[tuple[str, int, str]] = []
        self._drop = 0
        self._queries: dict[str, tuple[str, int, dict[str, Any]]] = {}  # id → token, update, query
        self._answered: set[str] = set()
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None  # created on the serving loop
        self._wake: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._http: aiohttp.ClientSession | None = None
        self.port = 0

    # ------------------------------------------------------------------ serving

    @property
    def base_url(self) -> str:
        """What PTB's ``base_url`` (STEWARD_TELEGRAM_API_URL) is set to."""
        return f"http://127.0.0.1:{self.port}/bot"

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Condition()
        self._closing = asyncio.Event()
        # Room for an upload over the Bot API's 50 MB, so the fake can refuse it as Telegram does.
        app = web.Application(client_max_size=MAX_UPLOAD_BYTES + 8 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        await self._notify()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start_in_thread(self) -> None:
        """Serve from a daemon thread with its own loop (for `steward run` tests)."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-telegram", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake Telegram did not start")

    def stop_thread(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on the fake's loop from another thread (a sync test) and return its
        result; coroutines are awaited there."""
        assert self._loop is not None

        async def run() -> Any:
            result = fn(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    async def _notify(self) -> None:
        if self._wake is not None:
            async with self._wake:
                self._wake.notify_all()

    # ------------------------------------------------------------------ test controls

    def rate_limit_next(self, seconds: float) -> None:
        """The next sendMessage answers 429 "Too Many Requests: retry after N"."""
        self._rate_limits.append(seconds)

    def fail_next(self, method: str, status: int, description: str) -> None:
        """The next call of `method` answers `status` with `description` (e.g. 502)."""
        self._failures.append((method, status, description))

    async def drop(self) -> None:
        """The held getUpdates (the adapter's inbound connection) ends with a 502."""
        self._drop += 1
        await self._notify()

    def webhook_unreachable(self, error: str = "Connection refused", token: str = TOKEN) -> None:
        """Telegram cannot reach the bot's webhook: updates wait, and getWebhookInfo says
        why (``last_error_message``), as Telegram does."""
        self.bots[token].last_error = error

    async def webhook_reachable(self, token: str = TOKEN) -> None:
        """The webhook answers again: what waited is delivered, the error forgotten."""
        bot = self.bots[token]
        bot.last_error = ""
        waiting, bot.undelivered = bot.undelivered, []
        for update in waiting:
            await self.deliver(update, token)

    def chat(self, chat_id: int, *, forum: bool = False) -> dict[str, Any]:
        if chat_id > 0:
            user = self.user(chat_id)
            return {k: user[k] for k in ("first_name", "username") if k in user} | {
                "id": chat_id,
                "type": "private",
            }
        chat: dict[str, Any] = {"id": chat_id, "type": "supergroup", "title": "Ops"}
        if forum:
            chat["is_forum"] = True
        return chat

    @staticmethod
    def user(user_id: int) -> dict[str, Any]:
        names = {ALICE: ("Alice", "alice"), BOB: ("Bob", "bob")}
        first, username = names.get(user_id, (f"User{user_id}", f"user{user_id}"))
        return {
            "id": user_id,
            "is_bot": False,
            "first_name": first,
            "username": username,
            "language_code": "en",
        }

    def bot_user(self, token: str = TOKEN) -> dict[str, Any]:
        bot = self.bots[token]
        return {"id": bot.id, "is_bot": True, "first_name": "Steward", "username": bot.username}

    def user_message_update(
        self,
        text: str,
        *,
        user: int = ALICE,
        chat: int | None = None,
        mention: bool = False,
        reply_to: int | None = None,
        topic: int | None = None,
        token: str = TOKEN,
    ) -> dict[str, Any]:
        """The Update Telegram sends for a person's text message: private by default, in
        `chat` (a group) with an @-mention entity, a reply, or in a forum topic."""
        chat_id = user if chat is None else chat
        bot = self.bots[token]
        entities: list[dict[str, Any]] = []
        if mention:
            text = f"@{bot.username} {text}"
            entities.append({"type": "mention", "offset": 0, "length": len(bot.username) + 1})
        if text.startswith("/"):
            command = text.split(" ", 1)[0]
            entities.append({"type": "bot_command", "offset": 0, "length": _utf16_len(command)})
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "from": self.user(user),
            "chat": self.chat(chat_id, forum=topic is not None),
            "date": int(time.time()),
            "text": text,
        }
        if entities:
            message["entities"] = entities
        if topic is not None:
            message["message_thread_id"] = topic
            message["is_topic_message"] = True
            if reply_to is None:  # in a topic, Telegram links the topic's first message
                message["reply_to_message"] = {
                    "message_id": topic,
                    "from": self.user(user),
                    "chat": self.chat(chat_id, forum=True),
                    "date": int(time.time()) - 60,
                    "message_thread_id": topic,
                    "forum_topic_created": {"name": "design", "icon_color": 7322096},
                    "is_topic_message": True,
                }
        if reply_to is not None:
            replied = self.messages.get((chat_id, reply_to))
            message["reply_to_message"] = replied or {
                "message_id": reply_to,
                "from": self.bot_user(token),
                "chat": self.chat(chat_id),
                "date": int(time.time()) - 5,
                "text": "earlier",
            }
        self.messages[(chat_id, message["message_id"])] = message
        return {"update_id": next(self._update_ids), "message": message}

    async def user_message(self, text: str, **kwargs: Any) -> dict[str, Any]:
        token = kwargs.get("token", TOKEN)
        update = self.user_message_update(text, **kwargs)
        await self.deliver(update, token)
        return update

    async def edit_user_message(
        self, chat_id: int, message_id: int, text: str, *, token: str = TOKEN
    ) -> dict[str, Any]:
        message = dict(self.messages[(chat_id, message_id)])
        message["text"] = text
        message["edit_date"] = int(time.time())
        update = {"update_id": next(self._update_ids), "edited_message": message}
        await self.deliver(update, token)
        return update

    def press_update(
        self, chat_id: int, message_id: int, data: str, *, user: int = ALICE
    ) -> dict[str, Any]:
        message = self.messages.get((chat_id, message_id)) or {
            "message_id": message_id,
            "from": self.bot_user(),
            "chat": self.chat(chat_id),
            "date": int(time.time()),
            "text": "?",
        }
        qid = f"{4000000000000000000 + next(self._query_ids)}"
        return {
            "update_id": next(self._update_ids),
            "callback_query": {
                "id": qid,
                "from": self.user(user),
                "message": message,
                "chat_instance": "-6123456789012345678",
                "data": data,
            },
        }

    async def press(
        self, chat_id: int, message_id: int, data: str, *, user: int = ALICE, token: str = TOKEN
    ) -> dict[str, Any]:
        update = self.press_update(chat_id, message_id, data, user=user)
        await self.deliver(update, token)
        return update

    async def deliver(self, update: dict[str, Any], token: str = TOKEN) -> None:
        """Queue for getUpdates, or POST to the webhook when one is set (like Telegram)."""
        bot = self.bots[token]
        query = update.get("callback_query")
        if query:
            self._queries[query["id"]] = (token, update["update_id"], query)
        if bot.webhook_url and bot.last_error:
            bot.undelivered.append(update)
            return
        if bot.webhook_url:
            bot.handed[update["update_id"]] = time.monotonic()
            status, text = await self.post_webhook(update, token)
            self.webhook_results.append((status, text))
            return
        bot.updates.append(update)
        await self._notify()

    async def post_webhook(
        self, update: dict[str, Any], token: str = TOKEN, *, secret: str | None = None
    ) -> tuple[int, str]:
        """POST an update as Telegram does (JSON, the secret header); `secret` overrides
        the header (a forgery), "" leaves it out."""
        bot = self.bots[token]
        header = bot.webhook_secret if secret is None else secret
        headers = {"Content-Type": "application/json"}
        if header:
            headers[SECRET_HEADER] = header
        if self._http is None:
            self._http = aiohttp.ClientSession()
        async with self._http.post(
            bot.webhook_url, data=json.dumps(update).encode(), headers=headers
        ) as resp:
            return resp.status, await resp.text()

    # ------------------------------------------------------------------ the API

    async def _params(self, request: web.Request) -> dict[str, Any]:
        if request.content_type == "application/json":
            raw = await request.json()
            return dict(raw) if isinstance(raw, dict) else {}
        form = await request.post()  # form-encoded, or multipart with files (uploads)
        params: dict[str, Any] = {}
        for key, value in form.items():
            if isinstance(value, web.FileField):
                params[key] = FilePart(
                    _form_name(value.filename), value.file.read(), value.content_type
                )
                continue
            if not isinstance(value, str):
                continue
            params[key] = value
            if key in ("reply_markup", "allowed_updates", "commands", "reply_parameters",
                       "link_preview_options", "entities"):  # fmt: skip
                with contextlib.suppress(ValueError):
                    params[key] = json.loads(value)
        return params

    async def _handle(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        method = request.match_info["method"]
        params = await self._params(request)
        record = Recorded(method, params, token, time.monotonic())
        self.requests.append(record)
        bot = self.bots.get(token)
        if bot is None:
            record.status, record.error = 401, "Unauthorized"
            return _err(401, "Unauthorized")
        for i, (name, status, description) in enumerate(self._failures):
            if name == method:
                del self._failures[i]
                record.status, record.error = status, description
                if status >= 500:
                    return web.Response(
                        status=status,
                        text=f"<html><body><h1>{status} {description}</h1></body></html>",
                        content_type="text/html",
                    )
                return _err(status, description)
        handler = getattr(self, f"_m_{method.lower()}", None)
        if handler is None:
            record.status, record.error = 404, "Not Found: method not found"
            return _err(404, "Not Found: method not found")
        response: web.Response = await handler(bot, params)
        record.status = response.status
        if response.status != 200 and response.content_type == "application/json":
            record.error = json.loads(response.body).get("description")  # type: ignore[arg-type]
        elif response.status != 200:
            record.error = f"HTTP {response.status}"
        return response

    async def _m_getme(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        return _ok(
            self.bot_user(bot.token)
            | {
                "can_join_groups": True,
                "can_read_all_group_messages": False,
                "supports_inline_queries": False,
            }
        )

    async def _m_deletewebhook(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        bot.webhook_url = bot.webhook_secret = ""
        if str(p.get("drop_pending_updates", "")).lower() == "true":
            bot.updates.clear()
        return _ok(True)

    async def _m_setwebhook(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        url = str(p.get("url", ""))
        if not url.startswith(("http://127.0.0.1", "https://")):
            return _err(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        secret = str(p.get("secret_token", ""))
        if secret and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
            return _err(400, "Bad Request: secret token contains unallowed characters")
        bot.webhook_url, bot.webhook_secret = url, secret
        pending, bot.updates = bot.updates, []
        for update in pending:  # what waited is delivered to the new webhook
            await self.deliver(update, bot.token)
        return _ok(True)

    async def _m_getwebhookinfo(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        return _ok(
            {
                "url": bot.webhook_url,
                "has_custom_certificate": False,
                "pending_update_count": len(bot.updates),
            }
            | (
                {"last_error_date": int(time.time()) - 5, "last_error_message": bot.last_error}
                if bot.last_error
                else {}
            )
        )

    async def _m_getupdates(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        if bot.webhook_url:
            return _err(409, _WEBHOOK_ACTIVE)
        if self.conflict:
            return _err(409, _CONFLICT)
        # Telegram serves one getUpdates per bot at a time: a newer one (another process
        # polling the same token) ends the one being held with 409 "terminated by other
        # getUpdates request". The newer one goes on as usual.
        terminated = asyncio.Event()
        if bot.held is not None:
            bot.held.set()
            await self._notify()
        bot.held = terminated
        try:
            return await self._poll(bot, p, terminated)
        finally:
            if bot.held is terminated:
                bot.held = None

    async def _poll(self, bot: _Bot, p: dict[str, Any], terminated: asyncio.Event) -> web.Response:
        offset = int(p.get("offset") or 0)
        if offset:
            bot.updates = [u for u in bot.updates if u["update_id"] >= offset]
        allowed = p.get("allowed_updates")
        hold = min(float(p.get("timeout") or 0), self.max_hold)
        deadline = time.monotonic() + hold
        assert self._wake is not None and self._closing is not None
        while True:
            if self._drop:  # the poll in flight (or the next one) ends with a 502
                self._drop -= 1
                return web.Response(
                    status=502,
                    text="<html><head><title>502 Bad Gateway</title></head></html>",
                    content_type="text/html",
                )
            if terminated.is_set():
                return _err(409, _CONFLICT)
            ready = [
                u
                for u in bot.updates
                if not allowed or any(k in u for k in allowed if k != "update_id")
            ][: int(p.get("limit") or 100)]
            if ready or time.monotonic() >= deadline or self._closing.is_set():
                break
            async with self._wake:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), deadline - time.monotonic())
        now = time.monotonic()
        for u in ready:
            bot.handed.setdefault(u["update_id"], now)
        return _ok(ready)

    def _chat_of(self, p: dict[str, Any]) -> int | None:
        try:
            return int(p.get("chat_id", ""))
        except ValueError:
            return None

    def _check_markup(self, p: dict[str, Any]) -> web.Response | None:
        markup = p.get("reply_markup")
        if markup is None:
            return None
        if not isinstance(markup, dict) or not isinstance(markup.get("inline_keyboard"), list):
            return _err(400, "Bad Request: can't parse reply keyboard markup JSON object")
        for _label, data in _buttons(markup):
            if not 1 <= len(data.encode()) <= 64:
                return _err(400, "Bad Request: BUTTON_DATA_INVALID")
        return None

    def _text(self, p: dict[str, Any], *, edit: bool) -> tuple[str, list[Any]] | web.Response:
        raw = str(p.get("text", ""))
        mode = str(p.get("parse_mode") or "")
        if mode.upper() == "HTML":
            try:
                text, entities = parse_html(raw)
            except ParseError as exc:
                return _err(400, f"Bad Request: can't parse entities: {exc}")
        elif mode:
            return _err(400, f"Bad Request: unsupported parse_mode {mode}")
        else:
            text, entities = raw, []
        if not text.strip():
            return _err(400, "Bad Request: message text is empty")
        if _utf16_len(text) > 4096:
            return _err(
                400, "Bad Request: MESSAGE_TOO_LONG" if edit else "Bad Request: message is too long"
            )
        return text, entities

    async def _m_sendmessage(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        chat_id = self._chat_of(p)
        if chat_id is None:
            return _err(400, "Bad Request: chat not found")
        if self._rate_limits:
            seconds = self._rate_limits.pop(0)
            wait = max(1, round(seconds))
            return _err(429, f"Too Many Requests: retry after {wait}", retry_after=wait)
        bad = self._check_markup(p)
        if bad is not None:
            return bad
        parsed = self._text(p, edit=False)
        if isinstance(parsed, web.Response):
            return parsed
        text, entities = parsed
        thread = int(p["message_thread_id"]) if p.get("message_thread_id") else None
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "from": self.bot_user(bot.token),
            "chat": self.chat(chat_id, forum=thread is not None),
            "date": int(time.time()),
            "text": text,
        }
        if entities:
            message["entities"] = entities
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        if p.get("reply_markup"):
            message["reply_markup"] = p["reply_markup"]
        self.messages[(chat_id, message["message_id"])] = message
        self.posted.append(
            Posted(
                "message",
                chat_id,
                message["message_id"],
                str(p.get("text", "")),
                p.get("parse_mode"),
                _buttons(p.get("reply_markup")),
                thread,
                history=[p],
            )
        )
        return _ok(message)

    async def _m_sendphoto(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        return self._upload(bot, p, "photo")

    async def _m_senddocument(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        return self._upload(bot, p, "document")

    def _upload(self, bot: _Bot, p: dict[str, Any], kind: str) -> web.Response:
        """sendPhoto / sendDocument with the file uploaded (a file_id or URL is not
        something Steward sends: refused like a bad identifier)."""
        chat_id = self._chat_of(p)
        if chat_id is None:
            return _err(400, "Bad Request: chat not found")
        part = p.get(kind)
        if not isinstance(part, FilePart):
            return _err(400, "Bad Request: wrong remote file identifier specified")
        if len(part.data) > MAX_UPLOAD_BYTES:
            return _err(413, "Request Entity Too Large")
        if not part.data:
            return _err(400, "Bad Request: file must be non-empty")
        caption = str(p.get("caption") or "")
        if _utf16_len(caption) > 1024:
            return _err(400, "Bad Request: message caption is too long")
        bad = self._check_markup(p)
        if bad is not None:
            return bad
        file_id = f"{kind[:2].upper()}file{next(self._file_ids)}"
        media: Any
        if kind == "photo":
            size = _picture_size(part.data)
            if size is None:
                return _err(400, "Bad Request: IMAGE_PROCESS_FAILED")
            width, height = size
            if width + height > 10000 or max(width, height) > 20 * max(1, min(width, height)):
                return _err(400, "Bad Request: PHOTO_INVALID_DIMENSIONS")
            if len(part.data) > MAX_PHOTO_BYTES:
                return _err(400, "Bad Request: PHOTO_SAVE_FILE_INVALID")
            media = [
                {
                    "file_id": file_id,
                    "file_unique_id": f"u{file_id}",
                    "width": width,
                    "height": height,
                    "file_size": len(part.data),
                }
            ]
        else:
            media = {
                "file_id": file_id,
                "file_unique_id": f"u{file_id}",
                "file_name": part.name,
                "mime_type": part.mime,
                "file_size": len(part.data),
            }
        thread = int(p["message_thread_id"]) if p.get("message_thread_id") else None
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "from": self.bot_user(bot.token),
            "chat": self.chat(chat_id, forum=thread is not None),
            "date": int(time.time()),
            kind: media,
        }
        if caption:
            message["caption"] = caption
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        if p.get("reply_markup"):
            message["reply_markup"] = p["reply_markup"]
        self.messages[(chat_id, message["message_id"])] = message
        self.uploads.append(
            Uploaded(
                kind,
                chat_id,
                message["message_id"],
                part.name,
                part.data,
                part.mime,
                caption,
                thread,
                bot.token,
            )
        )
        return _ok(message)

    def _posted(self, chat_id: int, message_id: int) -> Posted | None:
        return next(
            (x for x in self.posted if x.chat_id == chat_id and x.message_id == message_id),
            None,
        )

    async def _m_editmessagetext(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        chat_id = self._chat_of(p)
        mid = int(p.get("message_id") or 0)
        message = self.messages.get((chat_id or 0, mid))
        if message is None:
            return _err(400, "Bad Request: message to edit not found")
        bad = self._check_markup(p)
        if bad is not None:
            return bad
        parsed = self._text(p, edit=True)
        if isinstance(parsed, web.Response):
            return parsed
        text, entities = parsed
        markup = p.get("reply_markup")
        if text == message.get("text") and markup == message.get("reply_markup"):
            return _err(
                400,
                "Bad Request: message is not modified: specified new message content and "
                "reply markup are exactly the same as a current content and reply markup of "
                "the message",
            )
        message["text"] = text
        message["entities"] = entities
        message["edit_date"] = int(time.time())
        if markup:
            message["reply_markup"] = markup
        else:
            message.pop("reply_markup", None)
        self.edits.append((chat_id or 0, mid, p))
        posted = self._posted(chat_id or 0, mid)
        if posted is not None:
            posted.raw_text = str(p.get("text", ""))
            posted.parse_mode = p.get("parse_mode")
            posted.buttons = _buttons(markup)
            posted.history.append(p)
        return _ok(message)

    async def _m_editmessagereplymarkup(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        chat_id = self._chat_of(p)
        mid = int(p.get("message_id") or 0)
        message = self.messages.get((chat_id or 0, mid))
        if message is None:
            return _err(400, "Bad Request: message to edit not found")
        bad = self._check_markup(p)
        if bad is not None:
            return bad
        markup = p.get("reply_markup")
        if markup:
            message["reply_markup"] = markup
        else:
            message.pop("reply_markup", None)
        self.edits.append((chat_id or 0, mid, p))
        posted = self._posted(chat_id or 0, mid)
        if posted is not None:
            posted.buttons = _buttons(markup)
            posted.history.append(p)
        return _ok(message)

    async def _m_answercallbackquery(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        qid = str(p.get("callback_query_id", ""))
        known = self._queries.get(qid)
        if known is None or qid in self._answered or known[0] != bot.token:
            return _err(
                400,
                "Bad Request: query is too old and response timeout expired or query ID is invalid",
            )
        self._answered.add(qid)
        handed = self.bots[known[0]].handed.get(known[1], time.monotonic())
        text = p.get("text") or None
        if text is not None and len(text) > 200:
            return _err(400, "Bad Request: MESSAGE_TOO_LONG")
        show_alert = str(p.get("show_alert", "")).lower() == "true"
        self.answers.append(Answer(qid, text, show_alert, time.monotonic() - handed))
        if text:
            query = known[2]
            self.posted.append(
                Posted(
                    "alert",
                    int(query["message"]["chat"]["id"]),
                    0,
                    text,
                    None,
                    to=int(query["from"]["id"]),
                    history=[p],
                )
            )
        return _ok(True)

    async def _m_sendchataction(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        if self._chat_of(p) is None:
            return _err(400, "Bad Request: chat not found")
        self.chat_actions.append(p)
        return _ok(True)

    async def _m_setmycommands(self, bot: _Bot, p: dict[str, Any]) -> web.Response:
        commands = p.get("commands")
        if not isinstance(commands, list):
            return _err(400, "Bad Request: can't parse commands JSON object")
        self.commands = commands
        return _ok(True)


def _picture_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG, GIF or JPEG, as Telegram's image processing would find
    them; None for anything it could not process as a photo."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return width, height
    if data.startswith(b"\xff\xd8"):
        pos = 2
        while pos + 9 < len(data):
            if data[pos] != 0xFF:
                return None
            marker = data[pos + 1]
            length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
                return width, height
            pos += 2 + length
    return None


def _form_name(name: str) -> str:
    """A multipart file name as sent in HTML5 form encoding (httpx, like browsers, writes
    ``"``, CR and LF as %22, %0D, %0A), decoded."""
    return name.replace("%22", '"').replace("%0D", "\r").replace("%0A", "\n")
