"""Learned workflows end to end through `steward replay` with the scripted model: three
requests of one shape done the same way → an offer with Save / Show / No → saved to the
data dir (a git commit) → the fourth request runs it with no model call, its steps
through the guardian and the sandbox (the script really ran, with the new input) → a
look-alike request goes to the model, and the workflow does not run. Then a workflow
whose step fails hands back to the agent, told what ran, and is retired after its losses.
Judged by effects: what the scripted model was asked, files the steps wrote, the data
dir's files and history."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.llm import Reply, ScriptedLLM
from tests.fakes.workflows import restart_worker
from tests.test_replay_e2e import episodes, replay

SVC = 'echo "$1 $2" >> calls.log\necho "$2 $1: ok"\n'
ASK = re.compile(r"^restart the (\w+) worker and check health$")
DRAFT = restart_worker("sh svc.sh", output="Restarted {{inputs.service}}. Health: {{steps.health}}")


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


class Model:
    """The scripted model: it drafts when asked to, and does each restart in two calls."""

    def __init__(self) -> None:
        self.agent_calls: list[str] = []
        self.drafts = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        system = str(body["messages"][0]["content"])
        if system.startswith("A task succeeded several times"):
            self.drafts += 1
            return Reply.text("```json\n" + json.dumps(DRAFT) + "\n```")
        if not system.startswith("You are Steward"):
            return Reply.text("A summary.")
        request = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
        self.agent_calls.append(request)
        found = ASK.match(request)
        done = tool_results(body)
        if found is None:
            if not done:
                return Reply.tool("list_files", {"path": "."})
            return Reply.text("I looked at the workspace; I won't delete logs unasked.")
        service = found.group(1)
        if not done:
            return Reply.tool("shell", {"command": f"sh svc.sh restart {service}"})
        if len(done) == 1:
            return Reply.tool("shell", {"command": f"sh svc.sh health {service}"})
        return Reply.text(f"Restarted {service}; its health check said ok.")


def git_log(repo: Path, path: str) -> list[str]:
    """The subjects of the commits that touched `path` in the data dir's repository."""
    done = subprocess.run(
        ["git", "log", "--format=%s", "--", path],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def messages_to(out: list[dict[str, Any]], t: float) -> list[str]:
    return [o.get("text", "") for o in out if o["t"] == t and o["kind"] == "message"]


async def test_three_runs_an_offer_a_saved_workflow_and_a_fourth_run_without_the_model(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, history_turns=0)
    s.workspace.mkdir(parents=True, exist_ok=True)
    (s.workspace / "svc.sh").write_text(SVC)
    model = Model()
    llm.responder = model
    lines: list[dict[str, Any]] = [
        {"t": 0, "user": "alice", "text": "restart the api worker and check health"},
        {"t": 10, "user": "alice", "text": "restart the db worker and check health"},
        {"t": 20, "user": "alice", "text": "restart the web worker and check health"},
        {"t": 30, "user": "alice", "press": "Show"},
        {"t": 40, "user": "alice", "press": "Save"},
        {"t": 50, "user": "alice", "text": "restart the cache worker and check health"},
        {"t": 60, "user": "alice", "text": "restart the cache worker and delete its logs"},
    ]
    out = await replay(s, lines)
    # The offer came once, after the third run, with its three buttons.
    offers = [o for o in out if o["kind"] != "edit" and "Save as workflow" in o.get("text", "")]
    assert len(offers) == 1 and offers[0]["t"] == 20
    assert "restart-worker" in offers[0]["text"]
    assert [b["label"] for b in offers[0]["buttons"]] == ["Save", "Show", "No"]
    assert model.drafts == 1
    shown = "\n".join(messages_to(out, 30))
    assert '"restart-worker"' in shown and "svc.sh health" in shown
    # Saved: a file in the data dir, committed.
    saved = s.data_dir / "workflows" / "restart-worker.json"
    doc = json.loads(saved.read_text())
    assert doc["status"] == "enabled" and doc["taught_by"] == "replay:alice"
    assert len(doc["source_episodes"]) == 3
    assert git_log(s.data_dir, "workflows/restart-worker.json")
    # The fourth request: no model call at all, the steps really ran with its input.
    asked = [c for c in model.agent_calls if "cache" in c]
    assert asked == ["restart the cache worker and delete its logs"] * 2
    [reply] = messages_to(out, 50)
    assert reply.startswith("Restarted cache. Health:") and "cache health: ok" in reply
    calls = (s.workspace / "calls.log").read_text().splitlines()
    assert calls[-2:] == ["restart cache", "health cache"]
    eps = sorted(episodes(s), key=lambda e: e["started"])
    fourth, lookalike = eps[3], eps[4]
    assert fourth["workflow"] == "restart-worker" and fourth["outcome"] == "success"
    assert [t["name"] for t in fourth["tools"]] == ["shell", "shell"]
    assert fourth["tokens_in"] == 0 and fourth["steps"] == 0
    # The look-alike went to the model, and the workflow did not run for it.
    assert "workflow" not in lookalike and lookalike["steps"] == 2
    assert "won't delete logs" in messages_to(out, 60)[0]
    doc = json.loads(saved.read_text())
    assert (doc["runs"], doc["wins"], doc["losses"]) == (1, 1, 0)


async def test_a_failing_workflow_hands_back_and_is_retired_after_its_losses(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, history_turns=0, workflows_retire_losses=2)
    s.workspace.mkdir(parents=True, exist_ok=True)
    (s.workspace / "svc.sh").write_text('echo "$1 $2" >> calls.log\nexit 3\n')
    folder = s.data_dir / "workflows"
    folder.mkdir(parents=True)
    (folder / "restart-worker.json").write_text(json.dumps({**DRAFT, "status": "enabled"}))
    handed: list[str] = []

    def respond(body: dict[str, Any]) -> Reply:
        system = str(body["messages"][0]["content"])
        if not system.startswith("You are Steward"):
            return Reply.text("A summary.")
        said = [str(m["content"]) for m in body["messages"] if m["role"] == "user"]
        handed.append(said[-1])
        return Reply.text("The restart script fails (exit 3); I did not retry it.")

    llm.responder = respond
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "restart the api worker and check health"},
            {"t": 10, "user": "alice", "text": "restart the db worker and check health"},
            {"t": 20, "user": "alice", "text": "restart the web worker and check health"},
        ],
    )
    # Each of the first two ran its first step, failed, and handed back, saying what ran.
    assert len(handed) == 3
    assert "saved workflow 'restart-worker'" in handed[0] and "stopped" in handed[0]
    assert "sh svc.sh restart api" in handed[0]
    assert all("exit 3" in m for m in messages_to(out, 0) + messages_to(out, 10))
    doc = json.loads((folder / "restart-worker.json").read_text())
    assert doc["status"] == "retired" and doc["losses_in_a_row"] == 2
    # Retired: the third request went straight to the model; the script ran twice only.
    assert "saved workflow" not in handed[2]
    assert (s.workspace / "calls.log").read_text().splitlines() == ["restart api", "restart db"]
