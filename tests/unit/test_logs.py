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
