"""The memory bench's free-text questions (bench/memory_questions.py): about the stored
episodes, in other words than their requests, the same every run."""

from __future__ import annotations

import random

from bench import memory as bm


def test_episode_fields_are_the_ones_each_episode_was_made_from() -> None:
    for i in range(200):
        episode = bm.make_episode(i, random.Random(1_000_003 + i))
        request_at, fields, error_at, error_fields = bm.episode_fields(i)
        assert episode.request == bm.REQUESTS[request_at].format(**fields)
        if error_at is None:
            assert episode.error == ""
        else:
            assert episode.error == bm.ERRORS[error_at].format(**error_fields)


def test_questions_are_deterministic_and_never_the_request_text() -> None:
    asked, scopes = bm.free_text_questions(5000, 300)
    assert (asked, scopes) == bm.free_text_questions(5000, 300)
    requests = {bm.make_episode(i, random.Random(1_000_003 + i)).request for i in range(5000)}
    assert not set(asked) & requests
    assert len(set(asked)) > 250  # varied, not a handful of fixed strings
    assert all(s.startswith(("person:", "conversation:")) for s in scopes)
    # Other words and typos: many questions share few words with any request.
    words = {w for r in requests for w in r.lower().split()}
    strange = [q for q in asked if sum(w not in words for w in q.lower().split()) >= 3]
    assert len(strange) > 150
