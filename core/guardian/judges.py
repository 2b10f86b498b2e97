"""The judges of the built-in tools that have no rules in guard.py itself.

Why: shell, file and fetch calls are decided by guard.py; the later tools (web search,
the browser, code intelligence) each bring a small judge of their own, listed here so
that every `Guardian` (the running agent, `steward replay`, the policy CLI) decides
them the same way. Tools that come and go (MCP servers, skills) register their judge
with `Guardian.add_judge` where they are built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.guardian.decision import CallDecision, Verdict
from memory.redact import redact

if TYPE_CHECKING:
    from core.guardian.guard import Judge
    from core.policy import Policy


class WebSearchJudge:
    """web_search reads search results and changes nothing: allowed. Only its query
    leaves (to the owner's search backend), so a query holding what looks like a secret
    (memory/redact.py's patterns) is refused: a search engine keeps its queries."""

    def claims(self, tool: str) -> bool:
        return tool == "web_search"

    def decide(self, policy: Policy, tool: str, args: dict[str, Any]) -> CallDecision:
        query = args.get("query")
        if isinstance(query, str) and redact(query) != query:
            return CallDecision(
                Verdict.FORBID,
                "web_search: the query holds what looks like a secret "
                f"({redact(query)[:120]}); a search engine would keep it",
            )
        return CallDecision(Verdict.ALLOW, "web_search only reads search results")


class CodeJudge:
    """The code tools (core/code) only read the workspace's code and Steward's own index
    of it: allowed. A path outside the workspace is refused by the tool itself, as the
    file tools refuse it (core/tools/workspace.parse_path)."""

    TOOLS = frozenset({"code_symbols", "code_definition", "code_references", "code_impact"})

    def claims(self, tool: str) -> bool:
        return tool in self.TOOLS

    def decide(self, policy: Policy, tool: str, args: dict[str, Any]) -> CallDecision:
        return CallDecision(Verdict.ALLOW, f"{tool} only reads the workspace's code")


class BrowserJudge:
    """The browser tools (core/browser) but browser_open, which guard.py judges as a fetch
    of its URL. Reading, screenshots and closing change nothing: allowed. A click or
    typing acts on a page the guardian cannot see, so the tool itself refuses one that
    would submit a form or type into a password field, saying exactly what it would do;
    the call repeated with `confirm` set to those words is asked, showing them, and the
    tool goes on only if the page would still do exactly that."""

    TOOLS = frozenset(
        {"browser_click", "browser_type", "browser_text", "browser_screenshot", "browser_close"}
    )

    def claims(self, tool: str) -> bool:
        return tool in self.TOOLS

    def decide(self, policy: Policy, tool: str, args: dict[str, Any]) -> CallDecision:
        confirm = args.get("confirm")
        if tool in ("browser_click", "browser_type") and confirm not in (None, "", False):
            if not isinstance(confirm, str):
                return CallDecision(
                    Verdict.FORBID, f"{tool}: confirm must be the exact text the tool gave"
                )
            what = "submits a form" if tool == "browser_click" else "types into"
            return CallDecision(Verdict.APPROVAL, f"{tool} {what}: {confirm[:400]}")
        return CallDecision(
            Verdict.ALLOW, f"{tool} acts in the task's sandboxed browser, on pages it opened"
        )


class ThroughAgentJudge:
    """`delegate` (a child task) and `wf__<name>` (a learned workflow) do nothing
    themselves: every call they cause is a tool call of the agent's, judged here on its
    own (and asked about, and sandboxed) exactly as if the model had asked for it. So
    the wrapper is allowed; what it does is not waved through."""

    def claims(self, tool: str) -> bool:
        return tool == "delegate" or tool.startswith("wf__")

    def decide(self, policy: Policy, tool: str, args: dict[str, Any]) -> CallDecision:
        what = "a sub-task" if tool == "delegate" else f"the learned workflow {tool[4:]}"
        return CallDecision(
            Verdict.ALLOW, f"{tool} runs {what}; each of its tool calls is judged on its own"
        )


def builtin_judges() -> list[Judge]:
    """A fresh list of the built-in judges, in the order they are asked."""
    return [WebSearchJudge(), CodeJudge(), BrowserJudge(), ThroughAgentJudge()]
