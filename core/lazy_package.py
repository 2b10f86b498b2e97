"""Import an SDK package without running its ``__init__``, loading each name on first use.

Why: some SDKs' ``__init__`` modules import their whole API surface, and resident
memory of `steward run` is a target (bench/rss.py). line-bot-sdk's ``linebot``,
``linebot.v3``, ``linebot.v3.messaging`` and its ``models`` import the v2 API, every
webhook model and ~200 message models for an adapter that uses a dozen classes;
``openai.types`` and its subpackages import every type module of the openai SDK, of
which litellm uses a part. The SDKs' own modules import each other by full submodule
path (``from linebot.v3.messaging.models.flex_box import FlexBox``), so only the
package ``__init__`` files are in the way (bench rss: ~8 MB for LINE, ~12 MB for openai).

How: `defer_init` puts a module object for each named package into `sys.modules` with
its spec, ``__path__`` and ``__file__`` set but its code not run, so submodule imports
work as usual. The first time a name is asked of it (``from linebot.v3.messaging
import TextMessage``, or the SDK's ``getattr(linebot.v3.messaging.models, klass)``
when it deserialises a response), the package's ``__init__`` source is read (not run)
for the ``from X import Name`` statement that defines that name, and only module X is
imported; a name that is a submodule imports that submodule. A name the ``__init__``
does not import that way (``__all__``, ``__version__``, anything it computes) runs
the whole ``__init__`` once, in the module's own namespace, exactly as a plain import
would have: nothing the SDK offers goes missing, it only loads later. The SDK itself
is not modified.

Call it before the package is imported for the first time; a package already in
`sys.modules` is left alone (its ``__init__`` has run, there is nothing to save).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import threading
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import Any

_lock = threading.Lock()


def defer_init(*names: str) -> None:
    """Register each package (parents first) as a module whose ``__init__`` runs lazily."""
    with _lock:
        for name in names:
            if name in sys.modules:
                continue
            spec = _find_spec(name)
            if spec is None or spec.loader is None or spec.submodule_search_locations is None:
                raise ImportError(f"{name} is not an importable package")
            module = importlib.util.module_from_spec(spec)
            module.__getattr__ = _resolver(module)  # type: ignore[method-assign]
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:  # else the parent binds it when its __init__ imports it
                setattr(sys.modules[parent], child, module)


def _find_spec(name: str) -> ModuleSpec | None:
    """The package's spec, without importing a parent that is not imported yet (running
    ``openai/__init__`` would import the very ``openai.types`` that is to be deferred)."""
    parent, _, _ = name.rpartition(".")
    if not parent or parent in sys.modules:
        return importlib.util.find_spec(name)
    above = _find_spec(parent)
    if above is None or above.submodule_search_locations is None:
        return None
    return PathFinder.find_spec(name, list(above.submodule_search_locations))


def defer_tree(name: str) -> None:
    """`defer_init` for a package and every package below it (parents first)."""
    spec = _find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an importable package")
    names = [name]
    for top in spec.submodule_search_locations:
        for folder, subfolders, files in os.walk(top):
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            if folder != top and "__init__.py" in files:
                relative = os.path.relpath(folder, top).replace(os.sep, ".")
                names.append(f"{name}.{relative}")
    defer_init(*sorted(names, key=lambda n: n.count(".")))


def _resolver(module: ModuleType) -> Any:
    """The module's PEP 562 ``__getattr__``: called only for names not yet in it.

    Imports run without holding a lock of ours (importlib has its own per-module locks):
    a thread importing litellm and the event loop's thread importing an adapter's SDK
    must never wait on each other through this module. The per-package lock only guards
    reading the ``__init__`` source once and running it once."""
    sources: dict[str, tuple[str, str]] | None = None
    lock = threading.RLock()

    def __getattr__(attr: str) -> Any:
        nonlocal sources
        if not attr.startswith("__"):
            with lock:
                if sources is None:
                    sources = _imported_names(module)
            found = sources.get(attr)
            if found is not None:
                source, name = found
                if source == module.__name__:  # `from . import api`: its own submodule
                    value = importlib.import_module(f"{source}.{name}")
                else:
                    value = _load(source, name)
                setattr(module, attr, value)
                return value
            if _is_submodule(module, attr):
                # `from linebot.v3.messaging import async_rest`: what a plain import
                # of a package falls back to for a name its __init__ did not set
                return importlib.import_module(f"{module.__name__}.{attr}")
        with lock:
            if module.__dict__.get("__getattr__") is __getattr__:
                _run_init(module)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

    return __getattr__


def _load(source: str, name: str) -> Any:
    """What ``from source import name`` binds: an attribute of source, else its submodule."""
    module = importlib.import_module(source)
    try:
        return getattr(module, name)
    except AttributeError:
        return importlib.import_module(f"{source}.{name}")


def _imported_names(module: ModuleType) -> dict[str, tuple[str, str]]:
    """{bound name: (absolute module, name in it)} for every top-level ``from X import
    name [as bound]`` in the package's ``__init__``: where each of its names comes from."""
    spec = module.__spec__
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    found: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        relative = "." * node.level + (node.module or "")
        source = importlib.util.resolve_name(relative, module.__name__)
        for alias in node.names:
            if alias.name != "*":
                found[alias.asname or alias.name] = (source, alias.name)
    return found


def _is_submodule(module: ModuleType, attr: str) -> bool:
    return importlib.util.find_spec(f"{module.__name__}.{attr}") is not None


def _run_init(module: ModuleType) -> None:
    """Run the package's ``__init__`` in its own namespace, once, as a plain import does."""
    del module.__dict__["__getattr__"]
    spec = module.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(module)
