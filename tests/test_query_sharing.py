"""A task's request is embedded once, not once for recall and once for the rules.

Recall (the memory index's search, in its thread) and the learner's rule
matching embed the same request within milliseconds of each other. With a hosted
embedding model that was two API calls a message; with the hashed one an embedding
and a thread hop. `memory.embedder.share_query` lets the second asker wait for the
first one's vector.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory.embedder import HashedEmbedder, embed_query, embed_rows
from memory.index import MemoryIndex
from memory.rules import Rule, RuleStore
from tests.fakes.llm import ScriptedLLM


class Counting(HashedEmbedder):
    """The hashed embedder, counting the texts it embeds (and failing when told to)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.fail_next = 0
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.seen += list(texts)
            if self.fail_next:
                self.fail_next -= 1
                raise RuntimeError("embedder down")
        time.sleep(0.02)  # long enough for a second asker to arrive while it works
        return super().embed(texts)


class Gated:
    """An async embedder (as a hosted model is) that answers when the test says so."""

    name = "gated"
    dim = 512

    def __init__(self) -> None:
        self.inner = HashedEmbedder()
        self.gate = asyncio.Event()
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed(texts)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        await self.gate.wait()
        return self.inner.embed(texts)


async def test_two_askers_of_one_text_get_one_embedding_the_same_bits_read_only() -> None:
    e = Counting()
    a, b = await asyncio.gather(embed_query(e, "deploy the app"), embed_query(e, "deploy the app"))
    assert e.seen == ["deploy the app"]
    expected = embed_rows(HashedEmbedder(), ["deploy the app"])[0]
    assert a.tobytes() == expected.tobytes() and b.tobytes() == expected.tobytes()
    with pytest.raises(ValueError):
        a[0] = 1.0  # shared: nobody may change it for the others
    # Asked again later: still the kept vector, no new embedding.
    assert (await embed_query(e, "deploy the app")).tobytes() == expected.tobytes()
    assert e.seen == ["deploy the app"]
    await embed_query(e, "another request")
    assert e.seen == ["deploy the app", "another request"]


async def test_an_owner_that_fails_leaves_the_waiter_to_make_its_own() -> None:
    e = Counting()
    e.fail_next = 1
    first, second = await asyncio.gather(
        embed_query(e, "rotate keys"), embed_query(e, "rotate keys"), return_exceptions=True
    )
    assert isinstance(first, RuntimeError) and "embedder down" in str(first)
    assert isinstance(second, np.ndarray)
    assert second.tobytes() == embed_rows(HashedEmbedder(), ["rotate keys"])[0].tobytes()
    assert e.seen == ["rotate keys", "rotate keys"]
    # The failure is not kept: the next asker gets the vector made after it.
    assert (await embed_query(e, "rotate keys")).tobytes() == second.tobytes()
    assert len(e.seen) == 2


async def test_a_waiter_cancelled_does_not_cancel_the_vector_for_the_others() -> None:
    e = Gated()
    owner = asyncio.ensure_future(embed_query(e, "backup the replica"))
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(embed_query(e, "backup the replica"))
    other = asyncio.ensure_future(embed_query(e, "backup the replica"))
    await asyncio.sleep(0.01)
    waiter.cancel()
    e.gate.set()
    a, c = await asyncio.wait_for(asyncio.gather(owner, other), 5)
    assert waiter.cancelled()
    assert e.calls == [["backup the replica"]]
    assert a.tobytes() == c.tobytes()


async def test_an_owner_cancelled_hands_the_text_to_the_next_asker() -> None:
    e = Gated()
    owner = asyncio.ensure_future(embed_query(e, "restart nginx"))
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(embed_query(e, "restart nginx"))
    await asyncio.sleep(0.01)
    owner.cancel()  # e.g. a recall whose task ended: its waiter is not cancelled with it
    await asyncio.sleep(0.01)
    assert not waiter.done()
    e.gate.set()
    got = await asyncio.wait_for(waiter, 5)
    assert owner.cancelled()
    assert e.calls == [["restart nginx"], ["restart nginx"]]
    assert got.tobytes() == embed_rows(HashedEmbedder(), ["restart nginx"])[0].tobytes()


async def test_a_batch_takes_the_rows_of_texts_just_asked_for_and_embeds_the_rest() -> None:
    e = Counting()
    await embed_query(e, "restart the queue worker")
    texts = ["a new episode text", "restart the queue worker", "another new one"]
    e.seen.clear()
    got = embed_rows(e, texts)
    assert e.seen == ["a new episode text", "another new one"]
    assert got.tobytes() == embed_rows(HashedEmbedder(), texts).tobytes()  # the same bits
    e.seen.clear()
    assert embed_rows(e, ["restart the queue worker"]).shape == (1, 512)
    assert e.seen == []


async def test_the_index_search_and_a_second_asker_share_the_query_vector(
    tmp_path: Path,
) -> None:
    e = Counting()
    async with await MemoryIndex.open(tmp_path, e, progress=False) as idx:
        e.seen.clear()
        text = "deploy the staging cluster"
        searching = asyncio.ensure_future(idx.search(text, limit=5))
        await asyncio.sleep(0)  # the search has started (its thread embeds the text)
        vector = await embed_query(e, text)
        hits = await searching
        assert e.seen == [text]
        assert vector.tobytes() == embed_rows(HashedEmbedder(), [text])[0].tobytes()
        assert hits == []  # an empty index: nothing found, nothing failed
        # The other way round, the second asker being the search: it uses the kept vector.
        assert await idx.search(text, limit=5) == []
        assert e.seen == [text]


async def _seed_rule(data_dir: Path) -> None:
    store = RuleStore(data_dir)
    try:
        await store.save(
            Rule(
                id="r-1",
                text="Before you deploy the staging cluster, check the runbook.",
                status="active",
                confidence=0.7,
                signature="tool:run_command:DeployError:ab12",
                applies_when="deploying the staging cluster",
                # The scripted server's vectors come from each text's SHA-256: this one
                # is 0.475 from the request below (the learner's match is 0.3).
                examples=["deploy the staging cluster after migration 96"],
            ),
            "seed",
        )
    finally:
        store.store.close()


async def test_a_message_with_learned_rules_embeds_its_request_once_with_a_hosted_model(
    llm: ScriptedLLM,
    settings_for: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The assembled product: a hosted embedding model through litellm over HTTP, a
    learned rule on disk, one message. Recall, the rules and the episode (its request
    alone) all need the request's vector; the scripted server is asked for it once (it
    was asked three times: three API calls a message)."""
    from adapters.replay import ReplayChannel
    from bot.app import App
    from core.access import Rules
    from core.events import Message

    monkeypatch.setenv("OPENAI_API_KEY", "x")
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    llm.embedding_dim = 32
    settings = settings_for(llm, embedding_model="openai/embed-small")
    await _seed_rule(settings.data_dir)
    app = App(settings)
    app.access.rules["replay"] = Rules(open=True)
    replies: list[dict[str, Any]] = []
    channel = ReplayChannel(time.monotonic, replies.append)
    await app.start([channel])
    try:
        request = "deploy the staging cluster again"
        llm.reply_text("Done, the runbook was checked.")
        await app.dispatcher.handle(Message("replay", "c1", "u", request), channel)
        async with asyncio.timeout(20):
            await app.conversations.wait_idle("replay:c1")
            await app.persist.drain()
        assert [r["text"] for r in replies] == ["Done, the runbook was checked."]
        prompt = next(r for r in llm.requests if "tools" in r)["messages"][0]["content"]
        assert "check the runbook" in prompt  # the rule matched (by the shared vector)
        asked = [texts for texts in llm.embedded if request in texts]
        assert asked == [[request]], llm.embedded
    finally:
        await app.stop()
