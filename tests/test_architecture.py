"""The shape of the code, checked: layers point one way (bot → adapters → core →
memory → config), modules import each other without circles, every chat platform is
a package with the same modules, and adapters keep no files of their own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from config.platforms import PLATFORMS

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["config", "memory", "core", "adapters", "bot"]
#: The modules of every platform package, and nothing else.
PLATFORM_MODULES = {"__init__.py", "channel.py", "inbound.py", "render.py", "errors.py"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(path: Path, *, runtime_only: bool) -> set[str]:
    """Steward modules `path` imports. `runtime_only`: only imports that run when the
    module is imported (not those under `if TYPE_CHECKING:` or inside a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    nodes: list[ast.AST] = []
    if runtime_only:
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue  # runs when called, not when imported
            nodes.extend(_class_level(node) if isinstance(node, ast.ClassDef) else ast.walk(node))
    else:
        nodes = list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {_owner(n) for n in names if _owner(n)}


def _class_level(node: ast.AST) -> list[ast.AST]:
    """A class body runs at import; a function body does not."""
    if not isinstance(node, ast.ClassDef):
        return []
    out: list[ast.AST] = []
    for child in node.body:
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            out.extend(ast.walk(child))
    return out


def _owner(name: str) -> str | None:
    """The Steward module `name` is or lies in (None for a library)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _parents(module: str) -> set[str]:
    """`module` and the packages it lies in: Python imports those first anyway, so an
    import of one's own package (its `__init__` re-exporting) is no circle."""
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts) + 1)}


def test_layers_point_one_way() -> None:
    upward = []
    for module, path in MODULES.items():
        rank = LAYERS.index(module.split(".")[0])
        for target in _imports(path, runtime_only=False):
            if LAYERS.index(target.split(".")[0]) > rank:
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(upward)


def test_modules_import_each_other_without_circles() -> None:
    graph = {m: _imports(p, runtime_only=True) - _parents(m) for m, p in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for node in graph:
        if node not in index:
            visit(node)
    assert not circles, circles


@pytest.mark.parametrize("platform", [p.name for p in PLATFORMS])
def test_every_platform_is_a_package_of_the_same_modules(platform: str) -> None:
    folder = ROOT / "adapters" / platform
    assert folder.is_dir(), f"adapters/{platform}/ is not a package"
    assert not (ROOT / "adapters" / f"{platform}.py").exists()
    assert {p.name for p in folder.glob("*.py")} == PLATFORM_MODULES


def test_buttons_are_data_no_adapter_writes_its_own_approval() -> None:
    adapters = (ROOT / "adapters").rglob("*.py")
    found = [str(p) for p in adapters if "def send_approval" in p.read_text(encoding="utf-8")]
    assert not found, found


def test_adapters_write_no_files() -> None:
    """What an adapter must remember goes through a memory/ store that bot/ hands it."""
    writes = re.compile(
        r"(?<!store)\.write_(text|bytes)\(|os\.replace\(|memory\.atomic|(?<![.\w])open\("
    )
    found = []
    for path in (ROOT / "adapters").rglob("*.py"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if writes.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, found


def test_one_webhook_intake_reads_request_bodies() -> None:
    """Only adapters/webhook.py reads a platform's POST body: every platform's webhook
    goes through it (verify → parse → answer → background)."""
    found = []
    for path in (ROOT / "adapters").rglob("*.py"):
        if path.name in ("webhook.py", "web.py", "web_login.py"):  # the intake; the web chat
            continue
        text = path.read_text(encoding="utf-8")
        if "request.read()" in text or "request.content." in text or "await request.json()" in text:
            found.append(str(path.relative_to(ROOT)))
    assert not found, found
