"""Approvals on disk: <data dir>/approvals/<id>.md, so none is lost or approved by a restart.

Each request is written when it is asked and again when it is decided; the file is
the record a person can audit ("who approved `git push` on Tuesday?").
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

from memory.atomic import atomic_write_text
from memory.redact import redact
from memory.store import parse, render

log = structlog.get_logger("steward.approvals.store")


class ApprovalStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "approvals"

    def path(self, approval_id: str) -> Path:
        return self.root / f"{approval_id}.md"

    def _render(self, record: dict[str, Any]) -> str:
        body = f"{record.get('what', '')}\n\nWhy: {record.get('why', '')}\n"
        return redact(render(record, body))

    async def save(self, record: dict[str, Any]) -> None:
        await asyncio.to_thread(atomic_write_text, self.path(record["id"]), self._render(record))

    def load_all(self) -> list[dict[str, Any]]:
        """Every readable record; a malformed file is logged with its path and left alone."""
        records = []
        if not self.root.is_dir():
            return records
        for path in sorted(self.root.glob("*.md")):
            try:
                meta, _body = parse(path.read_text(encoding="utf-8"), path)
                if not meta.get("id") or not meta.get("status"):
                    raise ValueError("missing id or status")
                records.append(meta)
            except (OSError, ValueError) as exc:
                log.warning("approvals.malformed", path=str(path), error=str(exc))
        return records
