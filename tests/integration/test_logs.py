"""Structured logs: one JSON object per line, with the ids of what each line is about.

A real `kernel-gateway serve --log-format json` process, a workload that runs
code, prints, uploads and kills a kernel, then the whole log read back: every
line parses, the request id a client sent comes back in `X-Request-Id` and on
the lines about its request, and neither the code, its output, a file name nor
any token appears anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.processes import gateway

TOKEN = "TOKEN_d41d8cd98f00"
WRONG_TOKEN = "WRONG_TOKEN_9e107d9d"
CODE_MARKER = "CODE_MARKER_0cc175b9"
OUTPUT_MARKER = "OUTPUT_MARKER_92eb5ffe"
FILE_MARKER = "FILE_MARKER_4a8a08f0"


def test_json_logs_carry_ids_and_never_code_output_or_tokens(tmp_path: Path) -> None:
    args = ("--backend", "local", "--pool-size", "1", "--preload", "", "--log-format", "json")
    with gateway(tmp_path, *args, token=TOKEN) as gw, gw.client() as c:
        echoed = c.get("/health", headers={"X-Request-Id": "client-req-1"})
        assert echoed.headers["x-request-id"] == "client-req-1"
        replaced = c.get("/health", headers={"X-Request-Id": "not a sane id"})
        assert replaced.headers["x-request-id"] != "not a sane id"
        assert len(replaced.headers["x-request-id"]) == 32
        sid = c.post("/sessions", headers={"X-Request-Id": "create-req"}).json()["id"]
        code = f"{CODE_MARKER} = 1\nprint('{OUTPUT_MARKER}')"
        ran = c.post(
            f"/sessions/{sid}/execute", json={"code": code}, headers={"X-Request-Id": "exec-req"}
        )
        assert OUTPUT_MARKER in ran.text
        assert ran.headers["x-request-id"] == "exec-req"
        c.put(f"/sessions/{sid}/files/{FILE_MARKER}.txt", content=OUTPUT_MARKER.encode())
        died = c.post(
            f"/sessions/{sid}/execute",
            json={"code": "import os; os._exit(3)"},
            headers={"X-Request-Id": "death-req"},
        )
        assert '"reason":"exited"' in died.text
        junk = c.get("/sessions/not%20an%0Aid", headers={"X-Request-Id": "junk-req"})
        assert junk.status_code == 404
        bad = httpx.get(gw.url + "/sessions", headers={"Authorization": f"Bearer {WRONG_TOKEN}"})
        assert bad.status_code == 401 and bad.headers["x-request-id"]
        c.delete(f"/sessions/{sid}")
    text = gw.log.read_text()
    # every line is JSON
    records: list[dict[str, object]] = [json.loads(line) for line in text.splitlines()]

    def one(**match: object) -> dict[str, object]:
        found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
        assert len(found) == 1, (match, found)
        return found[0]

    one(request_id="client-req-1", logger="kernel_gateway.access", route="/health", status=200)
    one(
        request_id="create-req",
        logger="kernel_gateway.access",
        route="/sessions",
        status=201,
        session_id=sid,
    )
    one(
        request_id="exec-req",
        logger="kernel_gateway.access",
        route="/sessions/{session_id}/execute",
        method="POST",
        session_id=sid,
        execution_id="1",
    )
    death = one(request_id="death-req", logger="kernel_gateway.sessions.kernel_slot")
    assert (death["session_id"], death["execution_id"]) == (sid, "2")
    assert "exited" in str(death["message"])
    one(logger="kernel_gateway.access", route="/sessions", status=401)
    assert "session_id" not in one(request_id="junk-req")  # not an id: not logged as one
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    for secret in (TOKEN, WRONG_TOKEN, CODE_MARKER, OUTPUT_MARKER, FILE_MARKER):
        assert secret not in text


def test_text_logs_by_default_with_one_line_per_request(tmp_path: Path) -> None:
    args = ("--backend", "local", "--pool-size", "0")
    with gateway(tmp_path, *args) as gw, gw.client() as c:
        c.get("/sessions/nope")
    lines = gw.log.read_text().splitlines()
    assert not lines[0].startswith("{")
    assert any("kernel_gateway.access: GET /sessions/{session_id} 404" in line for line in lines)


def test_an_unknown_log_format_stops_serve(tmp_path: Path) -> None:
    env = {**os.environ, "KG_LOG_FORMAT": "xml"}
    cmd = [sys.executable, "-m", "kernel_gateway", "serve", "--runtime-dir", str(tmp_path)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "KG_LOG_FORMAT" in result.stderr and "text, json" in result.stderr
