"""A gateway on the docker backend for the SDK suites here, with E2B's variables pointing at
it, unless the caller already points them at one (`tests/integration/test_e2b_sdks.py` does, for the
oldest SDK: that run loads no conftest at all)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.server import ServerFactory

TOKEN = "e2b-test-token"
VARIABLES = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY")


@pytest.fixture(scope="module", autouse=True)
def e2b_gateway(servers: ServerFactory) -> Iterator[str]:
    """The gateway's `/e2b` URL, set as E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL
    for the module."""
    server = servers("docker", token=TOKEN, pool_size=2, max_sessions=16)
    saved = {key: os.environ.get(key) for key in VARIABLES}
    for key in VARIABLES[:3]:  # the volume content API too (else https://api.e2b.app)
        os.environ[key] = server.url + "/e2b"
    os.environ["E2B_API_KEY"] = TOKEN
    try:
        yield server.url + "/e2b"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
