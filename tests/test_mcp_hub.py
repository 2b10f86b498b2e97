"""The MCP hub against real servers: the stdio fake started in its sandbox by Steward,
the HTTP fake over streamable HTTP. Tools offered with their schemas, results (text,
images), a tool list that changes, a crash reported once with its tools withdrawn and
retried with backoff until it is back, a call that times out, a server that dies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from bot.cli.mcp import deployment
from config.settings import load_settings
from core.mcp import McpHub, State
from core.tools.base import ToolError, ToolOutput
from tests.conftest import make_env
from tests.fakes import mcp_servers
from tests.kit import until


def hub_for(settings: Any, **options: Any) -> McpHub:
    planner, egress = deployment(settings)
    return McpHub(settings.mcp, plan=planner, egress=egress, **options)


@pytest.fixture
def configure(settings_for: Callable, tmp_path: Path) -> Callable[..., Any]:
    """Settings whose STEWARD_MCP_CONFIG file declares the given tables."""

    def build(*tables: str, **overrides: Any) -> Any:
        path = mcp_servers.write(tmp_path / "mcp.toml", *tables)
        return settings_for(None, mcp_config=str(path), **overrides)

    return build


@pytest.fixture
async def running() -> AsyncIterator[list[McpHub]]:
    hubs: list[McpHub] = []
    yield hubs
    for hub in hubs:
        await hub.stop()


async def test_stdio_tools_are_offered_with_their_schemas_and_results(
    configure: Callable, running: list[McpHub]
) -> None:
    hub = hub_for(configure(mcp_servers.stdio("fake")))
    running.append(hub)
    await hub.start()
    [status] = hub.servers()
    assert status.state == State.CONNECTED, status.detail
    names = sorted(t.name for t in hub.tools())
    assert names == [
        f"mcp__fake__{n}"
        for n in ("crash", "grow", "lookup", "peek", "picture", "wait", "write_note")
    ]
    lookup = next(t for t in hub.tools() if t.name == "mcp__fake__lookup")
    assert lookup.parameters["type"] == "object"
    assert lookup.parameters["properties"]["query"]["type"] == "string"
    assert "Look something up." in lookup.description and "`fake`" in lookup.description
    assert hub.find("mcp__fake__lookup")[0].read_only  # type: ignore[index]
    assert not hub.find("mcp__fake__write_note")[0].read_only  # type: ignore[index]

    assert await hub.call("mcp__fake__lookup", {"query": "q"}, cap=1000) == "found q"
    picture = await hub.call("mcp__fake__picture", {}, cap=1000)
    assert isinstance(picture, ToolOutput)
    [file] = picture.attachments
    assert file.mime == "image/png" and file.data.startswith(b"\x89PNG")
    assert picture.images == (file,)
    assert "picture-1.png" in picture.text

    big = await hub.call("mcp__fake__picture", {"padding": 3_000_000}, cap=1000)
    assert (
        isinstance(big, ToolOutput) and len(big.attachments[0].data) == len(file.data) + 3_000_000
    )

    long = await hub.call("mcp__fake__lookup", {"query": "x" * 500}, cap=200)
    assert isinstance(long, str) and "[output cut:" in long


async def test_a_tool_list_that_changes_is_read_again(
    configure: Callable, running: list[McpHub]
) -> None:
    hub = hub_for(configure(mcp_servers.stdio("fake")))
    running.append(hub)
    await hub.start()
    assert "mcp__fake__extra" not in {t.name for t in hub.tools()}
    assert await hub.call("mcp__fake__grow", {}, cap=1000) == "grown"
    await until(lambda: "mcp__fake__extra" in {t.name for t in hub.tools()}, 10, "the new tool")
    assert await hub.call("mcp__fake__extra", {}, cap=1000) == "extra here"


async def test_a_crash_is_reported_once_withdrawn_and_retried_until_it_is_back(
    configure: Callable, running: list[McpHub], tmp_path: Path
) -> None:
    settings = configure(mcp_servers.stdio("fake"))
    hub = hub_for(settings, retry_first=0.05, retry_max=0.2)
    running.append(hub)
    with capture_logs() as logs:
        await hub.start()
        with pytest.raises(ToolError) as crashed:
            await hub.call("mcp__fake__crash", {}, cap=1000)
        said = str(crashed.value)
        assert "exited with code 3" in said and "crashing on purpose" in said
        assert "withdrawn until it is back" in said
        assert hub.tools() == ()  # gone before the model's next call
        [status] = hub.servers()
        # It keeps failing to start (it refuses while `crashed` is there), retried...
        await until(lambda: status.failures >= 3, 60, "several failed restarts")
        assert status.state in (State.FAILED, State.STARTING)
        assert "refusing to start" in status.detail
        assert hub.tools() == ()
        # ...until what kept it down is gone: then it is back, with its tools.
        (settings.data_dir / "mcp" / "fake" / "crashed").unlink()
        await until(lambda: status.state == State.CONNECTED, 60, "the server back")
    assert await hub.call("mcp__fake__lookup", {"query": "again"}, cap=1000) == "found again"
    down = [e for e in logs if e["event"] == "mcp.server_down"]
    assert len(down) == 1 and down[0]["log_level"] == "warning"  # reported once
    assert [e["event"] for e in logs].count("mcp.server_back") == 1


async def test_a_call_that_takes_too_long_times_out(
    configure: Callable, running: list[McpHub]
) -> None:
    hub = hub_for(configure(mcp_servers.stdio("fake", timeout=5)))
    running.append(hub)
    await hub.start()
    started = asyncio.get_running_loop().time()
    with pytest.raises(ToolError, match="did not answer `wait` within 5s"):
        await hub.call("mcp__fake__wait", {"seconds": 60}, cap=1000)
    assert asyncio.get_running_loop().time() - started < 20
    assert await hub.call("mcp__fake__lookup", {"query": "still"}, cap=1000) == "found still"


async def test_tools_and_exclude_tools_choose_what_is_offered(
    configure: Callable, running: list[McpHub]
) -> None:
    hub = hub_for(
        configure(
            mcp_servers.stdio(
                "fake", tools=["lookup", "pic*", "write_note"], exclude_tools=["write_*"]
            )
        )
    )
    running.append(hub)
    await hub.start()
    assert sorted(t.name for t in hub.tools()) == ["mcp__fake__lookup", "mcp__fake__picture"]
    with pytest.raises(ToolError, match="not available"):
        await hub.call("mcp__fake__write_note", {"text": "x"}, cap=1000)


async def test_a_server_that_cannot_start_is_failed_with_the_reason(
    configure: Callable, running: list[McpHub]
) -> None:
    settings = configure(
        mcp_servers.table("missing", command="no-such-mcp-server"),
        mcp_servers.table("dies", command="/bin/sh", args=["-c", "echo broken config >&2; exit 7"]),
        mcp_servers.table("off", command="/bin/true", enabled=False),
    )
    hub = hub_for(settings, retry_first=30)
    running.append(hub)
    await hub.start()
    status = {s.name: s for s in hub.servers()}
    assert status["missing"].state == State.FAILED
    assert "`no-such-mcp-server` was not found on PATH" in status["missing"].detail
    assert status["dies"].state == State.FAILED
    assert (
        "exited with code 7" in status["dies"].detail and "broken config" in status["dies"].detail
    )
    assert status["off"].state == State.DISABLED
    assert hub.tools() == ()


async def test_http_server_headers_results_changes_and_death(
    settings_for: Callable, running: list[McpHub], tmp_path: Path
) -> None:
    notes = tmp_path / "http-notes.txt"
    with mcp_servers.http_fake(notes) as fake:
        path = mcp_servers.write(
            tmp_path / "http.toml",
            mcp_servers.table(
                "docs", url=fake.url, headers={"Authorization": "Bearer ${DOCS_TOKEN}"}
            ),
        )
        env = {**make_env(tmp_path, None, mcp_config=str(path)), "DOCS_TOKEN": "t0ken"}
        hub = hub_for(load_settings(env=env, cwd=tmp_path), retry_first=30)
        running.append(hub)
        await hub.start()
        assert {t.name for t in hub.tools()} >= {"mcp__docs__lookup", "mcp__docs__whoami"}
        assert await hub.call("mcp__docs__whoami", {}, cap=1000) == "authorization=Bearer t0ken"
        assert await hub.call("mcp__docs__write_note", {"text": "hi"}, cap=1000) == "noted hi"
        assert notes.read_text() == "hi\n"
        picture = await hub.call("mcp__docs__picture", {}, cap=1000)
        assert isinstance(picture, ToolOutput) and picture.images
        assert await hub.call("mcp__docs__grow", {}, cap=1000) == "grown"
        await until(lambda: "mcp__docs__extra" in {t.name for t in hub.tools()}, 10, "new tool")
        fake.stop()  # the server dies
        with pytest.raises(ToolError, match="MCP server `docs` stopped while running `lookup`"):
            await hub.call("mcp__docs__lookup", {"query": "x"}, cap=1000)
        assert hub.tools() == ()
        [status] = hub.servers()
        await until(lambda: status.retry_at is not None, 10, "the retry planned")
        assert status.state == State.FAILED and status.detail
