"""Approvals on disk: <data dir>/approvals/<id>.md, so none is lost or approved by a restart.

Each request is written when it is asked and again when it is decided; the file is
the record a person can audit ("who approved `git push` on Tuesday?"). Written and
read through the one record store (`memory.records`): redacted, atomic, cached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from memory.records import RecordStore

log = structlog.get_logger("steward.approvals.store")


class ApprovalStore:
    def __init__(self, data_dir: Path) -> None:
        self.records = RecordStore(data_dir / "approvals", "approval")
        self.root = self.records.root

    def path(self, approval_id: str) -> Path:
        return self.records.path(approval_id)

    async def save(self, record: dict[str, Any]) -> None:
        body = f"{record.get('what', '')}\n\nWhy: {record.get('why', '')}\n"
        await self.records.save(self.path(record["id"]), record, body)

    def load_all(self) -> list[dict[str, Any]]:
        """Every readable record; a malformed file is logged with its path and left alone."""
        records = []
        for path in self.records.paths():
            try:
                meta, _body = self.records.read(path)
                if not meta.get("id") or not meta.get("status"):
                    raise ValueError("missing id or status")
                records.append(meta)
            except (OSError, ValueError) as exc:
                log.warning("approvals.malformed", path=str(path), error=str(exc))
        return records
