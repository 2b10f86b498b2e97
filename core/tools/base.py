"""What a tool is: a name, a JSON schema, a description the model reads, an async run.

Tools never check policy (the guardian does, before the call) and never retry.
They raise `ToolError` with a message the model can act on; anything else that
escapes a tool is a bug and is reported as such.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.events import Attachment

#: Tools that read and change nothing: no snapshot is taken before them (core/snapshots),
#: and a goal task cut off after only these may run again (core/goals/queue.py).
READ_ONLY_TOOLS = frozenset(
    {"read_file", "list_files", "search_files", "web_fetch", "web_search"}
    | {"browser_text", "browser_screenshot", "browser_close"}
    | {"code_symbols", "code_definition", "code_references", "code_impact"}
)

if TYPE_CHECKING:
    from core.browser import Browsers
    from core.code.service import CodeIntel
    from core.egress import EgressPolicy
    from core.sandbox import Grant, Sandbox
    from core.search import WebSearch


class ToolError(Exception):
    """A failure the model should read and react to ("No such file: a.md. Files here: ...")."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Everything a tool may use; built once per task from the settings."""

    workspace: Path
    shell_timeout: float = 60.0
    output_cap: int = 20_000
    fetch_timeout: float = 20.0
    fetch_max_bytes: int = 2_000_000
    #: Extra environment Steward itself sets for commands (added after the allowlist).
    env: dict[str, str] = field(default_factory=dict)
    #: Names of Steward's environment variables the owner lets commands see
    #: (`sandbox_env`), beside the allowlist of core/sandbox/environment.py.
    sandbox_env: tuple[str, ...] = ()
    #: The OS sandbox every shell command runs in (core/sandbox); None: no sandbox
    #: (`sandbox = "off"`, or none possible, where the agent asks before every command).
    sandbox: Sandbox | None = None
    #: What an approval granted the one call this context is for (None: nothing extra).
    grant: Grant | None = None
    #: Where the tools' network connections may go (core/egress; `egress_allow`). None:
    #: the egress rules with no exceptions (still no loopback, private or metadata hosts).
    egress: EgressPolicy | None = None
    #: The task this call belongs to (the agent sets it for each call): what per-task
    #: state, such as the task's browser, is kept by.
    task_id: str = ""
    #: The browsers of running tasks (core/browser), one per task, closed when it ends.
    #: None: no browser here (`browser_enabled` off, no Chromium, or no OS sandbox).
    browser: Browsers | None = None
    #: What web_search asks (core/search: the owner's backend, its fallback, the cache).
    #: None: web_search says it is not set up.
    search: WebSearch | None = None
    #: The code indexes the code tools answer from (core/code, under the data dir).
    #: None: each code tool call builds a throwaway index in memory.
    code: CodeIntel | None = None
    #: The running task's own services for tools that act through the agent (the agent
    #: sets it for each call, core/task_host.TaskHost): `delegate` starts a child there, a
    #: learned workflow's steps are called there, each judged like a call of the model's.
    host: Any = None


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool returns when text alone is not all of it: a screenshot, an image an
    MCP server returned, a report.

    `text` is what the model reads (say in it what the files are). `attachments` go to
    the person's chat with the task's progress, as files of a message. `images` (PNG
    or JPEG attachments) are also shown to the model when it accepts images."""

    text: str
    attachments: tuple[Attachment, ...] = ()
    images: tuple[Attachment, ...] = ()


ToolFn = Callable[[ToolContext, dict[str, Any]], Awaitable[str | ToolOutput]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: ToolFn

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling shape that litellm forwards to every provider."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def cap_output(text: str, limit: int) -> str:
    """Cut long output and say so, so the model knows it did not see everything."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[output cut: {len(text) - limit} more characters not shown]"
