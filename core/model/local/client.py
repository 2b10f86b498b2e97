"""The tiny local model made useful with code: the same `complete()` as `LLMClient`,
used only when the embedded model (core/model/local/runtime.py) is active.

A 135M-parameter model left to the server's own function calling over-calls tools,
loops after a tool result and invents arguments. So Steward decides what it can:

1. **Route.** A keyword router decides chit-chat (answered by the model with no
   tools) or one tool of a reduced set, and pulls argument candidates out of the
   request (file names, folders, quoted text, commands).
2. **Constrain.** The model then writes the call as JSON under a JSON schema
   (`response_format`, turned into a llama.cpp grammar by the server) that names the
   tool and, where the request offered candidates, allows only those values; free
   text is length-capped. The JSON becomes an ordinary tool call for the agent loop,
   so the guardian and approvals apply as always.
3. **Answer.** After the tool result, the answer is composed from the result by code
   (the tiny model would paraphrase a file listing wrongly); one call per task, and
   the agent's step cap is lowered (`local_model_max_steps`).

Reduced tool set: list_files, read_file, write_file, search_files and shell: the
everyday workspace jobs, each with one or two plain arguments. edit_file is left out
(its exact old text is beyond a tiny model) and web_fetch too (the point of the
local model is no network). shell stays: it is what shows approvals working, and the
guardian judges every command whoever wrote it.

`mode="native"` skips all of this and passes every tool to llama.cpp's own tool
calling (the model's chat template): the baseline the benchmark compares against.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import structlog

from core.clock import Clock
from core.model.client import LLMClient, OnReset, OnSlow, OnText
from core.model.errors import LLMError
from core.model.local.runtime import MODEL_ALIAS, MODEL_LABEL, LocalModelError, ModelServer
from core.model.result import LLMResult, ToolCallRequest

log = structlog.get_logger("steward.local_llm")

LOCAL_TOOLS = ("list_files", "read_file", "write_file", "search_files", "shell")

CHAT_SYSTEM = (
    "You are Steward, a helpful assistant. Answer in one to three short sentences. "
    "You are a very small model running on this computer."
)

TOOL_SYSTEM = (
    "You turn a request into one tool call written as JSON.\n"
    "Tools: list_files(path) lists a folder; read_file(path) shows a file; "
    "write_file(path, content) writes a file; search_files(pattern) finds text in files; "
    "shell(command) runs a command.\n"
    'Example: "read a.md" -> {"tool": "read_file", "arguments": {"path": "a.md"}}\n'
    'Example: "save hi to b.txt" -> {"tool": "write_file", "arguments": '
    '{"path": "b.txt", "content": "hi"}}'
)

CAPABILITIES = (
    "I am Steward running a tiny local model ({label}), so I keep to simple jobs in your "
    "workspace: list files, read a file, write a file, search the files for a word, or "
    "run a command (risky ones wait for your approval). For real work, configure a "
    "hosted or larger model: set STEWARD_MODEL (see docs/local-model.md)."
)

#: The start of gates.retry_instruction's lines: the agent asks for a corrected answer.
_GATE_RETRY = re.compile(r"^Your answer (says|reports)")

_FILE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{0,5})(?![\w/])")
_QUOTED = re.compile(r"`([^`]+)`|\"([^\"]+)\"|(?:(?<=\s)|^)'([^']+)'(?=[\s.,!?:;]|$)")
_DIR_AFTER = re.compile(
    r"\b(?:folder|directory|dir|under|inside|within)\s+(?:the\s+|my\s+)?([\w./-]+)", re.I
)
_DIR_BEFORE = re.compile(r"\b(?:the\s+|my\s+)?([\w./-]+)\s+(?:folder|directory|dir)\b", re.I)
_HERE = {"my", "the", "this", "current", "workspace", "working", "a", "that", "your", "root"}

_WRITE = re.compile(r"\b(write|create|save|make|put|store|append|add)\b", re.I)
_READ = re.compile(r"\b(read|open|show|cat|print|display|view|say|says|contents?)\b", re.I)
_LIST = re.compile(r"\b(list|ls|files|folder|directory|dir|what's in|whats in|tree)\b", re.I)
_LIST_STRONG = re.compile(r"(^ls\b|\blist\b|\bfolder\b|\bdirectory\b|what'?s in)", re.I)
_SEARCH = re.compile(
    r"\b(search|grep|find|look for|mention|mentions|mentioned|occurrences?|where is)\b", re.I
)
_SHELL_VERB = re.compile(r"^\s*(run|execute|exec)\b|\b(command|shell|terminal)\b", re.I)
_SHELL_CMD = re.compile(
    r"\b(git|df|du|pwd|uptime|whoami|uname|pytest|make|npm|pip|python3?|date|rm|mv|cp|"
    r"mkdir|touch|echo|wc|head|tail|free|ps)\b"
)
_SHELL_CHANGE = re.compile(r"\b(delete|remove|rename|move|copy)\b", re.I)
_CAPABILITY = re.compile(r"what can you do|who are you|what are you|^/?help\b", re.I)
_RECURSIVE = re.compile(r"\b(recursive(ly)?|tree|everything|all the files)\b", re.I)

_PRIORITY = ("shell", "write_file", "search_files", "read_file", "list_files")


@dataclass(slots=True)
class Route:
    """What the router decided: chit-chat, or one tool with argument candidates."""

    kind: str  # "chat" | "tool" | "capabilities"
    tool: str = ""
    candidates: dict[str, list[str]] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, int] = field(default_factory=dict)


def _unique(items: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        item = item.strip().strip(".,!?:;")
        if item:
            seen.setdefault(item, None)
    return list(seen)


def _quoted(text: str) -> list[str]:
    return _unique([next(g for g in m.groups() if g) for m in _QUOTED.finditer(text)])


def _files(text: str) -> list[str]:
    return _unique([m.group(1) for m in _FILE.finditer(text)])


def _dirs(text: str) -> list[str]:
    found = [m.group(1) for m in _DIR_AFTER.finditer(text)]
    found += [m.group(1) for m in _DIR_BEFORE.finditer(text)]
    out = []
    for d in found:
        d = d.strip().rstrip("/") or "."
        out.append("." if d.lower() in _HERE else d)
    return _unique(out)


def _after(text: str, pattern: str) -> list[str]:
    m = re.search(pattern, text, re.I)
    return [m.group(1).strip()] if m and m.group(1).strip() else []


def route(text: str) -> Route:
    """Decide chit-chat or one tool, by rules a person can read (and the bench measures)."""
    t = text.strip()
    if _CAPABILITY.search(t):
        return Route("capabilities")
    files, quoted, dirs = _files(t), _quoted(t), _dirs(t)
    scores = dict.fromkeys(_PRIORITY, 0)
    if _SHELL_CMD.search(t):
        scores["shell"] += 3
    if _SHELL_VERB.search(t):
        scores["shell"] += 2
    if _SHELL_CHANGE.search(t) and files:
        scores["shell"] += 2
    if _WRITE.search(t) and (files or re.search(r"\bfile\b", t, re.I)):
        scores["write_file"] += 4
    if _SEARCH.search(t):
        scores["search_files"] += 3
    if files and (_READ.search(t) or len(t.split()) <= 2):
        scores["read_file"] += 3
    if _LIST.search(t) and not files:
        scores["list_files"] += 2 if _LIST_STRONG.search(t) else 1
    best = max(scores.values())
    if best == 0:
        return Route("chat", scores=scores)
    tool = next(name for name in _PRIORITY if scores[name] == best)
    cands: dict[str, list[str]] = {}
    flags: dict[str, Any] = {}
    if tool == "list_files":
        cands["path"] = dirs or ["."]
        if _RECURSIVE.search(t):
            flags["recursive"] = True
    elif tool == "read_file":
        cands["path"] = files
    elif tool == "write_file":
        cands["path"] = files
        content = [q for q in quoted if q not in files]
        content += _after(
            t,
            r"(?:says?|saying|with the text|with text|containing|contents?|:)\s+(.+?)\s*$",
        )
        cands["content"] = _unique(content)
    elif tool == "search_files":
        cands["pattern"] = quoted or _unique(
            _after(
                t,
                r"\b(?:search|grep|look|find)\b(?:\s+the files)?\s+for\s+(?:the word\s+)?"
                r"([\w.-]+)",
            )
            + _after(t, r"\bmention(?:s|ed)?\s+([\w.-]+)")
            + _after(t, r"\bthe word\s+([\w.-]+)")
            + _after(t, r"\bfind\s+(?:where\s+)?([\w.-]+)")
        )
    elif tool == "shell":
        cmd = quoted or _after(t, r"^\s*(?:run|execute|exec)\s+(?:the\s+command\s+)?(.+?)\s*$")
        cmd += _after(t, r"\b(?:use|with|using)\s+([\w./ -]+?)\s*$")
        cands["command"] = _unique(cmd)
    return Route("tool", tool, {k: v for k, v in cands.items() if v}, flags, scores)


def _string(cands: list[str] | None, max_len: int) -> dict[str, Any]:
    if cands:
        return {"type": "string", "enum": cands}
    return {"type": "string", "minLength": 1, "maxLength": max_len}


_ARG_SPECS: dict[str, dict[str, int]] = {
    "list_files": {"path": 80},
    "read_file": {"path": 80},
    "write_file": {"path": 80, "content": 300},
    "search_files": {"pattern": 40},
    "shell": {"command": 120},
}


def call_schema(
    tools: list[str],
    candidates: dict[str, list[str]] | None = None,
    given: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A JSON schema for {"tool": NAME, "arguments": {...}} over `tools`; argument values
    are limited to `candidates` where there are some, free but length-capped elsewhere;
    arguments in `given` are left out (code fills them in, see `fixed_arguments`)."""
    candidates = candidates or {}
    given = given or {}
    options = []
    for name in tools:
        props = {
            arg: _string(candidates.get(arg), n)
            for arg, n in _ARG_SPECS[name].items()
            if arg not in given
        }
        options.append(
            {
                "type": "object",
                "properties": {
                    "tool": {"const": name},
                    "arguments": {
                        "type": "object",
                        "properties": props,
                        "required": list(props),
                        "additionalProperties": False,
                    },
                },
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"oneOf": options}


def fixed_arguments(r: Route) -> dict[str, str]:
    """Arguments the request settles by itself: exactly one candidate.

    Code copies these instead of asking the model to spell them out: the grammar would
    allow only that value anyway, and a tiny model asked to write characters it rarely
    saw (an emoji, a private-use or rare CJK character) can wander in the whitespace the
    JSON grammar allows until it runs out of tokens. Copied, every code point arrives
    byte for byte."""
    return {arg: values[0] for arg, values in r.candidates.items() if len(values) == 1}


def parse_call(
    content: str,
    allowed: tuple[str, ...] | list[str],
    given: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any]] | None:
    """The JSON the model wrote, if it is a call to an allowed tool with string args
    (those in `given` come from code, not from the model)."""
    given = given or {}
    try:
        data = json.loads(content)
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    name, args = data.get("tool"), data.get("arguments")
    if name not in allowed or not isinstance(args, dict):
        return None
    spec = [a for a in _ARG_SPECS.get(str(name), {}) if a not in given]
    if any(not isinstance(v := args.get(a), str) or not v.strip() for a in spec):
        return None
    return str(name), {**{a: args[a] for a in spec}, **given}


def _request_index(messages: list[dict[str, Any]]) -> int:
    """Index of the person's request: the last user message that is not a gate retry."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and not _GATE_RETRY.match(str(m.get("content") or "")):
            return i
    return -1


def compose_answer(messages: list[dict[str, Any]], start: int, cap: int = 3000) -> str:
    """The final answer, written by code from the tool results after `start`."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    parts = []
    for m in messages[start:]:
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    args = {}
                calls[tc.get("id", "")] = (
                    fn.get("name", ""),
                    args if isinstance(args, dict) else {},
                )
        elif m.get("role") == "tool":
            name, args = calls.get(m.get("tool_call_id", ""), (m.get("name", ""), {}))
            content = str(m.get("content") or "")
            if content.startswith(("Error:", "Refused", "Not approved")):
                parts.append(f"{name} did not work. {content}")
                continue
            if len(content) > cap:
                content = content[:cap] + f"\n[{len(content) - cap} more characters not shown]"
            head = {
                "list_files": f"Files in `{args.get('path', '.')}`:",
                "read_file": f"`{args.get('path', '')}`:",
                "search_files": f"Search for `{args.get('pattern', '')}`:",
                "shell": f"`{args.get('command', '')}`:",
            }.get(name)
            if head is None:  # write_file and the like say what they did in one line
                parts.append(content)
            else:
                parts.append(f"{head}\n```\n{content}\n```")
    return "\n\n".join(parts)


class LocalLLM:
    """`complete()` over the embedded model server, with the routing and constraints above."""

    def __init__(
        self,
        *,
        server: ModelServer,
        clock: Clock,
        timeout: float = 120.0,
        max_tokens: int = 256,
        stream: bool = True,
        mode: str = "constrained",
        label: str = MODEL_LABEL,
    ) -> None:
        self.server = server
        self.mode = mode
        self.label = label
        self.max_tokens = max_tokens
        self.model = f"local/{MODEL_ALIAS}"
        self._inner = LLMClient(
            model=f"openai/{MODEL_ALIAS}",
            clock=clock,
            api_base=server.base_url,
            api_key="sk-local",
            timeout=timeout,
            retries=1,
            backoff=0.5,
            backoff_max=2.0,
            max_tokens=max_tokens,
            # Not streamed: a tiny model's short answer takes about a second anyway, and
            # a stream that ends without a finish_reason (llama-cpp-python's server did
            # that) makes litellm raise; the whole text is passed to on_text at once.
            stream=False,
        )
        self.stream = stream

    def describe(self) -> str:
        return f"tiny local model {self.label} ({self.mode})"

    async def _call(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw: Any
    ) -> LLMResult:
        """One call; (re)starts the server first, and once more if it died meanwhile."""
        for attempt in (1, 2):
            try:
                self._inner.api_base = await self.server.ensure()
            except LocalModelError as exc:
                raise LLMError(
                    f"The local model could not start: {exc}. Run `steward doctor`, or set "
                    "STEWARD_MODEL to use another model.",
                    kind="connection",
                    retryable=False,
                ) from exc
            deaths = self.server.deaths
            try:
                async with self.server.in_use():
                    return await self._inner.complete(messages, tools, **kw)
            except LLMError as exc:
                # litellm calls a dropped connection a connection or a server error; what
                # counts is whether the server process died meanwhile.
                report = self.server.death_report()
                if not report and self.server.deaths > deaths:
                    report = self.server.last_death  # the watcher saw it first
                if not report:
                    raise
                if attempt == 2:
                    # Died twice on this request: say what killed it, not "connection error".
                    raise LLMError(
                        f"{report}. `steward doctor` shows the same; set STEWARD_MODEL to "
                        "use another model meanwhile.",
                        kind="local_crash",
                        retryable=False,
                    ) from exc
                log.warning("local_llm.server_died_retrying", report=report[:300])
        raise AssertionError("unreachable")  # pragma: no cover

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: OnText | None = None,
        on_reset: OnReset | None = None,
        on_slow: OnSlow | None = None,  # one attempt here: nothing to say early
    ) -> LLMResult:
        if self.mode == "native":
            result = await self._call(messages, tools)
            return await self._say_result(result, on_text)
        start = _request_index(messages)
        request = str(messages[start].get("content") or "") if start >= 0 else ""
        after = messages[start + 1 :] if start >= 0 else []
        if any(m.get("role") == "tool" for m in after):
            # The tool has run: the answer is its result, composed by code.
            return await self._say(compose_answer(messages, start + 1), on_text)
        if any(m.get("role") == "assistant" for m in after):
            # A gate asked for a corrected chit-chat answer: say plainly what this is.
            return await self._say(CAPABILITIES.format(label=self.label), on_text)
        offered = {
            (t.get("function") or {}).get("name") for t in tools or [] if isinstance(t, dict)
        }
        r = route(request)
        log.info("local_llm.route", kind=r.kind, tool=r.tool)
        if r.kind == "capabilities":
            return await self._say(CAPABILITIES.format(label=self.label), on_text)
        if r.kind == "tool" and r.tool in offered:
            called = await self.tool_call(request, r)
            if called is not None:
                return called
        return await self.chat(messages, start, on_text=on_text, on_reset=on_reset)

    async def tool_call(self, request: str, r: Route) -> LLMResult | None:
        """Ask the model for the call under the schema; None if it could not make one."""
        given = fixed_arguments(r)
        if set(_ARG_SPECS[r.tool]) <= set(given):
            # The request settles every argument: nothing is left for the model to choose.
            result = LLMResult(text=json.dumps({"tool": r.tool, "arguments": given}))
        else:
            schema = call_schema([r.tool], r.candidates, given)
            result = await self._call(
                [
                    {"role": "system", "content": TOOL_SYSTEM},
                    {"role": "user", "content": request},
                ],
                None,
                extra={
                    "response_format": {"type": "json_object", "schema": schema},
                    "temperature": 0.0,
                    "max_tokens": 200,
                },
            )
        parsed = parse_call(result.text, [r.tool], given)
        if parsed is None:
            log.warning("local_llm.bad_call", text=result.text[:200])
            return None
        name, args = parsed
        args.update(r.flags)
        result.text = ""
        result.tool_calls = [
            ToolCallRequest(id="call_local_1", name=name, arguments=json.dumps(args))
        ]
        return result

    async def chat(
        self,
        messages: list[dict[str, Any]],
        start: int,
        *,
        on_text: OnText | None,
        on_reset: OnReset | None,
    ) -> LLMResult:
        """Chit-chat: the model answers with no tools, a short prompt and a short history."""
        # A 135M model copies whatever came before: a file listing or code in the
        # history turns "hello" into more code. Only short plain exchanges go along.
        history = [
            {"role": m["role"], "content": str(m.get("content") or "")}
            for m in messages[:start]
            if m.get("role") in ("user", "assistant")
            and not m.get("tool_calls")
            and "```" not in str(m.get("content") or "")
            and len(str(m.get("content") or "")) <= 300
        ][-2:]
        convo = [{"role": "system", "content": CHAT_SYSTEM}, *history]
        if start >= 0:
            convo.append({"role": "user", "content": str(messages[start].get("content") or "")})
        return await self._say_result(await self._call(convo, None), on_text)

    @staticmethod
    async def _say_result(result: LLMResult, on_text: OnText | None) -> LLMResult:
        if on_text is not None and result.text and not result.tool_calls:
            await on_text(result.text)
        return result

    @staticmethod
    async def _say(text: str, on_text: OnText | None) -> LLMResult:
        if on_text is not None and text:
            await on_text(text)
        return LLMResult(text=text)
