"""One golden-file helper and one layout for every platform.

`tests/golden/<platform>/inbound/<case>.json` is a payload as the platform sends it,
`normalized/<case>.json` the event Steward makes of it, `outbound/<case>.json` a
request Steward sends. A mismatch fails with a diff; STEWARD_UPDATE_GOLDEN=1
rewrites the files (review the diff before committing).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from core.events import Inbound

ROOT = Path(__file__).parent / "golden"


def folder(platform: str, kind: str) -> Path:
    """`kind`: inbound, normalized or outbound."""
    return ROOT / platform / kind


def cases(platform: str, kind: str = "inbound") -> list[str]:
    return sorted(p.stem for p in folder(platform, kind).glob("*.json"))


def recorded(platform: str, case: str) -> Any:
    return json.loads((folder(platform, "inbound") / f"{case}.json").read_text())


def event_json(event: Inbound | None) -> Any:
    if event is None:
        return None
    return {"type": type(event).__name__, **dataclasses.asdict(event)}


def check(path: Path, actual: Any) -> None:
    """Compare with a golden file; rewrite it only when STEWARD_UPDATE_GOLDEN=1."""
    text = json.dumps(actual, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if os.environ.get("STEWARD_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path}; create it with STEWARD_UPDATE_GOLDEN=1")
    expected = path.read_text()
    if expected != text:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), str(path), "actual"
            )
        )
        pytest.fail(f"golden mismatch (STEWARD_UPDATE_GOLDEN=1 rewrites it):\n{diff}")


def check_normalized(platform: str, case: str, event: Inbound | None) -> None:
    check(folder(platform, "normalized") / f"{case}.json", event_json(event))


def check_outbound(platform: str, case: str, request: Any) -> None:
    check(folder(platform, "outbound") / f"{case}.json", request)
