"""Which indexed files an import statement names.

Why by path suffix: a source tree rarely starts where its imports do (`src/geo/shapes.py`
is `geo.shapes`; a Go import carries the module's host and path before the folder), so
a file's module path (`geo/shapes`; a Go package is its folder) is looked up by its
trailing segments. Relative imports (`./math`, `from . import util`) are joined to the
importing file's folder and must match a whole path.

Imports of code outside the workspace (the standard library, packages) resolve to
nothing, which is right: the index only links uses to definitions it holds.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from core.code.languages import FAMILY

_JS_EXTENSIONS = (".js", ".mjs", ".cjs", ".jsx", ".ts", ".mts", ".cts", ".tsx", ".d")
_RUST_EXTERNAL = frozenset({"std", "core", "alloc"})

Key = tuple[str, ...]


def module_key(path: str, lang: str) -> Key:
    """The module path of a file: `geo/shapes` for geo/shapes.py, `geo` for
    geo/__init__.py, web/index.ts and src/geo/mod.rs; a Go file's folder."""
    parts = path.split("/")
    folder = tuple(parts[:-1])
    if lang == "go":
        return folder
    stem = parts[-1].rsplit(".", 1)[0]
    if lang in ("typescript", "tsx") and stem.endswith(".d"):
        stem = stem[:-2]
    if (
        (lang == "python" and stem == "__init__")
        or (FAMILY[lang] == "js" and stem == "index")
        or (lang == "rust" and stem in ("mod", "lib", "main"))
    ):
        return folder
    return (*folder, stem)


class Modules:
    """The module paths of every indexed file, by family, looked up by suffix."""

    def __init__(self, files: Mapping[int, tuple[str, str]]) -> None:
        """`files`: id -> (path, language)."""
        self._files = files
        #: family -> trailing segments -> file ids
        self._suffix: dict[str, dict[Key, set[int]]] = {}
        #: family -> whole module path -> file ids
        self._exact: dict[str, dict[Key, set[int]]] = {}
        #: Java: package folder (by suffix) -> file ids, for `import a.b.*`
        self._java_dirs: dict[Key, set[int]] = {}
        for fid, (path, lang) in files.items():
            family = FAMILY[lang]
            key = module_key(path, lang)
            self._exact.setdefault(family, {}).setdefault(key, set()).add(fid)
            if family == "js":  # `./web/index` names index.ts as well as `./web`
                stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
                if stem == "index":
                    self._exact[family].setdefault((*key, "index"), set()).add(fid)
            suffixes = self._suffix.setdefault(family, {})
            for n in range(1, len(key) + 1):
                suffixes.setdefault(key[-n:], set()).add(fid)
            if lang == "java":
                folder = key[:-1]
                for n in range(1, len(folder) + 1):
                    self._java_dirs.setdefault(folder[-n:], set()).add(fid)

    def resolve(self, importer: str, lang: str, spec: str, name: str) -> set[int]:
        """The files the import `spec` (naming `name`) in file `importer` refers to."""
        family = FAMILY[lang]
        folder = tuple(importer.split("/")[:-1])
        if family == "python":
            return self._python(folder, spec, name)
        if family == "js":
            return self._js(folder, spec)
        if family == "go":
            parts = tuple(p for p in spec.split("/") if p)
            for n in range(len(parts), 0, -1):
                found = self._suffix.get("go", {}).get(parts[-n:])
                if found:
                    return found
            return set()
        if family == "rust":
            return self._rust(spec, name)
        if family == "java":
            parts = tuple(spec.split("."))
            if name == "*":
                return self._java_dirs.get(parts, set())
            return self._suffix.get("java", {}).get((*parts, name), set())
        return set()

    def _python(self, folder: Key, spec: str, name: str) -> set[int]:
        level = len(spec) - len(spec.lstrip("."))
        rest = tuple(p for p in spec[level:].split(".") if p)
        named = (*rest, name) if name and name != "*" else None
        if level:
            base = folder[: len(folder) - (level - 1)] if level > 1 else folder
            exact = self._exact.get("python", {})
            if named is not None and (*base, *named) in exact:
                return exact[(*base, *named)]
            return exact.get((*base, *rest), set())
        suffixes = self._suffix.get("python", {})
        if named is not None and named in suffixes:
            return suffixes[named]
        return suffixes.get(rest, set()) if rest else set()

    def _js(self, folder: Key, spec: str) -> set[int]:
        if spec.startswith("."):
            joined = posixpath.normpath(posixpath.join("/".join(folder) or ".", spec))
            for ext in _JS_EXTENSIONS:
                if joined.endswith(ext):
                    joined = joined[: -len(ext)]
                    break
            key = tuple(p for p in joined.split("/") if p and p != ".")
            return self._exact.get("js", {}).get(key, set())
        parts = [p for p in spec.split("/") if p]
        if parts and parts[0] in ("@", "~"):  # a path alias of the project: `@/lib/x`
            parts = parts[1:]
        if len(parts) < 2:
            return set()  # a package (`react`), not a file of the workspace
        return self._suffix.get("js", {}).get(tuple(parts), set())

    def _rust(self, spec: str, name: str) -> set[int]:
        parts = [p for p in spec.split("::") if p]
        if parts and parts[0] in _RUST_EXTERNAL:
            return set()
        while parts and parts[0] in ("crate", "self", "super"):
            parts = parts[1:]
        suffixes = self._suffix.get("rust", {})
        tries = [(*parts, name)] if name and name not in ("*", "self") else []
        tries += [tuple(parts[:n]) for n in range(len(parts), 0, -1)]
        for key in tries:
            if key in suffixes:
                return suffixes[key]
        return set()
