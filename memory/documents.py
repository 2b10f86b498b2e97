"""What the memory index reads from the Markdown files: one `Doc` per file.

The files are the truth (docs/memory.md); this module only reads them. A file
that cannot be read is reported as a `DocError` naming its path, never fixed or
rewritten here: a person may be halfway through editing it.

Where a document's scope comes from: the front matter's `scope` when present (the
agent writes `person:<channel>:<user>` for direct messages and
`conversation:<channel>:<conversation>` for groups). An episode without one gets its
conversation's scope, which fails closed: it is recalled only in the conversation it
came from, never into another. Rules and notes without one are workspace-wide.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path, PurePath
from typing import Any

from memory.store import MalformedFile
from memory.store import parse as parse_file

KINDS = ("episode", "rule", "note")
#: Folder of each kind under the data dir, and whether it is searched recursively.
FOLDERS = {"episode": ("episodes", True), "rule": ("rules", False), "note": ("notes", True)}
WORKSPACE_SCOPE = "workspace"

_HEADING = re.compile(r"^#{1,6}\s+(.+)$", re.MULTILINE)


class DocError(ValueError):
    """A file that could not be indexed; str() starts with its path."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(slots=True)
class Doc:
    kind: str
    doc_id: str
    #: Path relative to the data dir, with forward slashes: the document's key.
    path: str
    mtime_ns: int
    size: int
    title: str = ""
    error: str = ""
    body: str = ""
    embed_text: str = ""
    channel: str = ""
    conversation: str = ""
    user: str = ""
    scope: str = WORKSPACE_SCOPE
    outcome: str = ""
    status: str = ""
    started: str = ""
    ts: float = 0.0
    signatures: list[str] = field(default_factory=list)

    @property
    def text_hash(self) -> str:
        """Changes only when the embedded text does: re-embed then, not on every edit."""
        return hashlib.blake2b(self.embed_text.encode("utf-8"), digest_size=12).hexdigest()


def kind_of(data_dir: Path, path: Path) -> str | None:
    """Which kind of document a path under the data dir holds, if any."""
    try:
        rel = path.resolve().relative_to(data_dir.resolve())
    except ValueError:
        return None
    return kind_of_relative(rel, path.suffix)


def kind_of_relative(rel: PurePath, suffix: str) -> str | None:
    """`kind_of` for a path already resolved and made relative to the resolved data dir
    (`suffix`: the unresolved path's): a caller that also needs the relative path
    resolves once (each resolve is a lstat per path component, ~50 us)."""
    if suffix != ".md" or not rel.parts or rel.name.startswith("."):
        return None
    for kind, (folder, recursive) in FOLDERS.items():
        if rel.parts[0] == folder and (recursive or len(rel.parts) == 2):
            return kind
    return None


def walk(data_dir: Path) -> Iterator[tuple[str, str, int, int]]:
    """(kind, relative path, mtime_ns, size) of every indexable file, in sorted order.

    os.scandir rather than Path.rglob: at 100k episodes the stat calls are the cost of
    every start-up freshness check, and scandir avoids building a Path per file.
    """
    for kind, (folder, recursive) in FOLDERS.items():
        root = data_dir / folder
        if not root.is_dir():
            continue
        stack = [(root, folder)]
        found: list[tuple[str, str, int, int]] = []
        while stack:
            here, rel = stack.pop()
            try:
                entries = list(os.scandir(here))
            except OSError:
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if recursive:
                        stack.append((Path(entry.path), f"{rel}/{entry.name}"))
                elif entry.name.endswith(".md"):
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    found.append((kind, f"{rel}/{entry.name}", st.st_mtime_ns, st.st_size))
        found.sort(key=lambda item: item[1])
        yield from found


def parse(data_dir: Path, rel: str, kind: str, mtime_ns: int = 0, size: int = 0) -> Doc:
    """Read one file into a Doc; raises DocError (with the path) when it can't."""
    path = data_dir / rel
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise DocError(path, f"cannot read: {exc.strerror or exc}") from exc
    if not mtime_ns:
        st = path.stat()
        mtime_ns, size = st.st_mtime_ns, st.st_size
    return from_text(data_dir, rel, kind, text, mtime_ns, size)


def from_text(
    data_dir: Path,
    rel: str,
    kind: str,
    text: str,
    mtime_ns: int,
    size: int,
    parts: tuple[dict[str, Any], str] | None = None,
) -> Doc:
    """The Doc of a file whose text is already in memory (the episode writer has just
    written it: reading it back cost a read and a YAML parse per message).
    `parts` is (front matter, body) as `memory.store.parse(text)` returns them, when the
    caller knows them without parsing (`memory.store.rendered_parts`); else `text` is
    parsed. Raises DocError like `parse`."""
    path = data_dir / rel
    if parts is not None:
        meta, body = parts
    else:
        try:
            meta, body = parse_file(text, path, require_front_matter=False)
        except MalformedFile as exc:
            raise DocError(path, f"malformed front matter: {exc.reason}") from exc
    doc = Doc(kind=kind, doc_id=path.stem, path=rel, mtime_ns=mtime_ns, size=size, body=body)
    doc.ts = mtime_ns / 1e9
    try:
        if kind == "episode":
            if not meta:
                raise DocError(path, "an episode needs YAML front matter (id, request, outcome)")
            _episode(doc, meta)
        elif kind == "rule":
            _rule(doc, meta or {})
        else:
            _note(doc, meta or {})
    except (TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, DocError):
            raise
        raise DocError(path, f"unexpected front matter value: {_short(exc)}") from exc
    return doc


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "\n".join(_text(v) for v in value)
    return str(value)


def _timestamp(value: Any) -> tuple[str, float] | None:
    """(ISO text, epoch seconds) of a front matter date; naive times are taken as UTC."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    elif isinstance(value, str) and value.strip():
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat(), moment.timestamp()


def _episode(doc: Doc, meta: dict[str, Any]) -> None:
    doc.doc_id = _text(meta.get("id")) or doc.doc_id
    doc.channel = _text(meta.get("channel"))
    doc.conversation = _text(meta.get("conversation"))
    doc.user = _text(meta.get("user"))
    doc.outcome = _text(meta.get("outcome"))
    doc.title = _text(meta.get("request")).strip()
    sigs = meta.get("error_signatures") or []
    doc.signatures = sorted({_text(s) for s in sigs if _text(s)}) if isinstance(sigs, list) else []
    doc.error = "\n".join(x for x in [_text(meta.get("error")).strip(), *doc.signatures] if x)
    stamp = _timestamp(meta.get("started"))
    if stamp:
        doc.started, doc.ts = stamp
    scope = _text(meta.get("scope")).strip()
    doc.scope = scope or f"conversation:{doc.channel}:{doc.conversation}"
    doc.embed_text = f"{doc.title}\n{doc.error[:400]}".strip()


def _rule(doc: Doc, meta: dict[str, Any]) -> None:
    doc.doc_id = _text(meta.get("id")) or doc.doc_id
    doc.status = _text(meta.get("status")) or "candidate"
    text = doc.body.strip()
    raw = meta.get("trigger")
    if isinstance(raw, dict):  # the learner's form: signature, applies_when, examples
        trigger = _text(raw.get("applies_when")).strip()
    else:
        trigger = _text(raw).strip()
    doc.title = trigger or (text.splitlines()[0] if text else "")
    sigs = meta.get("signatures") or meta.get("error_signatures") or []
    if isinstance(sigs, str):
        sigs = [sigs]
    doc.signatures = sorted({_text(s) for s in sigs if _text(s)}) if isinstance(sigs, list) else []
    doc.error = "\n".join(doc.signatures)
    doc.scope = _text(meta.get("scope")).strip() or WORKSPACE_SCOPE
    for key in ("updated", "created", "date"):
        stamp = _timestamp(meta.get(key))
        if stamp:
            doc.started, doc.ts = stamp
            break
    doc.embed_text = f"{trigger}\n{text[:1000]}".strip()


def _note(doc: Doc, meta: dict[str, Any]) -> None:
    doc.doc_id = _text(meta.get("id")) or doc.path.removeprefix("notes/").removesuffix(".md")
    heading = _HEADING.search(doc.body)
    doc.title = (
        _text(meta.get("title")).strip()
        or (heading.group(1).strip() if heading else "")
        or Path(doc.path).stem
    )
    doc.channel = _text(meta.get("channel"))
    doc.conversation = _text(meta.get("conversation"))
    doc.user = _text(meta.get("user"))
    doc.scope = _text(meta.get("scope")).strip() or WORKSPACE_SCOPE
    for key in ("updated", "created", "date", "started"):
        stamp = _timestamp(meta.get(key))
        if stamp:
            doc.started, doc.ts = stamp
            break
    doc.embed_text = f"{doc.title}\n{doc.body.strip()[:2000]}".strip()


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
