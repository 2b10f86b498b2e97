"""Whether log lines are drawn for a person (console) or written as JSON.

Why its own module: `steward run` decides it before structlog is imported (without a
terminal to draw on, rich is never loaded: bot/startup/lean_imports.py), and bot/logs.py applies it.
"""

from __future__ import annotations

from typing import TextIO


def pretty_logs(fmt: str, stream: TextIO) -> bool:
    """`STEWARD_LOG_FORMAT`: "console" draws, "json" writes JSON, "auto" draws only on a
    terminal."""
    if fmt == "console":
        return True
    if fmt != "auto":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one: nobody to draw for
        return False
