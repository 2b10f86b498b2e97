"""Attachments a platform fetches from Steward by URL instead of taking an upload.

Why: LINE's image message carries only a URL (and bots cannot send other files), and
Google Chat's app cannot upload (its attachment upload needs a person's own
credentials), though its cards show an image from a URL. For those, the file is kept
by the channel's store for a week under an unguessable token and served at
`GET /files/<channel>/<token>/<name>` under `public_url`, outside the web chat's
login (the token is the permission). Without a `public_url` nothing can fetch it,
and the adapter says so in the message instead.
"""

from __future__ import annotations

from urllib.parse import quote

import structlog
from aiohttp import web

from core.events import Attachment
from memory.channel_store import ChannelStore

log = structlog.get_logger("steward.adapters.published")

#: Types shown in place; every other file is served as a download.
INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


class PublishedFiles:
    """One channel's files served by URL (see the module docstring)."""

    def __init__(self, channel: str, store: ChannelStore, public_url: str) -> None:
        self.channel = channel
        self.store = store
        self.public_url = public_url.strip().rstrip("/")
        self.route = f"/files/{channel}/{{token}}/{{name}}"

    @property
    def available(self) -> bool:
        """Whether a platform can fetch from here at all (a public URL and a data dir)."""
        return bool(self.public_url) and self.store.folder is not None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(self.route, self._serve)

    async def publish(self, attachment: Attachment) -> str | None:
        """The URL the platform fetches `attachment` from; None when not `available`."""
        if not self.available:
            return None
        token = await self.store.put_file(attachment.data, attachment.name, attachment.mime)
        if token is None:
            return None
        name = quote(attachment.name.replace("/", "_") or "file", safe="")
        return f"{self.public_url}/files/{self.channel}/{token}/{name}"

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        found = await self.store.get_file(request.match_info["token"])
        if found is None:
            log.info("published.unknown", channel=self.channel, remote=request.remote)
            raise web.HTTPNotFound(text="no such file (or it has expired)")
        data, name, mime = found
        # Served from Steward's own address (where the web chat logs in): only plain
        # pictures are shown in place; anything else (an SVG or HTML page could run
        # script there) is a download, sandboxed even if a browser shows it anyway.
        inline = mime.split(";")[0].strip().lower() in INLINE_TYPES
        return web.Response(
            body=data,
            headers={
                # As a header, not `content_type=`: aiohttp refuses a type with a charset.
                "Content-Type": mime or "application/octet-stream",
                "Content-Disposition": (
                    f"{'inline' if inline else 'attachment'}; filename*=UTF-8''{quote(name)}"
                ),
                "Content-Security-Policy": "sandbox; default-src 'none'",
                "Cache-Control": "private, max-age=3600",
                "X-Content-Type-Options": "nosniff",
            },
        )
