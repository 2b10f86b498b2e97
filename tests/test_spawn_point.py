"""One spawn point: every process the agent causes starts in `core.sandbox.launch`.

Why a test: a second `create_subprocess_exec` somewhere (an MCP server, a browser, a
skill's script) would be a door around the sandbox, the environment allowlist, the
limits and the git checks. This walks the product's code for every call that starts
a process and fails on one that is neither the spawn point nor one of Steward's own
helpers listed below with the reason it is not the agent's.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "adapters", "core", "memory", "config")

#: Calls that start a process, by their dotted name as written.
STARTERS = {
    *(f"subprocess.{n}" for n in ("run", "Popen", "call", "check_call", "check_output")),
    *(f"subprocess.{n}" for n in ("getoutput", "getstatusoutput")),
    "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
    *(f"os.{n}" for n in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp")),
    *(f"os.exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
    *(f"os.spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
    "pty.spawn",
    "multiprocessing.Process",
    "ProcessPoolExecutor",
}

#: (file, function) → why that process is not one the agent causes.
ALLOWED = {
    ("core/sandbox/spawn.py", "launch"): "the spawn point itself",
    ("core/sandbox/configure.py", "detect"): "probes once whether bwrap works (`true`)",
    ("core/sandbox/environment.py", "git_identity"): "reads the host's git user name/email",
    ("core/git_control.py", "read_entries"): "git reads a config file's bytes from stdin",
    ("core/model/local/runtime.py", "_spawn"): "Steward's own embedded model server",
    ("core/model/local/child.py", "main"): "the model server's own child (exec)",
    ("core/model/workers.py", "_start"): "Steward's own model-call worker processes",
    ("memory/index/rebuild.py", "_parsers"): "Steward's own parsers for a memory rebuild",
    ("core/egress/bridge.py", "_daemonize"): "the network bridge daemonizes inside the sandbox",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def call_sites() -> list[tuple[str, str, int, str]]:
    """(file, enclosing function, line, call) of every process-starting call."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            stack: list[tuple[ast.AST, str]] = [(tree, "<module>")]
            while stack:
                node, where = stack.pop()
                for child in ast.iter_child_nodes(node):
                    inside = where
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                        inside = child.name
                    if isinstance(child, ast.Call):
                        name = _dotted(child.func)
                        if name in STARTERS or name.split(".")[-1] in (
                            "create_subprocess_exec",
                            "create_subprocess_shell",
                        ):
                            found.append((rel, inside, child.lineno, name))
                    stack.append((child, inside))
    return found


def test_every_process_start_is_the_spawn_point_or_stewards_own() -> None:
    sites = call_sites()
    unknown = [s for s in sites if (s[0], s[1]) not in ALLOWED]
    assert not unknown, (
        "processes started outside core.sandbox.launch (route them through it, or, for "
        f"a process of Steward's own that the agent never causes, list it here): {unknown}"
    )


def test_the_list_has_no_stale_entries() -> None:
    used = {(s[0], s[1]) for s in call_sites()}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"listed but no longer starting a process: {stale}"


def test_the_shell_tool_starts_nothing_itself() -> None:
    assert not [s for s in call_sites() if s[0].startswith("core/tools/")]
