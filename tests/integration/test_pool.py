"""Pool and session lifecycle: limits, warm kernels, idle reaping, disconnects."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.api import execute
from tests.support.backends import settings_for
from tests.support.server import ServerThread


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A local gateway with room for two sessions and a short idle timeout."""
    settings = settings_for(
        "local",
        tmp_path_factory.mktemp("small"),
        max_sessions=2,
        pool_size=1,
        idle_timeout=2,
        reconnect_grace=0.5,
    )
    with ServerThread(settings) as s:
        yield s


@pytest.fixture
def client(small: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=small.url, timeout=60) as c:
        yield c
        for s in c.get("/sessions").json()["sessions"]:
            c.delete(f"/sessions/{s['id']}")


def wait_for(predicate: object, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_beyond_max_sessions_is_429_with_retry_after(client: httpx.Client) -> None:
    a = client.post("/sessions")
    b = client.post("/sessions")
    assert (a.status_code, b.status_code) == (201, 201)
    c = client.post("/sessions")
    assert c.status_code == 429
    assert c.json()["error"]["type"] == "too_many_sessions"
    assert int(c.headers["retry-after"]) >= 1
    client.delete(f"/sessions/{a.json()['id']}")
    assert client.post("/sessions").status_code == 201


def test_sessions_come_from_the_warm_pool(client: httpx.Client) -> None:
    wait_for(lambda: client.get("/health").json()["pool"]["warm"] == 1)
    started = time.monotonic()
    response = client.post("/sessions")
    assert response.status_code == 201
    assert time.monotonic() - started < 0.5  # no kernel start on this path
    wait_for(lambda: client.get("/health").json()["pool"]["warm"] == 1)


def test_idle_sessions_are_reaped(client: httpx.Client) -> None:
    sid = client.post("/sessions").json()["id"]
    busy = client.post("/sessions").json()["id"]
    # A running cell keeps its session alive past the idle timeout.
    stream = execute(client, busy, "import time; time.sleep(3); print('ok')")
    assert stream.stdout == "ok\n"
    assert client.get(f"/sessions/{sid}").status_code == 404
    assert client.get(f"/sessions/{busy}").status_code == 200
    wait_for(lambda: client.get(f"/sessions/{busy}").status_code == 404, timeout=10)


def test_disconnect_interrupts_the_cell(client: httpx.Client) -> None:
    sid = client.post("/sessions").json()["id"]
    execute(client, sid, "marker = 'kept'")
    with client.stream(
        "POST",
        f"/sessions/{sid}/execute",
        json={"code": "import time\nprint('going', flush=True)\ntime.sleep(60)"},
    ) as response:
        for line in response.iter_lines():
            if "going" in line:
                break
    # The client hung up and did not resume within the grace: the cell must be
    # interrupted, not left running for 60 s.
    started = time.monotonic()
    stream = execute(client, sid, "print(marker)")
    assert time.monotonic() - started < 5
    assert stream.stdout == "kept\n"


def test_queued_executions_beyond_the_limit_are_409(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    settings = settings_for(
        "local", tmp_path_factory.mktemp("q"), pool_size=0, max_queued_executions=1
    )
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        sid = c.post("/sessions").json()["id"]
        with c.stream(
            "POST", f"/sessions/{sid}/execute", json={"code": "import time; time.sleep(2)"}
        ) as first:
            assert first.status_code == 200
            with c.stream("POST", f"/sessions/{sid}/execute", json={"code": "1"}) as second:
                assert second.status_code == 200
                third = c.post(f"/sessions/{sid}/execute", json={"code": "2"})
                assert third.status_code == 409
                assert third.json()["error"]["type"] == "session_busy"


def test_deleting_a_session_kills_its_kernels_children(client: httpx.Client) -> None:
    import subprocess

    marker = "987.654321"  # a unique command line, found on the host by pgrep
    # (inside a bubblewrap sandbox the kernel's own pids are not host pids)

    def running() -> bool:
        return (
            subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True).returncode == 0
        )

    sid = client.post("/sessions").json()["id"]
    execute(client, sid, f"import subprocess; p = subprocess.Popen(['sleep', '{marker}'])")
    wait_for(running, timeout=10)
    execute(client, sid, "import os; os._exit(1)")  # the kernel dies; its child must not live on
    assert client.delete(f"/sessions/{sid}").status_code == 204
    wait_for(lambda: not running(), timeout=10)


def test_disconnect_stops_even_code_that_ignores_interrupts(client: httpx.Client) -> None:
    sid = client.post("/sessions").json()["id"]
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('going', flush=True)\n"
        "time.sleep(60)"
    )
    with client.stream("POST", f"/sessions/{sid}/execute", json={"code": code}) as response:
        for line in response.iter_lines():
            if "going" in line:
                break
    started = time.monotonic()
    stream = execute(client, sid, "print('next')")
    assert time.monotonic() - started < 10
    assert stream.stdout == "next\n"
    assert stream.done["restarted"] is True
