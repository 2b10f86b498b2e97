"""Saved workflows where the agent meets them: each enabled one is a tool `wf__<name>`,
and a request that fully matches one's pattern may run it without a model turn.

Why both: the tool lets the model choose a workflow when a request is close but not
worded the way it was taught (one model turn to fill its inputs, then none for its
steps); the direct run is the saving that matters, for the request asked the same way
again, where even the first model turn is work already learned. A direct run is only
made on a full match of one workflow's pattern whose inputs pass their schema: a
look-alike request ("restart the staging worker and delete its logs") does not match,
and two workflows matching one request run neither (the model decides).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from core.tools.base import Tool, ToolContext, ToolError
from core.workflows.document import Workflow, match_request

if TYPE_CHECKING:
    from core.workflows.store import WorkflowStore

log = structlog.get_logger("steward.workflows")


class Workflows:
    """The store's enabled workflows as tools and as direct runs (`Agent.workflows`)."""

    def __init__(
        self,
        store: WorkflowStore,
        *,
        enabled: bool = True,
        direct: bool = True,
        step_deadline: float = 120.0,
        judge_threshold: float = 0.7,
        retire_after: int = 3,
    ) -> None:
        self.store = store
        self.enabled = enabled
        self.direct = direct
        self.step_deadline = step_deadline
        self.judge_threshold = judge_threshold
        self.retire_after = retire_after
        #: One Tool per workflow object the store hands out: the same object while the
        #: file is unchanged, so the toolbox reuses its schema.
        self._tools: dict[str, tuple[Workflow, Tool]] = {}

    def _enabled(self) -> list[Workflow]:
        if not self.enabled:
            return []
        try:
            return self.store.enabled()
        except Exception:  # a broken folder must never break a task
            log.warning("workflows.list_failed", exc_info=True)
            return []

    def pick(self, text: str) -> tuple[Workflow, dict[str, Any]] | None:
        """The one workflow whose pattern the whole request matches, with its inputs;
        None when none does, or more than one (ambiguous: the model decides)."""
        if not self.direct:
            return None
        found = []
        for wf in self._enabled():
            try:
                inputs = match_request(wf, text)
            except Exception:
                log.warning("workflows.match_failed", workflow=wf.name, exc_info=True)
                continue
            if inputs is not None:
                found.append((wf, inputs))
        if len(found) == 1:
            return found[0]
        if found:
            log.info("workflows.ambiguous", workflows=[wf.name for wf, _ in found])
        return None

    async def record(self, name: str, ok: bool) -> None:
        """Count a run for or against `name`; a failure to write is logged only."""
        try:
            wf = await self.store.record_run(name, ok, retire_after=self.retire_after)
        except Exception:
            log.warning("workflows.record_failed", workflow=name, exc_info=True)
            return
        if wf is not None and wf.status == "retired":
            log.info("workflows.retired", workflow=name)

    def tools(self) -> list[Tool]:
        """The toolbox source: one tool per enabled workflow."""
        out = []
        kept: dict[str, tuple[Workflow, Tool]] = {}
        for wf in self._enabled():
            known = self._tools.get(wf.name)
            if known is not None and known[0] is wf:
                tool = known[1]
            else:
                tool = _tool(wf)
            kept[wf.name] = (wf, tool)
            out.append(tool)
        self._tools = kept
        return out


def _tool(wf: Workflow) -> Tool:
    async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
        if ctx.host is None:
            raise ToolError("a workflow runs only inside a task.")
        result = await ctx.host.run_workflow(wf, args)
        if not result.ok:
            raise ToolError(
                f"The workflow {wf.name} stopped: {result.handback}. The steps before that "
                "ran; finish the request yourself."
            )
        return str(result.output)

    description = (
        f"Learned workflow: {wf.description} Runs its steps ({', '.join(wf.tools())}) "
        "without further model turns; each call is checked like yours."
    )
    schema = dict(wf.inputs_schema) or {"type": "object", "properties": {}}
    return Tool(wf.tool_name(), description, schema, run)
