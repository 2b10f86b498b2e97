"""Approvals grant exactly what was approved, end to end through `steward replay` (the
real dispatcher, agent, guardian, sandbox and tools; the scripted model).

- "Approve for this session" is the presser's: another person's identical call in the
  same conversation is asked, and without an answer it does not run.
- "Always allow" of a command that runs a workspace script names the script's content:
  once another conversation rewrote it, the identical call is asked again.
- "Always for this host" of a web_fetch allows other pages of that host, not others.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay, tool_messages


async def test_a_session_approval_does_not_cover_another_person(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)
    cmd = {"command": "echo x >> ../session.txt"}
    llm.reply_tool("shell", cmd).reply_text("first")
    llm.reply_tool("shell", cmd).reply_text("second")
    llm.reply_tool("shell", cmd).reply_text("third")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "conversation": "team", "text": "append"},
            {"t": 1, "user": "alice", "conversation": "team", "press": "session"},
            {"t": 2, "user": "alice", "conversation": "team", "text": "append again"},
            {"t": 3, "user": "bob", "conversation": "team", "text": "append too"},
        ],
    )
    asked = [(o["t"], o["conversation"]) for o in out if o["kind"] == "approval"]
    assert asked == [(0, "team"), (3, "team")]  # alice's repeat ran unasked; bob is asked
    edits = [o["text"] for o in out if o["kind"] == "edit"]
    assert "Approved by alice (approved for this session)" in edits[0]
    assert "Expired" in edits[1]  # nobody answered bob's request
    assert (tmp_path / "session.txt").read_text() == "x\nx\n"  # bob's call did not run
    assert tool_messages(llm)[-1].startswith("Not approved")


async def test_always_allow_of_a_script_ends_when_the_script_is_rewritten(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)
    s.workspace.mkdir(parents=True, exist_ok=True)
    (s.workspace / "deploy.sh").write_text("echo v1 >> ../deployed.txt\n")
    run = {"command": "bash deploy.sh"}
    llm.reply_tool("shell", run).reply_text("deployed")
    llm.reply_tool("shell", run).reply_text("deployed again")
    rewrite = {"path": "deploy.sh", "content": "echo v2 >> ../deployed.txt\n"}
    llm.reply_tool("write_file", rewrite).reply_text("rewrote the script")
    llm.reply_tool("shell", run).reply_text("tried once more")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "deploy"},
            {"t": 1, "user": "alice", "press": "always"},
            {"t": 2, "user": "alice", "text": "deploy again"},
            {"t": 3, "user": "mallory", "text": "tidy up deploy.sh"},
            {"t": 4, "user": "alice", "text": "deploy once more"},
            {"t": 5, "user": "alice", "text": "/policy"},
        ],
        drain=700,
    )
    # Ran twice (asked once, then by the rule); the rewritten script did not run.
    assert (tmp_path / "deployed.txt").read_text() == "v1\nv1\n"
    assert (s.workspace / "deploy.sh").read_text() == rewrite["content"]
    approvals = [o for o in out if o["kind"] == "approval"]
    assert [o["t"] for o in approvals] == [0, 4]
    assert (
        "no longer matches because deploy.sh changed since it was allowed" in (approvals[1]["text"])
    )
    [rule] = tomllib.loads((s.data_dir / "policy.toml").read_text())["always_allow"]
    assert rule["match"] == "bash deploy.sh" and list(rule["reads"]) == ["deploy.sh"]
    assert rule["reads"]["deploy.sh"].startswith("sha256:")
    policy_text = next(o["text"] for o in out if o["t"] == 5)
    assert "while these files are unchanged: deploy.sh (sha256:" in policy_text


async def test_always_for_this_host_allows_that_host_and_asks_for_another(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    seen: list[str] = []

    async def page(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(text=f"page {request.path}", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    # The page is on this machine: the owner lets web_fetch reach exactly it.
    s = settings_for(llm, egress_allow=f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        llm.reply_tool("web_fetch", {"url": f"{base}/docs"}).reply_text("read the docs")
        llm.reply_tool("web_fetch", {"url": f"{base}/other/page?x=1"}).reply_text("read more")
        llm.reply_tool("web_fetch", {"url": "https://example.org/"}).reply_text("tried")
        out = await replay(
            s,
            [
                {"t": 0, "user": "alice", "text": "read the project docs"},
                {"t": 1, "user": "alice", "press": "always for this host"},
                {"t": 2, "user": "alice", "text": "and the other page"},
                {"t": 3, "user": "alice", "text": "and the example site"},
            ],
            drain=700,
        )
    finally:
        await runner.cleanup()
    approvals = [o for o in out if o["kind"] == "approval"]
    assert [o["t"] for o in approvals] == [0, 3]  # the same host's other page: not asked
    assert [b["label"] for b in approvals[0]["buttons"]] == [
        "Approve once",
        "Approve for this session",
        "Always for this host",
        "Deny",
    ]
    assert seen == ["/docs", "/other/page"]  # example.org was never fetched
    told = [
        m["content"] for r in llm.requests for m in r["messages"] if m["role"] == "tool"
    ]  # each task's own tool results (a later task does not resend them)
    assert any("page /other/page" in t for t in told)
    assert tool_messages(llm)[-1].startswith("Not approved")
    [rule] = tomllib.loads((s.data_dir / "policy.toml").read_text())["always_allow"]
    assert rule["tool"] == "web_fetch" and rule["match"] == f"host:127.0.0.1:{port}"
