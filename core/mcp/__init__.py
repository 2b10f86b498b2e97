"""MCP servers: their tools offered to the model, every call judged, stdio servers sandboxed.

The parts (docs/mcp.md says what a person configures and sees):
- config/mcp.py: the `[mcp.servers.NAME]` tables of steward.toml (and of the file
  STEWARD_MCP_CONFIG names), parsed where the settings are read;
- `names.py`: `mcp__<server>__<tool>`, renamed in the open where a name does not fit;
- `catalog.py`: the tools and server states everyone reads;
- `box.py`: how a stdio server is started in a sandbox of its own;
- `connection.py`: one live connection (the SDK is imported only here, lazily);
- `results.py`: a tool's result as text, files and images for the model;
- `judge.py`: the guardian's verdict for an MCP call ([mcp.<server>] policy sections);
- `hub.py`: every server kept alive, with backoff; the toolbox's source of MCP tools.

Nothing imported here loads the MCP SDK: a Steward without servers never does.
"""

from __future__ import annotations

from core.mcp.box import Launch, NotLaunchable, plan, state_folder
from core.mcp.catalog import McpTool, ServerStatus, State
from core.mcp.hub import McpHub, probe
from core.mcp.judge import McpJudge

__all__ = [
    "Launch",
    "McpHub",
    "McpJudge",
    "McpTool",
    "NotLaunchable",
    "ServerStatus",
    "State",
    "plan",
    "probe",
    "state_folder",
]
