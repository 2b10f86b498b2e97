"""A soak: 10,000 messages through `steward replay`, its resident memory every 1,000.

Target: RSS growth < 10% over 10,000 messages once the episodes' own index is counted.

Why `steward replay` and not `steward run`: even so, 10,000 messages take ~6 minutes
on a 2-core machine; a platform fake or the web chat's WebSocket would add their own
work per message and a wall clock to wait on. Replay is the same dispatcher, agent,
journal, history, proactive engine, memory index and background writers, fed from a
scenario file on a simulated clock (one message every `STEP` simulated seconds, so the
data dir's git batches, `COMMIT_EVERY` = 60 s, run as they would). Every setting is the
default a user gets; the scripted model answers at once, in this process, so its memory
is not counted. `BENCH_DATA_ROOT=/dev/shm` (tmpfs) shortens the wall time (a 1,000
message run at load 7-9: 50 s, against 2 min under the working directory) and changes
no figure (file pages are not the process's RSS); `BENCH_SOAK_MESSAGES` sets the count.

The load: `MESSAGES / PER_CONVERSATION` conversations of `PER_CONVERSATION` messages
each, `ACTIVE` at a time (people come and go: a conversation's state that is never let go shows as
growth, as in a Steward that runs for weeks), from `PEOPLE` people.

How the index is counted: each new episode is indexed (SQLite pages, vectors, the
in-memory keyword index), and that memory is wanted. Its share is measured, not
guessed: a second `steward replay` opens the soaked data dir fresh and answers 1,000
messages of new conversations, as the soak's first 1,000; its RSS minus the soak's RSS
at 1,000 (an empty data dir then) is what a process holds for the soaked dir's
episodes (10,101: its index, and anything else that grows with the stored data),
per episode times the 9,100 written between the soak's first and last samples. A
fresh process keeps no conversation's state, so a leak per message or conversation is
not in that share. Growth = last RSS - RSS at 1,000 - that share, as a % of RSS at
1,000: what stays is memory the stored data does not explain.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.data_root import bench_dir
from bench.rss import memory
from tests.fakes.llm import Reply, ScriptedLLM

STEWARD = str(Path(sys.executable).with_name("steward"))
MESSAGES = int(os.environ.get("BENCH_SOAK_MESSAGES") or 10_000)
EVERY = max(1, MESSAGES // 10)  # a sample every 1,000 messages
PER_CONVERSATION = 5
ACTIVE = 50
PEOPLE = 100
STEP = 2.0  # simulated seconds between two messages
#: Messages after the last sample of a run, so the process is still there to be read.
#: After the soak's 10,000th, the 10,001st vector moves the memory index from its exact
#: buffer to faiss (memory/vectors.py, EXACT_MAX): its last sample is taken `TAIL`
#: messages later, once that is done, as a fresh process on the same data has it.
TAIL = max(1, MESSAGES // 100)
TARGET_PCT = 10.0


def scenario(count: int, first_conversation: int = 0) -> list[str]:
    """`count` messages, then `TAIL` + 1 more that keep the process busy while the last
    sample is read. Conversations start `ACTIVE` at a time, each gets
    `PER_CONVERSATION` messages interleaved with the others', then ends."""
    block = ACTIVE * PER_CONVERSATION
    lines = []
    for i in range(count + TAIL + 1):
        conv = first_conversation + (i // block) * ACTIVE + i % ACTIVE
        turn = (i % block) // ACTIVE
        text = f"question {turn} in talk {conv}: how is service {conv % 13} doing after the deploy?"
        lines.append(
            json.dumps(
                {
                    "t": i * STEP,
                    "conversation": f"c{conv}",
                    "user": f"u{conv % PEOPLE}",
                    "text": text,
                }
            )
        )
    return lines


def _answer(body: dict) -> Reply:
    last = body["messages"][-1]["content"]
    return Reply.text(f"Service is fine. (re: {str(last)[:80]})")


Sample = tuple[int, float, float]


def soak(llm: ScriptedLLM, data: Path, count: int, first_conversation: int) -> list[Sample]:
    """Run `steward replay` over `count` messages; (messages, RSS, peak) every EVERY."""
    root = data.parent
    script = root / f"scenario-{first_conversation}.jsonl"
    script.write_text("\n".join(scenario(count, first_conversation)) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")} | {
        "STEWARD_DATA_DIR": str(data),
        "STEWARD_WORKSPACE": str(root / "ws"),
        "STEWARD_LOCAL_MODEL": "off",
        "STEWARD_LOG_LEVEL": "warning",
        "STEWARD_MODEL": f"openai/{llm.model_id}",
        "STEWARD_API_BASE": llm.base_url,
    }
    proc = subprocess.Popen(
        [STEWARD, "replay", str(script), "--drain", "0"],
        env=env,
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    errors: list[str] = []
    stderr = proc.stderr
    threading.Thread(target=lambda: errors.extend(stderr), daemon=True).start()
    samples: list[tuple[int, float, float]] = []
    answered = 0
    for raw in proc.stdout:
        if '"kind": "message"' not in raw:
            continue
        answered += 1
        if (answered % EVERY == 0 and answered <= count) or answered == count + TAIL:
            samples.append((answered, *memory(proc.pid)))
            llm.requests.clear()  # the scripted model keeps every request: not Steward's
            llm.embedded.clear()
    proc.wait()
    if proc.returncode != 0 or answered < count:
        raise RuntimeError(
            f"steward replay exited {proc.returncode} after {answered} answers: "
            + "".join(errors[-20:])
        )
    return samples


def main() -> None:
    llm = ScriptedLLM()
    llm.responder = _answer
    llm.start_in_thread()
    tmp = bench_dir("steward-soak-")
    load = [Path("/proc/loadavg").read_text().split()[0]]
    try:
        t0 = time.monotonic()
        runs = soak(llm, tmp / "data", MESSAGES, 0)
        took = time.monotonic() - t0
        fresh = soak(llm, tmp / "data", EVERY, 10 * MESSAGES)  # new conversations
    finally:
        llm.stop_thread()
        load.append(Path("/proc/loadavg").read_text().split()[0])
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"steward replay, {MESSAGES:,} messages in {took:.0f} s "
        f"({MESSAGES / PER_CONVERSATION:,.0f} conversations of {PER_CONVERSATION}, "
        f"{ACTIVE} at a time, {PEOPLE} people); "
        f"load {load[0]} -> {load[1]}"
    )
    for n, rss, peak in runs:
        print(f"  {n:6,} messages: {rss:6.1f} MB RSS (peak {peak:.1f})")
    start, end, peak = runs[0][1], runs[-1][1], max(p for *_, p in runs)
    # What a process holds per stored episode, times the episodes written between the
    # soak's first and last samples (the soaked dir holds count + TAIL + 1 of them).
    share = (fresh[0][1] - start) * (runs[-1][0] - runs[0][0]) / (MESSAGES + TAIL + 1)
    rest = end - start - share
    print(
        f"the soaked data dir opened fresh, {fresh[0][0]:,} messages: {fresh[0][1]:.1f} MB RSS "
        f"(baseline: the empty one after as many, {start:.1f} MB)"
    )
    grown = end - start
    print(
        f"growth {start:.1f} -> {end:.1f} MB: {grown:+.1f} MB ({grown / start:+.1%}); "
        f"the index's share {share:+.1f} MB; the rest {rest:+.1f} MB = "
        f"{rest / start:+.1%} of the start (target < {TARGET_PCT:.0f}%: "
        f"{'meets' if rest / start * 100 < TARGET_PCT else 'MISSES'}); peak {peak:.1f} MB"
    )
    # The same sum at the last sample before the switch to faiss: the share then counts
    # faiss (its library and lists) that this sample does not hold yet, so it flatters.
    before, written = runs[-2][1], runs[-2][0] - runs[0][0]
    early = before - start - (fresh[0][1] - start) * written / (MESSAGES + TAIL + 1)
    print(
        f"  at {runs[-2][0]:,} messages, before the memory index's switch to faiss: "
        f"{before - start:+.1f} MB, the rest {early:+.1f} MB ({early / start:+.1%}); the "
        f"switch itself {end - before:+.1f} MB in {runs[-1][0] - runs[-2][0]} messages"
    )


if __name__ == "__main__":
    main()
