"""Does the learning loop stop a repeated mistake, and does it drop a useless lesson?

A scripted model that makes one mistake unless the prompt holds a specific rule: asked
to summarize `report-N.txt`, it reads that name at the workspace root (the file is in
`reports/`) and fails with "No such file" — unless a rule telling it to list the folder
first is in its prompt. When asked to draft rules it proposes two: the useful one and a
decoy that does not help. Everything else is the real loop: `steward replay` through
the dispatcher, the agent, litellm over HTTP, episodes, the memory index (signature
counts), the learner (trials, promotion, retirement) and git commits in the data dir.

A third rule is seeded before the first task: a candidate born of failed `df` commands
(a shell signature) whose trigger matches these requests, as the built-in embedder's
match let happen in the field. No task here runs a command, so no task says anything
about it: it must stay where it started (confidence 0.30, no trials), not be promoted
on "wins" it had nothing to do with.

Also counted: how many of the tasks where the mistake happened (the model then says
honestly that it could not read the file) are recorded `outcome: failure`.

Baseline in the same run: the same tasks with learning switched off.
"""

from __future__ import annotations

import asyncio
import io
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.replay import run_replay
from config.settings import load_settings
from memory.episodes import EpisodeStore
from memory.rules import Rule, RuleStore
from tests.fakes.llm import Reply, ScriptedLLM

USEFUL = "Before reading a file the person names, list its folder to check the exact path."
DECOY = "Keep every answer friendly and under three sentences."
MARK = "list its folder"
SIGNATURE_PART = "No such file"
DF_DECOY = "Before you summarize a report, run df -h to check that the disk is not full."
DF_SIGNATURE = "shell:ToolError:exit code <n>"


def respond(body: dict[str, Any]) -> Reply:
    msgs = body["messages"]
    first = str(msgs[0]["content"])
    if first.startswith("You turn an AI agent"):
        return Reply.text(
            json.dumps(
                {
                    "rules": [
                        {"text": USEFUL, "applies_when": "summarizing a file the person names"},
                        {"text": DECOY, "applies_when": "summarizing a file the person names"},
                    ]
                }
            )
        )
    if first.startswith("You keep the running summary"):
        return Reply.text("The person asks for report summaries.")
    system = "\n".join(str(m["content"]) for m in msgs if m["role"] == "system")
    request = next(str(m["content"]) for m in reversed(msgs) if m["role"] == "user")
    name = next((w.strip(".,") for w in request.split() if w.startswith("report-")), "report.txt")
    tools_done: list[str] = []
    for m in reversed(msgs):
        if m["role"] == "user":
            break
        if m["role"] == "tool":
            tools_done.insert(0, str(m["content"]))
    if MARK in system:
        if not tools_done:
            return Reply.tool("list_files", {"path": "reports"})
        if len(tools_done) == 1:
            return Reply.tool("read_file", {"path": f"reports/{name}"})
        return Reply.text(f"I read reports/{name}: it says {tools_done[-1].strip()[:60]}")
    if not tools_done:
        return Reply.tool("read_file", {"path": name})
    if SIGNATURE_PART.lower() in tools_done[-1].lower():
        return Reply.text(f"I could not read {name}: there is no such file here.")
    return Reply.text(f"I read {name}: it says {tools_done[-1].strip()[:60]}")


@dataclass
class Outcome:
    #: Per task in order: did the mistake happen (the signature was hit)?
    failed: list[bool] = field(default_factory=list)
    #: Per task in order: the episode's outcome.
    outcomes: list[str] = field(default_factory=list)
    df_id: str = ""
    df_promoted_at: int | None = None
    promoted_at: int | None = None
    retired_at: int | None = None
    drafted_at: int | None = None
    rules: dict[str, tuple[str, float, int, int, int]] = field(default_factory=dict)
    useful_id: str = ""
    decoy_id: str = ""
    seconds: float = 0.0
    commits: int = 0

    def rate(self, start: int, end: int | None = None) -> float:
        part = self.failed[start:end]
        return sum(part) / len(part) if part else 0.0

    @property
    def mistakes_recorded_failed(self) -> tuple[int, int]:
        """(mistaken tasks recorded `outcome: failure`, mistaken tasks)."""
        hit = [o for f, o in zip(self.failed, self.outcomes, strict=True) if f]
        return sum(o == "failure" for o in hit), len(hit)


async def seed_df_decoy(data_dir: Path) -> str:
    """The decoy born of failed `df` commands, as the learner drafts one (not pinned)."""
    rules = RuleStore(data_dir)
    rule = Rule(
        id=rules.next_id(),
        text=DF_DECOY,
        status="candidate",
        confidence=0.3,
        source="learned",
        signature=DF_SIGNATURE,
        applies_when="summarizing a report the person names",
        examples=[f"Summarize report-{i}.txt and check the disk with df" for i in (91, 92, 93)],
        source_episodes=["df-1", "df-2", "df-3"],
        baseline_tasks=3,
        baseline_failures=3,
        created="2026-01-01T00:00:00+00:00",
    )
    await rules.save(rule, f"rule {rule.id} drafted as a candidate from 3 failed df commands")
    rules.store.close()
    return rule.id


async def run_scenario(root: Path, tasks: int, *, learning: bool) -> Outcome:
    """`tasks` report summaries, one per simulated 10 minutes, through `steward replay`."""
    ws = root / "ws"
    (ws / "reports").mkdir(parents=True, exist_ok=True)
    for i in range(tasks):
        (ws / "reports" / f"report-{i}.txt").write_text(f"quarter {i}: revenue up {i}%\n")
    out = Outcome()
    async with ScriptedLLM() as llm:
        llm.responder = respond
        env = {
            "STEWARD_DATA_DIR": str(root / "data"),
            "STEWARD_WORKSPACE": str(ws),
            "STEWARD_MODEL": f"openai/{llm.model_id}",
            "STEWARD_API_BASE": llm.base_url,
            "STEWARD_LOG_LEVEL": "warning",
            "STEWARD_LEARNING_ENABLED": str(learning).lower(),
            "STEWARD_HISTORY_TURNS": "0",
        }
        settings = load_settings(env=env, cwd=root)
        if learning:
            out.df_id = await seed_df_decoy(settings.data_dir)
        rules = RuleStore(settings.data_dir)
        t0 = time.perf_counter()
        for i in range(tasks):
            line = {"t": 600 * i, "user": "alice", "text": f"Summarize report-{i}.txt for me"}
            await run_replay(settings, [json.dumps(line)], io.StringIO(), drain=3600)
            eps = EpisodeStore(settings.data_dir)
            latest = max(eps.iter_files(), key=lambda p: p.stat().st_mtime_ns)
            meta = eps.read_front_matter(latest)
            out.failed.append(any(SIGNATURE_PART in s for s in meta["error_signatures"]))
            out.outcomes.append(str(meta["outcome"]))
            current = {r.id: r for r in rules.load()[0]}
            df = current.get(out.df_id)
            if df is not None and df.status == "active" and out.df_promoted_at is None:
                out.df_promoted_at = i
            for r in current.values():
                if r.text == USEFUL:
                    out.useful_id = r.id
                    if r.status == "active" and out.promoted_at is None:
                        out.promoted_at = i
                if r.text == DECOY:
                    out.decoy_id = r.id
                    if r.status == "retired" and out.retired_at is None:
                        out.retired_at = i
            if set(current) - {out.df_id} and out.drafted_at is None:
                out.drafted_at = i
        out.seconds = time.perf_counter() - t0
        for r in rules.load()[0]:
            out.rules[r.id] = (r.status, r.confidence, r.trials, r.wins, r.losses)
        out.commits = (
            len(rules.store.history("rules/" + out.useful_id + ".md")) if out.useful_id else 0
        )
        rules.store.close()
    return out


def report(learned: Outcome, base: Outcome, tasks: int) -> None:
    p = learned.promoted_at
    print(f"tasks: {tasks} (one 'summarize report-N.txt' every 10 simulated minutes)")
    print(f"baseline (learning off): mistake rate {base.rate(0):.0%} over {tasks} tasks")
    print(
        f"learning on: first draft after task {_n(learned.drafted_at)}; useful rule "
        f"{learned.useful_id} promoted after task {_n(p)}"
        + (
            f" ({p - learned.drafted_at} tasks after drafting)"
            if p is not None and learned.drafted_at is not None
            else ""
        )
    )
    print(f"decoy rule {learned.decoy_id} retired after task {_n(learned.retired_at)}")
    if p is not None:
        before, after = learned.rate(0, p + 1), learned.rate(p + 1)
        print(f"mistake rate before promotion {before:.0%}, after promotion {after:.0%}")
        ratio = after / base.rate(0) if base.rate(0) else 0.0
        print(f"after/baseline ratio: {ratio:.2f}")
    for rid, (status, conf, trials, wins, losses) in learned.rules.items():
        print(f"  {rid}: {status} confidence {conf:.2f}, {trials} trials ({wins}W/{losses}L)")
    if learned.df_id:
        status, conf, trials, wins, _losses = learned.rules[learned.df_id]
        print(
            f"df decoy {learned.df_id} (no task ran a command): {status}, confidence "
            f"{conf:.2f} after {trials} trials, promoted after task {_n(learned.df_promoted_at)}"
        )
    for name, run in (("learning on", learned), ("learning off", base)):
        done, of = run.mistakes_recorded_failed
        print(f"{name}: {done} of {of} tasks with the mistake recorded outcome: failure")
    print(f"git commits touching the useful rule: {learned.commits}")
    print(f"wall time: learning on {learned.seconds:.1f}s, off {base.seconds:.1f}s")


def _n(value: int | None) -> str:
    return "never" if value is None else str(value + 1)


async def _main(tasks: int = 30) -> None:
    from bot.logs import configure_logging
    from core.model.client import load_litellm

    configure_logging("warning", "json")
    load_litellm()  # its one-time import (seconds) must not count against either run
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        learned = await run_scenario(Path(a), tasks, learning=True)
        base = await run_scenario(Path(b), tasks, learning=False)
    report(learned, base, tasks)


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
