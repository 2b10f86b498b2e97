"""One glibc malloc arena for `steward run`: resident memory not spent on per-thread heaps.

Why: glibc gives each thread that allocates its own arena (up to 8 per core), and
memory freed in one arena serves only that arena. `steward run` imports litellm in a
worker thread (App.warm_up) while the event loop keeps allocating on the main thread,
and aiosqlite and `asyncio.to_thread` add more threads; each arena keeps its own
partly used pages. Python holds the GIL around nearly every allocation anyway, so one
shared arena costs no measurable lock contention. bench rss: 298.7 -> 295.3
MB after a message (importing litellm in a thread alone costs 4.7 MB more than on the
main thread with one arena per thread, and nothing more with one arena).

Same effect as starting the process with MALLOC_ARENA_MAX=1, which a console script
cannot do for itself; mallopt must run before the threads start. A MALLOC_ARENA_MAX
the operator set wins, and elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: mallopt's parameter number for the arena limit (glibc's malloc.h).
M_ARENA_MAX = -8


def single_arena() -> bool:
    """Limit glibc malloc to one arena; False when it does not apply here."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, 1))
