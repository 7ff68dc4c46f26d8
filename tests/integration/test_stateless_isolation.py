"""Stateless requests forked from one fork server cannot reach each other (docker backend).

Request A tries to leave something behind, or to reach request B; B looks for it. The
sequential tests run A and B in the same fork-server container (one server, checked by
its hostname), which is the hard case: two requests in different containers are
separated by Docker itself. The concurrent tests run a bad request beside good ones.
"""

from __future__ import annotations

import base64
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api import collected
from tests.support.backends import backend_settings, require_backend
from tests.support.server import ServerThread

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["docker"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    require_backend(request.param)
    settings = backend_settings(
        request.param,
        tmp_path_factory.mktemp("iso"),
        pool_size=0,
        fork_servers=2,
        max_stateless=8,
        memory_limit="512m",
        pids_limit=128,
        stateless_mode="fork",
    )
    with ServerThread(settings) as server:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            wait_for_servers(c, 2)
        yield server


def wait_for_servers(client: httpx.Client, count: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        servers = client.get("/health").json()["fork_servers"]
        if servers["idle"] >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"fork servers not ready: {servers}")


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def run(client: httpx.Client, code: str, timeout: float = 20) -> dict[str, Any]:
    return collected(client, "/execute", {"code": textwrap.dedent(code), "timeout": timeout})


def ok(client: httpx.Client, code: str) -> str:
    result = run(client, code)
    assert result["status"] == "ok", result
    return str(result["stdout"])


HOST = "import socket; print(socket.gethostname())\n"


def settle(client: httpx.Client) -> None:
    """Wait until the last request's fork server is idle again (it cleans up after the
    response): the next request then goes to it (the most recently used idle server)."""
    deadline = time.monotonic() + 30
    while client.get("/health").json()["fork_servers"]["busy"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)


FULL = "import pandas as _full\n"
"""A cell that imports pandas is forked from the fork server's full template, one that
imports only standard modules and numpy or matplotlib from the light one."""


@pytest.fixture(params=["light", "full"])
def template(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def same_server(
    client: httpx.Client, first: str, then: str, template: str = "light"
) -> tuple[str, str]:
    """Run `first`, then `then`, in the same fork-server container (forked from its
    `template`); their outputs."""
    head = HOST + (FULL if template == "full" else "")
    for _ in range(ATTEMPTS):
        a = ok(client, head + textwrap.dedent(first))
        settle(client)
        b = ok(client, head + textwrap.dedent(then))
        host_b, _, out_b = b.partition("\n")
        # (A's own threads may print before its first line)
        if host_b in a.splitlines():
            return a.replace(host_b + "\n", "", 1), out_b
        settle(client)  # A's server was replaced meanwhile (a fresh one took B): again
    raise AssertionError(f"{ATTEMPTS} pairs of requests each ran in two containers")


ATTEMPTS = 4


def test_each_request_has_a_uid_of_its_own_and_no_capabilities(
    client: httpx.Client, template: str
) -> None:
    code = """
        import os
        status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())
        print(os.getuid(), os.geteuid(), os.getgid(), status['CapEff'].strip(), os.getgroups())
    """
    a, b = same_server(client, code, code, template)
    uid_a, euid, gid, caps, groups = a.split(maxsplit=4)
    assert uid_a == euid == gid and int(uid_a) >= 1_000_000
    assert int(caps, 16) == 0 and groups.strip() == "[]"
    assert b.split()[0] != uid_a


def test_files_left_anywhere_writable_are_gone(client: httpx.Client, template: str) -> None:
    leave = """
        import os
        for d in ['.', '/tmp', '/dev/shm', os.path.expanduser('~'), '/workspace']:
            with open(os.path.join(d, 'left-by-a'), 'w') as f:
                f.write('secret')
            os.makedirs(os.path.join(d, 'dir-by-a', 'deep'), exist_ok=True)
        os.chmod('/tmp/left-by-a', 0o666)
        print('left')
    """
    look = """
        import os
        found = {d: sorted(os.listdir(d)) for d in
                 ['.', '/tmp', '/dev/shm', os.path.expanduser('~'), '/workspace']}
        print(found)
    """
    _, found = same_server(client, leave, look, template)
    assert "by-a" not in found, found


def test_writable_places_are_private_to_the_request(client: httpx.Client) -> None:
    out = ok(
        client,
        """
        import os, stat
        for d in ['/workspace', '/tmp', '/dev/shm', os.path.expanduser('~')]:
            st = os.stat(d)
            print(d, st.st_uid == os.getuid(), oct(stat.S_IMODE(st.st_mode)))
        """,
    )
    for line in out.splitlines():
        _, mine, mode = line.split()
        assert mine == "True" and mode == "0o700", line


def test_detached_processes_do_not_outlive_the_request(client: httpx.Client, template: str) -> None:
    leave = """
        import os, subprocess, time
        # a daemon: double fork + setsid, and one more with a new session via Popen
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True:
                    try:
                        open('/tmp/daemon-was-here', 'w').write('x')
                    except OSError:
                        pass
                    time.sleep(0.05)
            os._exit(0)
        subprocess.Popen(['sleep', '1000'], start_new_session=True)
        os.system('nohup sleep 1000 >/dev/null 2>&1 &')
        time.sleep(0.3)
        print('spawned')
    """
    look = """
        import os, time
        time.sleep(0.5)
        me = os.getuid()
        others = []
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                try:
                    uid = os.stat(f'/proc/{pid}').st_uid
                except FileNotFoundError:
                    continue
                if uid not in (0, me):
                    others.append((pid, uid))
        print(others, os.path.exists('/tmp/daemon-was-here'))
    """
    _, found = same_server(client, leave, look, template)
    assert found.strip() == "[] False"


def test_environment_modules_builtins_and_threads_start_fresh(
    client: httpx.Client, template: str
) -> None:
    leave = """
        import builtins, json, math, os, sys, threading, time, types, numpy
        os.environ['LEFT_BY_A'] = 'secret'
        os.putenv('PUT_BY_A', 'secret')
        json.loads = lambda *a, **k: 'patched'
        math.pi = 3
        numpy.sum = lambda *a, **k: -1
        builtins.abs = lambda x: 42
        builtins.LEFT = 'secret'
        sys.modules['planted_by_a'] = types.ModuleType('planted_by_a')
        def loop():
            while True:
                print('thread of A', flush=True)
                time.sleep(0.01)
        threading.Thread(target=loop, daemon=True, name='loop-of-a').start()
        time.sleep(0.1)
    """
    look = """
        import builtins, json, math, os, sys, threading, numpy
        print(os.environ.get('LEFT_BY_A'), os.environ.get('PUT_BY_A'), json.loads('1'),
              math.pi == 3, numpy.sum([1, 2]), abs(-1), hasattr(builtins, 'LEFT'),
              'planted_by_a' in sys.modules,
              [t.name for t in threading.enumerate() if t.name == 'loop-of-a'])
    """
    _, found = same_server(client, leave, look, template)
    assert found == "None None 1 False 3 1 False False []\n"
    assert "thread of A" not in found


def test_another_requests_code_and_output_are_nowhere_to_read(
    client: httpx.Client, template: str
) -> None:
    secret = "S3CR3T-" + "x9q" * 4
    leave = f"""
        value = '{secret}'
        print(value)
        import sys; sys.stderr.write(value)
    """
    look = """
        import gc, os, re
        needle = 'S3CR3T-' + 'x9q' * 4
        hits = [o for o in gc.get_objects() if isinstance(o, str) and needle in o]
        # every readable byte of this process's own memory
        mem_hits = 0
        with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if 'r' not in perms or line.rstrip().endswith(('[vvar]', '[vsyscall]')):
                    continue
                start, end = (int(x, 16) for x in span.split('-'))
                # in slices (an allocator may map a large reserve), overlapping by the
                # needle's length so that none is cut in two
                tail = b''
                for at in range(start, end, 1 << 24):
                    try:
                        mem.seek(at)
                        chunk = tail + mem.read(min(1 << 24, end - at))
                    except (OSError, ValueError, OverflowError):
                        break
                    mem_hits += chunk.count(needle.encode())
                    tail = chunk[-(len(needle) - 1):]
        # the needle is in this cell's own code once (as two parts) only: count whole hits
        print(len([h for h in hits if needle in h and 'needle' not in h]), mem_hits)
    """
    _, found = same_server(client, leave, look, template)
    strings, _ = found.split()
    assert strings == "0"


def test_the_fork_server_and_other_processes_cannot_be_read_signalled_or_traced(
    client: httpx.Client,
) -> None:
    out = ok(
        client,
        """
        import ctypes, errno, os, signal
        libc = ctypes.CDLL(None, use_errno=True)
        me = os.getpid()
        mine = open('/proc/self/environ', 'rb').read()
        results = []
        for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != me]:
            pid = int(pid)
            if os.stat(f'/proc/{pid}').st_uid == os.getuid():
                continue  # its own helpers (none expected)
            try:
                open(f'/proc/{pid}/mem', 'rb').read(1)
                results.append(f'read {pid} mem')
            except OSError:
                pass
            try:
                # gVisor lets it read the fork server's environment, which is exactly the
                # one the request itself started with: nothing it does not already have.
                if open(f'/proc/{pid}/environ', 'rb').read() != mine:
                    results.append(f'read {pid} environ')
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGTERM)
                results.append(f'signalled {pid}')
            except (PermissionError, ProcessLookupError):
                pass
            if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
                results.append(f'traced {pid}')
        print(results)
        """,
    )
    assert out == "[]\n"
    assert ok(client, "print(1)") == "1\n"  # the fork server is unharmed


def test_sysv_ipc_objects_do_not_carry_over(client: httpx.Client) -> None:
    leave = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        # IPC_CREAT | 0666: shared memory, a semaphore set, a message queue
        made = [libc.shmget(0x5eed, 4096, 0o1666), libc.semget(0x5eef, 1, 0o1666),
                libc.msgget(0x5ef0, 0o1666)]
        print(all(ident >= 0 for ident in made))
    """
    look = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5eed, 0, 0), libc.semget(0x5eef, 0, 0), libc.msgget(0x5ef0, 0))
    """
    made, found = same_server(client, leave, look)
    assert made.strip() == "True"
    assert found.split() == ["-1", "-1", "-1"]


def test_a_request_that_crashes_exhausts_memory_or_fork_bombs_fails_alone(
    client: httpx.Client,
) -> None:
    bad = {
        "crash": "import ctypes; ctypes.string_at(0)",
        "memory": "x = []\nwhile True:\n    x.append(bytearray(64 * 1024 * 1024))",
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        pass",
    }
    good = "import time; time.sleep(0.5); print(sum(range(10)))"
    gvisor = "runsc" in client.get("/health").json()["isolation"]

    def one(code: str) -> dict[str, Any]:
        return run(client, code, timeout=8)

    for name, code in bad.items():
        with ThreadPoolExecutor(2) as pool:
            bad_result = pool.submit(one, code)
            time.sleep(0.05)
            good_result = pool.submit(one, good)
            failed, fine = bad_result.result(), good_result.result()
        assert failed["status"] in ("died", "error", "timeout"), (name, failed)
        assert fine["status"] == "ok" and fine["stdout"] == "45\n", (name, fine)
        if name == "memory" and failed["status"] == "died" and not gvisor:
            # (gVisor does not count out-of-memory kills where the fork server can read)
            assert failed["done"]["reason"] == "out_of_memory", failed
    # and the service is whole afterwards
    assert ok(client, "print('after')") == "after\n"


def test_files_given_with_a_request_are_its_own(client: httpx.Client) -> None:
    body = {
        "code": "open('data/in.csv', 'a').write('3\\n')\n"
        "open('data/out.csv', 'w').write(open('data/in.csv').read())\n"
        "import os; print(os.stat('data').st_uid == os.getuid())",
        "files": [{"path": "data/in.csv", "data": base64.b64encode(b"n\n1\n2\n").decode()}],
    }
    response = client.post("/execute", json=body, headers={"Accept": "application/json"})
    result = response.json()
    assert result["status"] == "ok", result
    assert result["stdout"] == "True\n"
    files = {e["data"]["path"]: e["data"] for e in result["events"] if e["event"] == "file"}
    assert base64.b64decode(files["data/out.csv"]["data"]) == b"n\n1\n2\n3\n"


def test_limits_still_apply_per_request(client: httpx.Client) -> None:
    timed = run(client, "import time; time.sleep(30)", timeout=1)
    assert timed["status"] == "timeout"
    flood = run(client, "print('x' * 3_000_000)")
    assert flood["status"] == "ok" and flood["done"]["truncated"] is True
    assert ok(client, "print(2)") == "2\n"


def test_health_and_metrics_report_the_fork_servers(client: httpx.Client) -> None:
    settle(client)
    before = client.get("/health").json()["fork_servers"]["requests_served"]
    for _ in range(3):
        ok(client, "pass")
    settle(client)
    health = client.get("/health").json()
    assert health["stateless_mode"] == "fork"
    servers = health["fork_servers"]
    assert servers["target"] == 2 and servers["busy"] == 0
    assert servers["requests_served"] == before + 3
    scrape = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
    }
    assert scrape[("kernel_gateway_fork_server_requests_total", ())] == before + 3
    assert scrape[("kernel_gateway_fork_servers", (("state", "busy"),))] == 0
    idle = scrape[("kernel_gateway_fork_servers", (("state", "idle"),))]
    starting = scrape[("kernel_gateway_fork_servers", (("state", "starting"),))]
    assert (idle, starting) == (servers["idle"], servers["starting"])


def test_under_gvisor_auto_gives_each_request_a_container(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_backend("gvisor")
    settings = backend_settings("gvisor", tmp_path_factory.mktemp("gv"), pool_size=1)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        health = c.get("/health").json()
        assert health["stateless_mode"] == "container" and "fork_servers" not in health
        assert ok(c, "print(6 * 7)") == "42\n"
