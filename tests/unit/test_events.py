"""Jupyter message -> event translation and output caps: pure, no kernel."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_gateway.kernels.events import (
    MalformedMessage,
    OutputLimiter,
    error_event,
    input_count,
    is_idle,
    parse_reply,
    translate,
)
from kernel_gateway.types import Event


def msg(msg_type: str, content: dict[str, Any], parent: str = "p1") -> dict[str, Any]:
    return {
        "header": {"msg_type": msg_type, "msg_id": "m"},
        "parent_header": {"msg_id": parent},
        "metadata": {},
        "content": content,
    }


def test_stream_stdout_and_stderr() -> None:
    assert translate(msg("stream", {"name": "stdout", "text": "hi\n"})) == Event(
        "stdout", {"text": "hi\n"}
    )
    assert translate(msg("stream", {"name": "stderr", "text": "no"})) == Event(
        "stderr", {"text": "no"}
    )


def test_display_data_with_display_id() -> None:
    event = translate(
        msg(
            "display_data",
            {
                "data": {"image/png": "iVBOR", "text/plain": "<Figure>"},
                "metadata": {"image/png": {"width": 10}},
                "transient": {"display_id": "abc"},
            },
        )
    )
    assert event == Event(
        "display",
        {
            "data": {"image/png": "iVBOR", "text/plain": "<Figure>"},
            "metadata": {"image/png": {"width": 10}},
            "display_id": "abc",
            "update": False,
        },
    )


def test_update_display_data() -> None:
    event = translate(
        msg(
            "update_display_data",
            {"data": {"text/plain": "2"}, "metadata": {}, "transient": {"display_id": "abc"}},
        )
    )
    assert event is not None
    assert event.data["update"] is True
    assert event.data["display_id"] == "abc"


def test_display_without_transient() -> None:
    event = translate(msg("display_data", {"data": {"text/plain": "x"}, "metadata": {}}))
    assert event is not None and event.data["display_id"] is None


def test_execute_result() -> None:
    event = translate(
        msg("execute_result", {"data": {"text/plain": "2"}, "metadata": {}, "execution_count": 3})
    )
    assert event == Event(
        "result", {"data": {"text/plain": "2"}, "metadata": {}, "execution_count": 3}
    )


def test_error() -> None:
    event = translate(
        msg("error", {"ename": "ValueError", "evalue": "bad", "traceback": ["line1", "line2"]})
    )
    assert event == Event(
        "error", {"ename": "ValueError", "evalue": "bad", "traceback": ["line1", "line2"]}
    )


def test_clear_output() -> None:
    assert translate(msg("clear_output", {"wait": True})) == Event("clear", {"wait": True})
    assert translate(msg("clear_output", {})) == Event("clear", {"wait": False})


def test_internal_messages_are_not_forwarded() -> None:
    for msg_type in ("status", "execute_input", "comm_open", "comm_msg", "shutdown_reply"):
        assert translate(msg(msg_type, {})) is None


def test_display_is_not_a_substring_match() -> None:
    # "display" is a substring of "display_data"; only exact types may match.
    assert translate(msg("display", {"data": {}})) is None
    assert translate(msg("data", {"data": {}})) is None


def test_is_idle() -> None:
    assert is_idle(msg("status", {"execution_state": "idle"}))
    assert not is_idle(msg("status", {"execution_state": "busy"}))
    assert not is_idle(msg("stream", {"execution_state": "idle"}))


@pytest.mark.parametrize(
    ("msg_type", "content"),
    [
        ("stream", ["a", "list"]),
        ("stream", {"name": "stdout", "text": ["a", "list"]}),
        ("display_data", {"data": "not a dict"}),
        ("display_data", {"data": {}, "transient": {"display_id": 5}}),
        ("execute_result", {"data": {}, "execution_count": "3"}),
        ("error", {"ename": "E", "traceback": "not a list"}),
    ],
)
def test_a_message_of_the_wrong_shape_is_malformed(msg_type: str, content: Any) -> None:
    with pytest.raises(MalformedMessage):
        translate(msg(msg_type, content))


def test_input_count_and_reply() -> None:
    assert input_count(msg("execute_input", {"code": "", "execution_count": 7})) == 7
    assert input_count(msg("stream", {"text": ""})) is None
    reply = parse_reply(
        msg(
            "execute_reply",
            {"status": "ok", "execution_count": 3, "payload": [{"source": "ask_exit"}]},
        )
    )
    assert (reply.status, reply.execution_count, reply.exit_requested) == ("ok", 3, True)
    with pytest.raises(MalformedMessage):
        parse_reply(msg("execute_reply", {"status": "ok", "payload": {}}))


def test_error_events() -> None:
    assert error_event("KernelDied", "gone") == Event(
        "error", {"ename": "KernelDied", "evalue": "gone", "traceback": []}
    )


def test_limiter_passes_small_output() -> None:
    limiter = OutputLimiter(max_output_bytes=10, max_display_bytes=100)
    event = Event("stdout", {"text": "12345"})
    assert limiter.limit(event) is event
    assert not limiter.truncated


def test_limiter_cuts_at_the_cap_with_a_marker_once() -> None:
    limiter = OutputLimiter(max_output_bytes=10, max_display_bytes=100)
    assert limiter.limit(Event("stdout", {"text": "123456"})) is not None
    cut = limiter.limit(Event("stderr", {"text": "abcdefgh"}))
    assert cut is not None
    assert cut.name == "stderr"
    assert cut.data["text"].startswith("abcd")
    assert "[output truncated" in cut.data["text"]
    assert limiter.truncated
    assert limiter.limit(Event("stdout", {"text": "more"})) is None


def test_limiter_counts_utf8_bytes_and_never_splits_a_character() -> None:
    limiter = OutputLimiter(max_output_bytes=5, max_display_bytes=100)
    cut = limiter.limit(Event("stdout", {"text": "ééé"}))  # 6 bytes
    assert cut is not None
    assert cut.data["text"].startswith("éé\n[output truncated")


def test_limiter_replaces_oversized_display() -> None:
    limiter = OutputLimiter(max_output_bytes=10, max_display_bytes=100)
    big = Event(
        "display",
        {
            "data": {"image/png": "A" * 200},
            "metadata": {"x": 1},
            "display_id": None,
            "update": False,
        },
    )
    replaced = limiter.limit(big)
    assert replaced is not None
    assert list(replaced.data["data"]) == ["text/plain"]
    assert "over the 100-byte limit" in replaced.data["data"]["text/plain"]
    assert replaced.data["update"] is False


def test_limiter_leaves_other_events_alone() -> None:
    limiter = OutputLimiter(max_output_bytes=1, max_display_bytes=1)
    for event in (Event("clear", {"wait": False}), error_event("E", "v")):
        assert limiter.limit(event) is event


def test_limiter_caps_total_rich_output() -> None:
    limiter = OutputLimiter(max_output_bytes=100, max_display_bytes=1000, max_rich_bytes=2500)
    display = Event(
        "display",
        {"data": {"text/plain": "x" * 900}, "metadata": {}, "display_id": None, "update": False},
    )
    assert limiter.limit(display) is display
    assert limiter.limit(display) is display
    marker = limiter.limit(display)
    assert marker is not None and marker.name == "stderr"
    assert "[output truncated" in marker.data["text"]
    assert limiter.truncated
    assert limiter.limit(display) is None
    assert limiter.limit(Event("stdout", {"text": "late"})) is None


def test_limiter_caps_the_number_of_events() -> None:
    limiter = OutputLimiter(max_output_bytes=10**6, max_display_bytes=10**6, max_events=3)
    clear = Event("clear", {"wait": False})
    assert [limiter.limit(clear) for _ in range(3)] == [clear] * 3
    marker = limiter.limit(clear)
    assert marker is not None and "more than 3 output events" in marker.data["text"]
    assert limiter.limit(clear) is None
