"""An MCP tool's result as the model reads it: text, with files and images on the side.

Text blocks become the tool result (within `output_cap`, the cut announced). Images
and audio, and binary resources, become `ToolOutput` attachments, sent to the
person's chat with the task's progress; PNG and JPEG images are also shown to a model
that accepts images (core/model/images.py). A text resource is quoted with its URI; a
resource link is named. A result the server marks `isError` is a `ToolError`, so the
model reads it as a failure it may recover from.
"""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from typing import Any

from core.events import Attachment
from core.tools.base import ToolError, ToolOutput, cap_output

#: Images the model is shown (the others only reach the chat).
SHOWN_IMAGES = frozenset({"image/png", "image/jpeg"})
#: Largest file taken from one result; a larger one is named, not kept.
MAX_FILE = 20 * 1024 * 1024


def _file(data: str, mime: str, name: str, tool: str) -> Attachment | str:
    """An attachment from base64 `data`, or a line saying why there is none."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{name}: the server sent data that is not valid base64; dropped]"
    if len(raw) > MAX_FILE:
        return f"[{name}: {len(raw)} bytes, larger than {MAX_FILE} bytes; dropped]"
    return Attachment(name, raw, mime or "application/octet-stream", caption=f"from {tool}")


def _name(tool: str, n: int, mime: str, uri: str = "") -> str:
    base = uri.rstrip("/").rsplit("/", 1)[-1] if uri else ""
    if base and "." in base:
        return base[:100]
    extension = mimetypes.guess_extension(mime or "") or ".bin"
    return f"{tool}-{n}{extension}"


def tool_output(result: Any, *, tool: str, cap: int) -> str | ToolOutput:
    """`result` (mcp_types.CallToolResult) of the server's tool `tool`, for the model."""
    texts: list[str] = []
    files: list[Attachment] = []
    for n, block in enumerate(getattr(result, "content", None) or [], start=1):
        kind = getattr(block, "type", "")
        if kind == "text":
            texts.append(str(block.text))
        elif kind in ("image", "audio"):
            mime = str(getattr(block, "mime_type", "") or "")
            got = _file(str(block.data), mime, _name(tool, n, mime), tool)
            if isinstance(got, str):
                texts.append(got)
                continue
            files.append(got)
            shown = " and shown to you" if mime in SHOWN_IMAGES and kind == "image" else ""
            texts.append(
                f"[{kind} {got.name} ({mime}, {len(got.data)} bytes): sent to the chat{shown}]"
            )
        elif kind == "resource":
            res = block.resource
            uri = str(getattr(res, "uri", ""))
            mime = str(getattr(res, "mime_type", "") or "")
            if getattr(res, "text", None) is not None:
                texts.append(f"[resource {uri}]\n{res.text}")
                continue
            got = _file(str(getattr(res, "blob", "")), mime, _name(tool, n, mime, uri), tool)
            if isinstance(got, str):
                texts.append(got)
                continue
            files.append(got)
            texts.append(f"[resource {uri} ({got.mime}, {len(got.data)} bytes): sent to the chat]")
        elif kind == "resource_link":
            label = getattr(block, "name", "") or ""
            texts.append(f"[resource link: {block.uri}{f' ({label})' if label else ''}]")
        else:
            texts.append(f"[{kind or 'unknown'} content: not shown]")
    structured = getattr(result, "structured_content", None)
    if not texts and structured is not None:
        texts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(texts) or "(the tool returned nothing)"
    if getattr(result, "is_error", False):
        raise ToolError(f"the MCP tool reported an error: {cap_output(text, cap)}")
    text = cap_output(text, cap)
    if not files:
        return text
    images = tuple(f for f in files if f.mime in SHOWN_IMAGES)
    return ToolOutput(text, attachments=tuple(files), images=images)
