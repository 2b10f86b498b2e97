"""The tiny local model's tool calls: how often it picks a valid tool with valid arguments.

`python3 dev.py bench local_model` (needs the local model: `steward[local]`).

Fixed requests in `requests.jsonl` (40: 32 tool jobs, 8 chit-chat; written with the
router) and `heldout.jsonl` (16, written after the router was frozen and never used
to tune it). Each line: the request, the expected tool or "none", and checks on the
arguments (`in`: one of these values; `contains`: this text, case-insensitive).

Three ways of asking the same SmolLM2-135M server, each with Steward's real prompts:

- constrained: what Steward does (core/model/local/client.py): router, reduced tool set,
  JSON-schema-constrained arguments limited to candidates from the request.
- schema only: no router; one schema (oneOf over the five tools plus a "reply"
  option for plain answers) with free, length-capped arguments: the grammar alone.
- native: llama.cpp's own tool calling (the model's chat template) with every tool,
  tool_choice auto, through litellm (what you get without any of this).

A request counts as valid when the first call is the expected tool and its arguments
pass the checks (for "none": no tool call). Latency is per request, wall clock.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULTS = {"list_files": {"path": "."}}


def load(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (HERE / name).read_text().splitlines() if line.strip()]


def valid(row: dict[str, Any], name: str, args: dict[str, Any]) -> tuple[bool, bool]:
    """(right tool, right tool with valid arguments)."""
    if row["expected"] == "none":
        return name == "none", name == "none"
    if name != row["expected"]:
        return False, False
    full = {**DEFAULTS.get(name, {}), **args}
    for arg, rule in row["args"].items():
        value = full.get(arg)
        if not isinstance(value, str):
            return True, False
        if "in" in rule and value not in rule["in"]:
            return True, False
        if "contains" in rule and rule["contains"].lower() not in value.lower():
            return True, False
    return True, True


def schema_only() -> dict[str, Any]:
    from core.model.local.client import LOCAL_TOOLS, call_schema

    options = call_schema(list(LOCAL_TOOLS))["oneOf"]
    options.append(
        {
            "type": "object",
            "properties": {
                "tool": {"const": "reply"},
                "arguments": {
                    "type": "object",
                    "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 100}},
                    "required": ["text"],
                },
            },
            "required": ["tool", "arguments"],
        }
    )
    return {"oneOf": options}


async def ask(variant: str, llm: Any, request: str, workspace: Path) -> tuple[str, dict]:
    from core.agent import SYSTEM_PROMPT
    from core.model.local.client import LOCAL_TOOLS, TOOL_SYSTEM
    from core.tools import tool_schemas

    messages = [
        {"role": "system", "content": SYSTEM_PROMPT.format(workspace=workspace)},
        {"role": "user", "content": request},
    ]
    if variant == "schema":
        result = await llm._call(
            [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": request}],
            None,
            extra={
                "response_format": {"type": "json_object", "schema": schema_only()},
                "temperature": 0.0,
                "max_tokens": 200,
            },
        )
        try:
            data = json.loads(result.text)
            name = data.get("tool")
            args = data.get("arguments") or {}
        except (ValueError, AttributeError):
            return "invalid", {}
        return ("none" if name == "reply" else str(name)), args
    tools = tool_schemas(LOCAL_TOOLS if variant == "constrained" else None)
    result = await llm.complete(messages, tools)
    if not result.tool_calls:
        return "none", {}
    call = result.tool_calls[0]
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        return call.name, {"_invalid_json": call.arguments}
    return call.name, args if isinstance(args, dict) else {}


async def run_variant(variant: str, sets: dict[str, list[dict]], gguf: Path) -> dict[str, Any]:
    from core.clock import Clock
    from core.model.local.client import LocalLLM
    from core.model.local.runtime import ModelServer, server_command, threads

    tmp = Path(tempfile.mkdtemp(prefix="steward-bench-"))
    server = ModelServer(
        server_command(
            gguf=gguf,
            host="127.0.0.1",
            n_ctx=4096,
            n_threads=threads(0),
            native_tools=variant == "native",
        ),
        log_path=tmp / "server.log",
        start_timeout=120,
    )
    llm = LocalLLM(
        server=server,
        clock=Clock(),
        timeout=120,
        max_tokens=256,
        stream=False,
        mode="native" if variant == "native" else "constrained",
    )
    out: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        await server.ensure()
        out["start_s"] = time.perf_counter() - t0
        for set_name, rows in sets.items():
            lat, good, tool_ok, misses = [], 0, 0, []
            for row in rows:
                t = time.perf_counter()
                try:
                    name, args = await ask(variant, llm, row["request"], tmp)
                except Exception as exc:  # a 500 from the server counts as a miss
                    name, args = "error", {"error": str(exc)[:120]}
                lat.append(time.perf_counter() - t)
                right_tool, ok = valid(row, name, args)
                good += ok
                tool_ok += right_tool
                if not ok:
                    misses.append(f"{row['request']!r} -> {name} {json.dumps(args)[:100]}")
            out[set_name] = {
                "n": len(rows),
                "valid": good,
                "right_tool": tool_ok,
                "median_s": statistics.median(lat),
                "p90_s": sorted(lat)[int(0.9 * (len(lat) - 1))],
                "misses": misses,
            }
    finally:
        await server.stop()
    return out


def main() -> None:
    from bot.logs import configure_logging
    from core.model.local.runtime import availability

    configure_logging("error", "console")

    found = availability()
    if not found.ok or found.gguf is None:
        print(f"skipped: {found.reason} (install it with `python3 dev.py setup`)")
        return
    sets = {"requests": load("requests.jsonl"), "heldout": load("heldout.jsonl")}
    for variant in ("constrained", "schema", "native"):
        res = asyncio.run(run_variant(variant, sets, found.gguf))
        print(f"-- {variant} (server start {res['start_s']:.1f}s)")
        for set_name in sets:
            r = res[set_name]
            print(
                f"   {set_name:9s} valid tool+args {r['valid']:2d}/{r['n']} "
                f"({100 * r['valid'] / r['n']:.0f}%)  right tool {r['right_tool']}/{r['n']}  "
                f"latency median {r['median_s'] * 1000:.0f} ms  p90 {r['p90_s'] * 1000:.0f} ms"
            )
            for miss in r["misses"][:12]:
                print(f"      miss: {miss}")


if __name__ == "__main__":
    main()
