"""A stdio MCP server in its sandbox, judged by what it actually got: the fake server's
`peek` tool tries to read Steward's data dir (a canary file, the policy, another
server's state), the config file, Steward's environment (a canary variable), and to
reach a canary HTTP server that is not in its `network` list, directly and through its
proxy. The canary server counts every request that arrives."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.cli.mcp import deployment
from core.mcp import McpHub, State
from tests.fakes import mcp_servers

SECRET = "canary-7f3a9e"


class Canary:
    """An HTTP server on 127.0.0.1 that records each request it gets."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Canary:
        async def record(request: web.Request) -> web.Response:
            self.hits.append(request.path)
            return web.Response(text="canary answered")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/from-mcp"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def canaries() -> AsyncIterator[tuple[Canary, Canary]]:
    listed, unlisted = await Canary().start(), await Canary().start()
    yield listed, unlisted
    await listed.stop()
    await unlisted.stop()


async def peek(hub: McpHub, server: str, **args: Any) -> dict[str, Any]:
    text = await hub.call(f"mcp__{server}__peek", args, cap=100_000)
    assert isinstance(text, str)
    return dict(json.loads(text))


async def test_a_stdio_server_gets_nothing_of_stewards_and_only_its_listed_hosts(
    settings_for: Callable,
    tmp_path: Path,
    canaries: tuple[Canary, Canary],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed, unlisted = canaries
    monkeypatch.setenv("MCP_CANARY_SECRET", SECRET)  # in Steward's own environment
    config = mcp_servers.write(
        tmp_path / "mcp.toml",
        mcp_servers.stdio(
            "fake", env={"GIVEN": "by the owner"}, network=[f"127.0.0.1:{listed.port}"]
        ),
        mcp_servers.stdio("other"),
    )
    # egress_allow lets loopback through the egress rules: only the server's own
    # `network` list can then keep the unlisted canary out.
    settings = settings_for(None, mcp_config=str(config), egress_allow="127.0.0.1")
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True)
    (data / "canary.txt").write_text(SECRET)
    (data / "policy.toml").write_text(f"# {SECRET}\n")
    planner, egress = deployment(settings)
    hub = McpHub(settings.mcp, plan=planner, egress=egress)
    try:
        await hub.start()
        assert {s.state for s in hub.servers()} == {State.CONNECTED}
        assert (
            await hub.call("mcp__other__write_note", {"text": SECRET}, cap=100) == f"noted {SECRET}"
        )
        other_state = data / "mcp" / "other"
        assert (other_state / "notes.txt").read_text() == f"{SECRET}\n"
        report = await peek(
            hub,
            "fake",
            paths=[
                str(data),
                str(data / "canary.txt"),
                str(data / "policy.toml"),
                str(other_state),
                str(other_state / "notes.txt"),
                str(config),
                str(settings.workspace),
                "/proc/1/environ",
            ],
            urls=[f"http://127.0.0.1:{listed.port}/listed", unlisted.url],
        )
    finally:
        await hub.stop()

    shown = json.dumps(report)
    assert SECRET not in shown  # nothing it read, listed or was given holds the canary
    assert report[str(data)] == "ok: ['mcp']"  # the data dir: only the way to its own state
    for path in (
        data / "canary.txt",
        data / "policy.toml",
        other_state,
        other_state / "notes.txt",
        config,
    ):
        assert report[str(path)].startswith("failed:"), (path, report[str(path)])
    assert report[str(settings.workspace)].startswith("failed:")
    assert report["/proc/1/environ"].startswith("failed:")
    env = report["env"]
    assert env["GIVEN"] == "by the owner"
    assert "MCP_CANARY_SECRET" not in env and not any(k.startswith("STEWARD_") for k in env)
    assert set(env) <= {
        "GIVEN",
        "HOME",
        "LANG",
        "PATH",
        "PWD",
        "SHLVL",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "_",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    }, sorted(env)
    assert report["cwd"] == str(data / "mcp" / "fake") == env["HOME"]
    # The network: nothing direct; through the proxy, the listed host only.
    assert report[f"direct http://127.0.0.1:{listed.port}/listed"].startswith("failed:")
    assert report[f"direct {unlisted.url}"].startswith("failed:")
    assert report[f"proxied http://127.0.0.1:{listed.port}/listed"] == "ok: canary answered"
    assert report[f"proxied {unlisted.url}"].startswith("failed:")
    assert listed.hits == ["/listed"]
    assert unlisted.hits == []


async def test_its_state_folder_persists_and_a_server_without_network_has_none(
    settings_for: Callable, tmp_path: Path, canaries: tuple[Canary, Canary]
) -> None:
    _listed, unlisted = canaries
    config = mcp_servers.write(tmp_path / "mcp.toml", mcp_servers.stdio("fake"))
    settings = settings_for(None, mcp_config=str(config), egress_allow="127.0.0.1")
    planner, egress = deployment(settings)
    hub = McpHub(settings.mcp, plan=planner, egress=egress)
    try:
        await hub.start()
        await hub.call("mcp__fake__write_note", {"text": "first run"}, cap=100)
        await hub.stop()
        await hub.start()
        report = await peek(hub, "fake", paths=["notes.txt"], urls=[unlisted.url])
    finally:
        await hub.stop()
    assert report["notes.txt"] == "ok: first run\n"
    assert "HTTP_PROXY" not in report["env"]
    assert report[f"direct {unlisted.url}"].startswith("failed:")
    assert report[f"proxied {unlisted.url}"].startswith("failed:")
    assert unlisted.hits == []


def test_no_sandbox_here_no_stewards_files_and_off_means_unsandboxed(tmp_path: Path) -> None:
    """Where bubblewrap cannot work a stdio server does not start (unless the owner set
    sandbox = "off"); a path inside the data dir or a config file is never given."""
    from config.mcp import McpServer
    from core.mcp import NotLaunchable, plan
    from core.sandbox import Setup

    data = tmp_path / "data"
    data.mkdir()
    server = McpServer(
        "fake", "x.toml", "stdio", command=sys.executable, args=(str(mcp_servers.STDIO_FAKE),)
    )
    with pytest.raises(NotLaunchable, match="no OS sandbox on this machine"):
        plan(
            server,
            setup=Setup("auto", None, fallback="bwrap is missing"),
            data_dir=data,
            hidden=[data],
        )
    off = plan(server, setup=Setup("off", None), data_dir=data, hidden=[data])
    assert off.sandbox is None and off.grant.unsandboxed
    assert off.env == {"PATH": off.env["PATH"], "HOME": str(off.folder), "LANG": "C.UTF-8"}
    (data / "shared").mkdir()
    inside = McpServer("fake", "x.toml", "stdio", command="/bin/cat", args=(str(data / "shared"),))
    with pytest.raises(NotLaunchable, match="inside Steward's own data or settings"):
        plan(inside, setup=Setup("off", None), data_dir=data, hidden=[data])
