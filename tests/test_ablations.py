"""The ablation bench's plumbing (bench/ablations.py) on one seed and two small scenarios,
through real `steward replay` sessions: switching a part off must show in its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ablation_workload import Gates, Memory
from bench.ablations import CONFIGS, Tally, report, run_scenario, table, verdict


async def test_recall_off_makes_the_memory_scenario_redo_the_lookup(tmp_path: Path) -> None:
    full = await run_scenario(Memory, tmp_path / "full", CONFIGS["full"], 1, "welcoming")
    off = await run_scenario(Memory, tmp_path / "off", CONFIGS["-recall"], 1, "welcoming")
    later = 2 + 1 % 3  # the later asks for seed 1
    assert full.tasks == off.tasks == 1 + later
    assert full.failed == off.failed == 0
    # Recalled, each later ask is one call; not recalled, the lookup again (three).
    assert off.calls - full.calls == 2 * later, (full, off)
    assert off.tokens > full.tokens


async def test_gates_off_records_a_false_success(tmp_path: Path) -> None:
    lies = sum(Gates(1).lies(f"write the release notes for v1.{i}") for i in range(Gates.TASKS))
    assert lies >= 1  # the seed makes the model claim at least one unwritten file
    full = await run_scenario(Gates, tmp_path / "full", CONFIGS["full"], 1, "welcoming")
    off = await run_scenario(Gates, tmp_path / "off", CONFIGS["-gates"], 1, "welcoming")
    assert full.false_successes == full.failed == 0
    assert off.false_successes == off.failed == lies, off
    # Each caught claim costs two more calls: the retry's write and its answer.
    assert full.calls - off.calls == 2 * lies, (full, off)


def test_table_says_when_a_part_buys_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    same = Tally(tasks=4, failed=1, tokens=100, calls=3)
    worse = Tally(tasks=4, failed=3, repeated=2, tokens=90, calls=3)
    assert verdict(same, Tally(tasks=4, failed=1, tokens=100, calls=3)) == "buys nothing here"
    assert verdict(same, worse) == "saves 2 failures, 2 repeated failures; costs 10 tokens"
    results = {"full": {"s": same}, "-recall": {"s": worse}, "-gates": {"s": same}}
    printed = table(results)
    assert "(+2)" in printed and "(-10)" in printed
    report(results, (1,))
    out = capsys.readouterr().out
    assert "-gates: buys nothing here" in out and "s: failed +2, repeated +2, tokens -10" in out
