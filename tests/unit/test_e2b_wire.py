"""E2B's wire formats without a server: Connect envelopes and errors, the NDJSON lines."""

from __future__ import annotations

import json

import pytest

from kernel_gateway.protocols.e2b import connect, ndjson


def test_envelopes_round_trip_whatever_the_chunking() -> None:
    body = connect.envelope({"start": {"process": {"pid": 7}}}) + connect.envelope(
        {"data": {"input": {"stdin": "aGkK"}}}
    )
    for size in (1, 3, len(body)):
        reader = connect.EnvelopeReader()
        messages = []
        for i in range(0, len(body), size):
            messages += list(reader.feed(body[i : i + size]))
        reader.finish()
        assert messages == [
            {"start": {"process": {"pid": 7}}},
            {"data": {"input": {"stdin": "aGkK"}}},
        ]


def test_a_stream_ends_with_an_end_envelope_carrying_its_error() -> None:
    ok = connect.end_stream()
    assert ok[0] == connect.END_STREAM and json.loads(ok[5:]) == {}
    failed = connect.end_stream(connect.ConnectError("not_found", "no process 9"))
    assert json.loads(failed[5:]) == {"error": {"code": "not_found", "message": "no process 9"}}
    assert connect.ConnectError("not_found", "x").status == 404


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (connect.connect_header(0, 5) + b"[1, 2", "invalid_argument"),
        (connect.connect_header(0, 3) + b"[1]", "invalid_argument"),
        (connect.connect_header(connect.COMPRESSED, 2) + b"{}", "unimplemented"),
        (connect.connect_header(0, connect.MAX_MESSAGE_BYTES + 1), "resource_exhausted"),
    ],
)
def test_bad_envelopes_are_connect_errors(body: bytes, code: str) -> None:
    reader = connect.EnvelopeReader()
    with pytest.raises(connect.ConnectError) as caught:
        list(reader.feed(body))
        reader.finish()
    assert caught.value.code == code


def test_a_truncated_body_is_an_error() -> None:
    reader = connect.EnvelopeReader()
    assert list(reader.feed(connect.envelope({"a": 1})[:-2])) == []
    with pytest.raises(connect.ConnectError, match="ends inside a message"):
        reader.finish()


def test_events_become_e2b_lines() -> None:
    def lines(name: str, data: dict[str, object]) -> list[dict[str, object]]:
        out = ndjson.lines_of(name, data)
        assert all(raw.endswith(b"\n") and raw.count(b"\n") == 1 for raw in out)
        return [json.loads(raw) for raw in out]

    [stdout] = lines("stdout", {"text": "hi\n"})
    assert stdout["type"] == "stdout" and stdout["text"] == "hi\n" and stdout["timestamp"]
    [result] = lines(
        "result",
        {"data": {"text/plain": "'abc'", "image/png": "iVBO", "application/x-custom": 1}},
    )
    assert result == {
        "type": "result",
        "is_main_result": True,
        "text": "abc",
        "png": "iVBO",
        "extra": {"application/x-custom": 1},
    }
    [display] = lines("display", {"data": {"text/html": "<b>x</b>"}})
    assert display["is_main_result"] is False and display["html"] == "<b>x</b>"
    [error] = lines("error", {"ename": "ValueError", "evalue": "boom", "traceback": ["a", "b"]})
    assert error == {"type": "error", "name": "ValueError", "value": "boom", "traceback": "a\nb"}
    assert lines("done", {"status": "ok", "execution_count": 3}) == [
        {"type": "number_of_executions", "execution_count": 3},
        {"type": "end_of_execution"},
    ]
    assert lines("file", {"path": "a.png"}) == [] and lines("clear", {"wait": False}) == []
