"""An embedding model through litellm (STEWARD_EMBEDDING_MODEL) gets Steward's litellm:
imported by core.model.client.load_litellm whichever of the agent and the memory index asks
first. A plain `import litellm` first (the index probes the model's dimensions while
the app starts) fetched litellm's cost map from the network at run time and skipped
Steward's settings (token counter off, tokenizer read on use, offline mode)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.fakes.llm import ScriptedLLM
from tests.fresh import fresh_python

PROBE = """
import asyncio, json, os, sys
from pathlib import Path
for key in [k for k in os.environ if k.startswith(("LITELLM_", "HF_HUB", "OPENAI_"))]:
    del os.environ[key]
tmp, base = Path(sys.argv[1]), sys.argv[2]
os.environ["OPENAI_API_KEY"] = "x"
os.environ["OPENAI_BASE_URL"] = base
from bot.app import App
from config.settings import load_settings

settings = load_settings(
    env={
        "STEWARD_MODEL": "openai/scripted",
        "STEWARD_API_BASE": base,
        "STEWARD_DATA_DIR": str(tmp / "data"),
        "STEWARD_WORKSPACE": str(tmp / "ws"),
        "STEWARD_EMBEDDING_MODEL": "openai/embed-small",
    },
    cwd=tmp,
)

async def main():
    app = App(settings)
    await app.open_memory()  # the index asks the model for its dimensions first
    litellm = sys.modules["litellm"]
    out = {
        "cost_map": os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"),
        "offline": os.environ.get("LITELLM_OFFLINE_MODE"),
        "token_counter_off": litellm.disable_token_counter,
        "dim": app.index.embedder.dim,
    }
    await app.index.close()
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_the_embedding_model_gets_litellm_loaded_offline_as_the_agent_does(
    tmp_path: Path,
) -> None:
    async with ScriptedLLM() as llm:
        llm.embedding_dim = 24
        got = await asyncio.to_thread(fresh_python, PROBE, str(tmp_path), llm.base_url)
    assert got == {"cost_map": "True", "offline": "true", "token_counter_off": True, "dim": 24}
    assert llm.embedded and llm.embedded[0] == ["dimension probe"]  # over HTTP, scripted
