"""Snapshots and forks through the API, the client and the CLI, on real Docker kernels:
files and variables kept, sessions started from a snapshot many times and apart from each
other, forks of a running session, a save that never ends, bad input, limits, restarts."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel_gateway.client import Client, SnapshotNotFoundError, TooManySnapshotsError
from tests.support.api import execute
from tests.support.backends import backend_settings, require_backend, require_languages
from tests.support.server import ServerFactory, ServerThread

STATE = (
    "import pandas as pd\n"
    "frame = pd.DataFrame({'n': range(1000)})\n"
    "counter = 41\n"
    "numbers = (i for i in range(3))\n"  # a generator: not kept, and said so
    "open('notes.txt', 'w').write('kept on disk')\n"
    "import os\n"
    "os.makedirs('/home/sandbox/.config/app', exist_ok=True)\n"
    "open('/home/sandbox/.config/app/settings', 'w').write('home too')\n"
)
CHECK = (
    "print(counter + 1, int(frame.n.sum()), open('notes.txt').read(), "
    "open('/home/sandbox/.config/app/settings').read(), 'numbers' in dir())"
)
SEEN = "42 499500 kept on disk home too False\n"
FOREVER = (
    "class Forever:\n"
    "    def __reduce__(self):\n"
    "        while True:\n"
    "            pass\n"
    "stuck = Forever()\n"
    "kept = [1, 2, 3]\n"
)


@pytest.fixture(scope="module")
def gateway(servers: ServerFactory) -> ServerThread:
    """Kernels given 3 s to save their variables and files; at most 4 snapshots."""
    return servers("docker", snapshot_timeout=3.0, max_snapshots=4, max_sessions=12)


@pytest.fixture
def api(gateway: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        yield client
        for snapshot in client.get("/snapshots").json()["snapshots"]:
            client.delete(f"/snapshots/{snapshot['id']}")
        for session in client.get("/sessions").json()["sessions"]:
            client.delete(f"/sessions/{session['id']}")


def new_session(api: httpx.Client, **body: object) -> str:
    made = api.post("/sessions", json=body)
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def test_a_snapshot_keeps_files_and_variables_for_every_session_started_from_it(
    api: httpx.Client,
) -> None:
    source = new_session(api)
    assert execute(api, source, STATE).done["status"] == "ok"
    taken = api.post(f"/sessions/{source}/snapshots", json={"name": "analysis"})
    assert taken.status_code == 201, taken.text
    snapshot = taken.json()
    assert taken.headers["location"] == f"/snapshots/{snapshot['id']}"
    assert snapshot["id"].startswith("snap-") and snapshot["name"] == "analysis"
    assert snapshot["session_id"] == source and snapshot["language"] == "python"
    assert snapshot["bytes"] > 0
    assert [x["name"] for x in snapshot["lost"]] == ["numbers"], snapshot["lost"]
    # The session runs on, untouched.
    assert execute(api, source, CHECK.replace("'numbers' in dir()", "next(numbers)")).stdout == (
        "42 499500 kept on disk home too 0\n"
    )

    started = []
    for reference in (snapshot["id"], "analysis"):  # by id, and by name
        made = api.post("/sessions", json={"snapshot": reference})
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["restored"] == {"snapshot": snapshot["id"], "lost": snapshot["lost"]}
        assert body["status"] == "idle" and body["language"] == "python"
        started.append(body["id"])
        assert execute(api, body["id"], CHECK).stdout == SEEN
    first, second = started
    # Apart from each other and from the source.
    execute(api, first, "counter = 0\nopen('notes.txt', 'w').write('changed')")
    assert execute(api, second, "print(counter, open('notes.txt').read())").stdout == (
        "41 kept on disk\n"
    )
    assert execute(api, source, "print(counter, open('notes.txt').read())").stdout == (
        "41 kept on disk\n"
    )
    assert api.post("/sessions", json={}).json()["restored"] is None

    listed = api.get("/snapshots").json()["snapshots"]
    assert [s["id"] for s in listed] == [snapshot["id"]]
    assert api.get("/snapshots", params={"session_id": source}).json()["snapshots"] == listed
    assert api.get("/snapshots", params={"session_id": first}).json()["snapshots"] == []
    assert api.get("/snapshots", params={"name": "analysis"}).json()["snapshots"] == listed
    assert api.get("/snapshots/analysis").json() == snapshot
    assert api.delete("/snapshots/analysis").status_code == 204
    gone = api.get(f"/snapshots/{snapshot['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "snapshot_not_found"
    # A session started from it keeps its copy.
    assert execute(api, second, "print(int(frame.n.max()))").stdout == "999\n"


def test_a_name_taken_again_replaces_the_snapshot_under_the_same_id(api: httpx.Client) -> None:
    source = new_session(api)
    execute(api, source, "version = 1")
    first = api.post(f"/sessions/{source}/snapshots", json={"name": "daily"}).json()
    execute(api, source, "version = 2")
    second = api.post(f"/sessions/{source}/snapshots", json={"name": "daily"}).json()
    assert second["id"] == first["id"] and second["created_at"] >= first["created_at"]
    assert len(api.get("/snapshots").json()["snapshots"]) == 1
    started = new_session(api, snapshot="daily")
    assert execute(api, started, "print(version)").stdout == "2\n"


def test_forks_are_copies_of_a_running_session_apart_from_it_and_each_other(
    api: httpx.Client,
) -> None:
    source = new_session(api)
    execute(api, source, STATE)
    answer = api.post(f"/sessions/{source}/fork", json={"count": 2})
    assert answer.status_code == 201, answer.text
    forks = answer.json()["forks"]
    assert len(forks) == 2 and all("session" in f for f in forks), forks
    ids = [f["session"]["id"] for f in forks]
    assert len(set(ids)) == 2 and source not in ids
    assert all(f["session"]["restored"]["lost"][0]["name"] == "numbers" for f in forks)
    for fork_id in ids:
        assert execute(api, fork_id, CHECK).stdout == SEEN
    execute(api, ids[0], "counter = -1\nos.remove('notes.txt')")
    assert execute(api, ids[1], "print(counter, os.path.exists('notes.txt'))").stdout == (
        "41 True\n"
    )
    assert execute(api, source, "print(counter, next(numbers))").stdout == "41 0\n"
    assert api.get("/snapshots").json()["snapshots"] == []  # a fork keeps no snapshot
    assert api.get(f"/sessions/{source}").json()["status"] == "idle"


def test_a_value_that_never_saves_fails_the_snapshot_and_the_fork_and_the_session_runs_on(
    api: httpx.Client,
) -> None:
    source = new_session(api)
    assert execute(api, source, FOREVER).done["status"] == "ok"
    for path, body in (("snapshots", {}), ("fork", {"count": 2})):
        began = time.monotonic()
        answer = api.post(f"/sessions/{source}/{path}", json=body, timeout=30)
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["type"] == "hibernation_failed", error
        assert "'stuck'" in error["message"] and "3 s" in error["message"], error
        assert time.monotonic() - began < 2 * 3 + 10
        assert api.get(f"/sessions/{source}").json()["status"] == "idle"
        after = execute(api, source, "print(kept, type(stuck).__name__)", timeout=10)
        assert after.stdout == "[1, 2, 3] Forever\n", after.events
    assert api.get("/snapshots").json()["snapshots"] == []
    assert len(api.get("/sessions").json()["sessions"]) == 1  # no fork was left behind


def test_bad_requests_get_clear_errors(api: httpx.Client) -> None:
    source = new_session(api)
    cases = [
        (api.post(f"/sessions/{source}/fork", json={"count": 0}), 422, "invalid_request"),
        (api.post(f"/sessions/{source}/fork", json={"count": 101}), 422, "invalid_request"),
        (api.post(f"/sessions/{source}/snapshots", json={"name": "../x"}), 422, "invalid_request"),
        (api.post(f"/sessions/{source}/snapshots", json={"name": 3}), 422, "invalid_request"),
        (api.post("/sessions/nope/snapshots", json={}), 404, "session_not_found"),
        (api.post("/sessions/nope/fork", json={}), 404, "session_not_found"),
        (api.post("/sessions", json={"snapshot": "nope"}), 404, "snapshot_not_found"),
        (api.get("/snapshots/nope"), 404, "snapshot_not_found"),
        (api.delete("/snapshots/nope"), 404, "snapshot_not_found"),
        (
            api.post("/sessions", json={"snapshot": "x", "language": "python"}),
            404,
            "snapshot_not_found",
        ),
    ]
    for response, status, kind in cases:
        assert response.status_code == status, (response.request.url, response.text)
        assert response.json()["error"]["type"] == kind, response.text
    # A cell running: 409, and the cell goes on.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(execute, api, source, "import time\ntime.sleep(3)\nprint('slept')")
        deadline = time.monotonic() + 10
        while api.get(f"/sessions/{source}").json()["status"] != "busy":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        busy = api.post(f"/sessions/{source}/snapshots", json={})
        assert busy.status_code == 409 and busy.json()["error"]["type"] == "session_busy"
        assert running.result().stdout == "slept\n"
    assert len(api.get("/sessions").json()["sessions"]) == 1
    taken = api.post(f"/sessions/{source}/snapshots", json={}).json()["id"]
    for extra in ({"language": "python"}, {"fork": 1}):
        if "fork" in extra:  # a whole JSON number is an integer
            assert api.post(f"/sessions/{source}/fork", json={"count": 1.0}).status_code == 201
            continue
        same = api.post("/sessions", json={"snapshot": taken, **extra})
        assert same.status_code == 201, same.text
    other = api.post("/sessions", json={"snapshot": taken, "template": "analytics"})
    assert other.status_code == 409 and other.json()["error"]["type"] == "conflict", other.text


def test_snapshots_are_counted_and_a_replaced_name_is_not_one_more(api: httpx.Client) -> None:
    source = new_session(api)
    for _ in range(4):
        assert api.post(f"/sessions/{source}/snapshots", json={}).status_code == 201
    over = api.post(f"/sessions/{source}/snapshots", json={"name": "one-more"})
    assert over.status_code == 429 and over.json()["error"]["type"] == "too_many_snapshots"
    oldest = api.get("/snapshots").json()["snapshots"][0]["id"]
    api.delete(f"/snapshots/{oldest}")
    assert api.post(f"/sessions/{source}/snapshots", json={"name": "kept"}).status_code == 201
    assert api.post(f"/sessions/{source}/snapshots", json={"name": "kept"}).status_code == 201


def test_the_client_and_the_cli(gateway: ServerThread, api: httpx.Client) -> None:
    with Client(gateway.url) as client:
        session = client.create_session()
        session.run("answer = 42")
        snapshot = session.snapshot("from-client")
        assert snapshot["name"] == "from-client"
        assert [s["id"] for s in client.snapshots(session_id=session.id)] == [snapshot["id"]]
        with client.session(snapshot="from-client") as restored:
            assert restored.run("print(answer)").stdout == "42\n"
        forks = session.fork(2)
        assert len(forks) == 2
        for fork in forks:
            assert not isinstance(fork, Exception), fork
            assert fork.run("print(answer + 1)").stdout == "43\n"
            fork.delete()
        cli = [sys.executable, "-m", "kernel_gateway", "snapshot"]
        env = {**os.environ, "KG_URL": gateway.url}
        listed = subprocess.run([*cli, "list"], capture_output=True, text=True, env=env, check=True)
        assert json.loads(listed.stdout.splitlines()[0])["id"] == snapshot["id"]
        started = subprocess.run(
            [*cli, "start", "from-client"], capture_output=True, text=True, env=env, check=True
        )
        assert json.loads(started.stdout)["status"] == "idle"
        missing = subprocess.run([*cli, "delete", "nope"], capture_output=True, text=True, env=env)
        assert missing.returncode == 2 and "snapshot_not_found" in missing.stderr
        client.delete_snapshot("from-client")
        with pytest.raises(SnapshotNotFoundError):
            client.snapshot("from-client")
        for _ in range(4):
            session.snapshot()
        with pytest.raises(TooManySnapshotsError):
            session.snapshot()


def test_another_languages_snapshot_keeps_its_files_and_says_its_variables_are_not(
    api: httpx.Client,
) -> None:
    require_languages("bash")
    source = new_session(api, language="bash")
    execute(api, source, "echo data > kept.txt; mkdir -p deep/er; echo x > deep/er/y; GONE=1")
    snapshot = api.post(f"/sessions/{source}/snapshots", json={}).json()
    assert snapshot["language"] == "bash"
    assert snapshot["lost"][0]["name"] == "*" and "bash" in snapshot["lost"][0]["reason"]
    started = new_session(api, snapshot=snapshot["id"])
    assert api.get(f"/sessions/{started}").json()["language"] == "bash"
    out = execute(api, started, 'cat kept.txt deep/er/y; echo "[$GONE]"; pwd').stdout
    assert out == "data\nx\n[]\n/home/user\n", out


def test_snapshots_outlive_the_gateway(tmp_path: Path) -> None:
    require_backend("docker")
    root = tmp_path / "runtime"
    with ServerThread(backend_settings("docker", root)) as first:
        with httpx.Client(base_url=first.url, timeout=120) as api:
            source = new_session(api)
            execute(api, source, "survivor = 'still here'\nopen('f.txt', 'w').write('and me')")
            snapshot = api.post(f"/sessions/{source}/snapshots", json={"name": "keep"}).json()
    with ServerThread(backend_settings("docker", root)) as second:
        with httpx.Client(base_url=second.url, timeout=120) as api:
            assert [s["id"] for s in api.get("/snapshots").json()["snapshots"]] == [snapshot["id"]]
            started = new_session(api, snapshot="keep")
            assert execute(api, started, "print(survivor, open('f.txt').read())").stdout == (
                "still here and me\n"
            )
            api.delete("/snapshots/keep")
            api.delete(f"/sessions/{started}")
