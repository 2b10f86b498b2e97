"""Import an SDK package without running its ``__init__``, loading each name on first use.

Why: some SDKs' ``__init__`` modules import their whole API surface. line-bot-sdk's
``linebot.v3.messaging`` pulls in ~200 pydantic models (and ``linebot``, ``linebot.v3``
and ``linebot.v3.messaging.models`` do the same for the v2 API, the webhook models and
every message type): ~30 MB of resident memory in `steward run` (issue 26), for an
adapter that uses a dozen classes. The SDK's own modules import each other by full
submodule path (``from linebot.v3.messaging.models.flex_box import FlexBox``), so only
the package ``__init__`` files are in the way.

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
import sys
import threading
from types import ModuleType
from typing import Any

_lock = threading.RLock()


def defer_init(*names: str) -> None:
    """Register each package (parents first) as a module whose ``__init__`` runs lazily."""
    with _lock:
        for name in names:
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None or spec.submodule_search_locations is None:
                raise ImportError(f"{name} is not an importable package")
            module = importlib.util.module_from_spec(spec)
            module.__getattr__ = _resolver(module)  # type: ignore[method-assign]
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)


def _resolver(module: ModuleType) -> Any:
    """The module's PEP 562 ``__getattr__``: called only for names not yet in it."""
    sources: dict[str, str] | None = None

    def __getattr__(attr: str) -> Any:
        nonlocal sources
        with _lock:
            if attr in module.__dict__:  # another thread loaded it meanwhile
                return module.__dict__[attr]
            if sources is None:
                sources = _imported_names(module)
            source = sources.get(attr)
            if source is not None and not attr.startswith("__"):
                if source == module.__name__:  # `from . import api`: a submodule
                    value = importlib.import_module(f"{source}.{attr}")
                else:
                    value = getattr(importlib.import_module(source), attr)
                setattr(module, attr, value)
                return value
            if not attr.startswith("__") and _is_submodule(module, attr):
                # `from linebot.v3.messaging import async_rest`: what a plain import
                # of a package falls back to for a name its __init__ did not set
                return importlib.import_module(f"{module.__name__}.{attr}")
            if module.__dict__.get("__getattr__") is __getattr__:
                _run_init(module)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

    return __getattr__


def _imported_names(module: ModuleType) -> dict[str, str]:
    """{name: absolute module} for every top-level ``from X import name`` in the
    package's ``__init__``: where each public name of the package comes from."""
    spec = module.__spec__
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    found: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        relative = "." * node.level + (node.module or "")
        source = importlib.util.resolve_name(relative, module.__name__)
        for alias in node.names:
            if alias.name != "*":
                found[alias.asname or alias.name] = source
    return found


def _is_submodule(module: ModuleType, attr: str) -> bool:
    return importlib.util.find_spec(f"{module.__name__}.{attr}") is not None


def _run_init(module: ModuleType) -> None:
    """Run the package's ``__init__`` in its own namespace, once, as a plain import does."""
    del module.__dict__["__getattr__"]
    spec = module.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(module)
