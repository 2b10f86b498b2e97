"""Who may use the local web chat: a secret token per data dir, exchanged for a cookie.

Why: the web chat acts as the owner. Its buttons approve risky commands and its
`/pair CODE` lets strangers in, so listening on 127.0.0.1 is not protection enough:
every local process can reach loopback, including one the agent started (once,
a background script read a pending approval id from the data dir and pressed
Approve over the WebSocket 0.10 s after the request). So, like Jupyter, Steward
keeps a random token per data dir and `steward run` prints a login URL with it on
its terminal. Opening that URL sets an HttpOnly, SameSite=Strict cookie and
redirects to the same page without the token, so it does not stay in the address
bar. Every route except `/healthz` and the platforms' webhooks (they verify their
own signatures) needs one of:

* the cookie (what a browser uses after the login URL),
* the token itself (``?token=…`` or ``Authorization: Bearer …``: for scripts of the
  owner, who can read the token file),
* when ``STEWARD_WEB_PASSWORD`` is set, that password (HTTP Basic, user ``owner``).

The token is kept by `memory/login_token.py` (``<data dir>/secrets/web-token``);
`bot/` reads or makes it and hands it to `WebLogin`, which stores nothing. A new
token (`steward login --new`) logs out every browser logged in with the old one.

An authenticated request carries ``request[AUTHENTICATED]``; the web chat refuses a
WebSocket without it, so no route wiring mistake can give a stranger an owner's socket.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import hdrs, web

log = structlog.get_logger(__name__)

#: The request key set once a request is authenticated (its value: who, "owner").
AUTHENTICATED = web.RequestKey("steward.web_login", str)
#: A browser stays logged in this long (and until the token changes).
COOKIE_MAX_AGE = 30 * 24 * 3600

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_websocket_upgrade(request: web.Request) -> bool:
    return request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"


class WebLogin:
    """Checks a request's credentials and turns a valid ``?token=`` into the cookie."""

    def __init__(self, token: str, *, password: str = "") -> None:
        self._token = token
        self._password = password
        fingerprint = hashlib.sha256(token.encode()).hexdigest()[:12]
        #: Cookies are per host, not per port: naming the cookie after the token keeps two
        #: Stewards on one machine (two data dirs) from logging each other out.
        self.cookie_name = f"steward_{fingerprint}"
        # The cookie is derived, not the token: a cookie read out of a browser profile
        # cannot be turned back into the login URL.
        self._cookie_value = hmac.new(token.encode(), b"steward web login", "sha256").hexdigest()
        self._basic = (
            "Basic " + base64.b64encode(f"owner:{password}".encode()).decode() if password else ""
        )

    def login_url(self, base: str) -> str:
        """What a person opens once: ``http://127.0.0.1:8765/?token=…``."""
        return f"{base.rstrip('/')}/?token={self._token}"

    def credential(self, request: web.Request) -> str | None:
        """Which valid credential the request carries ("cookie", "token", "password"), if any."""
        cookie = request.cookies.get(self.cookie_name)
        if cookie is not None and _same(cookie, self._cookie_value):
            return "cookie"
        if self.token_in_query(request):
            return "token"
        authorization = request.headers.get(hdrs.AUTHORIZATION, "")
        if authorization.startswith("Bearer ") and _same(authorization[7:].strip(), self._token):
            return "token"
        if self._basic and _same(authorization, self._basic):
            return "password"
        return None

    def token_in_query(self, request: web.Request) -> bool:
        given = request.query.get("token")
        return given is not None and _same(given, self._token)

    def middleware(
        self, public: Callable[[web.Request], bool]
    ) -> Callable[..., Awaitable[web.StreamResponse]]:
        """Every route but the `public` ones needs a credential; refused before any handler
        runs, so a WebSocket without one is answered 401 and never upgraded."""

        @web.middleware
        async def login(request: web.Request, handler: Handler) -> web.StreamResponse:
            if public(request):
                return await handler(request)
            how = self.credential(request)
            if how is None:
                log.warning(
                    "web.login_refused",
                    path=request.path,
                    remote=request.remote,
                    websocket=is_websocket_upgrade(request),
                    wrong_token="token" in request.query,
                )
                return self.refusal()
            request[AUTHENTICATED] = "owner"
            if (
                self.token_in_query(request)
                and request.method == hdrs.METH_GET
                and not is_websocket_upgrade(request)
            ):
                return self.exchange(request)
            return await handler(request)

        return login

    def exchange(self, request: web.Request) -> web.Response:
        """Set the cookie and send the browser to the same URL without the token."""
        rest = [(k, v) for k, v in request.query.items() if k != "token"]
        location = request.rel_url.with_query(rest or None)
        response = web.Response(
            status=303,
            headers={
                hdrs.LOCATION: str(location),
                hdrs.CACHE_CONTROL: "no-store",
                "Referrer-Policy": "no-referrer",
            },
        )
        secure = request.secure or request.headers.get("X-Forwarded-Proto", "") == "https"
        response.set_cookie(
            self.cookie_name,
            self._cookie_value,
            max_age=COOKIE_MAX_AGE,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=secure,
        )
        log.info("web.login", path=request.path)
        return response

    def refusal(self) -> web.Response:
        """401 with the way in: the login URL (and the password prompt when one is set)."""
        text = (
            "Steward's web chat needs a login, even on this machine: open the login URL that "
            "`steward run` printed in its terminal (http://HOST:PORT/?token=...), or run "
            "`steward login` to print it again."
        )
        if self._password:
            text += " Or log in with user 'owner' and STEWARD_WEB_PASSWORD."
            challenge = 'Basic realm="Steward", charset="UTF-8"'
        else:
            challenge = 'Bearer realm="Steward"'
        return web.Response(
            status=401,
            text=text,
            headers={hdrs.WWW_AUTHENTICATE: challenge, hdrs.CACHE_CONTROL: "no-store"},
        )


def _same(given: str, expected: str) -> bool:
    """Constant-time comparison (a timing difference must not spell the token out)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())
