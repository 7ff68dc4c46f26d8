"""Structured logs: one JSON object per line, with the ids of what each line is about.

A real `kernel-gateway serve --log-format json` process, a workload that runs
code, prints, uploads and kills a kernel, then the whole log read back: every
line parses, the request id a client sent comes back in `X-Request-Id` and on
the lines about its request, and neither the code, its output, a file name nor
any token appears anywhere.
"""

from __future__ import annotations

import contextvars
import json
import logging

from kernel_gateway import logs


def test_a_record_is_one_json_line_with_the_bound_ids() -> None:
    def emit() -> str:
        logs.bind(request_id="r1", session_id="s1")
        logs.bind(execution_id="3", session_id=None)  # None leaves a field as it is
        record = logging.LogRecord(
            "kernel_gateway.x", logging.INFO, __file__, 1, "a\nb %s", ("c\u2028\x85\x1c",), None
        )
        record.fields = {"status": 200}
        return logs.JSONFormatter().format(record)

    line = contextvars.copy_context().run(emit)
    assert len(line.splitlines()) == 1 and line.isascii()  # no reader splits it
    document = json.loads(line)
    assert document["message"] == "a\nb c\u2028\x85\x1c"
    assert document["level"] == "info" and document["logger"] == "kernel_gateway.x"
    assert (document["request_id"], document["session_id"], document["execution_id"]) == (
        "r1",
        "s1",
        "3",
    )
    assert document["status"] == 200
    assert logs.current() == {}  # bound in the copied context only


def test_a_line_about_a_session_names_its_key_however_it_was_bound() -> None:
    owners = {"s1": "team-a", "s2": "admin"}
    stop = logs.name_keys(owners.get)

    def line(message: str) -> dict[str, object]:
        record = logging.LogRecord("kernel_gateway.x", logging.INFO, __file__, 1, message, (), None)
        document: dict[str, object] = json.loads(logs.JSONFormatter().format(record))
        return document

    def background() -> list[dict[str, object]]:
        lines = []
        for session_id in ("s1", "s2", "gone"):  # as the reaper walks the sessions
            with logs.bound(session_id=session_id):
                lines.append(line(f"about {session_id}"))
        lines.append(line("about none"))
        logs.bind(session_id="s1", key="renamed")  # a request's own key stands
        lines.append(line("a request's"))
        return lines

    try:
        found = contextvars.copy_context().run(background)
    finally:
        stop()
    assert [(d.get("session_id"), d.get("key")) for d in found] == [
        ("s1", "team-a"),
        ("s2", "admin"),
        ("gone", None),
        (None, None),
        ("s1", "renamed"),
    ]
    assert line_without_namers() is None


def line_without_namers() -> object:
    def emit() -> object:
        logs.bind(session_id="s1")
        record = logging.LogRecord("kernel_gateway.x", logging.INFO, __file__, 1, "m", (), None)
        return json.loads(logs.JSONFormatter().format(record)).get("key")

    return contextvars.copy_context().run(emit)
