"""`model_prices` on the assembled product (`steward replay`'s runner, litellm over HTTP to
the scripted model): a model the operator priced costs its tokens times that price, and
that price wins over litellm's table; a model priced nowhere costs None (unknown), never
0; each model of a fallback chain is priced on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.settings import ConfigError, load_settings
from core.model.client import load_litellm
from tests.conftest import make_env
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay

HI = [{"t": 0, "user": "alice", "text": "hi there"}]


def per_million(tokens: tuple[int, int], given: float, taken: float) -> float:
    return (tokens[0] * given + tokens[1] * taken) / 1_000_000


async def test_an_operator_price_prices_a_model_litellm_does_not_know(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    llm.reply_text("priced answer")
    env = make_env(tmp_path, llm, model_prices="openai/scripted=0.5/1.5;other/model=0/0")
    s = load_settings(env=env, cwd=tmp_path)
    await replay(s, HI)
    [ep] = episodes(s)
    served = llm.served_tokens()
    assert served[0] > 0 and served[1] > 0
    assert ep["cost_usd"] == per_million(served, 0.5, 1.5)  # exactly


async def test_a_model_priced_nowhere_costs_unknown(llm: ScriptedLLM, tmp_path: Path) -> None:
    llm.reply_text("unpriced answer")
    s = load_settings(env=make_env(tmp_path, llm, model_prices="other/model=1/1"), cwd=tmp_path)
    await replay(s, HI)
    [ep] = episodes(s)
    assert ep["cost_usd"] is None  # not 0: nobody knows its price


@pytest.mark.parametrize("override", [False, True])
async def test_a_known_model_uses_litellms_price_unless_overridden(
    llm: ScriptedLLM, tmp_path: Path, override: bool
) -> None:
    """openai/gpt-4o-mini, served by the scripted server: litellm's own table prices it
    while `model_prices` names only other models, and a price for it there wins over
    that table."""
    model = "openai/gpt-4o-mini"
    llm.reply_text("a known model's answer")
    priced = model if override else "openai/some-other-model"
    (tmp_path / "steward.toml").write_text(
        f'[model_prices."{priced}"]\ninput = 2.0\noutput = 8.0\n'
    )
    s = load_settings(env=make_env(tmp_path, llm, model=model), cwd=tmp_path)
    await replay(s, HI)
    [ep] = episodes(s)
    served = llm.served_tokens()
    if override:
        assert ep["cost_usd"] == per_million(served, 2.0, 8.0)
    else:
        info = load_litellm().get_model_info(model)
        expected = (
            served[0] * info["input_cost_per_token"] + served[1] * info["output_cost_per_token"]
        )
        assert expected > 0 and ep["cost_usd"] == pytest.approx(expected, rel=1e-9)


async def test_each_model_of_the_chain_is_priced_on_its_own(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    """The main model fails; the fallback answers and the episode costs the fallback's
    tokens at the fallback's price (not the main model's)."""
    async with ScriptedLLM() as backup:
        llm.responder = lambda _body: Reply.error(500)
        backup.reply_text("from the backup")
        (tmp_path / "steward.toml").write_text(
            "fallback_models = [{ model = "
            + json.dumps("openai/backup")
            + ", api_base = "
            + json.dumps(backup.base_url)
            + " }]\n"
            '[model_prices."openai/scripted"]\ninput = 100.0\noutput = 100.0\n'
            '[model_prices."openai/backup"]\ninput = 3.0\noutput = 5.0\n'
        )
        s = load_settings(env=make_env(tmp_path, llm), cwd=tmp_path)
        await replay(s, HI)
        [ep] = episodes(s)
        assert ep["model"] == "openai/backup"
        expected = per_million(backup.served_tokens(), 3.0, 5.0)
        assert ep["cost_usd"] == expected


@pytest.mark.parametrize(
    ("toml", "env", "says"),
    [
        ("", "a=1", "is not `model=input/output`"),
        ("", "a=x/1", "is not a number"),
        ('[model_prices."m"]\ninput = 1.0\n', "", "must give input and output"),
        ('[model_prices."m"]\ninput = -1.0\noutput = 1.0\n', "", "negative"),
    ],
)
def test_a_malformed_price_is_said_with_the_fix(
    tmp_path: Path, toml: str, env: str, says: str
) -> None:
    (tmp_path / "steward.toml").write_text(toml)
    overrides = {"model_prices": env} if env else {}
    with pytest.raises(ConfigError) as info:
        load_settings(env=make_env(tmp_path, None, **overrides), cwd=tmp_path)
    assert says in str(info.value) and "model_prices" in str(info.value).lower()
