"""litellm loaded the way Steward loads it (its Anthropic tokenizer JSON read on first
use, not parsed at import: core/model/litellm_tokenizer.py) counts tokens exactly as
litellm imported plainly does. Each side runs in a fresh interpreter: the trick only
applies to the import that creates the module."""

from __future__ import annotations

import json

from tests.fresh import fresh_python

MESSAGES = [{"role": "user", "content": "Résumé of the 3 failing deploys — and why? 日本語も"}]

PROBE = """
import json, sys
{load}
from litellm.utils import claude_json_str
import importlib.resources
packaged = importlib.resources.files("litellm.litellm_core_utils.tokenizers")
messages = json.loads(sys.argv[1])
out = {{
    "tokenizer": json.loads(claude_json_str),
    "claude": litellm.token_counter(model="claude-3-5-sonnet-20240620", messages=messages),
    "gpt": litellm.token_counter(model="gpt-4o", messages=messages),
    "other_file": len(packaged.joinpath("9b5ad71b2ce5302211f9c61530b329a4922fc6a4").read_text()),
}}
try:
    getattr(sys.modules["litellm.utils"], "no_such_attribute_here")
    out["missing"] = "found"
except AttributeError:
    out["missing"] = "AttributeError"
print(json.dumps(out))
"""

# Steward keeps litellm's token counter off (core/model/client.py): on here, to count with it.
STEWARD = (
    "from core.model.client import load_litellm\nlitellm = load_litellm()\n"
    "litellm.disable_token_counter = False"
)
PLAIN = "import litellm"


def probe(load: str) -> dict[str, object]:
    result: dict[str, object] = fresh_python(PROBE.format(load=load), json.dumps(MESSAGES))
    return result


def test_steward_counts_tokens_as_plain_litellm_does() -> None:
    steward, plain = probe(STEWARD), probe(PLAIN)
    assert steward["tokenizer"] == plain["tokenizer"]
    assert isinstance(steward["claude"], int) and steward["claude"] > 0
    assert steward["claude"] == plain["claude"]
    assert steward["gpt"] == plain["gpt"]
    assert steward["other_file"] == plain["other_file"] > 0
    assert steward["missing"] == plain["missing"] == "AttributeError"


def test_the_tokenizer_json_is_not_parsed_while_litellm_imports() -> None:
    check = (
        STEWARD
        + "\nimport sys\nutils = sys.modules['litellm.utils']\n"
        + "import json\nparsed = getattr(utils, 'json_data', None)\n"
        + "print(json.dumps(['claude_json_str' in vars(utils), parsed is None]))"
    )
    assert fresh_python(check) == [False, True]
