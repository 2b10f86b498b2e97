"""What the dashboard pages show, read from the stores the chat writes: no copy of its own.

Why plain functions over files: episodes, rules, offers of help and per-person
thresholds are Markdown files in the data dir (docs/memory.md), and the chat's
commands read the same files. These readers run in a worker thread (they stat and
parse files) and keep a small cache keyed by each file's mtime and size, so an
open dashboard refreshing every few seconds does not re-parse a month of episodes.
"""

from __future__ import annotations

import json
import mimetypes
import os
import re
import threading
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from core import safe_fs
from memory.atomic import atomic_write_text
from memory.records import RecordStore
from memory.store import MalformedFile
from memory.usage import UsageLedger, day_of, day_start, period_end, read_rows, zone

log = structlog.get_logger("steward.dashboard")

#: An episode id as the agent writes it (also what keeps a URL from naming another file).
EPISODE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,80}")
#: "confidence 0.30→0.42" in a rule's trial history (core/learning.py writes it).
CONFIDENCE_RE = re.compile(r"confidence (\d+(?:\.\d+)?)→(\d+(?:\.\d+)?)")
#: Files listed on the Artifacts page at most, and the largest one served.
ARTIFACTS_LISTED = 300
ARTIFACT_MAX_BYTES = 5 * 1024 * 1024
#: Folders of the workspace that are tooling, not work for people.
SKIPPED_DIRS = {".git", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache"}


#: One episode as Spend counts it: day, model, channel, tokens in, tokens out, cost.
SpendRow = tuple[str, str, str, int, int, float | None]


class FrontMatterCache:
    """Parsed front matter per file, re-read only when the file's mtime or size changes.

    The per-day Spend rows are also kept in `days_file` (a cache under the data dir's
    ignored `web/` folder): without it the first Spend view after a start parsed every
    episode of the window (seconds for a few thousand); with it, a start reads one small
    file and re-reads only the day folders that changed since.
    """

    def __init__(self, days_file: Path | None = None) -> None:
        #: Episode files parsed once until they change, at most this many kept (the
        #: record store's bounded cache: a long-lived dashboard must not grow forever).
        self._records = RecordStore(Path("."), "episode", cache_size=4096)
        self._days: dict[Path, tuple[int, list[SpendRow]]] = {}
        self._lock = threading.Lock()
        self.days_file = days_file
        self._days_loaded = days_file is None
        self._days_dirty = False

    def _load_days(self) -> None:
        """The day rows kept by an earlier run; anything unreadable is just recomputed."""
        self._days_loaded = True
        assert self.days_file is not None
        try:
            kept = json.loads(self.days_file.read_text(encoding="utf-8"))
            for folder, (stamp, rows) in kept.items():
                self._days[Path(folder)] = (
                    int(stamp),
                    [(str(a), str(b), str(c), int(d), int(e), f) for a, b, c, d, e, f in rows],
                )
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError) as exc:
            log.info("dashboard.spend_cache_unreadable", error=str(exc)[:200])
            self._days.clear()

    def save_days(self) -> None:
        """Keep the day rows for the next start (only when something changed)."""
        if self.days_file is None or not self._days_dirty:
            return
        with self._lock:
            kept = {str(k): [stamp, rows] for k, (stamp, rows) in self._days.items()}
            self._days_dirty = False
        try:
            atomic_write_text(self.days_file, json.dumps(kept, separators=(",", ":")))
        except OSError as exc:  # a cache: the next start recomputes
            log.info("dashboard.spend_cache_unwritable", error=str(exc)[:200])

    def read(self, path: Path, *, body: bool = False) -> tuple[dict[str, Any], str] | None:
        """An episode's front matter (and body), None when it is gone or unreadable."""
        try:
            meta, text = self._records.read(path)
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, MalformedFile, ValueError) as exc:
            log.info("dashboard.unreadable", path=str(path), error=str(exc)[:200])
            return None
        return meta, (text if body else "")

    def day_rows(self, folder: Path) -> list[SpendRow]:
        """(day, model, channel, tokens in, tokens out, cost) of each episode in one day
        folder, re-read only when the folder changed: episodes are written by rename
        (memory.atomic), which changes the folder's mtime, so a month of Spend costs a
        few stats when nothing new happened. (An old episode edited in place, without a
        rename, is seen once its day gets another file, or after a restart.)"""
        try:
            stamp = folder.stat().st_mtime_ns
        except OSError:
            return []
        with self._lock:
            if not self._days_loaded:
                self._load_days()
            hit = self._days.get(folder)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        rows: list[SpendRow] = []
        fallback = f"{folder.parent.parent.name}-{folder.parent.name}-{folder.name}"
        for path in folder.glob("*.md"):
            got = self.read(path)
            if got is None:
                continue
            meta = got[0]
            rows.append(
                (
                    str(meta.get("started") or "")[:10] or fallback,
                    str(meta.get("model") or ""),
                    str(meta.get("channel") or ""),
                    _int(meta.get("tokens_in")),
                    _int(meta.get("tokens_out")),
                    _float(meta.get("cost_usd")),
                )
            )
        with self._lock:
            self._days[folder] = (stamp, rows)
            self._days_dirty = True
        return rows


# ---------------------------------------------------------------------- episodes


def episode_days(root: Path, days: int, now: datetime) -> list[Path]:
    """The day folders episodes/YYYY/MM/DD of the last `days` days, newest first."""
    out = []
    for back in range(max(1, days)):
        d = (now - timedelta(days=back)).date()
        folder = root / f"{d:%Y}" / f"{d:%m}" / f"{d:%d}"
        if folder.is_dir():
            out.append(folder)
    return out


def episode_summary(meta: dict[str, Any], path: Path, data_dir: Path) -> dict[str, Any]:
    tools = meta.get("tools") or []
    return {
        "id": str(meta.get("id") or path.stem),
        "started": str(meta.get("started") or ""),
        "channel": str(meta.get("channel") or ""),
        "conversation": str(meta.get("conversation") or ""),
        "user": str(meta.get("user") or ""),
        "request": str(meta.get("request") or "")[:300],
        "outcome": str(meta.get("outcome") or ""),
        "model": str(meta.get("model") or ""),
        "tools": [str(t.get("name", "")) for t in tools if isinstance(t, dict)],
        "tokens_in": _int(meta.get("tokens_in")),
        "tokens_out": _int(meta.get("tokens_out")),
        "cost_usd": _float(meta.get("cost_usd")),
        "path": _relative(path, data_dir),
    }


def recent_episodes(
    cache: FrontMatterCache, data_dir: Path, *, limit: int, days: int, now: datetime
) -> list[dict[str, Any]]:
    """The newest episodes (by day folder, then start time), without the index."""
    root = data_dir / "episodes"
    out: list[dict[str, Any]] = []
    for folder in episode_days(root, days, now):
        found = []
        for path in folder.glob("*.md"):
            got = cache.read(path)
            if got is not None:
                found.append(episode_summary(got[0], path, data_dir))
        found.sort(key=lambda e: e["started"], reverse=True)
        out += found
        if len(out) >= limit:
            break
    return out[:limit]


def episodes_at(cache: FrontMatterCache, data_dir: Path, paths: list[str]) -> list[dict[str, Any]]:
    """Summaries of the episodes at these data-dir-relative paths (search hits), in order."""
    out = []
    for rel in paths:
        path = (data_dir / rel).resolve()
        if not path.is_relative_to(data_dir.resolve() / "episodes"):
            continue
        got = cache.read(path)
        if got is not None:
            out.append(episode_summary(got[0], path, data_dir))
    return out


def find_episode(data_dir: Path, episode_id: str) -> Path | None:
    if not EPISODE_ID_RE.fullmatch(episode_id) or episode_id.startswith("."):
        return None
    root = data_dir / "episodes"
    return next(iter(sorted(root.glob(f"*/*/*/{episode_id}.md"))), None)


def episode_detail(cache: FrontMatterCache, data_dir: Path, episode_id: str) -> dict | None:
    """One episode: its front matter (tools, gates, rules, tokens, cost) and Markdown body."""
    path = find_episode(data_dir, episode_id)
    if path is None:
        return None
    got = cache.read(path, body=True)
    if got is None:
        return None
    meta, body = got
    return {
        **episode_summary(meta, path, data_dir),
        "request": str(meta.get("request") or ""),
        "error": meta.get("error"),
        "tool_calls": [t for t in meta.get("tools") or [] if isinstance(t, dict)],
        "gates": list(meta.get("gates") or []),
        "rules_applied": list(meta.get("rules_applied") or []),
        "rules_trial": list(meta.get("rules_trial") or []),
        "duration_s": _float(meta.get("duration_s")),
        "workflow": str(meta.get("workflow") or ""),
        "children": [_child(c) for c in meta.get("children") or [] if isinstance(c, dict)],
        "markdown": body,
    }


def _child(c: dict[str, Any]) -> dict[str, Any]:
    """A child of `delegate` as the episode detail shows it, whatever the file holds."""
    return {
        "id": str(c.get("id") or ""),
        "task": str(c.get("task") or ""),
        "outcome": str(c.get("outcome") or ""),
        "reply": str(c.get("reply") or ""),
        "tools": [t for t in c.get("tools") or [] if isinstance(t, dict)],
        "tokens_in": _int(c.get("tokens_in")),
        "tokens_out": _int(c.get("tokens_out")),
        "cost_usd": _float(c.get("cost_usd")),
        "children": [_child(g) for g in c.get("children") or [] if isinstance(g, dict)],
    }


# ---------------------------------------------------------------------- spend


def spend(
    cache: FrontMatterCache,
    data_dir: Path,
    *,
    days: int,
    now: datetime,
    usage: UsageLedger | None = None,
) -> dict[str, Any]:
    """Tokens and cost per day, per model, per channel, per person and per purpose.

    From the usage ledger (memory/usage.py: every model call, background ones
    included, as the server reported it) for each day it has a file; a day before the
    ledger existed falls back to its episodes' totals (tasks only). `tasks` is always
    the episodes'. `usage`: the app's ledger (its queued lines are written first and
    its time zone makes the days); None reads `<data dir>/usage/` by UTC days."""
    tz = usage.tz if usage is not None else zone("UTC")
    today = now.astimezone(tz).date()
    first = today - timedelta(days=max(1, days) - 1)
    since, until = day_start(first, tz), period_end(now.timestamp(), tz)
    folder = data_dir / "usage"
    rows = (
        list(usage.rows(since, until)) if usage is not None else read_rows(folder, since, until)[0]
    )
    by_day: dict[str, dict[str, float]] = {}
    by_model: dict[str, dict[str, float]] = defaultdict(_zero)
    by_channel: dict[str, dict[str, float]] = defaultdict(_zero)
    by_person: dict[str, dict[str, float]] = defaultdict(_zero)
    by_purpose: dict[str, dict[str, float]] = defaultdict(_zero)
    total = _zero()
    for back in range(days - 1, -1, -1):  # every day present, oldest first: a chart's x axis
        by_day[f"{today - timedelta(days=back):%Y-%m-%d}"] = _zero()
    ledger_days = {d for d in by_day if (folder / f"{d}.jsonl").exists()}
    ledger_days.update(f"{day_of(r.at, tz):%Y-%m-%d}" for r in rows)
    for row in rows:
        channel = row.conversation.partition(":")[0] if row.conversation else ""
        for bucket in (
            by_day.setdefault(f"{day_of(row.at, tz):%Y-%m-%d}", _zero()),
            by_model[row.model or "unknown"],
            by_channel[channel or "none"],
            by_person[row.person or "steward"],
            by_purpose[row.purpose or "other"],
            total,
        ):
            _count(bucket, row.tokens_in, row.tokens_out, row.cost_usd)
    for folder_ in episode_days(data_dir / "episodes", days, now):
        for day, model, channel, tokens_in, tokens_out, cost in cache.day_rows(folder_):
            counted = day in ledger_days  # its tokens are in the ledger's rows already
            for bucket in (
                by_day.setdefault(day, _zero()),
                by_model[model or "unknown"],
                by_channel[channel or "unknown"],
                total,
            ):
                if not counted:
                    _count(bucket, tokens_in, tokens_out, cost, calls=0)
                bucket["tasks"] += 1
    cache.save_days()
    return {
        "days": [{"day": d, **v} for d, v in sorted(by_day.items())],
        "models": _ranked(by_model, "model"),
        "channels": _ranked(by_channel, "channel"),
        "people": _ranked(by_person, "person"),
        "purposes": _ranked(by_purpose, "purpose"),
        "total": total,
        "source": "ledger" if rows or ledger_days else "episodes",
    }


def _count(
    bucket: dict[str, float], tokens_in: int, tokens_out: int, cost: float | None, calls: int = 1
) -> None:
    bucket["tokens_in"] += tokens_in
    bucket["tokens_out"] += tokens_out
    bucket["cost_usd"] += cost or 0.0
    bucket["calls"] += calls
    if cost is None and calls:
        bucket["unpriced"] += calls


def _zero() -> dict[str, float]:
    """A bucket: `calls` are model calls (the ledger's), `unpriced` those of them with no
    known price (their cost is not in `cost_usd`: shown as unknown), `tasks` episodes."""
    return {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "tasks": 0, "calls": 0, "unpriced": 0}


def _ranked(buckets: dict[str, dict[str, float]], key: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{key: k, **v} for k, v in buckets.items()]
    rows.sort(key=lambda r: -(r["tokens_in"] + r["tokens_out"]))
    return rows


# ---------------------------------------------------------------------- rules


def rule_json(rule: Any) -> dict[str, Any]:
    """A rule with its confidence over time, from the trial lines of its history."""
    series: list[list[Any]] = []
    for h in rule.history:
        m = CONFIDENCE_RE.search(str(h.get("detail", "")))
        if m is None:
            continue
        if not series:
            series.append([rule.created or h.get("at", ""), float(m.group(1))])
        series.append([h.get("at", ""), float(m.group(2))])
    series.append([rule.updated or rule.created or "", round(rule.confidence, 4)])
    return {
        "id": rule.id,
        "text": rule.text,
        "status": rule.status,
        "confidence": round(rule.confidence, 4),
        "pinned": rule.pinned,
        "source": rule.source,
        "trigger": rule.signature,
        "applies_when": rule.applies_when,
        "trials": rule.trials,
        "wins": rule.wins,
        "losses": rule.losses,
        "created": rule.created,
        "updated": rule.updated,
        "series": series,
        "history": rule.history[-10:],
    }


# ---------------------------------------------------------------------- proactive


def proactive(
    cache: FrontMatterCache, data_dir: Path, *, days: int, now: datetime
) -> dict[str, Any]:
    """Offers per day by answer (from suggestions/), and each person's adapted threshold."""
    first = (now - timedelta(days=days - 1)).date()
    per_day: dict[str, dict[str, int]] = {}
    for back in range(days - 1, -1, -1):
        per_day[f"{(now - timedelta(days=back)).date():%Y-%m-%d}"] = {
            "offered": 0,
            "accepted": 0,
            "refused": 0,
            "ignored": 0,
        }
    folder = data_dir / "suggestions"
    for path in sorted(folder.glob("*.md")) if folder.is_dir() else []:
        got = cache.read(path)
        if got is None:
            continue
        meta = got[0]
        at = _float(meta.get("offered_at"))
        if at is None:
            continue
        day = datetime.fromtimestamp(at, UTC).date()
        if day < first:
            continue
        row = per_day.setdefault(f"{day:%Y-%m-%d}", {"offered": 0})
        row["offered"] = row.get("offered", 0) + 1
        status = str(meta.get("status") or "")
        if status in ("accepted", "refused", "ignored"):
            row[status] = row.get(status, 0) + 1
    people = []
    folder = data_dir / "proactive"
    for path in sorted(folder.glob("*.md")) if folder.is_dir() else []:
        got = cache.read(path)
        if got is None:
            continue
        meta = got[0]
        people.append(
            {
                "user": str(meta.get("user") or path.stem),
                "threshold": _float(meta.get("threshold")),
                "cooldown": _float(meta.get("cooldown")),
                "off": bool(meta.get("off", False)),
                "quiet": str(meta.get("quiet") or ""),
                "stats": meta.get("stats") or {},
            }
        )
    return {"days": [{"day": d, **v} for d, v in sorted(per_day.items())], "people": people}


# ---------------------------------------------------------------------- artifacts


def artifacts(workspace: Path) -> list[dict[str, Any]]:
    """Files in the workspace, newest first (tooling folders and hidden files left out)."""
    found: list[tuple[float, str, int]] = []
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if not path.is_file() or path.is_symlink():
                continue
            found.append((st.st_mtime, path.relative_to(workspace).as_posix(), st.st_size))
        if len(found) > ARTIFACTS_LISTED * 10:
            break
    found.sort(reverse=True)
    return [
        {"path": rel, "modified": mtime, "size": size, "kind": artifact_kind(rel)}
        for mtime, rel, size in found[:ARTIFACTS_LISTED]
    ]


def artifact_kind(name: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix in (".md", ".markdown"):
        return "markdown"
    if suffix in (".html", ".htm"):
        return "html"
    if suffix in (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg"):
        return "image"
    return "text"


def read_artifact(workspace: Path, rel: str) -> tuple[Path, bytes] | int | None:
    """The workspace file `rel` names and its bytes: None when it is outside, hidden or
    not a regular file (a link is never followed, a FIFO never opened for reading, core/
    safe_fs.py); its size when it is larger than ARTIFACT_MAX_BYTES. Blocking: run it on
    the workspace threads (core/io_threads.py)."""
    if not rel or "\x00" in rel or safe_fs.suspicious_character(rel):
        return None
    try:
        clean = safe_fs.normalize(rel)
    except safe_fs.Escape:
        return None
    if not clean or any(part.startswith(".") for part in clean.split("/")):
        return None
    try:
        root = safe_fs.open_root(workspace)
    except OSError:
        return None
    try:
        read = safe_fs.read_regular(root, clean, ARTIFACT_MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(root)
    if not read.complete:
        return read.st.st_size
    return workspace / clean, read.data


def artifact_type(path: Path) -> str:
    kind = artifact_kind(path.name)
    if kind == "markdown":
        return "text/markdown"
    if kind == "html":
        return "text/html"
    if path.suffix.lower() == ".svg":
        return "image/svg+xml"
    guessed = mimetypes.guess_type(path.name)[0]
    if kind == "image" and guessed:
        return guessed
    return "text/plain"


# ---------------------------------------------------------------------- helpers


def memory(health: Any) -> dict[str, Any]:
    """The Now page's memory box: failed writes and the damaged files set aside in
    quarantine/ (each with its place, why and since when) and how to clear them, as
    /healthz reports them (memory/quarantine.py). Stats a folder: run in a thread."""
    from memory.quarantine import memory_health

    return memory_health(health)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()  # built from root: no resolve() per file
    except ValueError:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return path.name
