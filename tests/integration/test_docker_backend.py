"""The docker backend against the real engine: hardening, deaths from outside, OOM."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from docker.models.containers import Container

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.docker import DockerBackend
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from tests.support.api import execute
from tests.support.backends import require_docker, settings_for
from tests.support.server import ServerFactory, ServerThread

LABEL_INSTANCE = "io.kernel-gateway.instance"
LABEL_ROLE = "io.kernel-gateway.role"


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("docker", pool_size=0, memory_limit="256m", token="tok")


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": "Bearer tok"}
    with httpx.Client(base_url=server.url, timeout=60, headers=headers) as c:
        yield c


@pytest.fixture
def sid(client: httpx.Client) -> Iterator[str]:
    session_id: str = client.post("/sessions").json()["id"]
    yield session_id
    client.delete(f"/sessions/{session_id}")


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


def session_container(client: httpx.Client, engine: docker.DockerClient, sid: str) -> Container:
    """The running container of a session (the pool is empty, so there is only one;
    fork servers have a role of their own)."""
    instance = client.get("/health").json()["instance"]
    labels = [f"{LABEL_INSTANCE}={instance}", f"{LABEL_ROLE}=kernel"]
    running = engine.containers.list(filters={"label": labels})
    assert len(running) == 1, [c.name for c in running]
    return running[0]


def test_container_is_hardened(client: httpx.Client, engine: docker.DockerClient, sid: str) -> None:
    container = session_container(client, engine, sid)
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert host["ReadonlyRootfs"] is True
    assert host["Init"] is True
    assert host["Memory"] == 256 * 1024 * 1024
    assert host["MemorySwap"] == host["Memory"]  # no swap
    assert host["NanoCpus"] > 0 and host["PidsLimit"] > 0
    assert not any("docker.sock" in b for b in host.get("Binds") or [])
    assert container.attrs["Config"]["User"] != "0:0"

    code = (
        "import os, socket\n"
        "print(os.getuid() != 0)\n"
        "print(any(k.startswith('KG_') for k in os.environ))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net')\n"
        "except OSError:\n"
        "    print('no net')\n"
        "try:\n"
        "    open('/usr/evil', 'w'); print('wrote')\n"
        "except OSError:\n"
        "    print('read-only')\n"
        "print(os.getcwd())\n"
    )
    stream = execute(client, sid, code)
    assert stream.stdout == "True\nFalse\nno net\nread-only\n/home/user\n"


def test_container_killed_from_outside(
    client: httpx.Client, engine: docker.DockerClient, sid: str
) -> None:
    execute(client, sid, "state = 1")
    container = session_container(client, engine, sid)
    threading.Timer(1.0, container.kill).start()
    started = time.monotonic()
    stream = execute(client, sid, "import time; time.sleep(60)")
    assert time.monotonic() - started < 10
    assert stream.done["status"] == "died"
    assert stream.done["reason"] == "killed"
    after = execute(client, sid, "print('state' in globals())")
    assert after.stdout == "False\n"
    assert after.done["restarted"] is True


def test_out_of_memory_is_a_death_with_its_reason(client: httpx.Client, sid: str) -> None:
    stream = execute(client, sid, "x = bytearray(1024 ** 3)")
    assert stream.done["status"] == "died"
    assert stream.done["reason"] == "out_of_memory"
    assert "out of memory" in stream.named("error")[0]["evalue"]
    assert execute(client, sid, "print('back')").stdout == "back\n"


async def test_launch_failures_are_kernel_unavailable(tmp_path: Path) -> None:
    """Whatever goes wrong at launch (here: the engine knows no such OCI runtime)."""
    require_docker()
    runtime = RuntimeDir(tmp_path / "rt")
    runtime.open()
    settings = settings_for("docker", tmp_path / "rt", runtime="kg-no-such-runtime")
    backend = DockerBackend(settings, runtime)
    try:
        await backend.start()
        storage = await backend.prepare_storage(runtime.new_workspace())
        with pytest.raises(KernelUnavailable, match="could not start a kernel container"):
            await backend.launch(storage)
        await backend.release_storage(storage)
        assert not list((runtime.path / "k").iterdir())  # its connection folder is gone too
    finally:
        await backend.close()
        runtime.close()


def test_a_sessions_metrics_are_its_containers(client: httpx.Client, sid: str) -> None:
    """CPU, memory and disk of the session's own container and disk: a sample at once for
    a new session, another per 5 s; memory held by a cell shows; bounds filter by time."""
    first = client.get(f"/sessions/{sid}/metrics")
    assert first.status_code == 200, first.text
    (sample,) = first.json()["metrics"]
    assert sample["cpu_count"] >= 1 and 0 <= sample["cpu_used_pct"] <= 100
    assert sample["mem_total"] == 256 * 2**20 and 0 < sample["mem_used"] < sample["mem_total"]
    assert 0 < sample["disk_used"] <= sample["disk_total"]
    code = "import time\nblock = b'x' * (96 * 2**20)\nt = time.time()\n"
    code += "while time.time() - t < 1:\n    pass"
    assert execute(client, sid, code).done["status"] == "ok"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        samples = client.get(f"/sessions/{sid}/metrics").json()["metrics"]
        if len(samples) > 1 and samples[-1]["mem_used"] > sample["mem_used"] + 64 * 2**20:
            break
        time.sleep(1)
    else:
        raise AssertionError(samples)
    stamps = [s["timestamp"] for s in samples]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    later = client.get(f"/sessions/{sid}/metrics", params={"start": time.time() + 3600})
    assert later.json() == {"metrics": []}
    bad = client.get(f"/sessions/{sid}/metrics", params={"start": "yesterday"})
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request"
    assert client.get("/sessions/nope/metrics").status_code == 404
