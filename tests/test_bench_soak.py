"""`bench soak` runs end to end and prints its verdict: a bench is run by hand, so code
it drives (`steward replay`'s output, the scripted model) can change under it
unnoticed. 100 messages instead of 10,000 (`BENCH_SOAK_MESSAGES`): the figure is the
bench's, this only checks that it still measures."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_short_soak_samples_rss_and_prints_the_growth_and_the_index_share(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "soak"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "BENCH_DATA_ROOT": str(tmp_path),
            "TMPDIR": tempfile.gettempdir(),  # the suite's scratch folder (tests/scratch.py)
            "BENCH_SOAK_MESSAGES": "100",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    # A sample every tenth of the run and one after its tail.
    assert out.count(" MB RSS (peak ") == 11, out
    assert "the soaked data dir opened fresh" in out, out
    assert "the index's share" in out and "target < 10%" in out, out
