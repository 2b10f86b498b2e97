"""`python -m core.model.local.server --model PATH --port N ...`: the embedded model's server.

Runs llama.cpp's own OpenAI-compatible HTTP server in this process through xllamacpp,
until SIGTERM/SIGINT. `core.model.local.runtime.ModelServer` starts it as a child and litellm
talks to it like any other endpoint.

Why xllamacpp and not llama-cpp-python: llama-cpp-python ships only a source
distribution, so a first run compiled llama.cpp for 5-18 minutes, and a build made
on a CPU with AMX used tile instructions the kernel had not enabled for its threads,
so the first request died with SIGILL. xllamacpp ships prebuilt manylinux wheels for
x86-64 and aarch64 compiled for portability (no `-march=native`, no AVX-512 or AMX
paths), so installing it is a 34 MB download and it runs on any CPU of the
architecture. Its server is llama.cpp's C++ one (JSON-schema grammars in C++, which
keep every Unicode code point, where llama-cpp-python's Python converter lost
characters outside the Basic Multilingual Plane).

Kept apart from `core.model.local.runtime` so that Steward's own process never imports the
native library: a crash in it then takes down only this child, which the supervisor
reports (signal name, last log lines) and restarts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m core.model.local.server")
    p.add_argument("--model", required=True, help="the GGUF file")
    p.add_argument("--alias", required=True, help="the model id clients ask for")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--jinja",
        action="store_true",
        help="apply the model's chat template with tool support (the unconstrained baseline)",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # The wheel's llama.cpp uses OpenMP, whose threads spin while they wait for work.
    # On a small machine shared with Steward (and whatever else runs there) spinning
    # threads steal the cores the others need; passive waiting yields them. Read by
    # the OpenMP runtime when the library loads, so set before the import.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import xllamacpp as xlc
    except ImportError as exc:
        print(f"steward: xllamacpp is not installed ({exc})", file=sys.stderr)
        return 3
    params = xlc.CommonParams()
    params.model.path = args.model
    params.model_alias = [args.alias]
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = 1  # one slot: a tiny model serving one owner, the whole context
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.use_jinja = args.jinja
    # No extra buffer types (the AMX and repacked-weight paths): the wheel has no AMX
    # code, and this keeps a from-source build of the same module off AMX too, whose
    # tile instructions need a per-thread permission the library does not ask for.
    params.no_extra_bufts = True
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"steward: loading {args.model}", file=sys.stderr, flush=True)
    try:
        server = xlc.Server(params)  # loads the model and starts listening
    except RuntimeError as exc:  # llama.cpp's own reason is in the lines above
        print(
            f"steward: llama.cpp could not load {args.model} or listen on port "
            f"{args.port} ({exc}); check that it is a GGUF model file",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(
        f"steward: serving {args.alias} on http://{args.host}:{args.port}/v1 "
        f"({xlc.get_system_info().strip()})",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(3600):
        pass
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
