from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import httpx
import pytest

from kernel_gateway.settings import DEFAULT_IMAGE, Settings

from .helpers import ServerThread

# Gateways the tests start as processes (CLI, persistence and fuzzing tests) keep one fork
# server rather than the default four: each is a preloaded container, and a 2-core CI
# machine starts dozens of gateways. Tests that need more ask for them.
os.environ.setdefault("KG_FORK_SERVERS", "1")

REQUIRE_DOCKER = os.environ.get("KG_REQUIRE_DOCKER") == "1"
REQUIRE_GVISOR = os.environ.get("KG_REQUIRE_GVISOR") == "1"
# Test backend name -> (settings backend, OCI runtime)
BACKENDS: dict[str, tuple[str, str | None]] = {
    "local": ("local", None),
    "docker": ("docker", None),
    "gvisor": ("docker", "runsc"),
}
IMAGE = os.environ.get("KG_TEST_IMAGE", DEFAULT_IMAGE)


def docker_unavailable_reason() -> str | None:
    """Why Docker tests cannot run here, or None when they can."""
    try:
        client = docker.from_env(timeout=10)
        try:
            client.ping()
            client.images.get(IMAGE)
        finally:
            client.close()
    except docker.errors.ImageNotFound:
        return f"kernel image {IMAGE} is missing (run `kernel-gateway build-image`)"
    except docker.errors.DockerException as exc:
        return f"no Docker engine answers ({exc})"
    return None


def require_docker() -> None:
    reason = docker_unavailable_reason()
    if reason is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"KG_REQUIRE_DOCKER=1 but Docker tests cannot run: {reason}")
    pytest.skip(reason)


def require_gvisor() -> None:
    require_docker()
    client = docker.from_env(timeout=10)
    try:
        runtimes = client.info().get("Runtimes", {})
    finally:
        client.close()
    if "runsc" in runtimes:
        return
    reason = "gVisor's runsc is not registered with Docker (see .ci/run)"
    if REQUIRE_GVISOR:
        pytest.fail(f"KG_REQUIRE_GVISOR=1 but {reason}")
    pytest.skip(reason)


def require_backend(name: str) -> None:
    if name == "docker":
        require_docker()
    elif name == "gvisor":
        require_gvisor()


def backend_settings(name: str, tmp: Path, **overrides: object) -> Settings:
    backend, runtime = BACKENDS[name]
    if runtime == "runsc":
        # gVisor delivers an interrupt's signal through its sentry: on a loaded 2-core CI
        # machine that took over a second now and then, and the kernel was restarted.
        overrides.setdefault("interrupt_grace", 3.0)
    return settings_for(backend, tmp, runtime=runtime, **overrides)


def settings_for(backend: str, tmp: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "backend": backend,
        "image": IMAGE,
        "pool_size": 1,
        "fork_servers": 1,
        "max_sessions": 8,
        "max_upload_bytes": 1024 * 1024,
        "runtime_dir": tmp,
        "interrupt_grace": 1.0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="session", params=["local", "docker"])
def backend_name(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return str(request.param)


@pytest.fixture(scope="session")
def gateway(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One real server per backend, shared by the API tests."""
    settings = backend_settings(backend_name, tmp_path_factory.mktemp(f"rt-{backend_name}"))
    with ServerThread(settings) as server:
        yield server


@pytest.fixture
def client(gateway: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=60) as c:
        yield c


@pytest.fixture
def session_id(client: httpx.Client) -> Iterator[str]:
    response = client.post("/sessions")
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    yield sid
    client.delete(f"/sessions/{sid}")
