"""Whether Steward has a model to work with, answered without loading the pipeline.

Why a module of its own: `steward chat -m` with no model must say so at once (exit 3),
not after importing the agent, litellm and every adapter (seconds on a busy machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from config.providers import embedded_wanted

if TYPE_CHECKING:  # this module is read before the settings exist (bot/cli/__init__.py)
    from config.settings import Settings
    from memory.embedder import Embedder

#: `steward chat` exit code when there is no model to work with.
EXIT_NO_MODEL = 3

NO_MODEL_MESSAGE = (
    "No model is configured, so I can't work on tasks yet. Set STEWARD_MODEL to a litellm "
    "model string and the provider's key, e.g.\n"
    "  export STEWARD_MODEL=openai/gpt-4.1-mini OPENAI_API_KEY=sk-...\n"
    "  export STEWARD_MODEL=anthropic/claude-sonnet-4-5 ANTHROPIC_API_KEY=...\n"
    "or point it at an OpenAI-compatible server (vLLM, llama.cpp, Ollama):\n"
    "  export STEWARD_MODEL=openai/<model-id> STEWARD_API_BASE=http://127.0.0.1:8080/v1\n"
    "then restart Steward. `steward doctor` checks the set-up."
)


def no_model_message(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """What people are told when there is no model; says how to get the local one when
    it would have been used but is not installed."""
    if embedded_wanted(settings, env):
        from core.model.local.runtime import INSTALL_HINT, availability  # only when it matters

        why = availability(settings.local_model_path.strip()).reason
        if why:
            return f"{NO_MODEL_MESSAGE}\n\nThe tiny local model can't run: {why}. {INSTALL_HINT}"
    return NO_MODEL_MESSAGE


def local_model_ready(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """The embedded model will be used (wanted and installed)."""
    if not embedded_wanted(settings, env):
        return False
    from core.model.local.runtime import availability

    return availability(settings.local_model_path.strip()).ok


def embedding_error(model: str, exc: BaseException) -> str:
    """What to fix when the embedding model (STEWARD_EMBEDDING_MODEL) did not answer the
    index's first question, its vectors' size, at start: the setting, what it answered,
    and which credentials it reads (its provider's own, through litellm: not
    STEWARD_API_KEY / STEWARD_API_BASE, which are the chat model's)."""
    provider = model.split("/", 1)[0] if "/" in model else "openai"
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    prefix = provider.upper().replace("-", "_")
    return (
        f"STEWARD_EMBEDDING_MODEL={model}: the embedding model did not answer "
        f"({type(exc).__name__}: {detail}). It is reached through litellm with its "
        f"provider's own settings, not STEWARD_API_KEY or STEWARD_API_BASE (those are the "
        f"chat model's): set {prefix}_API_KEY (and {prefix}_BASE_URL or {prefix}_API_BASE "
        "for a server of your own, as litellm reads them), check that the server is up, "
        "or leave STEWARD_EMBEDDING_MODEL empty to use the built-in offline embedder."
    )


async def configured_embedder(settings: Settings) -> Embedder:
    """The embedder STEWARD_EMBEDDING_MODEL names (the built-in one when empty), its
    vectors' size known: a model is asked it once here, before any index opens, so
    that one that cannot be asked stops `steward run` and `steward memory` alike with
    a ConfigError naming the setting, not a traceback from inside the index."""
    from config.settings import ConfigError
    from core.model.client import load_litellm
    from memory.embedder import embed_async, make_embedder

    model = settings.embedding_model.strip()
    embedder = make_embedder(model or None, load=load_litellm)
    if not embedder.dim:
        try:
            await embed_async(embedder, ["dimension probe"])
        except Exception as exc:
            raise ConfigError(embedding_error(model, exc)) from exc
    return embedder
