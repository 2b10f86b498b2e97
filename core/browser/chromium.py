"""Chromium for one task: started through the one spawn point, inside the OS sandbox.

Why this way (and not Playwright's own `launch`): every process the agent causes starts
in `core.sandbox.launch`, with the sandbox, the environment allowlist, the limits and
the egress proxy (core/sandbox/spawn.py); a browser that Playwright's driver started
itself would be a door around all of them. So Steward starts Chromium there:

- its sandbox root (the one folder it can write) is a private temporary folder holding
  its profile and its downloads, not the workspace: a page, even one that broke out of
  the renderer, sees the system folders read-only, an empty home and /tmp, and none of
  Steward's data dir, config, checkout or the person's workspace;
- its network is the sandbox's own empty namespace with one way out, the egress proxy
  (a network grant with no host list: any host the egress rules allow). Chromium is
  told to use it for everything (`--proxy-server`, loopback included:
  `--proxy-bypass-list=<-loopback>`), and nothing else exists in there to connect to,
  so every request a page makes (subresources, redirects, fetch/XHR, WebSockets, even
  WebRTC or DNS tricks) meets the same rules as web_fetch: loopback, private,
  link-local and metadata addresses refused unless `egress_allow` lists them, and
  Steward's own web chat and model server refused always;
- Chromium's own sandbox is off (`--no-sandbox`): it needs user namespaces or a setuid
  helper, neither of which exists inside bubblewrap, which is the sandbox here;
- DevTools run over a pipe, relayed to Playwright on a private Unix socket (relay.py).

Killing the launch's process group at the end stops bubblewrap, and with it the
sandbox's PID namespace and every Chromium process in it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from core.browser.relay import CdpRelay
from core.egress import EgressPolicy
from core.sandbox import Grant, Sandbox, launch
from core.sandbox import spawn as _spawn
from core.sandbox.bwrap import PROXY_PORT
from memory.stopping import cancel_and_wait

log = structlog.get_logger("steward.browser")

#: Chromium's command-line switches; the profile folder and the proxy are added per run.
FLAGS = (
    "--headless",
    "--no-sandbox",  # bubblewrap is the sandbox (module docstring)
    "--remote-debugging-pipe",
    f"--proxy-server=http://127.0.0.1:{PROXY_PORT}",
    "--proxy-bypass-list=<-loopback>",  # loopback through the proxy too: it decides
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--disable-quic",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-breakpad",
    "--mute-audio",
    "--hide-scrollbars",
    "--password-store=basic",
    "--use-mock-keychain",
)
#: The shell line that gives Chromium Steward's pipes as its DevTools fds 3 and 4.
PIPE_SHELL = 'exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>/dev/null'
#: Lines of Chromium's stderr kept for an error message when it does not start.
STDERR_LINES = 30


@dataclass(slots=True)
class Chromium:
    """A running Chromium: where to connect, where its downloads land, what it said."""

    endpoint: str
    downloads: Path
    pid: int
    stderr: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_LINES)
    )

    def said(self) -> str:
        """Chromium's last lines on stderr (for a failure to start)."""
        return "\n".join(self.stderr)


def argv(binary: str, profile: str) -> list[str]:
    return [
        "/bin/sh",
        "-c",
        PIPE_SHELL,
        binary,
        *FLAGS,
        f"--user-data-dir={profile}",
        "about:blank",
    ]


@contextlib.asynccontextmanager
async def running(
    binary: str, *, sandbox: Sandbox, egress: EgressPolicy
) -> AsyncIterator[Chromium]:
    """Chromium started as the module docstring says; stopped, with its folders removed,
    on leaving."""
    root, private = await asyncio.to_thread(_folders)
    try:
        await asyncio.to_thread(_prepare, root, sandbox)
        # The sandbox of a command, with the private folder in the workspace's place.
        boxed = dataclasses.replace(sandbox, workspace=Path(root), state_dir=None)
        async with launch(
            argv(binary, f"{root}/profile"),
            workspace=Path(root),
            sandbox=boxed,
            grant=Grant(network=True),
            egress=egress,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        ) as started:
            process = started.process
            assert process.stdin is not None and process.stdout is not None
            chromium = Chromium("", Path(root) / "downloads", process.pid)
            reading = asyncio.create_task(_keep_stderr(process.stderr, chromium))
            relay = CdpRelay(process.stdin, process.stdout)
            try:
                chromium.endpoint = await relay.start(os.path.join(private, "cdp.sock"))
                log.info("browser.started", pid=process.pid)
                yield chromium
            finally:
                await relay.stop()
                await cancel_and_wait(reading)
    finally:
        _spawn.forget_guard(root)  # the root is removed below
        await asyncio.to_thread(shutil.rmtree, root, True)
        await asyncio.to_thread(shutil.rmtree, private, True)
        log.info("browser.stopped")


def _folders() -> tuple[str, str]:
    """(the sandbox root, the relay's folder: never inside it), both private to Steward."""
    root = os.path.realpath(tempfile.mkdtemp(prefix="steward-browser-"))
    return root, tempfile.mkdtemp(prefix="steward-cdp-")


def _prepare(root: str, sandbox: Sandbox) -> None:
    """The profile and downloads folders, owned by the user Chromium runs as."""
    for name in ("profile", "downloads"):
        os.mkdir(os.path.join(root, name), 0o700)
    if sandbox.user is not None:  # Steward is root: Chromium runs as the sandbox user
        for path in (root, f"{root}/profile", f"{root}/downloads"):
            os.chown(path, sandbox.user.uid, sandbox.user.gid)


async def _keep_stderr(stream: asyncio.StreamReader | None, chromium: Chromium) -> None:
    """Drain Chromium's stderr (a full pipe would stop it), keeping its last lines."""
    if stream is None:
        return
    with contextlib.suppress(ConnectionError, ValueError):
        while line := await stream.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if "dbus" not in text:  # no D-Bus in the sandbox: noise, not the reason
                chromium.stderr.append(text[:300])
