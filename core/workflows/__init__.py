"""Learned workflows: a task Steward did the same way several times, written down as a
versioned JSON document of typed steps and run as one tool, `wf__<name>`.

The parts, in the order a workflow goes through them:
- `document.py`: the format (version 1), its JSON schema and limits, matching a request;
- `template.py`: the placeholders of its strings (`{{inputs.NAME}}`, `{{steps.ID}}`),
  shell-quoted in a shell command;
- `run.py`: running it through a `StepHost` (the agent's, which passes every call
  through the guardian, the sandbox and approvals), within its bounds, handing the task
  back when a step fails or a judge is unsure;
- `dryrun.py`: replaying it on recorded examples, with no tool run and no model asked;
- `grade.py`: what it must pass before it is offered (size, name, secrets, invisible
  characters, paths, tools);
- `store.py`: the data dir's `workflows/<name>.json`, committed, with runs, wins and
  losses, retired when it keeps failing;
- `learn.py`: drafting one after repeated runs, and the offer to save it.

docs/workflows.md is the person's side of it.
"""

from __future__ import annotations

from core.workflows.document import (
    DISABLED,
    ENABLED,
    RETIRED,
    TOOL_PREFIX,
    Workflow,
    WorkflowError,
    match_request,
    parse,
)
from core.workflows.dryrun import Example, RecordedCall, dry_run
from core.workflows.grade import Grade, grade
from core.workflows.run import CallResult, RunResult, StepHost, StepRecord, run_workflow
from core.workflows.store import WorkflowStore
from core.workflows.template import TemplateError

__all__ = [
    "DISABLED",
    "ENABLED",
    "RETIRED",
    "TOOL_PREFIX",
    "CallResult",
    "Example",
    "Grade",
    "RecordedCall",
    "RunResult",
    "StepHost",
    "StepRecord",
    "TemplateError",
    "Workflow",
    "WorkflowError",
    "WorkflowStore",
    "dry_run",
    "grade",
    "match_request",
    "parse",
    "run_workflow",
]
