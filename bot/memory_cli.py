"""`steward memory …` over the episode files (the indexes arrive with the memory issue)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from config.settings import Settings
from memory.episodes import EpisodeStore


def _episodes(settings: Settings) -> tuple[list[dict[str, Any]], list[str]]:
    store = EpisodeStore(settings.data_dir)
    found, problems = [], []
    for path in store.iter_files():
        try:
            meta = store.read_front_matter(path)
        except (OSError, ValueError) as exc:
            problems.append(str(exc))
            continue
        meta["path"] = str(path)
        found.append(meta)
    return found, problems


def memory_command(settings: Settings, args: argparse.Namespace) -> int:
    episodes, problems = _episodes(settings)
    for p in problems:
        print(f"skipped malformed episode: {p}", file=sys.stderr)
    if args.memory_command == "search":
        words = [w.lower() for w in args.query.split() if w]
        hits = [
            e
            for e in episodes
            if all(w in f"{e.get('request', '')} {e.get('error', '')}".lower() for w in words)
        ]
        hits.sort(key=lambda e: str(e.get("started", "")), reverse=True)
        hits = hits[: max(1, args.limit)]
        if args.json:
            print(
                json.dumps(
                    [
                        {k: e.get(k) for k in ("id", "started", "outcome", "request", "path")}
                        for e in hits
                    ],
                    default=str,
                )
            )
        elif not hits:
            print(f"No episodes match {args.query!r}.")
        else:
            for e in hits:
                print(f"{e.get('id')}  {e.get('outcome'):9} {str(e.get('request', ''))[:70]}")
        return 0
    outcomes: dict[str, int] = {}
    for e in episodes:
        outcomes[str(e.get("outcome"))] = outcomes.get(str(e.get("outcome")), 0) + 1
    print(f"data dir: {settings.data_dir}")
    print(f"episodes: {len(episodes)} " + " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())))
    if problems:
        print(f"malformed files skipped: {len(problems)}")
    return 0
