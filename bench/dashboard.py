"""The dashboard's Spend and History over a month of episodes (2,000 files): an open
page re-reads them on every finished task, so a warm read must stay in milliseconds.

Baseline in the same run: stat-ing every episode file once, the least a reader that
notices changed files could do without a cache keyed by folder.
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

EPISODES = 2000


def _write(folder: Path, now: datetime) -> None:
    from memory.atomic import atomic_write_text
    from memory.episodes import Episode, EpisodeStore, ToolRecord

    store = EpisodeStore(folder)
    for i in range(EPISODES):
        e = Episode(
            id=f"e{i}",
            started=now - timedelta(minutes=10 * i),
            channel="web",
            conversation="web:bench",
            user="owner",
            request=f"task {i}",
            outcome="success",
            model="openai/bench",
            tokens_in=1000,
            tokens_out=100,
            cost_usd=0.001,
            tools=[ToolRecord("shell", True, args={"command": "ls"})],
        )
        path = store.path_for(e)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, e.to_markdown())


def main() -> None:
    from bot.dashboard import data

    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write(folder, now)
        cache = data.FrontMatterCache()
        t0 = time.perf_counter()
        total = data.spend(cache, folder, days=14, now=now)["total"]["tasks"]
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        data.spend(cache, folder, days=14, now=now)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        data.recent_episodes(cache, folder, limit=50, days=90, now=now)
        history = time.perf_counter() - t0
        t0 = time.perf_counter()
        for path in (folder / "episodes").rglob("*.md"):
            path.stat()
        baseline = time.perf_counter() - t0
    print(
        f"spend over {total} episodes (14 days): cold {cold * 1000:.0f} ms, warm "
        f"{warm * 1000:.1f} ms; history page (50 newest, warm) {history * 1000:.1f} ms"
    )
    print(
        f"baseline: stat every episode file {baseline * 1000:.1f} ms; warm spend / baseline "
        f"{warm / baseline:.2f}"
    )


if __name__ == "__main__":
    main()
