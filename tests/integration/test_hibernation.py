"""Hibernation on real kernels: idle sessions saved to disk with their kernels stopped, and
resumed by themselves (docs/hibernation.md).

Every value kind the docs promise is checked by value after hibernate -> resume, on the
docker backend (a warm kernel takes up the session's disk), under gVisor and on the local
backend (a kernel is started on the session's disk). Then what cannot be kept (reported by
name), resuming on every kind of call, once for concurrent calls, a cell racing a
hibernation, idle hibernation, the time-to-live, and the snapshot's privacy.
"""

from __future__ import annotations

import concurrent.futures
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.support.api import Stream, execute
from tests.support.server import ServerFactory, ServerThread

SETUP = """
import json, math, os, socket, sys, threading
import numpy as np
import pandas as pd
n = 42
ratio = 2.5
words = "héllo wörld"
nested = {"a": [1, 2, (3, 4)], "b": {"c": None, "d": {1, 2}}}
arr = np.arange(250_000, dtype=np.float64).reshape(500, 500) / 7
df = pd.DataFrame({"x": range(1000), "y": [f"s{i}" for i in range(1000)],
                   "t": pd.date_range("2026-01-01", periods=1000, freq="h")})
def scale(v, k=3):
    return v * k
def counter(start):
    count = [start]
    def step():
        count[0] += 1
        return count[0]
    return step
tick = counter(10)
tick()
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm(self):
        return math.hypot(self.x, self.y)
p = Point(3, 4)
same = [df, df]
sys.path.append("/workspace/mylib")
os.environ["MY_SETTING"] = "on"
os.makedirs("data", exist_ok=True)
with open("data/notes.txt", "w") as f:
    f.write("kept on disk")
np.save("data/arr.npy", arr)
print(float(arr.sum()), len(df))
"""

CHECK = """
import hashlib
checks = {
    "n": n == 42, "ratio": ratio == 2.5, "words": words == "héllo wörld",
    "nested": nested == {"a": [1, 2, (3, 4)], "b": {"c": None, "d": {1, 2}}},
    "arr": hashlib.sha256(arr.tobytes()).hexdigest() == ARR_SHA and arr.shape == (500, 500),
    "df": int(pd.util.hash_pandas_object(df).sum()) == DF_HASH and df.shape == (1000, 3),
    "df_dtypes": str(df.dtypes["t"]).startswith("datetime64"),
    "function": scale(2) == 6 and scale(2, k=5) == 10,
    "closure": tick() == 12,
    "class": isinstance(p, Point) and p.norm() == 5.0 and type(p).__name__ == "Point",
    "shared": same[0] is same[1] is df,
    "modules": np.__name__ == "numpy" and pd.__name__ == "pandas" and json.dumps([1]) == "[1]",
    "sys_path": "/workspace/mylib" in sys.path,
    "environ": os.environ.get("MY_SETTING") == "on",
    "files": open("data/notes.txt").read() == "kept on disk"
             and (np.load("data/arr.npy") == arr).all(),
    "cwd": os.getcwd() == CWD,
    "In": In[1].lstrip().startswith("import json") and len(In) == COUNT + 1,
    "Out": Out.get(2) == 84,
}
print(sorted(k for k, ok in checks.items() if not ok))
"""


def hibernate(client: httpx.Client, sid: str) -> dict[str, Any]:
    response = client.post(f"/sessions/{sid}/hibernate", timeout=120)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == "hibernated", body
    return body


@pytest.fixture(scope="module", params=["docker", "gvisor", "local"])
def gateway(request: pytest.FixtureRequest, servers: ServerFactory) -> ServerThread:
    return servers(str(request.param))


@pytest.fixture
def api(gateway: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=120) as c:
        yield c


@pytest.fixture
def sid(api: httpx.Client) -> Iterator[str]:
    response = api.post("/sessions")
    assert response.status_code == 201, response.text
    session_id = str(response.json()["id"])
    yield session_id
    api.delete(f"/sessions/{session_id}")


def test_every_kind_of_value_comes_back_by_value(api: httpx.Client, sid: str) -> None:
    setup = execute(api, sid, SETUP)
    assert setup.done["status"] == "ok", setup.events
    count = execute(api, sid, "scale(28)")  # an Out entry
    assert count.done["status"] == "ok"
    facts = execute(
        api,
        sid,
        "import hashlib; print(hashlib.sha256(arr.tobytes()).hexdigest()); "
        "print(int(pd.util.hash_pandas_object(df).sum())); print(os.getcwd())",
    ).stdout.splitlines()
    arr_sha, df_hash, cwd = facts[0], facts[1], facts[2]
    session = hibernate(api, sid)
    # Everything kept but the file object `with open(...) as f` left behind.
    assert session["hibernation"]["lost"] == [
        {"name": "f", "reason": "a closed file: open it again by name (what it wrote is on disk)"}
    ], session
    assert session["hibernation"]["bytes"] > 2_000_000  # the array alone is 2 MB
    assert api.get(f"/sessions/{sid}").json()["status"] == "hibernated"
    check = CHECK.replace("ARR_SHA", repr(arr_sha)).replace("DF_HASH", df_hash)
    check = check.replace("CWD", repr(cwd)).replace("COUNT", "4")
    resumed = execute(api, sid, check)
    assert resumed.done["status"] == "ok", resumed.events
    assert resumed.stdout.strip() == "[]", resumed.stdout  # no check failed
    assert resumed.names[0] == "resumed"
    report = resumed.named("resumed")[0]
    assert report["lost"] == session["hibernation"]["lost"] and report["resume_ms"] > 0
    assert resumed.done["resumed"] == report
    assert resumed.done["execution_count"] == 4  # counting went on where it stopped
    assert api.get(f"/sessions/{sid}").json()["status"] == "idle"
    again = execute(api, sid, "print(n)")  # reported once, not on every cell
    assert again.stdout == "42\n" and "resumed" not in again.names


def test_what_cannot_be_kept_is_reported_by_name(api: httpx.Client, sid: str) -> None:
    made = execute(
        api,
        sid,
        "import socket, threading, time\n"
        "kept = [1, 2, 3]\n"
        "sock = socket.socket()\n"
        "gen = (i for i in range(3))\n"
        "worker = threading.Thread(target=time.sleep, args=(0.1,)); worker.start()\n"
        "holder = {'s': sock}\n",
    )
    assert made.done["status"] == "ok", made.events
    session = hibernate(api, sid)
    lost = {x["name"]: x["reason"] for x in session["hibernation"]["lost"]}
    assert set(lost) == {"sock", "gen", "worker", "holder"}, lost
    assert "socket" in lost["sock"] and "generator" in lost["gen"], lost
    resumed = api.post(f"/sessions/{sid}/resume")
    assert resumed.status_code == 200, resumed.text
    report = resumed.json()["resumed"]
    assert {x["name"] for x in report["lost"]} == set(lost)
    assert resumed.json()["status"] == "idle"
    # The report also reaches the next cell (the client that runs code sees it).
    stream = execute(api, sid, "print(kept, 'sock' in dir(), 'gen' in dir())")
    assert stream.stdout == "[1, 2, 3] False False\n", stream.events
    assert {x["name"] for x in stream.named("resumed")[0]["lost"]} == set(lost)
    assert api.post(f"/sessions/{sid}/resume").json()["resumed"] is None  # not hibernated


def test_calls_resume_it_by_themselves(api: httpx.Client, sid: str, gateway: ServerThread) -> None:
    assert execute(api, sid, "x = 7\nopen('f.txt', 'w').write('abc')").done["status"] == "ok"
    # A file download resumes it.
    hibernate(api, sid)
    download = api.get(f"/sessions/{sid}/files/f.txt")
    assert download.status_code == 200 and download.content == b"abc"
    assert api.get(f"/sessions/{sid}").json()["status"] == "idle"
    assert execute(api, sid, "print(x)").stdout == "7\n"
    # So does a listing and an upload; then the stream of the next cell tells what came back.
    hibernate(api, sid)
    assert api.put(f"/sessions/{sid}/files/g.txt", content=b"up").status_code == 201
    stream = execute(api, sid, "print(x, open('g.txt').read())")
    assert stream.stdout == "7 up\n" and stream.named("resumed")[0]["lost"] == []
    # A restart of a hibernated session starts it fresh: state gone, files kept.
    hibernate(api, sid)
    assert api.post(f"/sessions/{sid}/restart").json()["status"] == "idle"
    fresh = execute(api, sid, "print('x' in dir(), open('f.txt').read())")
    assert fresh.stdout == "False abc\n" and "resumed" not in fresh.names


def test_concurrent_calls_resume_it_once(api: httpx.Client, sid: str) -> None:
    assert execute(api, sid, "v = 'once'").done["status"] == "ok"
    hibernate(api, sid)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = list(pool.map(lambda _: execute(api, sid, "print(v)"), range(4)))
    assert all(s.stdout == "once\n" for s in streams), [s.events for s in streams]
    assert sum(1 for s in streams for _ in s.named("resumed")) == 1
    assert sorted(s.done["execution_count"] for s in streams) == [2, 3, 4, 5]


def test_a_cell_racing_a_hibernation_loses_nothing(api: httpx.Client, sid: str) -> None:
    made = execute(api, sid, "import numpy as np\nbig = np.ones(20_000_000)\nmark = 1")
    assert made.done["status"] == "ok"
    for attempt in range(3):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            saving = pool.submit(api.post, f"/sessions/{sid}/hibernate", timeout=120)
            time.sleep(0.05 * attempt)
            cell = pool.submit(execute, api, sid, "mark += 1; print(mark, big.sum())")
            answer, stream = saving.result(), cell.result()
        # Either the cell won (the hibernation was refused or cancelled: 409) or it waited
        # for the hibernation and resumed the session: never anything lost.
        assert answer.status_code in (200, 409), answer.text
        assert stream.done["status"] == "ok", stream.events
        assert stream.stdout == f"{attempt + 2} 20000000.0\n", stream.events
        if answer.status_code == 200:
            assert stream.named("resumed")[0]["lost"] == []


def test_other_languages_are_refused_clearly(api: httpx.Client, gateway: ServerThread) -> None:
    if gateway.settings.backend != "docker" or gateway.settings.runtime:
        pytest.skip("once is enough")
    languages = [x["name"] for x in api.get("/languages").json()["languages"]]
    other = next((x for x in languages if x != "python"), None)
    if other is None:
        pytest.skip("no other language here")
    created = api.post("/sessions", json={"language": other})
    assert created.status_code == 201
    other_id = created.json()["id"]
    try:
        refused = api.post(f"/sessions/{other_id}/hibernate")
        assert refused.status_code == 409, refused.text
        assert "cannot be hibernated" in refused.json()["error"]["message"]
    finally:
        api.delete(f"/sessions/{other_id}")
    assert api.post("/sessions/nope/hibernate").status_code == 404


# -- idle sessions, the time-to-live, the snapshot's privacy (docker) --------------------------


@pytest.fixture(scope="module")
def idle_gateway(servers: ServerFactory) -> ServerThread:
    return servers("docker", hibernate_after=1.0, hibernated_ttl=6.0, idle_timeout=2.0)


def _wait(check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_idle_sessions_hibernate_give_back_their_kernel_and_expire(
    idle_gateway: ServerThread,
) -> None:
    with httpx.Client(base_url=idle_gateway.url, timeout=120) as api:
        sid = api.post("/sessions").json()["id"]
        assert execute(api, sid, "kept = 'yes'").done["status"] == "ok"
        runtime = Path(idle_gateway.settings.runtime_dir)
        instance = api.get("/health").json()["instance"]
        snapshots = runtime / instance / "snapshots"
        # Past --hibernate-after (1 s), though --idle-timeout (2 s) would have removed it.
        _wait(lambda: api.get(f"/sessions/{sid}").json()["status"] == "hibernated", 15)
        time.sleep(2.5)  # longer than --idle-timeout: hibernated sessions outlive it
        assert api.get(f"/sessions/{sid}").json()["status"] == "hibernated"
        snapshot = snapshots / f"{sid}.snapshot"
        assert stat.S_IMODE(snapshots.stat().st_mode) == 0o700
        info = snapshot.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
        running = docker.from_env()
        try:
            listed = running.api.containers(all=True)  # one call: no race with removals
            names = [n.lstrip("/") for c in listed for n in c["Names"]]
        finally:
            running.close()
        kernels_of_session = [n for n in names if n and sid in n]
        assert kernels_of_session == []  # nothing of it runs
        # It comes back on its next call, and hibernates again when idle.
        assert execute(api, sid, "print(kept)").stdout == "yes\n"
        _wait(lambda: api.get(f"/sessions/{sid}").json()["status"] == "hibernated", 15)
        # Past --hibernated-ttl (6 s idle): deleted with its snapshot and files; 410 after.
        _wait(lambda: api.get(f"/sessions/{sid}").status_code == 410, 20)
        gone = api.get(f"/sessions/{sid}").json()["error"]
        assert gone["type"] == "session_lost" and "--hibernated-ttl" in gone["message"]
        assert not snapshot.exists()
        assert api.post(f"/sessions/{sid}/execute", json={"code": "1"}).status_code == 410


def test_a_deleted_session_takes_its_snapshot_with_it(idle_gateway: ServerThread) -> None:
    with httpx.Client(base_url=idle_gateway.url, timeout=120) as api:
        sid = api.post("/sessions").json()["id"]
        assert execute(api, sid, "secret = 'mine'").done["status"] == "ok"
        hibernate(api, sid)
        instance = api.get("/health").json()["instance"]
        snapshot = (
            Path(idle_gateway.settings.runtime_dir) / instance / "snapshots" / f"{sid}.snapshot"
        )
        assert snapshot.exists()
        assert api.delete(f"/sessions/{sid}").status_code == 204
        assert not snapshot.exists()
        # Another session never sees it.
        other = api.post("/sessions").json()["id"]
        stream: Stream = execute(api, other, "print('secret' in dir())")
        assert stream.stdout == "False\n" and "resumed" not in stream.names
        api.delete(f"/sessions/{other}")


@pytest.fixture(scope="module", params=["local", "docker"])
def impatient(request: pytest.FixtureRequest, servers: ServerFactory) -> ServerThread:
    """A gateway whose kernels have 2 s to save their variables."""
    return servers(str(request.param), snapshot_timeout=2.0)


def test_a_value_that_never_saves_fails_the_hibernation_and_the_session_runs_on(
    impatient: ServerThread,
) -> None:
    forever = (
        "class Forever:\n"
        "    def __reduce__(self):\n"
        "        while True:\n"
        "            pass\n"
        "stuck = Forever()\n"
        "kept = [1, 2, 3]\n"
    )
    with httpx.Client(base_url=impatient.url, timeout=120) as api:
        made = api.post("/sessions")
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        assert execute(api, sid, forever).done["status"] == "ok"
        # Within twice the limit and a little (the whole save, then the names alone): a
        # hang would outlast this request's 30 s. Meanwhile the session shows it.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            asked = pool.submit(api.post, f"/sessions/{sid}/hibernate", timeout=30)
            seen: set[str] = set()
            while not asked.done():
                seen.add(api.get(f"/sessions/{sid}").json()["status"])
                time.sleep(0.1)
            answer = asked.result()
        assert "hibernating" in seen, seen
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["type"] == "hibernation_failed", error
        assert "'stuck'" in error["message"] and "2 s" in error["message"], error
        assert api.get(f"/sessions/{sid}").json()["status"] == "idle"
        after = execute(api, sid, "print(kept, type(stuck).__name__)", timeout=10)
        assert after.done["status"] == "ok" and after.stdout == "[1, 2, 3] Forever\n", after.events
        api.delete(f"/sessions/{sid}")
