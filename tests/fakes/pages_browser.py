"""Pages for the browser tests, served on 127.0.0.1, and a canary that counts connections.

`Site` serves:
- `/`: a heading a button changes, a field whose text a script echoes into the page,
  a login form (user, password) posting to `/login`, links to a file download, to an
  `away` page on another port (a host not opened), to a redirect to the canary;
- `/login`: "Welcome <user>" (every POST is recorded in `posts`);
- `/file`: a text file sent as a download;
- `/probe`: a page that tries to reach the canary every way a page can: an image, a
  script, a stylesheet, an iframe, fetch, XHR, a WebSocket, a beacon, by 127.0.0.1,
  localhost and [::1];
- `/hop`: a redirect to the canary.

`Canary` is a TCP listener on every interface that records each connection (a page
reaching it at all is the failure, whatever it sent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

HOME = """<!doctype html>
<html><head><title>Steward test page</title>
<script>function say(id, text) { document.getElementById(id).textContent = text; }</script>
</head><body>
<h1 id="greeting">Hello from the test page</h1>
<button id="change" onclick="say('greeting', 'The button was pressed')">Change it</button>
<p>Echo: <span id="echo"></span></p>
<label>Note <input id="note" name="note" oninput="say('echo', this.value)"></label>
<form id="login" name="login" action="/login" method="post">
  <label>User <input name="user"></label>
  <label>Password <input type="password" name="password"></label>
  <button>Sign in</button>
</form>
<a href="/file">Get the file</a>
<a href="AWAY/elsewhere">Go away</a>
<a href="/hop">Hop</a>
</body></html>
"""

PROBE = """<!doctype html>
<html><head><title>Probe</title>
<link rel="stylesheet" href="http://127.0.0.1:PORT/style.css">
<script src="http://localhost:PORT/script.js"></script>
</head><body>
<p id="status">probing</p>
<img src="http://127.0.0.1:PORT/pixel.png">
<img src="http://[::1]:PORT/pixel6.png">
<iframe src="http://127.0.0.1:PORT/frame"></iframe>
<script>
const port = PORT;
const tries = [
  fetch(`http://127.0.0.1:${port}/fetch`, {mode: 'no-cors'}).catch(() => 'refused'),
  fetch(`http://localhost:${port}/fetch2`, {mode: 'no-cors'}).catch(() => 'refused'),
  new Promise((done) => {
    const x = new XMLHttpRequest();
    x.onloadend = () => done('xhr');
    x.open('GET', `http://127.0.0.1:${port}/xhr`);
    x.send();
  }),
  new Promise((done) => {
    try {
      const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
      ws.onerror = ws.onclose = () => done('ws');
    } catch (e) { done('ws'); }
  }),
];
navigator.sendBeacon(`http://127.0.0.1:${port}/beacon`, 'x');
Promise.all(tries).then(() => {
  document.getElementById('status').textContent = 'probe finished';
});
</script>
</body></html>
"""


@dataclass
class Canary:
    """A TCP listener that records every connection it gets."""

    port: int = 0
    seen: list[bytes] = field(default_factory=list)


@asynccontextmanager
async def canary() -> AsyncIterator[Canary]:
    found = Canary()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        found.seen.append(b"")
        try:
            found.seen[-1] = await asyncio.wait_for(reader.read(4096), 1)
        except (TimeoutError, ConnectionError):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nyes")
        writer.close()

    server = await asyncio.start_server(accept, "0.0.0.0", 0)
    found.port = server.sockets[0].getsockname()[1]
    try:
        yield found
    finally:
        server.close()


@dataclass
class Site:
    url: str = ""
    away_url: str = ""
    #: Every path requested on the site, in order.
    hits: list[str] = field(default_factory=list)
    #: The form fields of each POST to /login.
    posts: list[dict[str, str]] = field(default_factory=list)
    #: Paths requested on the away server (it should see none).
    away_hits: list[str] = field(default_factory=list)


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@asynccontextmanager
async def site(canary_port: int) -> AsyncIterator[Site]:
    made = Site()

    async def away(request: web.Request) -> web.Response:
        made.away_hits.append(request.path)
        return web.Response(text="<title>Away</title>away", content_type="text/html")

    away_app = web.Application()
    away_app.router.add_get("/{tail:.*}", away)
    away_runner, away_port = await _serve(away_app)
    made.away_url = f"http://127.0.0.1:{away_port}"

    async def home(_: web.Request) -> web.Response:
        return web.Response(text=HOME.replace("AWAY", made.away_url), content_type="text/html")

    async def login(request: web.Request) -> web.Response:
        form = await request.post()
        made.posts.append({k: str(v) for k, v in form.items()})
        user = form.get("user", "")
        return web.Response(
            text=f"<title>Signed in</title><p>Welcome {user}</p>", content_type="text/html"
        )

    async def file(_: web.Request) -> web.Response:
        return web.Response(
            body=b"quarterly numbers\n",
            headers={"Content-Disposition": 'attachment; filename="report.txt"'},
            content_type="text/plain",
        )

    async def probe(_: web.Request) -> web.Response:
        return web.Response(text=PROBE.replace("PORT", str(canary_port)), content_type="text/html")

    async def hop(_: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{canary_port}/hopped")

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        made.hits.append(request.path)
        response: web.StreamResponse = await handler(request)
        return response

    app = web.Application(middlewares=[record])
    app.router.add_get("/", home)
    app.router.add_post("/login", login)
    app.router.add_get("/file", file)
    app.router.add_get("/probe", probe)
    app.router.add_get("/hop", hop)
    runner, port = await _serve(app)
    made.url = f"http://127.0.0.1:{port}"
    try:
        yield made
    finally:
        await runner.cleanup()
        await away_runner.cleanup()
