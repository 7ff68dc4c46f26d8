"""Fixtures shared by every tier; helpers live in `tests/support/`.

The unit tier (`tests/unit/`, `make test-fast`) needs no server and no Docker; the rest
start real gateways on real backends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import scheduling
from tests.support.backends import BACKENDS, backend_settings, require_backend
from tests.support.server import ServerFactory, ServerThread
from tests.support.wheels import package_index  # noqa: F401 - a fixture for every test

# Gateways the tests start as processes (CLI, persistence and fuzzing tests) keep one fork
# server rather than the default four: each is a preloaded container, and a 2-core CI
# machine starts dozens of gateways. Tests that need more ask for them.
os.environ.setdefault("KG_FORK_SERVERS", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """On xdist workers, a short base folder: tests put runtime dirs under `tmp_path`, and
    a gateway's unix sockets (the egress proxy's, a fork server's) must stay within the
    108 bytes of a socket path. Workers add `popen-gwN/` to pytest's
    `/tmp/pytest-of-root/pytest-N`; `/tmp/kgt/xxxxxxxx` leaves room for it."""
    if config.option.basetemp is None and getattr(config.option, "numprocesses", None):
        if not hasattr(config, "workerinput"):
            config.option.basetemp = scheduling.short_basetemp()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test TEST_WORKERS=2`: files as units, the swarm suites as one, longest first."""
    if config.getvalue("dist") != "loadfile":
        return None
    return scheduling.make_scheduler(config, log)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Start real gateways for a module: `servers(backend="local", **settings)`.

    Each is a `ServerThread` on its own runtime dir; all stop when the module ends.
    """
    started: list[ServerThread] = []

    def start(backend: str = "local", **overrides: object) -> ServerThread:
        require_backend(backend)
        tmp = tmp_path_factory.mktemp(f"gw-{backend}")
        server = ServerThread(backend_settings(backend, tmp, **overrides)).__enter__()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in reversed(started):
            server.__exit__(None, None, None)


@pytest.fixture(scope="session", params=["local", "docker"])
def backend_name(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return str(request.param)


@pytest.fixture(scope="session")
def gateways() -> Iterator[dict[str, ServerThread]]:
    """The shared gateways by backend name, each started on first use; all stop at the end."""
    started: dict[str, ServerThread] = {}
    try:
        yield started
    finally:
        for server in reversed(started.values()):
            server.__exit__(None, None, None)


@pytest.fixture
def gateway(
    backend_name: str,
    gateways: dict[str, ServerThread],
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerThread:
    """One real server per backend, shared by the API tests.

    Looked up by name, not cached as a session fixture: pytest keys a session fixture's
    cache by its own parameters, so after a module that overrides `backend_name` (test_api
    adds gVisor) a later module's docker tests were given the gVisor gateway."""
    if backend_name not in gateways:
        tmp = tmp_path_factory.mktemp(f"rt-{backend_name}")
        # Two warm kernels: most tests take a session at once, and its successor starts
        # while the test runs (with one, the next test waited for a whole cold start).
        settings = backend_settings(backend_name, tmp, pool_size=2)
        gateways[backend_name] = ServerThread(settings).__enter__()
    server = gateways[backend_name]
    assert server.settings.runtime == BACKENDS[backend_name][1], backend_name
    return server


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
