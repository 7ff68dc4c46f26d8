"""The HTTP API against real kernels, on the local backend and in real Docker containers."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.api import execute
from tests.support.backends import BACKENDS, require_backend
from tests.support.server import ServerThread


@pytest.fixture(scope="session", params=["local", "docker", "gvisor"])
def backend_name(request: pytest.FixtureRequest) -> str:
    """The core tests run on every backend, gVisor included."""
    require_backend(request.param)
    return str(request.param)


def test_health(client: httpx.Client, backend_name: str) -> None:
    body = client.get("/health").json()
    assert body["status"] == "ok"
    assert body["backend"] == BACKENDS[backend_name][0]
    assert {"warm", "starting", "sessions", "max_sessions"} <= set(body["pool"])


def test_state_persists_between_cells(client: httpx.Client, session_id: str) -> None:
    first = execute(client, session_id, "x = 41")
    assert first.done["status"] == "ok"
    second = execute(client, session_id, "print(x + 1)")
    assert second.stdout == "42\n"
    assert second.names == ["stdout", "done"]
    assert second.done["execution_count"] == first.done["execution_count"] + 1
    assert second.done["restarted"] is False


def test_result_event(client: httpx.Client, session_id: str) -> None:
    stream = execute(client, session_id, "6 * 7")
    (result,) = stream.named("result")
    assert result["data"]["text/plain"] == "42"
    assert result["execution_count"] == stream.done["execution_count"]


def test_output_streams_live(client: httpx.Client, session_id: str) -> None:
    code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')"
    stream = execute(client, session_id, code)
    first_at = next(t for n, d, t in stream.events if n == "stdout" and "first" in d["text"])
    done_at = stream.events[-1][2]
    assert done_at - first_at > 1.0
    assert stream.stdout == "first\nsecond\n"


def test_stderr(client: httpx.Client, session_id: str) -> None:
    stream = execute(client, session_id, "import sys; sys.stderr.write('oops\\n')")
    assert stream.named("stderr") == [{"text": "oops\n"}]


def test_error_event(client: httpx.Client, session_id: str) -> None:
    stream = execute(client, session_id, "1/0")
    (error,) = stream.named("error")
    assert error["ename"] == "ZeroDivisionError"
    assert error["traceback"]
    assert stream.done["status"] == "error"
    assert stream.names[-1] == "done"


def test_display_update_and_clear(client: httpx.Client, session_id: str) -> None:
    code = (
        "from IPython.display import display, update_display, clear_output\n"
        "display('a', display_id='d1')\n"
        "update_display('b', display_id='d1')\n"
        "clear_output(wait=True)\n"
    )
    stream = execute(client, session_id, code)
    first, second = stream.named("display")
    assert (first["display_id"], first["update"]) == ("d1", False)
    assert (second["display_id"], second["update"]) == ("d1", True)
    assert second["data"]["text/plain"] == "'b'"
    assert stream.named("clear") == [{"wait": True}]


def test_timeout_interrupts_and_keeps_state(
    client: httpx.Client, session_id: str, gateway: ServerThread
) -> None:
    execute(client, session_id, "kept = 'still here'")
    started = time.monotonic()
    stream = execute(client, session_id, "while True: pass", timeout=2)
    assert time.monotonic() - started < 2 + gateway.settings.interrupt_grace + 2
    assert stream.done["status"] == "timeout"
    assert stream.done["restarted"] is False
    after = execute(client, session_id, "print(kept)")
    assert after.stdout == "still here\n"


def test_uninterruptible_code_is_restarted_on_timeout(
    client: httpx.Client, session_id: str, gateway: ServerThread
) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
    started = time.monotonic()
    stream = execute(client, session_id, code, timeout=1)
    assert time.monotonic() - started < 1 + gateway.settings.interrupt_grace + 2
    assert stream.done["status"] == "timeout"
    assert stream.done["restarted"] is True
    assert stream.named("error")[-1]["ename"] == "TimeoutError"
    assert execute(client, session_id, "print('alive')").stdout == "alive\n"


def test_kernel_death_is_reported_and_recovered(client: httpx.Client, session_id: str) -> None:
    execute(client, session_id, "lost = 1")
    started = time.monotonic()
    stream = execute(client, session_id, "import os; os._exit(1)")
    assert time.monotonic() - started < 10
    assert stream.done["status"] == "died"
    assert stream.named("error")[0]["ename"] == "KernelDied"
    after = execute(client, session_id, "print('lost' in globals())")
    assert after.done["restarted"] is True
    assert after.stdout == "False\n"
    again = execute(client, session_id, "1")
    assert again.done["restarted"] is False


def test_segfault_is_a_death(client: httpx.Client, session_id: str) -> None:
    stream = execute(client, session_id, "import ctypes; ctypes.string_at(0)")
    assert stream.done["status"] == "died"
    assert stream.done["reason"] in ("signal", "exited")


def test_interrupt_endpoint(client: httpx.Client, session_id: str) -> None:
    import threading

    def interrupt_soon() -> None:
        time.sleep(1.0)
        client.post(f"/sessions/{session_id}/interrupt")

    threading.Thread(target=interrupt_soon).start()
    stream = execute(client, session_id, "import time; time.sleep(30)")
    assert stream.done["status"] == "interrupted"
    assert stream.named("error")[0]["ename"] == "KeyboardInterrupt"


def test_restart_endpoint_clears_state(client: httpx.Client, session_id: str) -> None:
    execute(client, session_id, "gone = 1")
    response = client.post(f"/sessions/{session_id}/restart")
    assert response.status_code == 200
    assert response.json()["status"] == "idle"
    stream = execute(client, session_id, "print('gone' in globals())")
    assert stream.stdout == "False\n"


def test_executions_run_in_order_and_stay_separate(
    gateway: object, client: httpx.Client, session_id: str
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def run(i: int) -> str:
        return execute(client, session_id, f"import time; time.sleep(0.05); print({i})").stdout

    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(run, range(8)))
    assert outputs == [f"{i}\n" for i in range(8)]


def test_background_output_does_not_leak(client: httpx.Client, session_id: str) -> None:
    code = (
        "import threading, time\n"
        "def noisy():\n"
        "    for _ in range(30):\n"
        "        print('background', flush=True); time.sleep(0.02)\n"
        "threading.Thread(target=noisy, daemon=True).start()\n"
    )
    execute(client, session_id, code)
    later = execute(client, session_id, "import time; time.sleep(0.3); print('mine')")
    assert later.stdout == "mine\n"


def test_output_is_capped(client: httpx.Client, session_id: str) -> None:
    stream = execute(client, session_id, "for _ in range(3000): print('x' * 1000)")
    assert stream.done["status"] == "ok"
    assert stream.done["truncated"] is True
    text = stream.stdout
    assert "[output truncated" in text
    assert len(text.encode()) < 1024 * 1024 + 200


def test_json_mode(client: httpx.Client, session_id: str) -> None:
    response = client.post(
        f"/sessions/{session_id}/execute",
        json={"code": "print('hi'); 1/0"},
        headers={"Accept": "application/json"},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "error"
    assert body["stdout"] == "hi\n"
    assert body["error"]["ename"] == "ZeroDivisionError"
    assert [e["event"] for e in body["events"]][-1] == "done"


def test_session_crud(client: httpx.Client) -> None:
    created = client.post("/sessions")
    assert created.status_code == 201
    sid = created.json()["id"]
    assert created.headers["location"] == f"/sessions/{sid}"
    assert client.get(f"/sessions/{sid}").json()["status"] == "idle"
    assert sid in [s["id"] for s in client.get("/sessions").json()["sessions"]]
    assert client.delete(f"/sessions/{sid}").status_code == 204
    assert client.get(f"/sessions/{sid}").status_code == 404
    assert client.delete(f"/sessions/{sid}").status_code == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/sessions/nope"),
        ("DELETE", "/sessions/nope"),
        ("POST", "/sessions/nope/execute"),
        ("POST", "/sessions/nope/interrupt"),
        ("POST", "/sessions/nope/restart"),
        ("GET", "/sessions/..%2F..%2Fetc"),
    ],
)
def test_unknown_session_is_404(client: httpx.Client, method: str, path: str) -> None:
    response = client.request(method, path, json={"code": "1"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] in ("session_not_found", "not_found")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"not json", 400),
        (b"{", 400),
        (b"", 400),
        (b"[1, 2]", 422),
        (b'{"timeout": 1}', 422),
        (b'{"code": 5}', 422),
        (b'{"code": "1", "timeout": -1}', 422),
        (b'{"code": "1", "timeout": "soon"}', 422),
        (b'{"code": "1", "timeout": true}', 422),
        (b'{"code": "1", "timeout": 1e9}', 422),
        (b'{"code": "1", "extra": 1}', 422),
    ],
)
def test_malformed_execute(client: httpx.Client, session_id: str, body: bytes, status: int) -> None:
    response = client.post(
        f"/sessions/{session_id}/execute",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] in ("bad_request", "invalid_request")
    assert error["message"]


def test_oversized_body_is_413(client: httpx.Client, session_id: str) -> None:
    code = "x = '" + "a" * (3 * 1024 * 1024) + "'"
    response = client.post(f"/sessions/{session_id}/execute", json={"code": code})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert client.get("/nowhere").json()["error"]["type"] == "not_found"
    response = client.put("/sessions")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "method_not_allowed"


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_json_bodies_need_a_json_content_type(
    client: httpx.Client, session_id: str, content_type: str | None
) -> None:
    # What a cross-site <form> or fetch without preflight could send must not run code.
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post(
        f"/sessions/{session_id}/execute", content=b'{"code": "1"}', headers=headers
    )
    assert response.status_code == 415
    assert response.json()["error"]["type"] == "unsupported_media_type"


def test_a_rebound_host_name_is_refused(client: httpx.Client) -> None:
    response = client.post("/sessions", headers={"Host": "attacker.example:8888"})
    assert response.status_code == 400
    assert "loopback" in response.json()["error"]["message"]
    assert client.get("/health", headers={"Host": "localhost:1"}).status_code == 200


def test_subprocess_and_fd_level_output_reach_the_stream(
    client: httpx.Client, session_id: str
) -> None:
    code = (
        "import subprocess, os\n"
        "subprocess.run(['ls', '/no/such/dir'])\n"
        "os.system('echo from-the-shell')\n"
    )
    stream = execute(client, session_id, code)
    stderr = "".join(d["text"] for d in stream.named("stderr"))
    assert "/no/such/dir" in stderr
    assert "from-the-shell" in stream.stdout


def test_thread_display_goes_to_the_cell_that_started_it(
    client: httpx.Client, session_id: str
) -> None:
    code = (
        "import threading, time\n"
        "from IPython.display import display\n"
        "def later():\n"
        "    time.sleep(0.3); display('from-thread')\n"
        "threading.Thread(target=later).start()\n"
    )
    first = execute(client, session_id, code)
    assert first.named("display") == []
    second = execute(client, session_id, "import time; time.sleep(0.6)")
    assert second.named("display") == []


def test_executor_output_goes_to_the_submitting_cell(client: httpx.Client, session_id: str) -> None:
    execute(
        client,
        session_id,
        "from concurrent.futures import ThreadPoolExecutor\n"
        "pool = ThreadPoolExecutor(2)\npool.submit(print, 'warm').result()",
    )
    stream = execute(client, session_id, "pool.submit(print, 'in-this-cell').result()")
    assert stream.stdout == "in-this-cell\n"


def test_restart_drops_cells_queued_behind_a_stuck_one(
    client: httpx.Client, session_id: str
) -> None:
    import threading

    results: list[str] = []

    def run(code: str) -> None:
        results.append(execute(client, session_id, code).done["status"])

    stuck = threading.Thread(target=run, args=("import time; time.sleep(60)",))
    stuck.start()
    time.sleep(0.5)
    queued = threading.Thread(target=run, args=("import time; time.sleep(60)",))
    queued.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert client.post(f"/sessions/{session_id}/restart").status_code == 200
    stuck.join(15)
    queued.join(15)
    assert time.monotonic() - started < 15
    assert sorted(results) == ["interrupted", "interrupted"]
    assert execute(client, session_id, "print('fresh')").stdout == "fresh\n"


@pytest.mark.parametrize(
    "body",
    [
        b'{"code": "1", "timeout": 1' + b"0" * 400 + b"}",
        b'{"code": "\\ud800"}',
    ],
)
def test_unusual_values_are_422_not_500(client: httpx.Client, session_id: str, body: bytes) -> None:
    response = client.post(
        f"/sessions/{session_id}/execute",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert execute(client, session_id, "print('ok')").stdout == "ok\n"


def test_preloading_leaves_no_names_behind(client: httpx.Client, session_id: str) -> None:
    code = (
        "import sys\n"
        "user = sorted(k for k in globals() if not k.startswith('_') and k != 'sys')\n"
        "print(user)\n"
        "print('__kg_preload' in globals(), 'matplotlib.pyplot' in sys.modules)\n"
    )
    stream = execute(client, session_id, code)
    assert stream.done["execution_count"] == 1  # preloading did not count as a cell
    names, flags = stream.stdout.splitlines()
    # Exactly what IPython itself defines (ipykernel 7 adds `open`), nothing preloaded.
    assert set(eval(names)) <= {"In", "Out", "exit", "get_ipython", "open", "quit"}
    assert flags == "False True"


def test_invalid_utf8_from_a_subprocess_does_not_silence_later_output(
    client: httpx.Client, session_id: str
) -> None:
    bad = execute(
        client,
        session_id,
        "import subprocess, time\n"
        "subprocess.run(['printf', 'bad \\\\377\\\\376 bytes\\\\n']); time.sleep(0.5)",
    )
    assert "bad" in bad.stdout and "bytes" in bad.stdout
    later = execute(
        client, session_id, "import os, time; os.system('echo still here'); time.sleep(0.5)"
    )
    assert later.stdout == "still here\n"


def test_kernel_release_shows_the_isolation(
    client: httpx.Client, session_id: str, backend_name: str
) -> None:
    import platform

    release = execute(client, session_id, "import platform; print(platform.release())").stdout
    if backend_name == "gvisor":
        assert release == "4.4.0\n"  # gVisor's own kernel, not the host's
    else:
        assert release == platform.release() + "\n"  # runc and local share the host kernel


def test_a_malformed_message_from_the_kernel_is_dropped_not_fatal(
    client: httpx.Client, session_id: str
) -> None:
    # Code can sign messages with its own kernel's key: publish a `stream` whose content
    # is a list, parented to this very cell. The reader must drop it and carry on.
    code = (
        "k = get_ipython().kernel\n"
        "k.session.send(k.iopub_socket, 'stream', b'[1, 2]', parent=k.get_parent('shell'))\n"
        "del k\n"
        "print('after', flush=True)"
    )
    stream = execute(client, session_id, code, timeout=20)
    assert stream.stdout == "after\n"
    assert stream.done["status"] == "ok"
    assert execute(client, session_id, "print('next')").stdout == "next\n"
