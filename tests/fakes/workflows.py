"""The workflow the tests and the workflows bench teach Steward: "restart the X worker
and check health", as the scripted model drafts it when asked (one document, so a change
of the format is made once for all of them)."""

from __future__ import annotations

from typing import Any

#: What a request of the taught shape looks like, for the scripted models.
MATCH = r"^restart the (?P<service>[a-z0-9-]+) worker and check (its )?health\W*$"


def restart_worker(run: str = "./svc", *, output: str | None = None) -> dict[str, Any]:
    """The document, its two `call` steps running `<run> restart|health SERVICE`."""
    return {
        "workflow": 1,
        "name": "restart-worker",
        "description": "Restart a worker and check its health",
        "match": MATCH,
        "inputs": {
            "type": "object",
            "properties": {"service": {"type": "string", "pattern": "^[a-z0-9-]+$"}},
            "required": ["service"],
            "additionalProperties": False,
        },
        "steps": [
            {
                "id": step,
                "kind": "call",
                "tool": "shell",
                "args": {"command": f"{run} {step} {{{{inputs.service}}}}"},
            }
            for step in ("restart", "health")
        ],
        "output": output or "Restarted {{inputs.service}}.\n{{steps.health}}",
    }
