"""A fake Google Chat on 127.0.0.1: the token endpoint, the certificates, the REST API,
and signed interaction events POSTed to the app.

Why: the adapter must be exercised exactly as Google drives it (a service-account JWT
exchanged for an access token at the JSON's ``token_uri``, bearer tokens on REST
calls, Google's ``{"error": {code, message, status}}`` error shape, 429
RESOURCE_EXHAUSTED with a ``google.rpc.RetryInfo`` delay, and inbound events carrying
a JWT from ``chat@system.gserviceaccount.com`` signed with a key whose x509
certificate the app fetches), with no network and no patching of Steward's code.
The keys are real RSA keys made with `cryptography`; tokens are signed with
google-auth's own `crypt`/`jwt` (nothing hand-rolled).

What it serves::

    POST  /token                          the OAuth2 JWT-bearer grant (service account)
    GET   /certs                          {kid: x509 PEM} of Chat's signing key
    POST  /v1/spaces/{s}/messages         spaces.messages.create
    PATCH /v1/spaces/{s}/messages/{m}     spaces.messages.patch (updateMask)
    GET   /v1/spaces, /v1/spaces/{s}      spaces.list / spaces.get

Attachments: a Chat app cannot upload a file, so Steward's message carries cards that
point at files it publishes; each one (an ``image`` widget's ``imageUrl``, a
``decoratedText`` button's ``openLink``) is recorded in :attr:`links` with the card's
caption, for a test to fetch as Chat would.

What a test drives: the event builders (:meth:`message_event`, :meth:`card_clicked`,
:meth:`added_to_space`, :meth:`removed_from_space`), :meth:`post_event` (signed
delivery; the app's synchronous answer is applied as Chat would: a message posted,
or the clicked card updated), :meth:`chat_token` (valid, expired, wrong audience,
forged), :meth:`rate_limit_next`, :meth:`error_next`, :meth:`outage`; and what it
reads: :attr:`messages`, :attr:`posted`, :attr:`edits`, :attr:`requests`,
:attr:`deliveries`, :attr:`links`.
"""

from __future__ import annotations

import asyncio
import datetime
import html
import itertools
import json
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import aiohttp
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

CHAT_ISSUER = "chat@system.gserviceaccount.com"
PROJECT_NUMBER = "123456789012"
#: A message with its cards (Chat's limit).
MAX_MESSAGE_BYTES = 32_000


@cache
def rsa_key(label: str) -> tuple[bytes, bytes]:
    """(private key PEM, self-signed x509 certificate PEM), made once per label."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, label)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return private, cert.public_bytes(serialization.Encoding.PEM)


@cache
def signer(label: str, key_id: str) -> crypt.RSASigner:
    """google-auth's signer for a key (loading a private key is slow: done once)."""
    return crypt.RSASigner.from_string(rsa_key(label)[0], key_id=key_id)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(data).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def google_error(status: int, code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": code, **extra}}


@dataclass
class Recorded:
    """One REST call as the fake received it."""

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any]
    token: str
    status: int = 200


@dataclass
class Delivery:
    """One event POSTed to the app, and what came back."""

    event: dict[str, Any]
    status: int
    answer: Any
    #: Seconds from sending the event to the app's answer.
    latency: float


@dataclass
class Linked:
    """A file a message's card points at (what Chat fetches to show it)."""

    space: str
    message: str
    url: str
    #: "image" for an image widget, "link" for a button that opens the file.
    kind: str
    #: The name the card shows (a link's text; an image's alt text).
    name: str
    #: The text paragraph under it, unescaped ("" when none).
    caption: str = ""


def linked_files(space: str, message: dict[str, Any]) -> list[Linked]:
    """The files the cards of `message` point at, in order."""
    found: list[Linked] = []
    for card in message.get("cardsV2") or []:
        for section in _dict(card.get("card")).get("sections", []):
            widgets = section.get("widgets", [])
            texts = [_dict(w.get("textParagraph")).get("text", "") for w in widgets]
            caption = html.unescape(next((t for t in texts if t), ""))
            for widget in widgets:
                image = _dict(widget.get("image"))
                line = _dict(widget.get("decoratedText"))
                link = _dict(_dict(_dict(line.get("button")).get("onClick")).get("openLink"))
                if image.get("imageUrl"):
                    url, kind, name = image["imageUrl"], "image", str(image.get("altText", ""))
                elif link.get("url"):
                    url, kind, name = link["url"], "link", html.unescape(str(line.get("text")))
                else:
                    continue
                found.append(Linked(space, message["name"], url, kind, name, caption))
    return found


@dataclass
class _Failure:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class FakeGoogleChat:
    """An aiohttp server playing Google (token endpoint, certificates, Chat REST API)."""

    sa_email = "steward@steward-test.iam.gserviceaccount.com"
    chat_kid = "chat-key-1"

    def __init__(self, *, audience: str = PROJECT_NUMBER) -> None:
        self.audience = audience
        self.base_url = ""
        self.sa_private, self.sa_cert = rsa_key("service-account")
        self.chat_private, self.chat_cert = rsa_key("chat-signing")
        #: Every message by name (people's and the app's), edits applied.
        self.messages: dict[str, dict[str, Any]] = {}
        #: Names of the messages the app created (incl. private ones), in order.
        self.posted: list[str] = []
        #: Every edit (REST patch or synchronous UPDATE_MESSAGE): name + new fields.
        self.edits: list[dict[str, Any]] = []
        self.requests: list[Recorded] = []
        self.deliveries: list[Delivery] = []
        #: Every file the app's cards pointed at, in the order the messages came.
        self.links: list[Linked] = []
        #: Access tokens issued and still honoured.
        self.tokens: set[str] = set()
        self.token_requests = 0
        self.certs_requests = 0
        self.spaces: dict[str, dict[str, Any]] = {}
        self.refuse_grant = False
        self._failures: list[_Failure] = []
        self._outage = False
        self._outage_hit: asyncio.Event | None = None
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/token", self._token)
        app.router.add_get("/certs", self._certs)
        app.router.add_get("/v1/spaces", self._list_spaces)
        app.router.add_get("/v1/spaces/{space}", self._get_space)
        app.router.add_post("/v1/spaces/{space}/messages", self._create)
        app.router.add_patch("/v1/spaces/{space}/messages/{message}", self._patch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"
        self._outage_hit = asyncio.Event()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def certs_url(self) -> str:
        return f"{self.base_url}/certs"

    def service_account_info(self) -> dict[str, str]:
        """The JSON key a person downloads from the Cloud console, pointing at this fake."""
        return {
            "type": "service_account",
            "project_id": "steward-test",
            "private_key_id": "sa-key-1",
            "private_key": self.sa_private.decode(),
            "client_email": self.sa_email,
            "client_id": "1000000000001",
            "token_uri": f"{self.base_url}/token",
        }

    def add_space(self, name: str, *, direct: bool, display: str = "") -> dict[str, Any]:
        space = {
            "name": name,
            "type": "DM" if direct else "ROOM",
            "spaceType": "DIRECT_MESSAGE" if direct else "SPACE",
            "singleUserBotDm": direct,
        }
        if display:
            space["displayName"] = display
        self.spaces[name] = space
        return space

    # ------------------------------------------------------------------ test controls

    def rate_limit_next(self, seconds: float) -> None:
        """The next REST call answers 429 RESOURCE_EXHAUSTED with a RetryInfo delay."""
        body = google_error(
            429,
            "RESOURCE_EXHAUSTED",
            "Resource has been exhausted (e.g. check quota).",
            details=[
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{seconds}s"}
            ],
        )
        self._failures.append(_Failure(429, body))

    def error_next(self, status: int, code: str, message: str = "failed") -> None:
        """The next REST call answers `status` with Google's error shape."""
        self._failures.append(_Failure(status, google_error(status, code, message)))

    async def outage(self) -> None:
        """The network path to Google drops: issued tokens are forgotten and the token
        endpoint hangs up on the next request; returns once one has been refused so."""
        assert self._outage_hit is not None
        self.tokens.clear()
        self._outage_hit.clear()
        self._outage = True
        try:
            await asyncio.wait_for(self._outage_hit.wait(), 10)
        finally:
            self._outage = False

    # ------------------------------------------------------------------ tokens Chat signs

    def chat_token(
        self,
        *,
        audience: str | None = None,
        issuer: str = CHAT_ISSUER,
        expires_in: int = 3600,
        forged: bool = False,
        kid: str | None = None,
        **claims: Any,
    ) -> str:
        """A bearer token as Chat sends it. ``forged``: signed with another key under the
        real key id; ``expires_in`` < 0: already expired."""
        key = signer("forger" if forged else "chat-signing", kid or self.chat_kid)
        now = int(time.time())
        payload = {
            "iss": issuer,
            "aud": audience if audience is not None else self.audience,
            "iat": now - 5 if expires_in > 0 else now - 7200,
            "exp": now + expires_in,
            **claims,
        }
        return jwt.encode(key, payload).decode()

    # ------------------------------------------------------------------ events Chat sends

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def _user(self, user: str, name: str | None = None) -> dict[str, Any]:
        return {"name": user, "displayName": name or user.split("/")[-1], "type": "HUMAN"}

    def message_event(
        self,
        space: str,
        user: str,
        text: str,
        *,
        mention: bool = False,
        thread: str | None = None,
        slash: str | None = None,
        user_name: str | None = None,
    ) -> dict[str, Any]:
        """A ``MESSAGE`` event; in a space ``mention`` prefixes ``@Steward`` as Chat does
        (``argumentText`` is the text after it)."""
        sp = self.spaces.get(space) or self.add_space(space, direct=False)
        direct = sp["spaceType"] == "DIRECT_MESSAGE"
        name = f"{space}/messages/{self._new_id('u')}"
        thread_name = thread or f"{space}/threads/{self._new_id('t')}"
        message: dict[str, Any] = {
            "name": name,
            "sender": self._user(user, user_name),
            "createTime": "2026-01-01T00:00:00.000000Z",
            "text": text,
            "thread": {"name": thread_name},
            "space": {"name": space},
        }
        if mention:
            message["text"] = f"@Steward {text}"
            message["argumentText"] = f" {text}"
            message["annotations"] = [
                {
                    "type": "USER_MENTION",
                    "startIndex": 0,
                    "length": 8,
                    "userMention": {
                        "user": {"name": "users/app", "displayName": "Steward", "type": "BOT"},
                        "type": "MENTION",
                    },
                }
            ]
        elif direct:
            message["argumentText"] = text
        if slash is not None:
            message["text"] = f"{slash} {text}".strip()
            message["argumentText"] = f" {text}" if text else ""
            message["slashCommand"] = {"commandId": "1"}
            message["annotations"] = [
                {
                    "type": "SLASH_COMMAND",
                    "startIndex": 0,
                    "length": len(slash),
                    "slashCommand": {
                        "bot": {"name": "users/app", "displayName": "Steward", "type": "BOT"},
                        "type": "INVOKE",
                        "commandName": slash,
                        "commandId": "1",
                    },
                }
            ]
        self.messages[name] = message
        return {
            "type": "MESSAGE",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "space": dict(sp),
            "user": self._user(user, user_name),
            "message": message,
            "common": {"userLocale": "en", "hostApp": "CHAT"},
        }

    def card_clicked(self, message_name: str, value: str, user: str) -> dict[str, Any]:
        """A ``CARD_CLICKED`` on the app's button carrying `value` (function from the card)."""
        message = self.messages[message_name]
        function = "steward.press"
        for card in message.get("cardsV2") or []:
            for section in card["card"].get("sections", []):
                for widget in section.get("widgets", []):
                    for button in widget.get("buttonList", {}).get("buttons", []):
                        action = button["onClick"]["action"]
                        if any(p["value"] == value for p in action.get("parameters", [])):
                            function = action["function"]
        space = message_name.split("/messages/")[0]
        params = [{"key": "value", "value": value}]
        return {
            "type": "CARD_CLICKED",
            "eventTime": f"2026-01-01T00:00:{next(self._ids) % 60:02d}.000000Z",
            "space": dict(self.spaces.get(space) or {"name": space}),
            "user": self._user(user),
            "message": dict(message),
            "action": {"actionMethodName": function, "parameters": params},
            "common": {
                "invokedFunction": function,
                "parameters": {"value": value},
                "hostApp": "CHAT",
            },
        }

    def added_to_space(self, space: str, user: str) -> dict[str, Any]:
        sp = self.spaces.get(space) or self.add_space(space, direct=False)
        return {
            "type": "ADDED_TO_SPACE",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "space": dict(sp),
            "user": self._user(user),
        }

    def removed_from_space(self, space: str, user: str) -> dict[str, Any]:
        return {**self.added_to_space(space, user), "type": "REMOVED_FROM_SPACE"}

    async def post_event(
        self,
        url: str,
        event: dict[str, Any],
        *,
        token: str | None = "",
        raw: bytes | None = None,
        authorization: str | None = None,
    ) -> Delivery:
        """POST `event` to the app as Chat does (bearer token: a valid one unless given;
        None sends none; `authorization` replaces the whole header). The synchronous
        answer is applied: a message for MESSAGE / ADDED_TO_SPACE, a card update for
        CARD_CLICKED."""
        bearer = self.chat_token() if token == "" else token
        headers = {"Content-Type": "application/json", "User-Agent": "Google-Dynamite"}
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        if authorization is not None:
            headers["Authorization"] = authorization
        data = raw if raw is not None else json.dumps(event).encode()
        t0 = time.monotonic()
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=data, headers=headers) as response:
                text = await response.text()
                latency = time.monotonic() - t0
                status = response.status
        try:
            answer: Any = json.loads(text) if text else None
        except ValueError:
            answer = text
        delivery = Delivery(event, status, answer, latency)
        self.deliveries.append(delivery)
        if status == 200 and isinstance(answer, dict) and answer:
            self._apply_answer(event, answer)
        return delivery

    def _apply_answer(self, event: dict[str, Any], answer: dict[str, Any]) -> None:
        kind = _dict(answer.get("actionResponse")).get("type")
        if event.get("type") == "CARD_CLICKED" and kind == "UPDATE_MESSAGE":
            name = event["message"]["name"]
            fields = {k: answer[k] for k in ("text", "cardsV2") if k in answer}
            self.messages[name].update(fields)
            self.edits.append({"name": name, "via": "response", **fields})
        elif kind in (None, "NEW_MESSAGE") and ("text" in answer or "cardsV2" in answer):
            space = event["space"]["name"]
            thread = _dict(_dict(event.get("message")).get("thread")).get("name")
            self._store(space, {k: answer[k] for k in ("text", "cardsV2") if k in answer}, thread)

    # ------------------------------------------------------------------ HTTP handlers

    async def _token(self, request: web.Request) -> web.StreamResponse:
        """The JWT-bearer grant: the assertion must be signed by the service account's key."""
        self.token_requests += 1
        if self._outage:
            assert self._outage_hit is not None
            self._outage_hit.set()
            if request.transport is not None:
                request.transport.abort()  # the connection drops without an answer
            return web.Response(status=503)
        form = await request.post()
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return _json({"error": "unsupported_grant_type"}, 400)
        try:
            claims = jwt.decode(str(form.get("assertion", "")), certs=self.sa_cert, audience=None)
        except ValueError as exc:
            return _json({"error": "invalid_grant", "error_description": str(exc)}, 400)
        if self.refuse_grant or claims.get("iss") != self.sa_email:
            refusal = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            return _json(refusal, 400)
        if "chat.bot" not in str(claims.get("scope", "")):
            return _json({"error": "invalid_scope", "error_description": "chat.bot missing"}, 400)
        token = f"ya29.fake-{next(self._ids)}"
        self.tokens.add(token)
        return _json({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    async def _certs(self, request: web.Request) -> web.Response:
        self.certs_requests += 1
        return _json(
            {self.chat_kid: self.chat_cert.decode()},
            headers={"Cache-Control": "public, max-age=3600"},
        )

    async def _authorized(self, request: web.Request, body: dict[str, Any]) -> web.Response | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        record = Recorded(request.method, request.path, dict(request.query), body, token)
        self.requests.append(record)
        if scheme != "Bearer" or token not in self.tokens:
            record.status = 401
            return _json(
                google_error(
                    401,
                    "UNAUTHENTICATED",
                    "Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential.",
                ),
                401,
            )
        if self._failures:
            failure = self._failures.pop(0)
            record.status = failure.status
            return _json(failure.body, failure.status, failure.headers)
        return None

    async def _list_spaces(self, request: web.Request) -> web.Response:
        refused = await self._authorized(request, {})
        if refused is not None:
            return refused
        size = int(request.query.get("pageSize", "100"))
        return _json({"spaces": list(self.spaces.values())[:size]})

    async def _get_space(self, request: web.Request) -> web.Response:
        refused = await self._authorized(request, {})
        if refused is not None:
            return refused
        name = f"spaces/{request.match_info['space']}"
        if name not in self.spaces:
            return _json(google_error(404, "NOT_FOUND", "Space not found."), 404)
        return _json(self.spaces[name])

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = await self._authorized(request, body)
        if refused is not None:
            return refused
        space = f"spaces/{request.match_info['space']}"
        if space not in self.spaces:
            return _json(google_error(404, "NOT_FOUND", f"Space {space} not found."), 404)
        if len(body.get("text", "")) > 4096:
            return _json(google_error(400, "INVALID_ARGUMENT", "Message text too long."), 400)
        if len(json.dumps(body).encode()) > MAX_MESSAGE_BYTES:
            return _json(google_error(400, "INVALID_ARGUMENT", "Message too large."), 400)
        thread = _dict(body.get("thread")).get("name")
        if thread and request.query.get("messageReplyOption") is None:
            thread = None  # without a reply option Chat starts a new thread
        return _json(self._store(space, body, thread))

    def _store(self, space: str, body: dict[str, Any], thread: str | None) -> dict[str, Any]:
        name = f"{space}/messages/{self._new_id('b')}"
        message = {
            **body,
            "name": name,
            "sender": {"name": "users/app", "displayName": "Steward", "type": "BOT"},
            "createTime": "2026-01-01T00:00:00.000000Z",
            "thread": {"name": thread or f"{space}/threads/{self._new_id('t')}"},
            "space": {"name": space},
        }
        self.messages[name] = message
        self.posted.append(name)
        self.links.extend(linked_files(space, message))
        return message

    async def _patch(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = await self._authorized(request, body)
        if refused is not None:
            return refused
        name = f"spaces/{request.match_info['space']}/messages/{request.match_info['message']}"
        mask = [m for m in request.query.get("updateMask", "").split(",") if m]
        if not mask:
            return _json(google_error(400, "INVALID_ARGUMENT", "updateMask is required."), 400)
        message = self.messages.get(name)
        if message is None or _dict(message.get("sender")).get("type") != "BOT":
            return _json(google_error(404, "NOT_FOUND", f"Message {name} not found."), 404)
        fields = {k: body.get(k, [] if k == "cardsV2" else "") for k in mask}
        message.update(fields)
        self.edits.append({"name": name, "via": "patch", **fields})
        return _json(message)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
