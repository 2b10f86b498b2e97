"""What does each part of Steward buy? One scripted workload, run with the full system and
then with one part switched off at a time, over the same seeds.

Everything goes through `steward replay` (the dispatcher, the agent, litellm over HTTP to
a scripted OpenAI-compatible model, the guardian and sandbox, episodes, the memory index,
the learner, proactive help, workflows, the answer gates). The workload is six scenarios
(bench/ablation_workload.py: learning, proactive, recall, memory, workflows, gates),
each in its own data dir and workspace, each run once per seed and configuration.
`BENCH_ABLATIONS_SEEDS=1,2,3` chooses the seeds. Results: docs/ablations.md.

Columns: tasks failed (recorded failures plus false successes), repeated failures (a
failure whose signature an earlier failure of the same scenario had), false successes
(recorded success, claimed file absent), tokens (as the scripted server reported them in
`usage`: what a provider bills), model calls, interruptions (offers of help refused or
ignored) and acceptance (offers accepted / offers made).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from bench.ablation_workload import SCENARIOS, Outbox, Person, Scenario
from bot.replay import run_replay
from config.settings import load_settings
from memory.episodes import EpisodeStore
from tests.fakes.llm import ScriptedLLM

#: The configurations: the full system, then one part off at a time.
CONFIGS: dict[str, dict[str, str]] = {
    "full": {},
    "-learning": {"STEWARD_LEARNING_ENABLED": "false"},
    "-recall": {"STEWARD_RECALL_LIMIT": "0"},
    "-gates": {"STEWARD_ANSWER_GATES": "false"},
    "-proactive": {"STEWARD_PROACTIVE_ENABLED": "false"},
    "-workflows": {"STEWARD_WORKFLOWS_ENABLED": "false"},
}
SEEDS = tuple(
    int(s) for s in (os.environ.get("BENCH_ABLATIONS_SEEDS") or "").split(",") if s.strip()
) or (1, 2, 3)
#: The person of the i-th seed answers offers of help as this bench/proactive.py persona.
PERSONA_CYCLE = ("welcoming", "fine", "wants_quiet")


@dataclass
class Tally:
    """One configuration's figures, summed over scenarios and seeds."""

    tasks: int = 0
    failed: int = 0
    repeated: int = 0
    false_successes: int = 0
    tokens: int = 0
    calls: int = 0
    offers: int = 0
    accepted: int = 0
    interruptions: int = 0

    def add(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _lines(scenario: Scenario, person: Person, out: Outbox) -> Iterator[str]:
    for line in scenario.lines(person, out):
        yield json.dumps(line)


def tally(episodes: EpisodeStore, scenario: Scenario, ws: Path) -> Tally:
    """Tasks, failures, repeated failures and false successes from the episode files."""
    metas = sorted(
        (episodes.read_front_matter(p) for p in episodes.iter_files()),
        key=lambda m: str(m["started"]),
    )
    out = Tally(tasks=len(metas))
    seen: set[str] = set()
    for meta in metas:
        false = meta["outcome"] == "success" and scenario.false_success(meta, ws)
        if meta["outcome"] == "success" and not false:
            continue
        out.failed += 1
        out.false_successes += false
        signature = (
            "false success"
            if false
            else "|".join(meta.get("error_signatures") or []) or str(meta.get("error"))[:80]
        )
        out.repeated += signature in seen
        seen.add(signature)
    return out


async def run_scenario(
    kind: type[Scenario], root: Path, config: dict[str, str], seed: int, persona: str
) -> Tally:
    """One scenario, one configuration, one seed: a whole `steward replay` session."""
    scenario = kind(seed)
    ws = root / "ws"
    ws.mkdir(parents=True)
    scenario.setup(ws)
    person = Person(persona, random.Random(f"{seed}:{kind.name}"))
    async with ScriptedLLM() as llm:
        llm.responder = scenario.respond
        env = {
            "STEWARD_DATA_DIR": str(root / "data"),
            "STEWARD_WORKSPACE": str(ws),
            "STEWARD_MODEL": f"openai/{llm.model_id}",
            "STEWARD_API_BASE": llm.base_url,
            "STEWARD_LOG_LEVEL": "error",
            # What a task sees of earlier ones comes from recall, not the transcript.
            "STEWARD_HISTORY_TURNS": "0",
            "STEWARD_SKILLS_PROPOSE": "false",
            **config,
        }
        settings = load_settings(env=env, cwd=root)
        out = Outbox()
        await run_replay(settings, _lines(scenario, person, out), out, drain=3600)
        result = tally(EpisodeStore(settings.data_dir), scenario, ws)
        result.tokens = sum(llm.served_tokens())
        result.calls = len(llm.requests)
    result.offers, result.accepted = person.offers, person.accepted
    result.interruptions = person.interruptions
    return result


async def run_config(
    config: dict[str, str],
    seeds: tuple[int, ...] = SEEDS,
    scenarios: tuple[type[Scenario], ...] = SCENARIOS,
) -> dict[str, Tally]:
    """The workload under one configuration: a Tally per scenario, summed over seeds."""
    out = {kind.name: Tally() for kind in scenarios}
    for i, seed in enumerate(seeds):
        persona = PERSONA_CYCLE[i % len(PERSONA_CYCLE)]
        with tempfile.TemporaryDirectory() as tmp:
            # A seed's scenarios together: while one waits on a sandboxed command or a
            # git commit, another runs (measured: ~30% less wall time on 2 cores; more
            # at once gained nothing). Each has its own dirs, model server and clock.
            runs = [
                run_scenario(kind, Path(tmp) / kind.name, config, seed, persona)
                for kind in scenarios
            ]
            for kind, result in zip(scenarios, await asyncio.gather(*runs), strict=True):
                out[kind.name].add(result)
    return out


#: (Tally field, column heading, what a difference counts) per column of the table.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("failed", "failed", "failures"),
    ("repeated", "repeated", "repeated failures"),
    ("false_successes", "false succ.", "false successes"),
    ("tokens", "tokens", "tokens"),
    ("calls", "calls", "model calls"),
    ("interruptions", "interrupt.", "interruptions"),
)


def _acceptance(t: Tally) -> str:
    return f"{t.accepted}/{t.offers}" if t.offers else "-"


def _total(per: dict[str, Tally]) -> Tally:
    total = Tally()
    for t in per.values():
        total.add(t)
    return total


def verdict(full: Tally, off: Tally) -> str:
    """What a part buys (switched off, a figure grows) and costs (it shrinks)."""
    saves: list[str] = []
    costs: list[str] = []
    for key, _, noun in COLUMNS:
        diff = getattr(off, key) - getattr(full, key)
        if diff:
            (saves if diff > 0 else costs).append(f"{abs(diff)} {noun}")
    said = f"saves {', '.join(saves)}" if saves else "buys nothing here"
    return said + (f"; costs {', '.join(costs)}" if costs else "")


def by_scenario(full: dict[str, Tally], off: dict[str, Tally]) -> list[str]:
    """Per scenario, each figure that switching the part off changed."""
    changed = []
    for name, f in full.items():
        o = off[name]
        diffs = [
            f"{label} {getattr(o, key) - getattr(f, key):+d}"
            for key, label, _ in COLUMNS
            if getattr(o, key) != getattr(f, key)
        ]
        if (o.accepted, o.offers) != (f.accepted, f.offers):
            diffs.append(f"acceptance {_acceptance(f)} -> {_acceptance(o)}")
        changed.append(f"{name}: {', '.join(diffs) if diffs else 'no change'}")
    return changed


def table(results: dict[str, dict[str, Tally]]) -> str:
    """The printed table: each row's totals and its difference against the full system."""
    full = _total(results["full"])
    head = (
        f"{'configuration':13s} {'tasks':>5s} "
        + " ".join(f"{label:>15s}" for _, label, _ in COLUMNS)
        + f" {'acceptance':>10s}"
    )
    rows = [head, "-" * len(head)]
    for name, per in results.items():
        t = _total(per)
        cells = []
        for key, _, _ in COLUMNS:
            value = getattr(t, key)
            diff = f"({value - getattr(full, key):+d})" if name != "full" else ""
            cells.append(f"{value:>7d} {diff:>7s}")
        rows.append(f"{name:13s} {t.tasks:>5d} " + " ".join(cells) + f" {_acceptance(t):>10s}")
    return "\n".join(rows)


def report(results: dict[str, dict[str, Tally]], seeds: tuple[int, ...]) -> None:
    """The table, then what each part buys: in all, and scenario by scenario."""
    personas = ", ".join(PERSONA_CYCLE[i % len(PERSONA_CYCLE)] for i in range(len(seeds)))
    full = results["full"]
    print(
        f"workload: {', '.join(full)}; {len(seeds)} seeds ({', '.join(map(str, seeds))}; "
        f"the person answering offers: {personas}); {_total(full).tasks} tasks in the full "
        "system; figures summed over the seeds, (±n) against the full system"
    )
    print(table(results))
    print("the full system by scenario:")
    for name, t in full.items():
        figures = ", ".join(f"{label} {getattr(t, key)}" for key, label, _ in COLUMNS)
        print(f"    {name}: tasks {t.tasks}, {figures}, acceptance {_acceptance(t)}")
    for name, per in results.items():
        if name != "full":
            print(f"{name}: {verdict(_total(full), _total(per))}")
            for line in by_scenario(full, per):
                print(f"    {line}")


async def _main() -> None:
    from bot.logs import configure_logging
    from core.model.client import load_litellm

    configure_logging("error", "json")
    load_litellm()  # its one-time import (seconds) must not count against any run
    t0 = time.perf_counter()
    results: dict[str, dict[str, Tally]] = {}
    for name, config in CONFIGS.items():
        started = time.perf_counter()
        results[name] = await run_config(config)
        print(f"ran {name} in {time.perf_counter() - started:.1f}s", flush=True)
    report(results, SEEDS)
    print(f"wall time: {time.perf_counter() - t0:.1f}s (budget: 180s)")


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
