"""The `fallback_models` and `model_prices` settings: read from TOML or the environment,
checked, and turned into small frozen values the model client uses.

Why apart from config/settings.py: both settings have their own shapes (a list of
tables, a table of tables) and their own environment forms, and a mistake in one must be
said as what it is (which entry, which key, what to write instead), not as a pydantic
type error.

A fallback entry's `api_key_env` names an environment variable that is not set: that is
a `ConfigError` at start, not a doctor warning. The variable was named on purpose, so it
missing is a mistake (a typo, a secret not deployed), and the moment a fallback is needed
is an outage of the main model: the worst time to find out its key is not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: How the environment forms are written, for the error messages.
FALLBACK_ENV_FORM = "STEWARD_FALLBACK_MODELS=openai/gpt-4o-mini,anthropic/claude-3-5-haiku-latest"
PRICES_ENV_FORM = "STEWARD_MODEL_PRICES=my-vllm/qwen=0.5/1.5;other/model=0/0"


class ChainError(ValueError):
    """A mistake in `fallback_models` or `model_prices`, worded for the person fixing it."""


@dataclass(frozen=True, slots=True)
class FallbackModel:
    """One model to try when the ones before it in the chain do not answer."""

    model: str
    #: Its server ("" = the provider's usual endpoint).
    api_base: str = ""
    #: The environment variable holding its key ("" = the provider's usual variable).
    api_key_env: str = ""

    def key(self, env: Mapping[str, str]) -> str:
        """Its API key, read from `api_key_env` ("" when it has none of its own)."""
        return env.get(self.api_key_env, "").strip() if self.api_key_env else ""


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """An operator's price for a model, in USD per million tokens."""

    input: float
    output: float

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input + tokens_out * self.output) / 1_000_000


def parse_fallback_models(raw: Any, origin: str, env: Mapping[str, str]) -> list[FallbackModel]:
    """`fallback_models` as a list of FallbackModel, from a TOML list of tables (or of
    model strings) or the environment's comma-separated model strings."""
    if isinstance(raw, str):
        entries: list[Any] = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list):
        entries = raw
    else:
        raise ChainError(
            f"`fallback_models` ({origin}) must be a list of tables such as "
            '[{ model = "openai/gpt-4o-mini" }], or in the environment '
            f"{FALLBACK_ENV_FORM}."
        )
    chain: list[FallbackModel] = []
    for number, entry in enumerate(entries, start=1):
        where = f"entry {number} of `fallback_models` ({origin})"
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, dict):
            raise ChainError(
                f"{where} is {entry!r}. Fix: write it as a table, "
                '{ model = "provider/model", api_base = "...", api_key_env = "..." }.'
            )
        unknown = sorted(set(entry) - {"model", "api_base", "api_key_env"})
        if unknown:
            raise ChainError(
                f"{where} has an unknown key {unknown[0]!r}. Fix: use only model, api_base "
                "and api_key_env (the name of the variable holding the key, never the key)."
            )
        model = str(entry.get("model") or "").strip()
        if not model:
            raise ChainError(
                f"{where} has an empty model. Fix: set its model to a provider/model string "
                '(e.g. model = "openai/gpt-4o-mini"), or remove the entry.'
            )
        key_env = str(entry.get("api_key_env") or "").strip()
        if key_env and not env.get(key_env, "").strip():
            raise ChainError(
                f"{where} ({model}) takes its key from the environment variable {key_env}, "
                f"which is not set. Fix: export {key_env}=<the key>, or change or remove "
                "its api_key_env (without it the provider's usual variable is used)."
            )
        chain.append(FallbackModel(model, str(entry.get("api_base") or "").strip(), key_env))
    return chain


def parse_model_prices(raw: Any, origin: str) -> dict[str, ModelPrice]:
    """`model_prices` as {model: ModelPrice}, from a TOML table of tables
    (`[model_prices."my-vllm/qwen"] input = 0.5  output = 1.5`) or the environment's
    `model=input/output;model=input/output`."""
    if isinstance(raw, str):
        table: dict[str, Any] = {}
        for part in raw.split(";"):
            if not part.strip():
                continue
            model, sep, price = part.strip().rpartition("=")
            sent, slash, received = price.partition("/")
            if not sep or not model.strip() or not slash:
                raise ChainError(
                    f"{part.strip()!r} in {origin} is not `model=input/output`. Fix: write "
                    f"prices in USD per million tokens, e.g. {PRICES_ENV_FORM}."
                )
            table[model.strip()] = {"input": sent.strip(), "output": received.strip()}
    elif isinstance(raw, dict):
        table = raw
    else:
        raise ChainError(
            f"`model_prices` ({origin}) must be a table such as "
            '[model_prices."my-vllm/qwen"] with input = 0.5 and output = 1.5, or in the '
            f"environment {PRICES_ENV_FORM}."
        )
    prices: dict[str, ModelPrice] = {}
    for model, price in table.items():
        where = f"the price of {model!r} in `model_prices` ({origin})"
        if not str(model).strip():
            raise ChainError(f"{where} has no model name. Fix: name the model it prices.")
        if not isinstance(price, dict) or set(price) != {"input", "output"}:
            raise ChainError(
                f"{where} must give input and output, in USD per million tokens. Fix: "
                f'[model_prices."{model}"] input = 0.5  output = 1.5 (0 for a free model).'
            )
        try:
            given, taken = float(price["input"]), float(price["output"])
        except (TypeError, ValueError):
            raise ChainError(
                f"{where} is not a number ({price['input']!r}, {price['output']!r}). Fix: "
                "write USD per million tokens as numbers, e.g. input = 0.5, output = 1.5."
            ) from None
        if given < 0 or taken < 0 or given != given or taken != taken:
            raise ChainError(f"{where} is negative or not a number. Fix: use 0 or more.")
        prices[str(model).strip()] = ModelPrice(given, taken)
    return prices
