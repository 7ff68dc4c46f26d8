"""The `kernel-gateway` command as a user runs it: a real process, real containers."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import httpx

from tests.support.backends import require_docker
from tests.support.ports import free_port
from tests.support.processes import gateway

LABEL_INSTANCE = "io.kernel-gateway.instance"
LABEL_ROLE = "io.kernel-gateway.role"


@contextmanager
def serve(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`kernel-gateway serve` as a process (tests/support/processes.py): (process, url)."""
    with gateway(tmp_path, *args, env=env) as gw:
        yield gw.proc, gw.url


def containers_of(instance: str, role: str | None = None) -> list[str]:
    """The names of `instance`'s containers (of one `role`: kernel or fork-server)."""
    labels = [f"{LABEL_INSTANCE}={instance}"]
    if role is not None:
        labels.append(f"{LABEL_ROLE}={role}")
    client = docker.from_env()
    try:
        # The low-level listing: the high-level one inspects each container, and fails on
        # one removed between the listing and its inspection (a fork server replaced).
        found = client.api.containers(all=True, filters={"label": labels})
        return sorted(str(c["Names"][0]).lstrip("/") for c in found if c.get("Names"))
    finally:
        client.close()


def test_module_and_console_script_both_work() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kernel_gateway", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "serve" in out and "build-image" in out
    script = Path(sys.executable).parent / "kernel-gateway"
    out = subprocess.run(
        [str(script), "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in (
        "--host",
        "--port",
        "--backend",
        "--pool-size",
        "--max-sessions",
        "--token",
        "--no-auth",
        "--image",
        "--exec-timeout",
        "--idle-timeout",
    ):
        assert flag in out


def test_refuses_a_network_address_without_a_token(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_gateway",
            "serve",
            "--host",
            "0.0.0.0",
            "--runtime-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in result.stderr


def test_an_unparsable_size_stops_serve_before_anything_starts(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_gateway",
            "serve",
            "--backend",
            "local",
            "--port",
            str(free_port()),
            "--memory-limit",
            "lots",
            "--runtime-dir",
            str(tmp_path / "rt"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "kernel-gateway: --memory-limit (KG_MEMORY_LIMIT): 'lots' is not a size "
        "(examples: 512m, 1g, 1GiB, 1048576)\n"
    )
    assert not (tmp_path / "rt").exists()


def test_an_unsafe_runtime_dir_stops_serve_with_a_clear_message(tmp_path: Path) -> None:
    shared = tmp_path / "rt"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could have planted sockets or connection files here
    result = subprocess.run(
        [sys.executable, "-m", "kernel_gateway", "serve", "--backend", "local",
         "--port", str(free_port()), "--runtime-dir", str(shared)],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(f"kernel-gateway: runtime dir {shared} is writable by group")
    assert "Traceback" not in result.stderr
    assert list(shared.iterdir()) == []


def test_a_memory_limit_in_gib_reaches_the_container(tmp_path: Path) -> None:
    require_docker()
    args = ("--backend", "docker", "--pool-size", "0", "--memory-limit", "1GiB")
    with serve(tmp_path, *args) as (_, url):
        instance = httpx.get(url + "/health").json()["instance"]
        response = httpx.post(url + "/sessions", timeout=60)
        assert response.status_code == 201, response.text
        body = httpx.post(
            url + f"/sessions/{response.json()['id']}/execute",
            json={"code": "print('fits')"},
            headers={"Accept": "application/json"},
            timeout=60,
        ).json()
        assert body["stdout"] == "fits\n"
        client = docker.from_env()
        try:
            (name,) = containers_of(instance, role="kernel")
            host_config = client.api.inspect_container(name)["HostConfig"]
        finally:
            client.close()
        assert host_config["Memory"] == host_config["MemorySwap"] == 1024**3


def test_auto_falls_back_to_local_and_warns(tmp_path: Path) -> None:
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock", "KG_POOL_SIZE": "0"}
    with gateway(tmp_path, env=env) as gw:
        assert httpx.get(gw.url + "/health").json()["backend"] == "local"
        gw.stop()
        output = gw.log.read_text()
    assert "falling back to local" in output
    assert "backend: local; isolation:" in output
    assert (
        "WARNING: the local backend runs code as YOUR USER ON THIS HOST" in output
        or "kernels run in a bubblewrap sandbox but share this host's kernel" in output
    )


def test_shutdown_removes_every_container(tmp_path: Path) -> None:
    require_docker()
    with serve(tmp_path, "--backend", "docker", "--pool-size", "2") as (proc, url):
        health = httpx.get(url + "/health").json()
        assert health["backend"] == "docker"
        instance = health["instance"]
        sid = httpx.post(url + "/sessions", timeout=60).json()["id"]
        body = httpx.post(
            url + f"/sessions/{sid}/execute",
            json={"code": "print('in box')"},
            headers={"Accept": "application/json"},
            timeout=60,
        ).json()
        assert body["stdout"] == "in box\n"
        assert len(containers_of(instance)) >= 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    assert containers_of(instance) == []


def test_startup_reclaims_orphans_of_a_crashed_gateway(tmp_path: Path) -> None:
    require_docker()
    with serve(tmp_path, "--backend", "docker", "--pool-size", "1") as (proc, url):
        instance = httpx.get(url + "/health").json()["instance"]
        deadline = time.monotonic() + 30
        while not containers_of(instance) and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.kill()  # no cleanup: its containers are now orphans
        proc.wait()
    assert containers_of(instance), "the crashed gateway should have left a container behind"
    with serve(tmp_path, "--backend", "docker", "--pool-size", "0") as (_, url):
        assert httpx.get(url + "/health").json()["instance"] != instance
        assert containers_of(instance) == []


def test_gateways_with_different_runtime_dirs_leave_each_other_alone(tmp_path: Path) -> None:
    require_docker()
    with serve(tmp_path / "a", "--backend", "docker", "--pool-size", "1") as (_, url_a):
        instance = httpx.get(url_a + "/health").json()["instance"]
        deadline = time.monotonic() + 30
        while not containers_of(instance) and time.monotonic() < deadline:
            time.sleep(0.1)
        mine = containers_of(instance)
        assert mine
        with serve(tmp_path / "b", "--backend", "docker", "--pool-size", "0"):
            assert containers_of(instance) == mine  # a live neighbour's kernels are not orphans
