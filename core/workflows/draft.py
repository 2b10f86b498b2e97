"""The one model call that drafts a workflow from runs that worked the same way: its
prompt, and reading the document out of the model's answer.

The prompt shows the format (version 1, compact) and the recorded runs: each request,
each call's tool, arguments (whole: the draft must reproduce them) and result (cut),
and the reply (cut). It asks for the JSON document only. Whatever the model answers is
checked afterwards without any model (core/workflows/learn.py): parsed, dry-run on the
same runs, graded.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Characters of a call's result shown to the model.
RESULT_CHARS = 600
#: Characters of the task's reply shown to the model.
REPLY_CHARS = 600
#: Characters of a call's arguments (as JSON) shown; longer ones are cut, and a draft
#: made from cut arguments fails its dry run (it cannot reproduce them).
ARGS_CHARS = 3000
#: The fields of a draft taken from the model's answer; anything else (bookkeeping the
#: store sets on save, or a field the model made up) is dropped.
DRAFT_FIELDS = ("workflow", "name", "description", "match", "inputs", "steps", "output")

SYSTEM = """\
A task succeeded several times with the same tool calls. Write it down as a workflow: \
a JSON document Steward runs as one tool, without asking a model, for the next request \
of the same shape. Answer with ONLY the JSON document, no prose.

Format (version 1):
{"workflow": 1,
 "name": "lowercase-hyphen-name, 2 to 40 characters",
 "description": "one line: what it does",
 "match": "a Python regex for re.fullmatch against the whole request (stripped, \
case-insensitive), with a named group (?P<NAME>...) for each part that differs between \
the requests",
 "inputs": {"type": "object",
            "properties": {"NAME": {"type": "string", "pattern": "^[a-z0-9-]+$"}},
            "required": ["NAME"], "additionalProperties": false},
 "steps": [{"id": "short-id", "kind": "call", "tool": "TOOL", "args": {...}}],
 "output": "the reply, as a template"}

Templates: {{inputs.NAME}} is an input; {{steps.ID}} is the text call step ID returned. \
In a shell command an input is shell-quoted for you: write ./svc restart \
{{inputs.service}}, not '{{inputs.service}}'.

Rules:
- One call step per recorded call, with the same tool, in the same order. With each \
run's inputs filled in, its args must equal that run's recorded args exactly.
- Every part of the requests that differs between runs is a named group in match and \
an input; the rest of match is literal text (escape . ? ( ) and the like).
- Every string input has a pattern, as narrow as the values seen allow.
- output reads like the replies, with the varying parts as templates; it may quote a \
call's result with {{steps.ID}}.
- No other tools than the recorded ones, no secrets, no paths outside the workspace.
"""


def _cut(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f"… [cut, {len(text)} characters]"


def runs_text(runs: list[dict[str, Any]]) -> str:
    """The recorded runs (observations: request, calls, reply) as the model reads them."""
    lines = [f"{len(runs)} runs that worked, oldest first."]
    for n, run in enumerate(runs, 1):
        lines += ["", f"Run {n}", f"Request: {run.get('request', '')}", "Calls:"]
        for i, call in enumerate(run.get("calls") or [], 1):
            args = json.dumps(call.get("args") or {}, ensure_ascii=False, sort_keys=True)
            lines.append(f"{i}. tool {call.get('tool', '')} args {_cut(args, ARGS_CHARS)}")
            result = _cut(str(call.get("result") or ""), RESULT_CHARS)
            lines.append("   result: " + (result.replace("\n", "\n   ") if result else "(empty)"))
        reply = _cut(str(run.get("reply") or ""), REPLY_CHARS)
        lines.append("Reply: " + (reply if reply else "(none)"))
    lines += ["", "Answer with the JSON document only."]
    return "\n".join(lines)


def messages_for(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The drafting prompt: the format, then the runs."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": runs_text(runs)},
    ]


def first_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in the model's answer (inside a ```json fence or not, with
    chatter around it); None when there is none."""
    fenced = re.search(r"```(?:json|JSON)?\s*\n(.*?)```", text, re.S)
    candidates = [fenced.group(1), text] if fenced else [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        for m in re.finditer(r"\{", candidate):
            try:
                value, _end = decoder.raw_decode(candidate, m.start())
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def slug(text: str) -> str:
    """A workflow name from free text: lowercase words joined by hyphens, ≤ 40 characters."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    name = "-".join(words)[:40].strip("-")
    return name if len(name) >= 2 else "learned-task"


def cleaned(doc: dict[str, Any], request: str) -> dict[str, Any]:
    """The draft as a document to check: only the fields a draft has (bookkeeping is set
    by the store on save), the version set, the name made lowercase-hyphen (from the
    request when missing), a description when the model gave none."""
    out = {k: doc[k] for k in DRAFT_FIELDS if k in doc}
    out["workflow"] = out.get("workflow", 1)
    name = out.get("name")
    out["name"] = slug(name) if isinstance(name, str) and name.strip() else slug(request)
    description = out.get("description")
    if not isinstance(description, str) or not description.strip():
        line = " ".join(request.split())
        out["description"] = "Learned from requests like: " + (
            line if len(line) <= 200 else line[:199] + "…"
        )
    return out
