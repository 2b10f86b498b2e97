"""litellm loaded the way Steward loads it (its Anthropic tokenizer JSON read on first
use, not parsed at import: core/litellm_tokenizer.py, issue 26) counts tokens exactly as
litellm imported plainly does. Each side runs in a fresh interpreter: the trick only
applies to the import that creates the module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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

# Steward keeps litellm's token counter off (core/llm.py): on here, to count with it.
STEWARD = (
    "from core.llm import load_litellm\nlitellm = load_litellm()\n"
    "litellm.disable_token_counter = False"
)
PLAIN = "import litellm"


def probe(load: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(load=load), json.dumps(MESSAGES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


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
        + "print('claude_json_str' in vars(utils), getattr(utils, 'json_data', None) is None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["False", "True"]
