"""Which environment variables mean "a hosted model is intended".

Standard library only, on purpose: `dev.py` reads it before the virtualenv exists (to
decide whether to install the tiny local model) and Steward reads it at start-up (to
decide whether to run it); one list, so the two never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

PROVIDER_KEYS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENROUTER_API_KEY",
    "GEMINI_API_KEY",
    "GROQ_API_KEY",
    "MISTRAL_API_KEY",
    "DEEPSEEK_API_KEY",
    "TOGETHERAI_API_KEY",
    "XAI_API_KEY",
    "COHERE_API_KEY",
    "AZURE_API_KEY",
)


def provider_key_present(env: Mapping[str, str]) -> str | None:
    """The first provider key variable that is set, if any."""
    return next((k for k in PROVIDER_KEYS if env.get(k, "").strip()), None)


def embedded_wanted(settings: Any, env: Mapping[str, str] | None = None) -> bool:
    """Use the embedded model: no model configured, no OpenAI-compatible server given,
    no provider key in the environment, and `local_model` not "off"."""
    env = os.environ if env is None else env
    if settings.local_model == "off":
        return False
    if settings.model_configured or settings.api_base.strip():
        return False
    return provider_key_present(env) is None
