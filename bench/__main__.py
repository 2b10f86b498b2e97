"""`python3 dev.py bench [NAME ...]`: run the benchmarks and print their numbers.

Each benchmark measures a baseline in the same run and prints the ratio to it, so
a figure survives a noisy or slower machine.
"""

from __future__ import annotations

import importlib
import sys

BENCHES = {
    "cli_startup": "bench.cli_startup",
    "agent_overhead": "bench.agent_overhead",
    "concurrent": "bench.concurrent",
    "cpu_per_message": "bench.cpu_per_message",
    "tokens": "bench.tokens",
    "guardian_corpus": "bench.guardian_corpus",
    "memory": "bench.memory",
    "learning": "bench.learning",
    "proactive": "bench.proactive",
    "history": "bench.history",
    "sandbox": "bench.sandbox",
    "journal": "bench.journal",
    "schedules": "bench.schedules",
    "dashboard": "bench.dashboard",
    "goals": "bench.goals",
    "snapshots": "bench.snapshots",
    "code_index": "bench.code_index",
    "workflows": "bench.workflows",
    "rss": "bench.rss",
    "soak": "bench.soak",
    "webchat": "bench.webchat",
    "ablations": "bench.ablations",
    "local_model": "bench.local_model",  # skips, saying why, without steward[local]
    "cluster": "bench.cluster",  # needs NATS (JetStream) and PostgreSQL on 127.0.0.1
    "cluster_store": "bench.cluster_store",  # needs PostgreSQL on 127.0.0.1
    "dashboard_copy": "bench.dashboard_copy",  # needs PostgreSQL on 127.0.0.1
    "cluster_vectors": "bench.cluster_vectors",  # PostgreSQL; pgvector half skips without it
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
        return 2
    for name in names:
        print(f"== {name}", flush=True)
        importlib.import_module(BENCHES[name]).main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
