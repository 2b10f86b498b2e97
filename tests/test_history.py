"""Long conversations: older turns are compacted into a stored summary, nothing said is
lost, the context budget holds and is reported per task, and history survives a restart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.clock import SimClock
from core.history import History, extractive_summary
from memory.transcripts import TranscriptStore
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay

SUMMARY_MARK = "You keep the running summary"


def is_summary_request(body: dict[str, Any]) -> bool:
    return str(body["messages"][0]["content"]).startswith(SUMMARY_MARK)


def task_requests(llm: ScriptedLLM) -> list[dict[str, Any]]:
    """Requests of tasks (not compaction, not rule drafting)."""
    return [r for r in llm.requests if str(r["messages"][0]["content"]).startswith("You are Stew")]


def history(tmp_path: Path, summarizer: Any = None, **kw: int) -> History:
    return History(
        TranscriptStore(tmp_path),
        SimClock(),
        summarizer=summarizer,
        max_turns=kw.get("max_turns", 6),
        budget_tokens=kw.get("budget", 10_000),
        summary_tokens=kw.get("summary", 200),
    )


async def test_compaction_folds_oldest_exchanges_and_keeps_every_turn(tmp_path: Path) -> None:
    calls: list[tuple[str, list[dict[str, str]]]] = []

    async def summarize(previous: str, turns: list[dict[str, str]], budget: int) -> str:
        calls.append((previous, turns))
        return f"{previous} | folded {len(turns)}".strip(" |")

    h = history(tmp_path, summarize, max_turns=6)
    for i in range(5):
        await h.record("c", f"question {i}", f"answer {i}")
    ctx = await h.context("c")
    # 10 turns > 6: the oldest whole exchanges are folded until at most 3 remain verbatim.
    assert calls and all(len(turns) % 2 == 0 for _, turns in calls)
    assert ctx.turns[0]["role"] == "user" and len(ctx.turns) <= 6
    assert ctx.turns[-1] == {"role": "assistant", "content": "answer 4"}
    assert ctx.summary.startswith("folded")
    folded = [t["content"] for _, turns in calls for t in turns]
    assert folded[:2] == ["question 0", "answer 0"]
    # Nothing lost: every turn is in the transcript file, and a new process sees the same.
    text = TranscriptStore(tmp_path).path("c").read_text()
    assert all(f"question {i}" in text and f"answer {i}" in text for i in range(5))
    again = await history(tmp_path, summarize).context("c")
    assert again == ctx


async def test_token_budget_triggers_compaction_even_with_few_turns(tmp_path: Path) -> None:
    h = history(tmp_path, None, max_turns=100, budget=200, summary=200)
    await h.record("c", "x " * 300, "ok")  # one exchange of ~150 tokens fits
    assert (await h.context("c")).summary == ""
    await h.record("c", "y " * 300, "ok")
    ctx = await h.context("c")
    # Over budget: the older exchange is folded (extractive, no summarizer given), the
    # newest stays verbatim because it fits on its own.
    assert [t["content"][:3] for t in ctx.turns] == ["y y", "ok"]
    assert ctx.summary.startswith("- user: x x x")
    await h.record("c", "z " * 900, "ok")  # alone over the whole share: folded too
    ctx = await h.context("c")
    assert ctx.turns == [] and "- user: z z" in ctx.summary


def test_extractive_summary_keeps_the_newest_lines_inside_its_budget() -> None:
    turns = [{"role": "user", "content": f"line {i} " + "w" * 100} for i in range(40)]
    text = extractive_summary("earlier", turns, 120)
    assert len(text) // 4 + 1 <= 120 and "line 39" in text and "line 0 " not in text


async def test_history_zero_sends_no_turns_but_keeps_the_transcript(tmp_path: Path) -> None:
    h = history(tmp_path, None, max_turns=0)
    await h.record("c", "hello", "hi")
    assert (await h.context("c")).turns == []
    assert "hello" in TranscriptStore(tmp_path).path("c").read_text()


async def test_malformed_transcript_is_set_aside_not_overwritten(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    path = store.path("c")
    path.parent.mkdir(parents=True)
    path.write_text("---\nrecent: [unclosed\n---\nbody a person wrote\n")
    h = history(tmp_path)
    assert (await h.context("c")).turns == []
    await h.record("c", "q", "a")
    assert path.with_suffix(".malformed").read_text().endswith("body a person wrote\n")
    assert "q" in path.read_text()


async def test_long_chat_is_compacted_by_the_model_and_the_prompt_stays_in_budget(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(
        llm,
        history_turns=4,
        context_budget=300,
        recall_budget=50,
        summary_budget=60,
        recall_limit=0,
    )
    counter = iter(range(1000))

    def respond(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply.text("Summary: the person's staging bucket is blue-42.")
        return Reply.text(f"noted {next(counter)}")

    llm.responder = respond
    lines: list[dict[str, Any]] = [
        {"t": 0, "user": "alice", "text": "remember: my staging bucket is blue-42"}
    ]
    lines += [{"t": i, "user": "alice", "text": f"step {i}: " + "z" * 200} for i in range(1, 6)]
    lines.append({"t": 10, "user": "alice", "text": "which bucket is staging?"})
    await replay(s, lines)

    summaries = [r for r in llm.requests if is_summary_request(r)]
    assert summaries and "blue-42" in str(summaries[0]["messages"][1]["content"])
    last = task_requests(llm)[-1]
    contents = [str(m["content"]) for m in last["messages"]]
    # The first message left the prompt, its substance is there through the summary.
    assert not any(c.startswith("remember: my staging") for c in contents)
    assert any("Summary: the person's staging bucket is blue-42." in c for c in contents)
    eps = sorted(episodes(s), key=lambda e: e["started"])
    ctx = eps[-1]["context"]
    assert ctx["budget"] == 300 and ctx["summary"] > 0
    assert ctx["episodes"] + ctx["summary"] + ctx["history"] <= 300
    # ...and the transcript on disk still holds every word.
    [transcript] = (s.data_dir / "conversations").glob("*.md")
    assert "remember: my staging bucket is blue-42" in transcript.read_text()


async def test_compaction_with_the_model_down_uses_an_extractive_summary(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=2, llm_retries=0, recall_limit=0)

    def respond(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply.error(503, message="overloaded")
        return Reply.text("fine")

    llm.responder = respond
    await replay(
        s,
        [
            {"t": 0, "user": "bob", "text": "the deploy key lives in vault path ops/deploy"},
            {"t": 1, "user": "bob", "text": "second"},
            {"t": 2, "user": "bob", "text": "third"},
        ],
    )
    last = task_requests(llm)[-1]
    assert any(
        "- user: the deploy key lives in vault" in str(m["content"]) for m in last["messages"]
    )


async def test_conversation_history_survives_a_restart(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, recall_limit=0)
    llm.reply_text("Got it, Tuesday.").reply_text("You said Tuesday.")
    await replay(
        s,
        [
            {"t": 0, "user": "carol", "text": "the release is on Tuesday"},
            {"restart": True},
            {"t": 5, "user": "carol", "text": "when is the release?"},
        ],
    )
    contents = [m["content"] for m in llm.requests[-1]["messages"]]
    assert "the release is on Tuesday" in contents and "Got it, Tuesday." in contents


async def test_a_long_transcript_moves_into_part_files_and_keeps_every_turn(
    tmp_path: Path,
) -> None:
    store = TranscriptStore(tmp_path)
    store.part_size = 2_000
    h = History(
        store, SimClock(), summarizer=None, max_turns=4, budget_tokens=10_000, summary_tokens=200
    )
    for i in range(40):
        await h.record("c", f"question {i} " + "q" * 100, f"answer {i}")
    main = store.path("c").read_text()
    parts = sorted(store.root.glob("*.part-*.md"))
    assert parts and len(main) < 2_000 + 1_000  # the file rewritten per exchange stays small
    everything = main + "".join(p.read_text() for p in parts)
    assert all(f"question {i} " in everything and f"answer {i}" in everything for i in range(40))
    again = await history(tmp_path, None, max_turns=4).context("c")
    assert again == await h.context("c")  # a restart reads the same context


async def test_a_new_conversation_loads_without_a_thread_hop_and_saves_are_seen(
    tmp_path: Path,
) -> None:
    """Once the folder is listed, a conversation with no file starts empty at once (no
    worker thread), one this store saved since is read from disk, and a fresh store
    (a restart) sees every file."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from memory.transcripts import Transcript

    class Counting(ThreadPoolExecutor):
        calls = 0

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            Counting.calls += 1
            return super().submit(fn, *args, **kwargs)

    asyncio.get_running_loop().set_default_executor(Counting(max_workers=2))
    old = TranscriptStore(tmp_path)
    t = Transcript("old", recent=[{"role": "user", "content": "kept"}])
    await old.save(t, updated=SimClock().utcnow())

    store = TranscriptStore(tmp_path)
    assert (await store.load("old")).recent == t.recent  # the first load lists the folder
    before = Counting.calls
    assert (await store.load("brand new")).recent == []
    assert Counting.calls == before  # known absent: no hop

    fresh = Transcript("fresh", recent=[{"role": "assistant", "content": "said"}])
    await store.save(fresh, updated=SimClock().utcnow())
    assert (await store.load("fresh")).recent == fresh.recent
    assert (await TranscriptStore(tmp_path).load("fresh")).recent == fresh.recent


async def test_a_background_save_keeps_order_and_is_on_disk_when_its_future_is(
    tmp_path: Path,
) -> None:
    """`record(wait=False)`: the turns are in memory at once, the file follows in the
    background, saves of one conversation land in order (the last one wins), and
    `drain` waits for every save, as a stop does."""
    h = history(tmp_path, max_turns=50)
    first = await h.record("c", "question 1", "answer 1", wait=False)
    second = await h.record("c", "question 2", "answer 2", wait=False)
    assert first is not None and second is not None
    ctx = await h.context("c")  # what the next task reads: both exchanges, no waiting
    assert [t["content"] for t in ctx.turns] == ["question 1", "answer 1", "question 2", "answer 2"]
    await second
    await h.drain()
    again = await history(tmp_path, max_turns=50).context("c")  # a restart
    assert again.turns == ctx.turns
    # A waiting record after background ones: still in order, and on disk on return.
    await h.record("c", "question 3", "answer 3", wait=False)
    await h.record("c", "question 4", "answer 4")
    text = TranscriptStore(tmp_path).path("c").read_text()
    assert all(f"question {i}" in text for i in range(1, 5))
    assert len((await history(tmp_path, max_turns=50).context("c")).turns) == 8


async def test_a_failed_background_save_raises_from_its_future_and_the_next_saves_all(
    tmp_path: Path,
) -> None:
    import pytest

    h = history(tmp_path, max_turns=50)
    await h.record("c", "question 1", "answer 1")
    folder = TranscriptStore(tmp_path).root
    aside = folder.with_name("aside")
    folder.rename(aside)
    folder.write_text("a file where the folder was: every save fails")
    failing = await h.record("c", "question 2", "answer 2", wait=False)
    assert failing is not None
    with pytest.raises(OSError):
        await failing
    await h.drain()
    folder.unlink()
    aside.rename(folder)
    saved = await h.record("c", "question 3", "answer 3", wait=False)
    assert saved is not None
    await saved
    turns = (await history(tmp_path, max_turns=50).context("c")).turns
    assert [t["content"] for t in turns][-4:] == [
        "question 2",
        "answer 2",
        "question 3",
        "answer 3",
    ]
