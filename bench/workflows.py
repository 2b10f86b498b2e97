"""Do learned workflows stop paying the model for work it has already learned, without
answering a look-alike request wrongly?

A scripted workload through `steward replay` (dispatcher, agent, litellm over HTTP,
the guardian, the sandbox running a real script, the learner, the data dir's git): a
team asks "restart the X worker and check health" again and again for different X,
mixed with requests that only look similar ("… and delete its logs", "… and check
health twice") which need other calls. The scripted model does each the way a model
would: one tool call per turn, then an answer. When it is asked to draft a workflow it
writes the right document; the offer is saved by a press, as a person would.

Baseline in the same run: the same workload with workflows switched off. Tokens are
counted as the model server would bill them: the whole request (messages and tool
schemas) and the answer, a quarter of the characters each; the drafting call is counted
too, against the request that triggered it.

Printed: tokens and model calls per repeated request before learning (baseline) and
after the workflow was saved, the saving, the cost of drafting, wrong-workflow runs
(a workflow ran for a look-alike: a wrong answer a person would not have got from the
agent) and fallbacks (a workflow ran and handed back).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.replay import run_replay
from config.settings import load_settings
from memory.episodes import EpisodeStore
from tests.fakes.llm import Reply, ScriptedLLM
from tests.fakes.workflows import restart_worker

SERVICES = ["api", "db", "web", "cache", "queue", "auth", "mail", "search", "jobs", "cron"]
REPEAT = "restart the {} worker and check health"
LOOKALIKES = [
    "restart the {} worker and delete its logs",
    "restart the {} worker and check health twice",
]
ASK = re.compile(r"^restart the (\w+) worker and (check health|delete its logs)( twice)?$")
SCRIPT = 'echo "$1 $2" >> calls.log\necho "$2 $1: ok"\n'
DRAFT = restart_worker("sh svc.sh", output="Restarted {{inputs.service}}. Health: {{steps.health}}")


def workload(n: int) -> list[tuple[str, bool]]:
    """(request, is it the repeated one) × n: every fourth and fifth a look-alike."""
    out = []
    for i in range(n):
        service = SERVICES[i % len(SERVICES)]
        if i % 5 in (3, 4):
            out.append((LOOKALIKES[i % 2].format(service), False))
        else:
            out.append((REPEAT.format(service), True))
    return out


def _tokens(chars: int) -> int:
    return chars // 4 + 1


@dataclass
class Model:
    """The scripted model; it counts what each request would be billed."""

    tokens: int = 0
    calls: int = 0
    drafts: int = 0
    #: The drafting calls' share of `tokens` (and of `calls`: one each).
    draft_tokens: int = 0
    #: Whether it calls the workflow's tool when it is offered one for the request.
    uses_tool: bool = False

    def __call__(self, body: dict[str, Any]) -> Reply:
        drafts = self.drafts
        reply = self._answer(body)
        sent = len(json.dumps(body["messages"])) + len(json.dumps(body.get("tools") or []))
        said = reply.content or "".join(c.name + c.arguments_json() for c in reply.tool_calls)
        billed = _tokens(sent) + _tokens(len(said))
        if self.drafts > drafts:
            self.draft_tokens += billed
        else:
            self.tokens += billed
            self.calls += 1
        return reply

    def _answer(self, body: dict[str, Any]) -> Reply:
        system = str(body["messages"][0]["content"])
        if system.startswith("A task succeeded several times"):
            self.drafts += 1
            return Reply.text(json.dumps(DRAFT))
        if not system.startswith("You are Steward"):
            return Reply.text("A summary.")
        request = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
        done = [m for m in body["messages"] if m["role"] == "tool"]
        found = ASK.match(request)
        if found is None:
            return Reply.text("I don't know that one.")
        service, action, twice = found.group(1), found.group(2), bool(found.group(3))
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        if self.uses_tool and "wf__restart-worker" in offered and action == "check health":
            if not twice and not done:
                return Reply.tool("wf__restart-worker", {"service": service})
            if not twice:
                return Reply.text(f"Restarted {service}; check health done.")
        plan = [f"sh svc.sh restart {service}"]
        if action == "delete its logs":
            plan.append(f"rm -f logs/{service}.log")
        else:
            plan += [f"sh svc.sh health {service}"] * (2 if twice else 1)
        if len(done) < len(plan):
            return Reply.tool("shell", {"command": plan[len(done)]})
        return Reply.text(f"Restarted {service}; {action} done.")


@dataclass
class Run:
    #: Per request: (repeated?, tokens, model calls, workflow it ran, outcome).
    rows: list[tuple[bool, int, int, str, str]] = field(default_factory=list)
    saved_at: int | None = None
    draft_tokens: int = 0
    seconds: float = 0.0


async def scenario(root: Path, n: int, *, learning: bool, direct: bool = True) -> Run:
    ws = root / "ws"
    (ws / "logs").mkdir(parents=True, exist_ok=True)
    (ws / "svc.sh").write_text(SCRIPT)
    run = Run()
    model = Model(uses_tool=not direct)
    async with ScriptedLLM() as llm:
        llm.responder = model
        env = {
            "STEWARD_DATA_DIR": str(root / "data"),
            "STEWARD_WORKSPACE": str(ws),
            "STEWARD_MODEL": f"openai/{llm.model_id}",
            "STEWARD_API_BASE": llm.base_url,
            "STEWARD_LOG_LEVEL": "warning",
            "STEWARD_WORKFLOWS_ENABLED": str(learning).lower(),
            "STEWARD_WORKFLOWS_DIRECT": str(direct).lower(),
            "STEWARD_HISTORY_TURNS": "0",
            "STEWARD_SKILLS_PROPOSE": "false",
            "STEWARD_PROACTIVE_ENABLED": "false",
        }
        settings = load_settings(env=env, cwd=root)
        episodes = EpisodeStore(settings.data_dir)
        t0 = time.perf_counter()
        for i, (text, repeated) in enumerate(workload(n)):
            (ws / "logs" / f"{text.split()[2]}.log").write_text("old\n")
            tokens, calls = model.tokens, model.calls
            out = io.StringIO()
            line = {"t": 60 * i, "user": "alice", "text": text}
            await run_replay(settings, [json.dumps(line)], out, drain=3600)
            for sent in map(json.loads, out.getvalue().splitlines()):
                for button in sent.get("buttons") or []:
                    if str(button.get("value", "")).startswith("wf-save:"):
                        # Typed, as where there are no buttons (each replay is a restart).
                        offer = button["value"].split(":", 1)[1]
                        save = {
                            "t": 60 * i + 30,
                            "user": "alice",
                            "text": f"/workflows save {offer}",
                        }
                        said = io.StringIO()
                        await run_replay(settings, [json.dumps(save)], said, drain=3600)
                        if "Saved" in said.getvalue():
                            run.saved_at = i
            latest = max(episodes.iter_files(), key=lambda p: p.stat().st_mtime_ns)
            meta = episodes.read_front_matter(latest)
            run.rows.append(
                (
                    repeated,
                    model.tokens - tokens,
                    model.calls - calls,
                    str(meta.get("workflow") or ""),
                    str(meta.get("outcome")),
                )
            )
        run.draft_tokens = model.draft_tokens
        run.seconds = time.perf_counter() - t0
    return run


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def report(learned: Run, base: Run, tool: Run, n: int) -> None:
    repeated = sum(1 for _, r in workload(n) if r)
    print(f"workload: {n} requests, {repeated} repeated, {n - repeated} look-alikes")
    b_tokens = _mean([t for r, t, _, _, _ in base.rows if r])
    b_calls = _mean([c for r, _, c, _, _ in base.rows if r])
    print(
        f"baseline (workflows off): {b_tokens:.0f} tokens, {b_calls:.1f} model calls "
        "per repeated request"
    )
    if learned.saved_at is None:
        print("learning on: no workflow was saved: nothing to compare")
        return
    after = [row for row in learned.rows[learned.saved_at + 1 :] if row[0]]
    a_tokens = _mean([t for _, t, _, _, _ in after])
    a_calls = _mean([c for _, _, c, _, _ in after])
    print(
        f"learning on: workflow saved after request {learned.saved_at + 1}; "
        f"drafting it cost {learned.draft_tokens} tokens (one model call)"
    )
    print(
        f"after learning: {a_tokens:.0f} tokens, {a_calls:.1f} model calls per repeated "
        f"request ({len(after)} requests)"
    )
    saving = 1 - a_tokens / b_tokens if b_tokens else 0.0
    print(f"token saving on repeated requests: {saving:.0%} (target: at least 80%)")
    print(f"after/baseline ratio: {a_tokens / b_tokens:.3f}" if b_tokens else "")
    if b_tokens > a_tokens:
        print(
            f"drafting paid back after "
            f"{learned.draft_tokens / (b_tokens - a_tokens):.1f} repeated requests"
        )
    wrong = [row for row in learned.rows if not row[0] and row[3]]
    ran = [row for row in learned.rows if row[3]]
    fallbacks = [row for row in ran if row[2] > 0]
    failed = [row for row in learned.rows if row[4] != "success"]
    print(
        f"workflow runs: {len(ran)}; wrong-workflow runs (a look-alike): {len(wrong)}; "
        f"fallbacks to the model: {len(fallbacks)}; tasks not successful: {len(failed)}"
    )
    if tool.saved_at is not None:
        rows = [row for row in tool.rows[tool.saved_at + 1 :] if row[0]]
        t_tokens = _mean([t for _, t, _, _, _ in rows])
        t_calls = _mean([c for _, _, c, _, _ in rows])
        wrong_t = sum(1 for row in tool.rows if not row[0] and row[3])
        print(
            f"with workflows_direct = false (the model calls wf__restart-worker): "
            f"{t_tokens:.0f} tokens, {t_calls:.1f} model calls per repeated request, saving "
            f"{1 - t_tokens / b_tokens:.0%}; wrong-workflow runs: {wrong_t}"
        )
    print(
        f"wall time: learning on {learned.seconds:.1f}s, off {base.seconds:.1f}s, "
        f"tool only {tool.seconds:.1f}s"
    )


async def _main(n: int = 30) -> None:
    from bot.logs import configure_logging
    from core.model.client import load_litellm

    configure_logging("warning", "json")
    load_litellm()
    with (
        tempfile.TemporaryDirectory() as a,
        tempfile.TemporaryDirectory() as b,
        tempfile.TemporaryDirectory() as c,
    ):
        learned = await scenario(Path(a), n, learning=True)
        base = await scenario(Path(b), n, learning=False)
        tool = await scenario(Path(c), n, learning=True, direct=False)
    report(learned, base, tool, n)


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
