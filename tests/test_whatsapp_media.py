"""WhatsApp attachments against the wire-level fake: each file uploaded to `/media`
(multipart), then shown by an `image` or `document` message after the text; files
WhatsApp can't take become a line in the text; outside the 24-hour window a media
message is held with its media id like any other message, and goes out as its text
line once the upload has expired."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from adapters.whatsapp import (
    MAX_DOCUMENT_BYTES,
    MAX_IMAGE_BYTES,
    MEDIA_KEEP,
    WINDOW_SECONDS,
    GraphError,
)
from adapters.whatsapp.render import fits, media_kind, render_media
from core.events import Attachment, Button
from tests import golden
from tests.fakes.whatsapp import graph_error
from tests.kit import until
from tests.test_whatsapp import ALICE, Rig, running

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf000000030101009e6b3a6d0000000049454e44ae426082"
)
CHART = Attachment("chart.png", PNG, "image/png", caption="Latency this week")
REPORT = Attachment("report.pdf", b"%PDF-1.4 " + b"x" * 5000, "application/pdf", "Nightly")


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with running(tmp_path) as r:
        yield r


def _types(rig: Rig) -> list[str]:
    return [m["type"] for m in rig.fake.to(ALICE)]


async def test_files_are_uploaded_and_sent_after_the_text(rig: Rig) -> None:
    await rig.says("hi")
    ref = await rig.channel.send(ALICE, "Here is the summary.", attachments=[CHART, REPORT])
    assert _types(rig) == ["text", "image", "document"]
    text, image, document = rig.fake.to(ALICE)
    assert ref.id == text["id"]  # the message an edit would quote
    assert text["text"]["body"] == "Here is the summary."
    by_id = rig.fake.media
    assert image["image"]["caption"] == "Latency this week"
    shown = by_id[image["image"]["id"]]
    assert (shown.name, shown.mime, shown.data) == ("chart.png", "image/png", PNG)
    assert document["document"]["filename"] == "report.pdf"
    assert document["document"]["caption"] == "Nightly"
    shown = by_id[document["document"]["id"]]
    assert (shown.name, shown.mime, shown.data) == ("report.pdf", "application/pdf", REPORT.data)
    assert [(f.kind, f.media.name, f.caption) for f in rig.fake.files] == [
        ("image", "chart.png", "Latency this week"),
        ("document", "report.pdf", "Nightly"),
    ]
    uploads = [p for m, p in rig.fake.requests if m == "POST" and p.endswith("/media")]
    assert len(uploads) == 2


async def test_only_files_no_empty_text(rig: Rig) -> None:
    await rig.says("hi")
    ref = await rig.channel.send(ALICE, "", attachments=[CHART])
    assert _types(rig) == ["image"]
    assert ref.id == rig.fake.to(ALICE)[0]["id"]


async def test_buttons_first_then_the_file(rig: Rig) -> None:
    await rig.says("hi")
    buttons = [Button("Yes, help", "suggest-yes:c0ffee"), Button("No thanks", "suggest-no:c0")]
    ref = await rig.channel.send(ALICE, "Go through it?", buttons=buttons, attachments=[REPORT])
    assert _types(rig) == ["interactive", "document"]
    assert ref.id == rig.fake.to(ALICE)[0]["id"]


def test_kinds_and_limits() -> None:
    assert media_kind(CHART) == "image"
    assert media_kind(Attachment("a.jpg", b"x", "image/JPEG")) == "image"
    assert media_kind(Attachment("a.gif", b"x", "image/gif")) == "document"
    assert media_kind(REPORT) == "document"
    assert fits(Attachment("a.png", bytes(MAX_IMAGE_BYTES), "image/png"))
    assert not fits(Attachment("a.png", bytes(MAX_IMAGE_BYTES + 1), "image/png"))
    assert fits(Attachment("a.pdf", bytes(MAX_IMAGE_BYTES + 1), "application/pdf"))
    assert not fits(Attachment("a.pdf", bytes(MAX_DOCUMENT_BYTES + 1), "application/pdf"))
    assert not fits(Attachment("empty.txt", b"", "text/plain"))
    long = render_media(ALICE, Attachment("a.png", PNG, "image/png", "c" * 2000), "9")
    assert len(long["image"]["caption"]) == 1024 and long["image"]["caption"].endswith("…")
    bare = render_media(ALICE, Attachment("a.txt", b"x", "text/plain"), "9")
    assert bare["document"] == {"id": "9", "filename": "a.txt"}


async def test_a_picture_over_the_limit_is_a_line_in_the_text(rig: Rig) -> None:
    await rig.says("hi")
    big = Attachment("big.png", PNG + bytes(MAX_IMAGE_BYTES), "image/png")
    with capture_logs() as logs:
        await rig.channel.send(ALICE, "The chart.", attachments=[big, CHART])
    assert _types(rig) == ["text", "image"]
    assert rig.fake.to(ALICE)[0]["text"]["body"] == (
        "The chart.\n\n[attachment not sent here: big.png, 5.0 MB]"
    )
    assert [m.name for m in rig.fake.media.values()] == ["chart.png"]
    assert any(e["event"] == "whatsapp.attachment_too_large" for e in logs)


async def test_a_type_graph_refuses_is_a_line_in_the_text(rig: Rig) -> None:
    await rig.says("hi")
    archive = Attachment("logs.zip", b"PK\x03\x04" + b"x" * 2000, "application/zip", "all logs")
    with capture_logs() as logs:
        await rig.channel.send(ALICE, "The logs.", attachments=[archive])
    assert _types(rig) == ["text"]
    assert rig.fake.to(ALICE)[0]["text"]["body"] == (
        "The logs.\n\n[attachment not sent here: logs.zip, 2 KB] all logs"
    )
    [refused] = [e for e in logs if e["event"] == "whatsapp.upload_refused"]
    assert "application/zip" in refused["error"]


async def test_a_transient_upload_failure_sends_nothing(rig: Rig) -> None:
    """Uploads come first: when one fails for a while, nothing has gone out, so the
    channel layer's retry of the whole send repeats no message."""
    await rig.says("hi")
    rig.fake.fail_next_upload(graph_error(2, "Service temporarily unavailable", status=503))
    with pytest.raises(GraphError) as caught:
        await rig.channel.send(ALICE, "Here.", attachments=[CHART])
    assert caught.value.transient
    assert rig.fake.to(ALICE) == []
    await rig.channel.send(ALICE, "Here.", attachments=[CHART])
    assert _types(rig) == ["text", "image"]


async def test_outside_the_window_a_file_waits_with_its_media_id(rig: Rig) -> None:
    await rig.says("start the report")
    rig.clock.t += WINDOW_SECONDS + 1
    rig.fake.close_window(ALICE)
    ref = await rig.channel.send(ALICE, "The report.", attachments=[REPORT])
    assert ref.id.startswith("held:") and rig.fake.to(ALICE) == []
    [media_id] = rig.fake.media  # uploading is not messaging: done at once
    state = (rig.data_dir / "whatsapp" / "state.json").read_text()
    held = json.loads(state)["held"]
    assert [h["payload"]["type"] for h in held] == ["text", "document"]
    assert held[1]["payload"]["document"]["id"] == media_id
    assert len(state) < 2000  # the id, not the file's bytes
    await rig.start()  # and across a restart
    await rig.says("morning")
    await until(lambda: len(rig.fake.to(ALICE)) == 2, what="the held text and file")
    assert _types(rig) == ["text", "document"]
    assert rig.fake.files[0].media.data == REPORT.data


async def test_a_held_file_past_its_upload_life_goes_as_its_text_line(rig: Rig) -> None:
    await rig.says("start the report")
    rig.clock.t += WINDOW_SECONDS + 1
    rig.fake.close_window(ALICE)
    await rig.channel.send(ALICE, "The report.", attachments=[REPORT])
    rig.clock.t += MEDIA_KEEP
    await rig.says("back after a month")
    await until(lambda: len(rig.fake.to(ALICE)) == 2, what="the held text and the line")
    assert [m["text"]["body"] for m in rig.fake.to(ALICE)] == [
        "The report.",
        "[attachment not sent here: report.pdf, 5 KB] Nightly",
    ]
    assert rig.channel.state.held == []


async def test_a_file_failed_by_131047_is_held_and_sent_later(rig: Rig) -> None:
    """Graph accepts the media message, then reports it failed (131047) by webhook."""
    await rig.says("hi")
    rig.fake.close_window(ALICE)  # the adapter doesn't know: Graph tells it
    await rig.channel.send(ALICE, "", attachments=[CHART])
    await until(lambda: rig.channel.state.held, what="the held picture")
    [held] = rig.channel.state.held
    assert held["reason"] == "error 131047" and held["payload"]["type"] == "image"
    assert held["instead"]["text"]["body"].startswith("[attachment not sent here: chart.png")
    await rig.says("back")
    await until(lambda: rig.fake.files, what="the picture")
    assert rig.fake.files[0].media.data == PNG


async def test_golden_media_messages(rig: Rig) -> None:
    await rig.says("hi")
    await rig.channel.send(ALICE, "", attachments=[CHART, REPORT])

    def anonymous(message: dict[str, Any]) -> dict[str, Any]:
        kind = message["type"]
        return {
            **{k: v for k, v in message.items() if k != "id"},
            kind: {**message[kind], "id": "<media id>"},
        }

    image, document = (anonymous(m) for m in rig.fake.to(ALICE))
    golden.check_outbound("whatsapp", "image", image)
    golden.check_outbound("whatsapp", "document", document)
