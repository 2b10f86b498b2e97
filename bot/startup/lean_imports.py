"""Modules `steward run` never uses but its libraries import eagerly: never loaded.

Why: resident memory of `steward run` is a target (bench rss). httpx's package
``__init__`` imports ``httpx._main``, its command-line client, which imports click,
rich's progress bars and tables and pygments' lexers for syntax highlighting: ~1.6 MB
of modules in a bare ``import httpx``, ~3 MB in bench rss, for a command Steward never
runs (it only uses httpx as a library).

How: ``sys.modules[name] = None`` is the import system's documented way to make
``import name`` raise ImportError. httpx guards that import (``try: from ._main import
main / except ImportError``) and defines a ``main`` that says how to install its CLI,
so the library is unchanged and only ``httpx.main`` differs. Nothing is modified on
disk, and a module already imported is left alone.

rich is the same when the logs are JSON (no terminal, the way a service runs):
structlog's package ``__init__`` imports its console renderer, which imports rich's
pretty-printer and tracebacks, pygments and attrs (~9 MB resident) to draw
tracebacks on a terminal. Both of structlog's imports of rich are guarded; without it,
the console renderer draws plain tracebacks, and JSON logs never use it. Nothing else
`steward run` does imports rich (its terminal chat and progress bars are `steward
chat`'s and the rebuild command's).
"""

from __future__ import annotations

import sys

#: Modules no part of `steward run` imports itself, each guarded by its importer.
UNUSED = ("httpx._main",)
#: Modules `steward run` only uses to draw on a terminal (pretty log lines).
TERMINAL_ONLY = ("rich",)


def skip_unused(*, terminal: bool = True) -> list[str]:
    """Mark each `UNUSED` module (and, without a `terminal` to draw on, each
    `TERMINAL_ONLY` one) as not importable, unless it is loaded already; returns those
    marked. Call before the libraries that import them (httpx, structlog) are imported."""
    marked = []
    for name in UNUSED if terminal else UNUSED + TERMINAL_ONLY:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
            marked.append(name)
    return marked
