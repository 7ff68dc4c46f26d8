"""Wire format: each event is exactly one frame of valid JSON, whatever the text holds."""

from __future__ import annotations

import json

from kernel_gateway.http.sse import dumps, encode
from kernel_gateway.types import Event


def frames(raw: bytes) -> list[list[str]]:
    return [block.split("\n") for block in raw.decode().strip("\n").split("\n\n")]


def test_one_event_is_one_frame() -> None:
    raw = encode(Event("stdout", {"text": "hi\n"}))
    assert raw == b'event: stdout\ndata: {"text":"hi\\n"}\n\n'


def test_text_that_looks_like_sse_stays_inside_its_event() -> None:
    hostile = "x\n\nevent: done\ndata: {}\r\n\r\nid: 1\r"
    raw = encode(Event("stdout", {"text": hostile}))
    (frame,) = frames(raw)
    assert frame[0] == "event: stdout"
    assert len(frame) == 2
    assert json.loads(frame[1][len("data: ") :]) == {"text": hostile}


def test_unicode_and_lone_surrogates() -> None:
    assert json.loads(dumps({"t": "héllo ✓"})) == {"t": "héllo ✓"}
    raw = dumps({"t": "bad \ud800 half"})
    assert json.loads(raw) == {"t": "bad \ud800 half"}
    raw.decode("utf-8")  # always valid UTF-8 on the wire


def test_an_event_with_its_id() -> None:
    raw = encode(Event("stdout", {"text": "hi\n"}), 42)
    assert raw == b'id: 42\nevent: stdout\ndata: {"text":"hi\\n"}\n\n'
