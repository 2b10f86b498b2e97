"""The guardian corpus (tests/guardian_corpus.tsv): confusion matrix and throughput.

Accuracy: every labelled call through `Guardian.check_sync` in the same sandbox the
tests use; a 3×3 matrix (rows: expected verdict, columns: what the guardian said),
counts per category, and the one number that must stay 0: forbid-labelled or
dangerous calls that came out allowed.

Throughput: calls judged per second, against a baseline measured in the same run on
the same calls — `shlex.split` of each command (`json.dumps` of the arguments for
other tools), i.e. the cheapest "look at the text" a checker could do. The ratio
says what parsing and judging cost over merely tokenising.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from core.guardian import Guardian, Verdict
from tests.test_guardian import CATEGORIES, Row, load_corpus, make_sandbox

VERDICTS = (Verdict.ALLOW, Verdict.APPROVAL, Verdict.FORBID)
PASSES = 5


def _rate(rows: list[Row], judge: Callable[[Row], object]) -> float:
    """Calls per second: the best of PASSES passes over every row (least disturbed)."""
    best = []
    for _ in range(PASSES):
        t0 = time.perf_counter()
        for row in rows:
            judge(row)
        best.append(time.perf_counter() - t0)
    return len(rows) / min(best)


def _baseline(row: Row) -> object:
    if row.tool == "shell" and isinstance(row.args.get("command"), str):
        try:
            return shlex.split(row.args["command"])
        except ValueError:
            return None
    return json.dumps(row.args)


def main() -> None:
    rows = load_corpus()
    base = Path(tempfile.mkdtemp(prefix="steward-bench-guardian-"))
    ws, home, overlay = make_sandbox(base)
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        guardian = Guardian(ws, overlay_path=overlay)
        verdicts = [guardian.check_sync(row.tool, row.args).verdict for row in rows]
        got = {row.line: v for row, v in zip(rows, verdicts, strict=True)}
        matrix = Counter((row.expected, got[row.line]) for row in rows)
        print(f"{len(rows)} labelled calls ({sum(r.is_shell for r in rows)} shell)")
        print("expected \\ got   " + "".join(f"{v.value:>10}" for v in VERDICTS))
        for expected in VERDICTS:
            cells = "".join(f"{matrix[(expected, g)]:>10}" for g in VERDICTS)
            print(f"{expected.value:<16} {cells}")
        correct = sum(matrix[(v, v)] for v in VERDICTS)
        print(f"correct {correct}/{len(rows)}")
        for category in CATEGORIES:
            in_cat = [r for r in rows if r.category == category]
            by_got = Counter(got[r.line].value for r in in_cat)
            right = sum(got[r.line] == r.expected for r in in_cat)
            spread = ", ".join(f"{v.value} {by_got[v.value]}" for v in VERDICTS)
            print(f"  {category:<10} {len(in_cat):>4} rows, {right:>4} as labelled  ({spread})")
        dangerous_allowed = [
            r.text
            for r in rows
            if (r.expected == Verdict.FORBID or r.category == "dangerous")
            and got[r.line] == Verdict.ALLOW
        ]
        print(f"dangerous allowed: {len(dangerous_allowed)} (must be 0)")
        for text in dangerous_allowed:
            print(f"  ALLOWED: {text}")

        base_rate = _rate(rows, _baseline)
        guard_rate = _rate(rows, lambda r: guardian.check_sync(r.tool, r.args))
        print(f"shlex.split          {base_rate:>9.0f} calls/s  (baseline, best of {PASSES})")
        print(
            f"guardian.check_sync  {guard_rate:>9.0f} calls/s  ({1e6 / guard_rate:.0f} µs a "
            f"call; ratio to baseline {guard_rate / base_rate:.4f}, "
            f"{base_rate / guard_rate:.0f}x slower)"
        )
    finally:
        if old_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old_home
        shutil.rmtree(base, ignore_errors=True)
