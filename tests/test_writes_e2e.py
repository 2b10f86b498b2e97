"""Verified writes through the assembled product (`steward replay`): the scripted model
calls write_file and edit_file with text beyond ASCII, over real HTTP and litellm; the
file on disk must be byte-exact and what the model is told (and the episode records)
must carry the byte count, the character count, the short hash and the text itself."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import episodes, replay, tool_messages

#: Emoji with ZWJ, CJK, Hebrew with a right-to-left mark, Arabic, combining marks.
MIXED = "plain 🚀 👨\u200d👩\u200d👧 日本語 שלום\u200f مرحبا cafe\u0301 Vie\u0323\u0302t"
ADDED = "中文 🌍 עברית e\u0301"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


async def test_unicode_write_and_edit_round_trip_through_the_product(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    llm.reply_tool("write_file", {"path": "mixed.txt", "content": MIXED})  # \uXXXX on the wire
    # The same text as raw UTF-8 inside the JSON string, as many servers send it.
    raw_args = json.dumps(
        {"path": "mixed.txt", "old_text": "日本語", "new_text": ADDED}, ensure_ascii=False
    )
    llm.reply_tool("edit_file", raw_args)
    llm.reply_text("I wrote mixed.txt and edited it.")
    out = await replay(s, [{"t": 0, "user": "alice", "text": "write the greetings file"}])
    assert out[-1]["text"] == "I wrote mixed.txt and edited it."

    written = MIXED.encode()
    final = MIXED.replace("日本語", ADDED).encode()
    assert (s.workspace / "mixed.txt").read_bytes() == final
    wrote, edited = tool_messages(llm)
    assert wrote == (
        f"Wrote {len(written)} bytes ({len(MIXED)} characters) to mixed.txt, verified on "
        f"disk (sha256 {sha(written)}): {json.dumps(MIXED, ensure_ascii=False)}"
    )
    assert edited == (
        f"Replaced 1 occurrence in mixed.txt with {len(ADDED.encode())} bytes "
        f'({len(ADDED)} characters): "{ADDED}"; mixed.txt is now {len(final)} bytes, '
        f"verified on disk (sha256 {sha(final)})"
    )
    [ep] = episodes(s)
    assert ep["outcome"] == "success" and all(t["ok"] for t in ep["tools"])


async def test_a_dropped_emoji_shows_in_what_the_model_and_person_get(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The reported bug: `write "plain 🚀" to rocket.txt` arrived as content "plain "."""
    s = settings_for(llm)
    llm.reply_tool("write_file", {"path": "rocket.txt", "content": "plain "})
    llm.reply_text("I wrote rocket.txt.")
    await replay(s, [{"t": 0, "user": "alice", "text": 'write "plain 🚀" to rocket.txt'}])
    [told] = tool_messages(llm)
    assert told.startswith("Wrote 6 bytes (6 characters) to rocket.txt")
    assert told.endswith(': "plain "')  # next to the request, the missing emoji is plain
    assert (s.workspace / "rocket.txt").read_bytes() == b"plain "
