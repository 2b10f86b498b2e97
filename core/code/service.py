"""The code indexes of one Steward: one per workspace, stored under the data dir.

Built by bot/app.py from the settings (`code_skip`, `code_max_files`,
`code_max_file_bytes`) and handed to the tools in their `ToolContext`. An index is
opened on the first question about a workspace's code, not at start: a chat that never
asks about code pays nothing (tree-sitter included).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.code.index import CodeIndex
from memory.code_index_store import CodeIndexStore, index_path

#: Folders never indexed, whatever the settings: version control, dependencies, build
#: output and caches (code, but not the workspace's own).
DEFAULT_SKIP = (
    ".git",
    "node_modules",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".tox",
    "target",
    "dist",
    "build",
    "vendor",
    ".next",
)
DEFAULT_MAX_FILES = 50_000
DEFAULT_MAX_FILE_BYTES = 1_000_000


class CodeIntel:
    """Hands out the index of a workspace, opening it once per process."""

    def __init__(
        self,
        data_dir: Path | None,
        *,
        skip: Iterable[str] = (),
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        """`data_dir` None: indexes in memory only (rebuilt by every new CodeIntel)."""
        self.data_dir = data_dir
        self.skip = frozenset({*DEFAULT_SKIP, *(s.strip() for s in skip if s.strip())})
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        self._indexes: dict[str, CodeIndex] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, data_dir: Path) -> CodeIntel:
        return cls(
            data_dir,
            skip=str(settings.code_skip).split(","),
            max_files=settings.code_max_files,
            max_file_bytes=settings.code_max_file_bytes,
        )

    def index(self, workspace: Path) -> CodeIndex:
        """The index of `workspace` (opened, not updated: `CodeIndex.refresh` does that).
        Runs in a worker thread: opening reads the store."""
        real = os.path.realpath(workspace)
        with self._lock:
            found = self._indexes.get(real)
            if found is None:
                path = index_path(self.data_dir, Path(real)) if self.data_dir else None
                found = CodeIndex(
                    Path(real),
                    CodeIndexStore(path, real),
                    skip=self.skip,
                    max_files=self.max_files,
                    max_file_bytes=self.max_file_bytes,
                    exclude=self._inside(real),
                )
                self._indexes[real] = found
            return found

    def _inside(self, workspace: str) -> tuple[str, ...]:
        """Steward's data dir, relative to the workspace when it lies inside it."""
        if self.data_dir is None:
            return ()
        data = os.path.realpath(self.data_dir)
        if data.startswith(workspace.rstrip("/") + "/"):
            return (data[len(workspace.rstrip("/")) + 1 :],)
        return ()

    def close(self) -> None:
        with self._lock:
            for index in self._indexes.values():
                index.store.close()
            self._indexes.clear()
