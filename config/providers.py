"""Which environment variables mean "a hosted model is intended".

Standard library only, on purpose: `dev.py` reads it before the virtualenv exists (to
decide whether to install the tiny local model) and Steward reads it at start-up (to
decide whether to run it); one list, so the two never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: The settings file read from the working folder when no --config is given (config/settings.py,
#: and before settings exist: dev.py and `steward chat`'s no-model check).
DEFAULT_CONFIG_NAME = "steward.toml"

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


#: The settings `surely_no_model` can judge without validating anything: any other
#: STEWARD_* variable (or a config file) may hold a mistake that must be named first.
_PLAIN_SETTINGS = frozenset({"STEWARD_DATA_DIR", "STEWARD_WORKSPACE", "STEWARD_LOCAL_MODEL"})


def surely_no_model(env: Mapping[str, str]) -> bool:
    """No model can be used, decided from a plain environment alone (no config file, no
    settings validation, no imports): no STEWARD_* variable but the data dir, the
    workspace and `local_model = "off"`, and no provider key.

    Why: `steward chat -m` with no model must say so at once (exit 3); validating the
    settings imports pydantic and builds the schema (~0.3 s). False means "ask the full
    settings", never "there is a model": a mistake in another setting is named first,
    and a wanted local model's availability is the full path's to check."""
    names = {k for k in env if k.startswith("STEWARD_")}
    if not names <= _PLAIN_SETTINGS or provider_key_present(env) is not None:
        return False
    if any(not env[k].strip() for k in names):  # an empty folder path is a config error
        return False
    return env.get("STEWARD_LOCAL_MODEL", "") == "off"
