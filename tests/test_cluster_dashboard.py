"""The dashboard served by a cluster gateway: the same URLs and login as one process,
showing what the workers do.

End to end, as deployed (one gateway and one worker as real processes, real NATS and
PostgreSQL, the scripted model and the Slack wire fake): a message answered by the
worker is on the gateway's /api/status while it runs and after, with the worker's id;
a schedule made through the worker is listed; an approval the worker waits for is
approved from the gateway's page and the task goes on; the emergency stop cancels the
worker's running task; the gateway restarted still shows the finished task (from the
task journal); without the login every page is refused.

In process, the gateway's board (bot/cluster/activity.py) fed the messages a worker
publishes: a task started before the gateway listened appears with the next heartbeat,
a missed end is settled by the next one, and a silent worker's tasks end on the board.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bot.cluster.activity import ClusterBoard
from core.approvals import ORPHANED_REASON
from memory.approvals import ApprovalStore
from memory.login_token import token_path
from tests.cluster_harness import (
    NEEDS_APPROVAL,
    Chats,
    Cluster,
    EchoModel,
    Node,
    threaded,
    wait_until,
)
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.test_cluster_transport import ALICE, DM, eventually
from tests.test_cluster_transport import Cluster as InProcess

pytestmark = pytest.mark.timeout(300)


def _http(
    node: Node, path: str, *, token: str | None, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    """(status, decoded JSON or None) of a request to the gateway, with its login token
    as a script of the owner sends it (`Authorization: Bearer`), or none."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(node.url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


#: A request the model answers only once the test lets it (a task to stop meanwhile).
HELD = "a long task to stop"


class HeldModel(EchoModel):
    """The echo model, holding its answer to HELD until `held` is set."""

    def __init__(self, latency: float) -> None:
        super().__init__(latency)
        self.held = threading.Event()

    async def _answer(self, body: dict[str, Any]) -> Any:
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        if users and HELD in str(users[-1].get("content")):
            await asyncio.to_thread(self.held.wait, 60)
        return await super()._answer(body)


def _task(status: dict[str, Any], part: str, request: str) -> dict[str, Any] | None:
    return next((t for t in status.get(part, []) if t.get("request") == request), None)


def test_a_gateway_dashboard_shows_the_workers_tasks_and_schedules(
    tmp_path: Path, llm_thread: ScriptedLLM, nats_url: str, postgres_url: str, cluster_prefix: str
) -> None:
    model = HeldModel(latency=1.5)  # long enough to be seen running
    llm_thread.responder = model
    with threaded(FakeSlack()) as slack, threaded(FakeTelegram()) as telegram:
        chats = Chats(slack, telegram)
        env = {
            **make_env(tmp_path, llm_thread, llm_workers=0),
            **{k: v for k, v in chats.env().items() if "TELEGRAM" not in k},
        }
        cluster = Cluster(
            tmp_path / "cluster",
            env,
            cluster_url=nats_url,
            database_url=postgres_url,
            name=cluster_prefix,
            gateways=1,
            workers=1,
        )
        gateway, worker = cluster.gateways[0], cluster.workers[0]
        with cluster:
            token = token_path(gateway.data_dir).read_text(encoding="utf-8").strip()

            def status() -> dict[str, Any]:
                code, body = _http(gateway, "/api/status", token=token)
                assert code == 200, (code, body)
                return body  # type: ignore[no-any-return]

            # Without the login: refused, as in one process (pages and API alike).
            for path in ("/api/status", "/api/approvals", "/dashboard", "/api/events"):
                code, body = _http(gateway, path, token=None)
                assert code == 401, (path, code)
                assert not (isinstance(body, dict) and "running" in body)
            assert _http(gateway, "/api/status", token="not-the-token")[0] == 401

            # The worker is known from its heartbeat.
            wait_until(
                lambda: any(
                    w["id"] == worker.name and w["state"] == "up"
                    for w in status().get("cluster", {}).get("workers", [])
                ),
                "the worker on the gateway's dashboard",
                30,
                every=0.2,
            )

            # A message: running on the worker, then finished, each with its worker.
            text = "hello from the dashboard test"
            code, _ = chats.send_slack(gateway.url, 1, text)
            assert code == 200
            running = wait_until(
                lambda: _task(status(), "running", text), "the task running", 30, every=0.1
            )
            assert running["worker"] == worker.name
            assert running["channel"] == "slack"
            wait_until(lambda: f"re: {text}" in chats.answers(1, "slack"), "the answer", 30)
            done = wait_until(
                lambda: _task(status(), "recent", text), "the task finished", 30, every=0.1
            )
            assert done["worker"] == worker.name
            assert not _task(status(), "running", text)
            # Its episode reached the gateway through the shared memory.
            model.latency = 0.0
            wait_until(
                lambda: any(
                    e["request"] == text
                    for e in _http(gateway, "/api/episodes", token=token)[1]["items"]
                ),
                "the episode on the History page",
                30,
                every=0.2,
            )

            # A schedule made through the worker (a command: no model) is listed.
            schedule = "water the plants"
            code, _ = chats.send_slack(gateway.url, 2, f"/schedule every 1h {schedule}")
            assert code == 200
            listed = wait_until(
                lambda: next((s for s in status()["schedules"] if s["text"] == schedule), None),
                "the schedule on the gateway's dashboard",
                30,
                every=0.2,
            )
            assert listed["channel"] == "slack" and listed["next_run"]

            # An approval asked on the worker is listed, and approved from the gateway's
            # page: the worker holding it decides it and the task goes on.
            code, _ = chats.send_slack(gateway.url, 3, f"{NEEDS_APPROVAL}plan")
            assert code == 200
            pending = wait_until(
                lambda: _http(gateway, "/api/approvals", token=token)[1]["pending"],
                "the approval on the gateway's dashboard",
                30,
                every=0.2,
            )
            assert pending[0]["channel"] == "slack"
            code, body = _http(
                gateway,
                f"/api/approvals/{pending[0]['id']}",
                token=token,
                body={"action": "approve"},
            )
            assert code == 200 and body["ok"], (code, body)
            wait_until(
                lambda: "ran plan" in chats.answers(3, "slack"), "the approved task's end", 30
            )
            code, body = _http(
                gateway, "/api/approvals/no-such-id", token=token, body={"action": "approve"}
            )
            assert code == 409 and "No pending approval" in body["error"], (code, body)

            # The emergency stop reaches the worker: its running task is cancelled.
            code, _ = chats.send_slack(gateway.url, 4, HELD)
            assert code == 200
            wait_until(lambda: _task(status(), "running", HELD), "the held task running", 30)
            code, body = _http(gateway, "/api/stop", token=token, body={})
            assert code == 200 and body["tasks_cancelled"] == 1, (code, body)
            assert body["workers"] == 1 and body["goals_stopped"] == []
            wait_until(lambda: _task(status(), "recent", HELD), "the stopped task ended", 30)
            model.held.set()  # the model's call for it, whose caller is gone, ends too

            # What a gateway cannot show is said, not silently empty.
            notes = status()["cluster"]["notes"]
            assert "recent" in notes and "history" in notes
            spend = _http(gateway, "/api/spend", token=token)[1]
            assert spend["total"]["tasks"] >= 1 and ("note" in spend or spend["source"] == "ledger")

            # Restarted, the gateway shows the finished task again (from the journal).
            gateway.restart()
            again = wait_until(
                lambda: _task(status(), "recent", text),
                "the finished task after the gateway's restart",
                30,
                every=0.2,
            )
            assert again["worker"] == worker.name
            assert any(s["text"] == schedule for s in status()["schedules"])


# ── the board, in process ─────────────────────────────────────────────────────────────
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _start(worker: str, task_id: str, request: str) -> dict[str, Any]:
    return {
        "type": "event",
        "worker": worker,
        "kind": "task_start",
        "task_id": task_id,
        "channel": "slack",
        "conversation": "D1",
        "user": "U1",
        "request": request,
    }


def _running(task_id: str, request: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "channel": "slack",
        "conversation": "D1",
        "user": "U1",
        "request": request,
        "started": 990.0,
        "ended": None,
        "status": "",
        "current": None,
        "steps": [{"tool": "shell", "text": "ls", "started": 995.0, "ok": None, "result": ""}],
        "parent": "",
        "children": [],
    }


def test_the_board_follows_events_heartbeats_and_silence() -> None:
    clock = Clock()
    board = ClusterBoard(clock, gone_after=10)
    board.receive(_start("w1", "t1", "first"))
    board.receive(
        {"type": "event", "worker": "w1", "kind": "tool_start", "task_id": "t1", "tool": "shell",
         "text": "make"}
    )  # fmt: skip
    snap = board.snapshot()
    assert [(t["task_id"], t["worker"]) for t in snap["running"]] == [("t1", "w1")]
    assert snap["running"][0]["current"]["tool"] == "shell"

    # A task begun before this gateway listened: learnt from w2's heartbeat.
    board.receive({"type": "beat", "worker": "w2", "running": [_running("t2", "second")],
                   "model": "m2"})  # fmt: skip
    snap = board.snapshot()
    assert {t["task_id"]: t["worker"] for t in snap["running"]} == {"t1": "w1", "t2": "w2"}
    assert snap["running"][1]["steps"][0]["text"] == "ls"

    # w1's end was missed: its next heartbeat no longer lists t1, which ends.
    clock.now += 2
    board.receive({"type": "beat", "worker": "w1", "running": []})
    snap = board.snapshot()
    assert [t["task_id"] for t in snap["running"]] == ["t2"]
    assert [(t["task_id"], t["worker"]) for t in snap["recent"]] == [("t1", "w1")]

    # w2 goes silent: after gone_after its task ends, saying so, and it is listed gone.
    clock.now += 11
    board.receive({"type": "beat", "worker": "w1", "running": []})
    board.check()
    snap = board.snapshot()
    assert snap["running"] == []
    gone = snap["recent"][0]
    assert gone["task_id"] == "t2" and "stopped answering" in gone["status"]
    assert {w["id"]: w["state"] for w in board.workers_json()} == {"w1": "up", "w2": "gone"}

    # A worker that stops says so: forgotten at once, and its tasks end.
    board.receive(_start("w1", "t3", "third"))
    board.receive({"type": "bye", "worker": "w1"})
    assert board.snapshot()["running"] == []
    assert "w1" not in {w["id"] for w in board.workers_json()}


# ── the gateway's copy of the shared memory, in process ────────────────────────────────
class _Counting:
    """The store, recording every document the copy received (what crossed the wire)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.received: list[str] = []

    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None:
        raise AssertionError("a read-only copy never writes")

    async def documents_since(
        self, cursor: int, prefixes: list[str] | None = None
    ) -> tuple[int, list[tuple[str, str | None]]]:
        top, docs = await self.store.documents_since(cursor, prefixes=prefixes)
        self.received += [path for path, _text in docs]
        return top, docs  # type: ignore[no-any-return]

    def document_notifications(self) -> Any:
        return self.store.document_notifications()


async def test_the_dashboard_copy_asks_the_store_only_for_its_folders(
    postgres_url: str, tmp_path: Path
) -> None:
    """The conversations (most of a memory's bytes) never leave PostgreSQL for a
    gateway; its cursor still moves past their writes, so it never asks for them again."""
    from memory.cluster.reader import DASHBOARD_FOLDERS, ReadOnlyMirror
    from memory.cluster.store import ClusterStore

    store = await ClusterStore.open(postgres_url, worker_id="w1")
    try:
        chat = "**user**: the deploy failed again\n" * 500
        memory: list[tuple[str, str | None]] = [
            (f"conversations/slack/C{i}.md", chat) for i in range(50)
        ]
        memory += [("notes/n.md", "a note\n"), ("episodes/2026/12/07/e1.md", "an episode\n")]
        await store.put_documents([*memory, ("rules/r-1.md", "list first\n")])
        # In the query: only the paths under the prefixes, the cursor past everything.
        everything, _ = await store.documents_since(0)
        top, docs = await store.documents_since(0, prefixes=["episodes/", "rules/"])
        assert top == everything
        assert docs == [
            ("episodes/2026/12/07/e1.md", "an episode\n"),
            ("rules/r-1.md", "list first\n"),
        ]
        assert await store.documents_since(top, prefixes=["episodes/"]) == (top, [])

        counting = _Counting(store)
        changed: list[list[str]] = []

        async def on_change(paths: list[str]) -> None:
            changed.append(paths)

        mirror = ReadOnlyMirror(
            counting, tmp_path / "gw", only=DASHBOARD_FOLDERS, on_change=on_change, interval=0.1
        )
        await mirror.start()
        try:
            assert sorted(counting.received) == ["episodes/2026/12/07/e1.md", "rules/r-1.md"]
            assert not (tmp_path / "gw" / "conversations").exists()
            assert mirror.cursor == top
            # Later writes: the conversations' only move the cursor; an episode arrives,
            # a deleted rule goes.
            await store.put_documents(
                [(f"conversations/slack/C{i}.md", chat + "more\n") for i in range(5)]
            )
            await store.put_documents(
                [("episodes/2026/12/07/e2.md", "another\n"), ("rules/r-1.md", None)]
            )
            await store.put_documents([("conversations/slack/C9.md", chat)])
            last, _ = await store.documents_since(0)
            for _ in range(100):
                if mirror.cursor == last:
                    break
                await asyncio.sleep(0.05)
            assert mirror.cursor == last
            assert (tmp_path / "gw" / "episodes/2026/12/07/e2.md").read_text() == "another\n"
            assert not (tmp_path / "gw" / "rules/r-1.md").exists()
            assert not [p for p in counting.received if not p.startswith(("episodes/", "rules/"))]
            assert sorted(p for batch in changed for p in batch) == [
                "episodes/2026/12/07/e1.md",
                "episodes/2026/12/07/e2.md",
                "rules/r-1.md",
                "rules/r-1.md",
            ]
        finally:
            await mirror.stop()
    finally:
        await store.close()


# ── an approval whose worker died, pressed on the page (gateway and workers in process) ─
async def _decide(cluster: InProcess, rid: str, action: str) -> tuple[int, dict[str, Any]]:
    """POST the page's approval control to the in-process gateway, as the owner."""
    import aiohttp

    token = token_path(cluster.tmp / "gw1" / "data").read_text(encoding="utf-8").strip()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{cluster.url}/api/approvals/{rid}",
            json={"action": action},
            headers={"Authorization": f"Bearer {token}"},
        ) as resp,
    ):
        return resp.status, dict(await resp.json())


async def test_an_approval_whose_worker_died_is_expired_from_the_dashboard(
    in_process: InProcess,
) -> None:
    """As a chat press does (tests/test_cluster_handover.py): the request is expired,
    nothing runs, its chat message and its record say why, and so does the page."""
    cluster = in_process
    w1 = await cluster.start_worker("w1")
    cluster.llm.reply_tool("shell", {"command": "echo x > ../approved.txt"}).reply_text("Wrote it.")
    await cluster.post(cluster.fake.dm(DM, ALICE, "write next to the workspace"))
    [ask] = await eventually(lambda: cluster.said("Approval needed"), "the approval request")
    values = [
        e["value"] for b in ask.get("blocks", []) for e in b.get("elements", []) if "value" in e
    ]
    rid = next(v for v in values if v.startswith("approve:")).partition(":")[2]
    await cluster.start_worker("w2")
    await cluster.stop_worker(w1)  # its task ends with it; the question stays in the store

    status, body = await _decide(cluster, rid, "approve")
    assert status == 200, body
    assert body["status"] == "expired" and body["ok"] is False and body["decided"] is True
    assert ORPHANED_REASON in body["text"], body
    message = cluster.fake.messages[ask["ts"]]
    assert ORPHANED_REASON in message["text"], message
    assert not [b for b in message.get("blocks", []) if b.get("type") == "actions"], message
    stored = {r["id"]: r for r in ApprovalStore(cluster.tmp / "w2" / "data").load_all()}
    assert stored[rid]["status"] == "expired", stored[rid]
    assert not (cluster.tmp / "w1" / "approved.txt").exists()
    assert not cluster.said("Wrote it.")

    # Pressed again: decided already, said so (not run, not a second edit).
    status, body = await _decide(cluster, rid, "approve")
    assert status == 409 and body["text"] == "Already expired.", body
