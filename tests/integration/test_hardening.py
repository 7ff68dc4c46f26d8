"""Adversarial suite: hostile code and hostile clients never hurt the gateway or other sessions.

Run alone with `pytest -m adversarial`. Every test checks the exact outcome and
that a canary session in the same gateway still answers quickly afterwards.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.api import execute
from tests.support.backends import require_docker, settings_for
from tests.support.processes import gateway
from tests.support.server import ServerThread

pytestmark = pytest.mark.adversarial

CANARY_SECONDS = 3.0


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A docker gateway with small limits, so every bomb hits a wall quickly."""
    require_docker()
    settings = settings_for(
        "docker",
        tmp_path_factory.mktemp("hostile"),
        pool_size=2,
        max_sessions=16,
        memory_limit="512m",
        workspace_size="64m",
        pids_limit=128,
        preload="",
        token="canary-token",
    )
    with ServerThread(settings) as server:
        yield server


@pytest.fixture
def client(hostile: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": "Bearer canary-token"}
    with httpx.Client(base_url=hostile.url, timeout=120, headers=headers) as c:
        yield c


@pytest.fixture(scope="module")
def canary(hostile: ServerThread) -> Iterator[str]:
    headers = {"Authorization": "Bearer canary-token"}
    with httpx.Client(base_url=hostile.url, timeout=60, headers=headers) as c:
        sid = c.post("/sessions").json()["id"]
        execute(c, sid, "alive = 'yes'")
        yield sid
        c.delete(f"/sessions/{sid}")


@pytest.fixture
def sid(client: httpx.Client, canary: str) -> Iterator[str]:
    session_id: str = client.post("/sessions").json()["id"]
    yield session_id
    client.delete(f"/sessions/{session_id}")
    check_canary(client, canary)


def check_canary(client: httpx.Client, canary: str) -> None:
    started = time.monotonic()
    stream = execute(client, canary, "print(alive)")
    assert stream.stdout == "yes\n", "the canary session lost its state"
    assert time.monotonic() - started < CANARY_SECONDS, "the canary session became slow"
    assert client.get("/health").json()["status"] == "ok"


# -- resource bombs ----------------------------------------------------------------------------


def test_fork_bomb_hits_the_pids_limit(client: httpx.Client, sid: str) -> None:
    code = (
        "import os, time\n"
        "children = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        children += 1\n"
        "except OSError as e:\n"
        "    print('stopped by', e.errno, 'after', children)\n"
    )
    stream = execute(client, sid, code, timeout=30)
    assert stream.done["status"] == "ok"
    match = re.match(r"stopped by (\d+) after (\d+)", stream.stdout)
    assert match, stream.stdout
    assert int(match.group(1)) == 11  # EAGAIN
    assert int(match.group(2)) < 128


def test_thread_bomb_hits_the_pids_limit(client: httpx.Client, sid: str) -> None:
    code = (
        "import threading, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n"
        "except RuntimeError as e:\n"
        "    print('stopped:', e)\n"
    )
    stream = execute(client, sid, code, timeout=30)
    assert "stopped: can't start new thread" in stream.stdout


def test_memory_bomb_is_killed_as_out_of_memory(client: httpx.Client, sid: str) -> None:
    stream = execute(client, sid, "hog = bytearray(2 * 1024 ** 3)", timeout=30)
    assert stream.done["status"] == "died"
    assert stream.done["reason"] == "out_of_memory"
    assert execute(client, sid, "print('recovered')").stdout == "recovered\n"


def test_disk_fill_stops_at_the_workspace_cap(
    client: httpx.Client, sid: str, hostile: ServerThread
) -> None:
    """Working directory, /tmp and home share one 64 MB disk: full is ENOSPC, never a death."""
    code = (
        "import errno, os\n"
        "written = 0\n"
        "try:\n"
        "    with open('fill.bin', 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'0' * 2**20); f.flush(); written += 1\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno], written)\n"
        "os.remove('fill.bin')\n"
    )
    execute(client, sid, "kept = 'yes'")
    stream = execute(client, sid, code, timeout=60)
    errname, megabytes = stream.stdout.split()
    assert errname == "ENOSPC"
    assert 32 <= int(megabytes) <= 64
    # /tmp is the same disk: what the working directory holds, /tmp cannot have.
    execute(client, sid, "open('half.bin', 'wb').write(b'0' * 40 * 2**20)")
    tmp = execute(client, sid, code.replace("'fill.bin'", "'/tmp/fill.bin'"), timeout=60)
    errname, megabytes = tmp.stdout.split()
    assert errname == "ENOSPC"
    assert int(megabytes) <= 24
    assert execute(client, sid, "print(kept)").stdout == "yes\n"


def test_fd_exhaustion_hits_the_open_files_limit(client: httpx.Client, sid: str) -> None:
    code = (
        "files = []\n"
        "try:\n"
        "    while True:\n"
        "        files.append(open('/dev/null'))\n"
        "except OSError as e:\n"
        "    print(e.errno, len(files) < 1024)\n"
        "for f in files: f.close()\n"
    )
    assert execute(client, sid, code).stdout == "24 True\n"  # EMFILE


# -- escape attempts ---------------------------------------------------------------------------


def test_the_box_has_no_way_out(client: httpx.Client, sid: str) -> None:
    code = (
        "import os, socket\n"
        "status = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines()"
        " if ':\\t' in l)\n"
        "print('caps', status['CapEff'].strip(), status['CapBnd'].strip())\n"
        "print('nnp', status['NoNewPrivs'].strip())\n"
        "print('uid', os.getuid())\n"
        "print('sock', any(os.path.exists(p) for p in "
        "['/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock']))\n"
        "print('secrets', sorted(k for k in os.environ if 'TOKEN' in k or k.startswith('KG_')))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net open')\n"
        "except OSError:\n"
        "    print('net closed')\n"
        "for path in ['/etc/passwd', '/usr/bin/evil', '/root/x', '/proc/sys/kernel/hostname']:\n"
        "    try:\n"
        "        open(path, 'a').write('x'); print('wrote', path)\n"
        "    except OSError as e:\n"
        "        print('refused', path)\n"
        "print('interfaces', sorted(os.listdir('/sys/class/net')))\n"
        "print('seccomp', status['Seccomp'].strip())\n"
    )
    out = execute(client, sid, code).stdout.splitlines()
    assert out[0] == "caps 0000000000000000 0000000000000000"
    assert out[1] == "nnp 1"
    assert out[2] == "uid 1000"
    assert out[3] == "sock False"
    assert out[4] == "secrets []"
    assert out[5] == "net closed"
    assert [line.split()[0] for line in out[6:10]] == ["refused"] * 4
    assert out[10] == "interfaces ['lo']"
    assert out[11] == "seccomp 2"  # Docker's default seccomp filter is on


def test_the_gateway_token_is_nowhere_in_the_box(client: httpx.Client, sid: str) -> None:
    code = (
        "import os, subprocess\n"
        "needle = 'canary' + '-token'  # built here, so this cell's own text cannot match\n"
        "found = subprocess.run(['grep', '-rl', needle, '/proc/1/environ', '/conn', "
        "'/workspace', '/tmp', os.path.expanduser('~')], capture_output=True, text=True)\n"
        "print(repr(found.stdout))\n"
    )
    assert execute(client, sid, code).stdout == "''\n"


def test_host_files_are_out_of_reach_through_symlinks_and_the_file_api(
    client: httpx.Client, sid: str
) -> None:
    code = (
        "import os\n"
        "os.symlink('/etc/shadow', 'shadow')\n"
        "os.symlink('/proc/1/root', 'root')\n"
        "print('made')\n"
    )
    assert execute(client, sid, code).stdout == "made\n"
    for path in ("shadow", "root/etc/shadow", "../../../../etc/shadow"):
        response = client.get(f"/sessions/{sid}/files/{path}")
        assert response.status_code in (400, 403, 404), path
        assert b"root:" not in response.content


# -- output abuse ------------------------------------------------------------------------------


def raw_frames(client: httpx.Client, sid: str, code: str, timeout: float) -> list[list[str]]:
    """The SSE body split into frames exactly as sent."""
    body = {"code": code, "timeout": timeout}
    with client.stream("POST", f"/sessions/{sid}/execute", json=body) as response:
        raw = response.read().decode()
    return [frame.split("\n") for frame in raw.split("\n\n") if frame.strip()]


def test_output_flood_is_capped_and_every_frame_is_valid(client: httpx.Client, sid: str) -> None:
    frames = raw_frames(client, sid, "while True: print('x' * 100)", timeout=4)
    events, ids = [], []
    for frame in frames:
        if all(line.startswith(":") for line in frame):
            continue  # keepalive
        assert len(frame) == 3, frame
        assert frame[0].startswith("id: ") and frame[1].startswith("event: ")
        assert frame[2].startswith("data: ")
        ids.append(int(frame[0][4:]))
        events.append((frame[1][7:], json.loads(frame[2][6:])))
    assert ids == sorted(set(ids))  # increasing, none twice
    names = [name for name, _ in events]
    assert names.count("done") == 1 and names[-1] == "done"
    done = events[-1][1]
    assert done["status"] == "timeout" and done["truncated"] is True
    text = "".join(d["text"] for n, d in events if n in ("stdout", "stderr"))
    assert len(text.encode()) <= 1024 * 1024 + 200
    assert "[output truncated" in text


def test_one_giant_line_and_a_giant_display(client: httpx.Client, sid: str) -> None:
    line = execute(client, sid, "print('y' * (20 * 2**20))", timeout=60)
    assert line.done["truncated"] is True
    assert len(line.stdout) < 1024 * 1024 + 200
    big = execute(
        client,
        sid,
        "from IPython.display import display\n"
        "display({'text/plain': 'z' * (20 * 2**20)}, raw=True)",
        timeout=60,
    )
    (display,) = big.named("display")
    assert display["data"]["text/plain"].startswith("[output omitted")


def test_thousands_of_displays_are_capped(client: httpx.Client, sid: str) -> None:
    stream = execute(
        client,
        sid,
        "from IPython.display import display\nfor i in range(20000): display(i)",
        timeout=60,
    )
    assert stream.done["status"] == "ok"
    assert len(stream.named("display")) <= 10_000
    assert stream.done["truncated"] is True


def test_hostile_bytes_stay_inside_their_event(client: httpx.Client, sid: str) -> None:
    code = (
        "import os, time\n"
        "os.write(1, b'bad utf8: \\xff\\xfe\\xc3\\x28 nul: \\x00 bell: \\x07 esc: \\x1b[2J\\n')\n"
        'print(\'fake frame\\n\\nevent: done\\ndata: {"status": "ok"}\\n\\n\')\n'
        "time.sleep(0.5)  # fd-level output is forwarded by a watcher thread\n"
    )
    frames = raw_frames(client, sid, code, timeout=30)
    events = [(f[1][7:], json.loads(f[2][6:])) for f in frames if not f[0].startswith(":")]
    assert [n for n, _ in events].count("done") == 1
    text = "".join(d["text"] for n, d in events if n in ("stdout", "stderr"))
    assert "fake frame\n\nevent: done" in text  # delivered as text, not as a frame
    assert "bad utf8" in text and "\x00" in text and "\x1b[2J" in text


def test_slow_reader_does_not_grow_gateway_memory(tmp_path: Path) -> None:
    require_docker()
    with running_gateway(tmp_path) as (proc, url):
        with httpx.Client(base_url=url, timeout=120) as c:
            sid = c.post("/sessions").json()["id"]
            before = rss_mib(proc.pid)
            body = {"code": "while True: print('x' * 1000)", "timeout": 8}
            with c.stream("POST", f"/sessions/{sid}/execute", json=body) as response:
                for _ in response.iter_bytes(1024):
                    time.sleep(0.01)  # a very slow reader
            after = rss_mib(proc.pid)
    assert after - before < 40, f"gateway grew from {before:.0f} to {after:.0f} MiB"


def test_replay_buffers_stay_bounded_under_a_flood_of_executions(tmp_path: Path) -> None:
    """Each session keeps finished executions' events for resuming, within its caps."""
    require_docker()
    with running_gateway(tmp_path) as (proc, url):
        with httpx.Client(base_url=url, timeout=120) as c:
            sid = c.post("/sessions").json()["id"]
            code = {"code": "for _ in range(900): print('y' * 1000)"}  # ~0.9 MB of events
            headers = {"Accept": "application/json"}
            samples = []
            for i in range(60):
                response = c.post(f"/sessions/{sid}/execute", json=code, headers=headers)
                assert response.status_code == 200 and response.json()["status"] == "ok"
                if i in (29, 59):
                    samples.append(rss_mib(proc.pid))
            kept = c.get(f"/sessions/{sid}/executions").json()["executions"]
    assert len(kept) <= 20  # the 16 MiB cap holds about 17 of these
    assert samples[1] - samples[0] < 15, f"RSS went from {samples[0]:.0f} to {samples[1]:.0f} MiB"


# -- kernel deaths and the restart budget ------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reasons"),
    [
        ("import os; os._exit(3)", {"exited"}),
        ("import ctypes; ctypes.string_at(0)", {"signal"}),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", {"killed", "signal"}),
    ],
)
def test_kernel_deaths_end_the_stream_and_recover(
    client: httpx.Client, sid: str, code: str, reasons: set[str]
) -> None:
    started = time.monotonic()
    stream = execute(client, sid, code, timeout=30)
    assert time.monotonic() - started < 10
    assert stream.done["status"] == "died"
    assert stream.done["reason"] in reasons
    after = execute(client, sid, "print('back')")
    assert after.stdout == "back\n" and after.done["restarted"] is True


def test_exit_restarts_the_kernel(client: httpx.Client, sid: str) -> None:
    execute(client, sid, "gone = True")
    execute(client, sid, "exit()", timeout=30)
    after = execute(client, sid, "print('gone' in globals())")
    assert after.stdout == "False\n"
    assert after.done["restarted"] is True


def test_uninterruptible_c_loop_is_restarted_in_time(client: httpx.Client, sid: str) -> None:
    started = time.monotonic()
    stream = execute(client, sid, "sum(range(10**13))", timeout=2)
    elapsed = time.monotonic() - started
    assert stream.done["status"] == "timeout"
    assert stream.done["restarted"] is True
    assert elapsed < 2 + 1.0 + 3  # timeout + grace + margin; the restart continues after
    assert execute(client, sid, "print(1)").stdout == "1\n"


def test_a_kernel_that_keeps_dying_fails_the_session(tmp_path: Path) -> None:
    require_docker()
    settings = settings_for(
        "docker", tmp_path, pool_size=1, preload="", restart_budget=2, restart_window=120
    )
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        sid = c.post("/sessions").json()["id"]
        statuses = []
        for _ in range(3):
            stream = execute(c, sid, "import os; os._exit(1)")
            statuses.append(stream.done["status"])
        assert statuses == ["died"] * 3
        assert stream.done.get("session_failed") is True
        assert stream.named("error")[-1]["ename"] == "SessionFailed"
        response = c.post(f"/sessions/{sid}/execute", json={"code": "1"})
        assert response.status_code == 409
        assert response.json()["error"]["type"] == "session_failed"
        assert c.get(f"/sessions/{sid}").json()["status"] == "failed"


# -- API abuse ---------------------------------------------------------------------------------


def test_huge_declared_body_is_refused_before_it_is_sent(hostile: ServerThread) -> None:
    host, port = hostile.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /sessions/x/execute HTTP/1.1\r\nHost: localhost\r\n"
            b"Authorization: Bearer canary-token\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000000\r\n\r\n{"
        )
        started = time.monotonic()
        reply = sock.recv(4096)
    assert time.monotonic() - started < 2
    assert reply.startswith(b"HTTP/1.1 413") or reply.startswith(b"HTTP/1.1 404")


def test_wrong_tokens_get_identical_answers(hostile: ServerThread) -> None:
    answers = set()
    for auth in (None, "Bearer x", "Bearer " + "c" * 12, "Bearer canary-toke", "Basic abc"):
        headers = {"Authorization": auth} if auth else {}
        response = httpx.post(hostile.url + "/sessions", headers=headers)
        answers.add((response.status_code, response.text, response.headers["www-authenticate"]))
    assert len(answers) == 1 and next(iter(answers))[0] == 401


def test_thousands_of_bad_requests_leave_memory_flat(tmp_path: Path) -> None:
    with running_gateway(tmp_path, backend="local", token="t") as (proc, url):
        auth = {"Authorization": "Bearer t", "Content-Type": "application/json"}
        with httpx.Client(base_url=url, timeout=30) as c:

            def burst(n: int) -> None:
                for i in range(n):
                    c.get(f"/sessions/{'x' * (i % 300)}", headers=auth)
                    c.post("/sessions/nope/execute", content=b"{bad", headers=auth)
                    c.post("/sessions", headers={"Authorization": "Bearer wrong"})
                    c.get(f"/sessions/a/files/{'%2e%2e/' * 5}etc", headers=auth)

            burst(300)
            before = rss_mib(proc.pid)
            burst(1500)
            after = rss_mib(proc.pid)
            assert c.get("/health").status_code == 200
    assert after - before < 10, f"gateway grew from {before:.1f} to {after:.1f} MiB"


# -- load --------------------------------------------------------------------------------------


def test_fifty_sessions_twenty_cells_each(tmp_path: Path) -> None:
    require_docker()
    settings = settings_for(
        "docker", tmp_path, pool_size=8, max_sessions=60, preload="", max_concurrent_starts=6
    )
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=180) as c:
        ids = [c.post("/sessions").json()["id"] for _ in range(50)]
        canary = c.post("/sessions").json()["id"]
        canary_worst = 0.0
        stop = threading.Event()

        def watch_canary() -> None:
            nonlocal canary_worst
            with httpx.Client(base_url=server.url, timeout=60) as cc:
                while not stop.is_set():
                    started = time.monotonic()
                    assert execute(cc, canary, "print('ok')").stdout == "ok\n"
                    canary_worst = max(canary_worst, time.monotonic() - started)
                    time.sleep(0.2)

        def run_session(sid: str) -> list[str]:
            with httpx.Client(base_url=server.url, timeout=180) as sc:
                return [execute(sc, sid, f"print('{sid}:{i}')").stdout for i in range(20)]

        watcher = threading.Thread(target=watch_canary)
        watcher.start()
        try:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(50) as pool:
                results = dict(zip(ids, pool.map(run_session, ids), strict=True))
        finally:
            stop.set()
            watcher.join()
        for sid, outputs in results.items():
            assert outputs == [f"{sid}:{i}\n" for i in range(20)]
        assert canary_worst < 5, f"the canary took {canary_worst:.1f} s under load"


# -- helpers -----------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@contextmanager
def running_gateway(
    tmp: Path, backend: str = "docker", token: str | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`kernel-gateway serve` as its own process with one warm kernel, so its memory can be
    read: (process, url)."""
    args = ["--backend", backend, "--pool-size", "1", "--preload", "", "--log-level", "warning"]
    with gateway(tmp, *args, token=token) as gw:
        gw.wait_settled(1)
        yield gw.proc, gw.url


def test_local_kernels_run_in_a_bubblewrap_sandbox(tmp_path: Path) -> None:
    import shutil

    if shutil.which("bwrap") is None:
        if os.environ.get("KG_REQUIRE_DOCKER") == "1":
            pytest.fail("bubblewrap is missing (.ci/run installs it)")
        pytest.skip("bubblewrap (bwrap) is not installed")
    settings = settings_for("local", tmp_path, pool_size=0, preload="", token="local-secret")
    headers = {"Authorization": "Bearer local-secret"}
    with (
        ServerThread(settings) as server,
        httpx.Client(base_url=server.url, timeout=60, headers=headers) as c,
    ):
        assert c.get("/health").json()["isolation"].startswith("bubblewrap sandbox")
        other = c.post("/sessions").json()["id"]
        execute(c, other, "open('private.txt', 'w').write('other session')")
        sid = c.post("/sessions").json()["id"]
        code = (
            "import os, socket, glob\n"
            "print('pid', os.getpid(), len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
            "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
            "print('caps', caps[0])\n"
            "try:\n"
            "    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net open')\n"
            "except OSError:\n"
            "    print('net closed')\n"
            "try:\n"
            "    open('/usr/evil', 'w'); print('wrote /usr')\n"
            "except OSError:\n"
            "    print('system read-only')\n"
            "print('secrets', [k for k in os.environ if 'TOKEN' in k or k.startswith('KG_')])\n"
            "print('others', glob.glob('/tmp/**/private.txt', recursive=True))\n"
            "print('host', [p for p in ['/var/run/docker.sock', '/run/docker.sock', "
            "'/etc/shadow', '/home', '/root/.ssh', '/root/.bash_history'] if os.path.exists(p)])\n"
        )
        out = execute(c, sid, code).stdout.splitlines()
    assert out[0].startswith("pid 1 ")  # its own pid namespace: the gateway is invisible
    assert int(out[0].split()[2]) <= 3
    assert out[1] == "caps 0000000000000000"
    assert out[2:] == ["net closed", "system read-only", "secrets []", "others []", "host []"]


def test_network_option_gives_kernels_a_network(tmp_path: Path) -> None:
    require_docker()
    settings = settings_for("docker", tmp_path, pool_size=0, preload="", network="bridge")
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        assert "network 'bridge'" in c.get("/health").json()["isolation"]
        sid = c.post("/sessions").json()["id"]
        out = execute(c, sid, "import os; print(sorted(os.listdir('/sys/class/net')))").stdout
    assert "eth0" in out  # an interface to the bridge; nothing is sent in this test
