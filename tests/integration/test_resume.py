"""Resumable streams on real kernels: event ids, Last-Event-ID, the executions list, the grace.

A client may drop and resume an execution's stream any number of times without
losing or repeating one event.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel_gateway.client.sse import SSEDecoder
from tests.support.backends import backend_settings, require_backend
from tests.support.server import ServerThread

Seen = list[tuple[int, str, dict[str, Any]]]

CELL = """\
import time
import matplotlib.pyplot as plt
for i in range(1000):
    print(f"line {i}", flush=True)
    if i % 50 == 0:
        time.sleep(0.05)
    if i == 500:
        plt.plot([1, 3, 2])
        plt.show()
        open("middle.txt", "w").write("saved in the middle")
"""


def read(response: httpx.Response, seen: Seen, most: int | None = None) -> bool:
    """Append up to `most` events to `seen` (all if None); True once `done` was read."""
    decoder = SSEDecoder()
    count = 0
    for chunk in response.iter_bytes():
        for event in decoder.feed(chunk):
            seen.append((int(event.id), event.event, event.json()))
            count += 1
            if event.event == "done":
                return True
            if most is not None and count >= most:
                return False
    return False


def events_url(session_id: str, execution_id: str) -> str:
    return f"/sessions/{session_id}/executions/{execution_id}/events"


def test_a_stream_cut_25_times_and_resumed_yields_every_event_once(
    client: httpx.Client, session_id: str
) -> None:
    rng = random.Random(25)
    seen: Seen = []
    with client.stream(
        "POST", f"/sessions/{session_id}/execute", json={"code": CELL, "timeout": 120}
    ) as response:
        assert response.status_code == 200
        execution_id = response.headers["execution-id"]
        url = events_url(session_id, execution_id)
        assert response.headers["content-location"] == url
        done = read(response, seen, rng.randint(1, 40))  # then the connection is cut
    cuts = 1
    while not done:
        last = str(seen[-1][0])
        with client.stream("GET", url, headers={"Last-Event-ID": last}) as response:
            assert response.status_code == 200, response.read()
            most = rng.randint(1, 40) if cuts < 25 else None
            done = read(response, seen, most)
        cuts += 1
    assert cuts >= 25, "the cell ended before 25 cuts: make it longer"

    with client.stream("GET", url) as response:  # the uncut read, from the start
        whole: Seen = []
        assert read(response, whole)
    assert seen == whole  # in order, none lost, none twice
    ids = [event_id for event_id, _, _ in whole]
    assert ids == sorted(set(ids))
    text = "".join(data["text"] for _, name, data in whole if name == "stdout")
    assert text == "".join(f"line {i}\n" for i in range(1000))
    names = [name for _, name, _ in whole]
    assert "display" in names and names[-2:] == ["file", "done"]
    assert whole[-1][2]["status"] == "ok"

    after = client.get(url, params={"after": whole[10][0]}, headers={"Accept": "application/json"})
    assert after.status_code == 200
    assert len(after.json()["events"]) == len(whole) - 11


def test_the_executions_list_and_bad_resume_points(client: httpx.Client, session_id: str) -> None:
    first = client.post(
        f"/sessions/{session_id}/execute",
        json={"code": "print(1)"},
        headers={"Accept": "application/json"},
    )
    assert first.status_code == 200 and first.json()["execution_id"] == "1"
    listed = client.get(f"/sessions/{session_id}/executions").json()["executions"]
    assert [(e["id"], e["status"]) for e in listed] == [("1", "ok")]
    assert listed[0]["last_event_id"] >= 2 and listed[0]["duration_ms"] >= 0
    url = events_url(session_id, "1")
    for bad in ("x", "-1", "1.5"):
        response = client.get(url, headers={"Last-Event-ID": bad})
        assert response.status_code == 422, bad
        assert response.json()["error"]["type"] == "invalid_request"
    missing = client.get(events_url(session_id, "7"))
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "execution_not_found")
    gone = client.get(f"/sessions/{'0' * 32}/executions")
    assert gone.status_code == 404


@pytest.fixture(scope="module", params=["local", "docker"])
def short_grace(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A gateway that keeps only 2 executions per session and waits 1.5 s for a resume."""
    require_backend(request.param)
    settings = backend_settings(
        request.param,
        tmp_path_factory.mktemp(f"grace-{request.param}"),
        reconnect_grace=1.5,
        replay_executions=2,
    )
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def start_and_drop(client: httpx.Client, session_id: str, code: str) -> str:
    """Start a cell, read its first event, and drop the connection; its execution id."""
    with client.stream("POST", f"/sessions/{session_id}/execute", json={"code": code}) as r:
        read(r, [], 1)
        return r.headers["execution-id"]


def test_a_resume_within_the_grace_lets_the_cell_finish(short_grace: httpx.Client) -> None:
    session_id = short_grace.post("/sessions").json()["id"]
    code = "import time\nprint('start', flush=True)\ntime.sleep(2.5)\nprint('end')"
    execution_id = start_and_drop(short_grace, session_id, code)
    time.sleep(0.5)  # well within the grace
    seen: Seen = []
    with short_grace.stream("GET", events_url(session_id, execution_id)) as response:
        assert read(response, seen)
    assert seen[-1][2]["status"] == "ok"
    assert "end\n" in [data.get("text") for _, _, data in seen]


def test_without_a_resume_the_cell_is_interrupted_after_the_grace(
    short_grace: httpx.Client,
) -> None:
    session_id = short_grace.post("/sessions").json()["id"]
    code = "import time\nprint('start', flush=True)\ntime.sleep(60)"
    started = time.monotonic()
    execution_id = start_and_drop(short_grace, session_id, code)
    while True:
        listed = short_grace.get(f"/sessions/{session_id}/executions").json()["executions"]
        status = {e["id"]: e["status"] for e in listed}[execution_id]
        if status != "running":
            break
        assert time.monotonic() - started < 15, "never interrupted"
        time.sleep(0.1)
    assert status == "interrupted"
    assert time.monotonic() - started >= 1.5  # not before the grace


def test_executions_past_the_retention_answer_410(short_grace: httpx.Client) -> None:
    session_id = short_grace.post("/sessions").json()["id"]
    for i in range(3):
        response = short_grace.post(
            f"/sessions/{session_id}/execute",
            json={"code": f"print({i})"},
            headers={"Accept": "application/json"},
        )
        assert response.status_code == 200
    expired = short_grace.get(events_url(session_id, "1"))
    assert (expired.status_code, expired.json()["error"]["type"]) == (410, "execution_expired")
    listed = short_grace.get(f"/sessions/{session_id}/executions").json()["executions"]
    assert [e["id"] for e in listed] == ["2", "3"]
