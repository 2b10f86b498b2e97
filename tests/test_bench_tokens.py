"""bench/tokens.py counts a first turn's prompt (the prompt-size figure is read from it).

It printed a division by zero once Steward turned litellm's token counter off for its
own calls (core/model/client.py): a counter that is off answers 0 for every text."""

from __future__ import annotations

import json

from bench.tokens import first_turn, measure
from core.model.client import load_litellm


async def test_a_first_turn_is_counted_part_by_part_and_the_counter_left_off() -> None:
    body = await first_turn()
    got = measure(body)
    assert {"read_file", "write_file", "shell"} <= set(got["tools"])
    assert all(tokens > 10 for tokens in got["tools"].values())
    assert got["system"] > 20 and got["message"] >= 1
    assert got["total"] == got["system"] + got["schemas"] + got["message"]
    # The schemas as one JSON array count close to the sum of each schema alone.
    assert abs(got["schemas"] - sum(got["tools"].values())) <= len(got["tools"]) + 2
    assert len(json.dumps(body["tools"])) > got["schemas"]  # tokens, not characters
    assert load_litellm().disable_token_counter is True  # as Steward set it
