"""The one SSE decoder (client, tests and bench): the WHATWG parsing rules."""

from __future__ import annotations

import pytest

from kernel_gateway.client.sse import ServerSentEvent, SSEDecoder, iter_events
from kernel_gateway.http.sse import encode
from kernel_gateway.types import Event


def decode(raw: bytes, chunk: int = 0) -> list[ServerSentEvent]:
    """Every event in `raw`, fed whole or `chunk` bytes at a time."""
    if not chunk:
        return list(iter_events([raw]))
    return list(iter_events(raw[i : i + chunk] for i in range(0, len(raw), chunk)))


@pytest.mark.parametrize("chunk", [0, 1, 2, 7])
def test_multi_line_data_comments_and_names(chunk: int) -> None:
    raw = b': ping\n\nevent: stdout\ndata: {"text":\ndata:  "x"}\n\n\n\ndata: 1\n\n'
    assert decode(raw, chunk) == [
        ServerSentEvent("stdout", '{"text":\n "x"}'),  # only one leading space is removed
        ServerSentEvent("message", "1"),
    ]


@pytest.mark.parametrize("chunk", [0, 1, 3])
def test_cr_lf_and_crlf_all_end_lines(chunk: int) -> None:
    raw = b"event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n"
    assert [(e.event, e.data) for e in decode(raw, chunk)] == [
        ("a", "1"),
        ("b", "2"),
        ("message", "3"),
    ]


def test_a_crlf_split_across_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\r") == []
    assert decoder.feed(b"\n\r") == []
    assert decoder.feed(b"\ndata: 2\r\n") == [ServerSentEvent("message", "1")]


def test_only_cr_and_lf_end_lines_not_unicode_separators() -> None:
    # json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 raw; httpx's
    # iter_lines() would split the data line there.
    text = "a\u2028b\u2029c\x85d\x0ce"
    raw = encode(Event("stdout", {"text": text}))
    (event,) = decode(raw, 1)
    assert event.json() == {"text": text}


def test_missing_trailing_blank_line_discards_the_unfinished_event() -> None:
    assert decode(b"data: 1\n\ndata: 2\n") == [ServerSentEvent("message", "1")]
    assert decode(b"data: 1\n\ndata: 2") == [ServerSentEvent("message", "1")]


def test_id_is_the_last_event_id_each_later_event_carries() -> None:
    raw = (
        b"id: 1\ndata: a\n\n"
        b"data: b\n\n"  # no id: keeps the last one
        b"id: 3\n\n"  # no data: nothing dispatched, but the id is taken
        b"data: c\n\n"
        b"id: bad\0id\ndata: d\n\n"  # an id with NUL is ignored
        b"id\ndata: e\n\n"  # a bare `id` resets it
    )
    events = decode(raw)
    assert [(e.data, e.id) for e in events] == [
        ("a", "1"),
        ("b", "1"),
        ("c", "3"),
        ("d", "3"),
        ("e", ""),
    ]


def test_fields_without_colon_unknown_fields_retry_and_bom() -> None:
    raw = "\ufeffdata\n\nfoo: bar\nretry: 3000\nretry: soon\ndata:x\n\n".encode()
    assert decode(raw) == [
        ServerSentEvent("message", ""),
        ServerSentEvent("message", "x", retry=3000),
    ]


def test_event_name_resets_after_each_event() -> None:
    assert [
        e.event for e in decode(b"event: a\n\ndata: 1\n\nevent: b\ndata: 2\n\ndata: 3\n\n")
    ] == [
        "message",
        "b",
        "message",
    ]


def test_utf8_split_inside_a_character_and_bad_bytes() -> None:
    raw = "data: héllo ✓\n\n".encode() + b"data: \xff\n\n"
    assert [e.data for e in decode(raw, 1)] == ["héllo ✓", "\ufffd"]


def test_lines_already_split_go_through_decode() -> None:
    decoder = SSEDecoder()
    lines = [": c", "event: stdout", "data: 1", ""]
    assert [e for line in lines if (e := decoder.decode(line)) is not None] == [
        ServerSentEvent("stdout", "1")
    ]


def test_a_long_line_in_many_chunks() -> None:
    payload = "x" * 1_000_000
    raw = f"data: {payload}\n\n".encode()
    (event,) = decode(raw, 4096)
    assert event.data == payload
