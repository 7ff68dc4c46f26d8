"""Schemathesis against a live gateway, on the local and the docker backend.

The real tool, run as its users run it (`st run` on `/openapi.json`, every check:
no 5xx; status, content type, headers and body as documented; invalid input
refused, valid input accepted; 405 with a true `Allow`; no answer slower than
30 s), through the coverage, fuzzing and stateful phases. Settings are in
`tests/integration/schemathesis.toml`.

Bounded by default (4 examples per operation, a fixed seed): about 20 s on the
local backend and 75 s on docker. For release checks, the long mode:

    KG_FUZZ_EXAMPLES=200 .venv/bin/pytest tests/integration/test_fuzz.py  # any seed: KG_FUZZ_SEED=7

Around the run, the gateway is watched from outside: its open descriptors are
back near where they were after a warm-up, every kernel it started is gone once
the sessions are, and nothing is left after it stops. Its resident memory is
checked for leaks by a second, shorter pass over every operation (the coverage
phase): a leak grows with each pass, while the first pass's growth (3 to 25 MiB
measured, with the machine's load) is mostly the allocator finding its working
size, which a check against the warm-up read as a leak. Under load the second pass
can still grow (threads waiting on a slow Docker get malloc arenas of their own), so
a pass past the slack gets another, up to three: a leak grows in each.
The local gateway runs without a token and the docker one with a token, so both
auth modes are fuzzed. Both log in JSON, and every line must parse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernel_gateway.http.middleware import template
from kernel_gateway.server.app import create_app
from tests.support.backends import require_backend, settings_for
from tests.support.ports import free_port
from tests.support.processes import Gateway, gateway

from .test_cli import containers_of

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = int(os.environ.get("KG_FUZZ_EXAMPLES", "0"))  # 0: the bounded mode
SEED = os.environ.get("KG_FUZZ_SEED")
LONG = EXAMPLES > 0
POOL = 2
TOKEN = "fuzz-token"
# Growth allowed over a pass after the first (measured from -15 to +7 MiB on a quiet
# machine, 0.2 MiB pass after pass over six; once 16.3 in a loaded CI run, which a third
# pass would have told apart from a leak), and descriptors after the run.
RSS_SLACK = 16 * 1024**2
LEAK_PASSES = 3
FD_SLACK = 4


def _secrets_key(tmp_path: Path) -> Path:
    key = tmp_path / "secrets.key"
    key.write_bytes(os.urandom(32))
    return key


def fuzzed_gateway(tmp_path: Path, backend: str) -> Any:
    """A gateway sized for fuzzing: cells stop within 5 s, few sessions, cheap kernels."""
    return gateway(
        tmp_path,
        "--backend",
        backend,
        "--pool-size",
        str(POOL),
        "--preload",
        "",
        "--max-sessions",
        "6",
        "--max-stateless",
        "2",
        "--max-volumes",
        "3",
        "--idle-timeout",
        "120",
        "--log-format",
        "json",
        # The chat and the secrets on: a model that is not there (each turn ends
        # `model_error` at once), and a key for the secrets.
        "--llm-url",
        f"http://127.0.0.1:{free_port()}/v1",
        "--llm-model",
        "nobody",
        "--secrets-key-file",
        str(_secrets_key(tmp_path)),
        token=TOKEN if backend == "docker" else None,
        env={"KG_MAX_EXEC_TIMEOUT": "5", "KG_EXEC_TIMEOUT": "5"},
    )


def settled_descendants(gw: Gateway, seconds: float = 10) -> int:
    """How many processes run below the gateway, once the count has held for a second: a
    stateless cell's kernel is closed in the background after its slot is given back, so
    one may still be exiting when the pool looks settled."""
    deadline = time.monotonic() + seconds
    count, since = len(gw.descendants()), time.monotonic()
    while time.monotonic() - since < 1.0 and time.monotonic() < deadline:
        time.sleep(0.1)
        now = len(gw.descendants())
        if now != count:
            count, since = now, time.monotonic()
    return count


def wait_for_fork_servers(gw: Gateway, seconds: float = 180) -> None:
    """Until the fork servers have started: on a busy machine (the suite's other worker)
    their first start can take longer than a request's wait for one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        forks = httpx.get(gw.url + "/health", headers=gw.headers).json().get("fork_servers")
        if forks is None or forks["idle"] + forks["busy"] >= forks["target"]:
            return
        time.sleep(0.2)
    raise AssertionError(f"the fork servers did not start within {seconds:g} s")


def warm_up(gw: Gateway) -> None:
    """One of everything, several at once, so lazy imports, thread pools and the Docker
    client's connection pool have grown to their working size before measuring."""

    def session_round(_: int) -> None:
        with gw.client() as c:
            sid = c.post("/sessions").json()["id"]
            for accept in ("text/event-stream", "application/json"):
                body = {"code": "print(1)"}
                r = c.post(f"/sessions/{sid}/execute", json=body, headers={"Accept": accept})
                assert r.status_code == 200, r.text
            assert c.put(f"/sessions/{sid}/files/a/b.txt", content=b"x").status_code == 201
            assert c.get(f"/sessions/{sid}/files/a/b.txt").content == b"x"
            assert c.get(f"/sessions/{sid}/executions/1/events").status_code == 200
            assert c.post(f"/sessions/{sid}/restart").status_code == 200
            for path in ("/metrics", "/openapi.json", "/sessions", "/nowhere"):
                c.get(path)
            assert c.delete(f"/sessions/{sid}").status_code == 204

    def stateless(_: int) -> None:
        with gw.client() as c:
            r = c.post("/execute", json={"code": "1"}, headers={"Accept": "application/json"})
            assert r.status_code in (200, 429), r.text

    with ThreadPoolExecutor(6) as pool:
        for _ in range(2):
            list(pool.map(session_round, range(4)))
            list(pool.map(stateless, range(4)))


def alive(pid: int) -> bool:
    """Whether a process is still running (a zombie waiting to be reaped is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def delete_sessions(gw: Gateway) -> None:
    """Every session, then every template the fuzzer made (its warm kernel holds sockets),
    each once its build has ended."""
    with gw.client() as c:
        for session in c.get("/sessions").json()["sessions"]:
            c.delete(f"/sessions/{session['id']}")
        listed = c.get("/templates")
        for template in listed.json()["templates"] if listed.status_code == 200 else []:
            deadline = time.monotonic() + 120
            while c.get(f"/templates/{template['id']}").json().get("state") == "building":
                assert time.monotonic() < deadline, template
                time.sleep(0.5)
            c.delete(f"/templates/{template['id']}")


def settle(gw: Gateway) -> None:
    """Every session and template gone, the pool refilled, sockets and buffers freed."""
    delete_sessions(gw)
    gw.wait_settled(POOL)
    time.sleep(1)


def run_schemathesis(
    gw: Gateway, report_dir: Path, *options: str
) -> tuple[subprocess.CompletedProcess[str], Any]:
    cmd = [
        str(Path(sys.executable).with_name("st")),
        "--config-file",
        str(CONFIG),
        "run",
        gw.url + "/openapi.json",
        "--checks",
        "all",
        "--no-color",
        "--report",
        "json",
        "--report-dir",
        str(report_dir),
    ]
    for name, value in gw.headers.items():
        cmd += ["-H", f"{name}: {value}"]
    if LONG and not options:
        cmd += ["--max-examples", str(EXAMPLES)]
    cmd += options
    if SEED:
        cmd += ["--seed", SEED]
    started = time.monotonic()
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=None if LONG else 400, cwd=report_dir
    )
    (report,) = report_dir.glob("*.json")
    summary = json.loads(report.read_text())
    summary["seconds"] = time.monotonic() - started
    return result, summary


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_schemathesis_finds_nothing(tmp_path: Path, backend: str) -> None:
    require_backend(backend)
    with fuzzed_gateway(tmp_path, backend) as gw:
        instance = httpx.get(gw.url + "/health").json()["instance"]
        wait_for_fork_servers(gw)
        warm_up(gw)
        gw.wait_settled(POOL)
        fds, kernels = gw.open_fds(), settled_descendants(gw)

        report_dir = tmp_path / "report"
        report_dir.mkdir()
        result, summary = run_schemathesis(gw, report_dir)
        figures = (
            f"{backend}: {summary['test_cases']['generated']} test cases in "
            f"{summary['seconds']:.0f} s, seed {summary['seed']}"
        )
        print(figures)
        assert result.returncode == 0, f"{figures}\n{result.stdout[-20000:]}\n{result.stderr}"
        assert summary["test_cases"]["generated"] >= 150
        assert summary["failures"] == [] and summary["errors"] == []

        # Every answer was counted under a route template, and none was a 5xx.
        with gw.client() as c:
            exposition = c.get("/metrics").text
        requests = {
            tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(exposition)
            if family.name == "kernel_gateway_http_requests"
            for s in family.samples
            if s.name.endswith("_total")
        }
        assert sum(requests.values()) >= summary["test_cases"]["generated"]
        app = create_app(settings_for(backend, tmp_path))
        templates = {template(r) for r in app.routes} | {"unmatched"}
        for labels in requests:
            label = dict(labels)
            assert label["route"] in templates, label
            assert not label["status"].startswith("5"), label

        settle(gw)
        rss = gw.rss_bytes()
        assert gw.open_fds() <= fds + FD_SLACK, (fds, gw.open_fds())

        # The leak check: every operation again. Growth here is what each pass leaves; a
        # pass that grew past the slack gets one more, since a leak grows again.
        growth = []
        for attempt in range(LEAK_PASSES):
            again = tmp_path / f"again-{attempt}"
            again.mkdir()
            result, second = run_schemathesis(
                gw, again, "--phases", "coverage", "--max-examples", "1"
            )
            assert result.returncode == 0, result.stdout[-20000:]
            settle(gw)
            growth.append(gw.rss_bytes() - rss)
            rss += growth[-1]
            if growth[-1] < RSS_SLACK:
                break
        print(
            f"{backend}: RSS {rss / 2**20:.1f} MiB, "
            + ", ".join(f"{g / 2**20:+.1f}" for g in growth)
            + f" over passes of {second['test_cases']['generated']} cases; "
            f"fds {fds} -> {gw.open_fds()}"
        )
        assert growth[-1] < RSS_SLACK, f"gateway RSS grew by {growth} bytes, pass after pass"
        assert gw.open_fds() <= fds + FD_SLACK, (fds, gw.open_fds())
        if backend == "docker":
            assert len(containers_of(instance, role="kernel")) == POOL
        else:
            assert settled_descendants(gw) == kernels
        left = gw.descendants()
        assert gw.stop() in (0, -15)

    if backend == "docker":
        assert containers_of(instance) == []
    deadline = time.monotonic() + 15
    while [pid for pid in left if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in left if alive(pid)] == []
    records = []
    for line in gw.log.read_text().splitlines():  # every line is one JSON object
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
    assert len(records) > summary["test_cases"]["generated"]
    errors = [r for r in records if r["level"] in ("error", "critical")]
    assert errors == []
