"""One template, every way in: built through the API with a package from a wheel (served
here, on the host's loopback: no internet), a file and an environment variable; then a
session on it through the API, E2B's SDK, MCP and Jupyter's API each sees all three."""

from __future__ import annotations

import base64
import io
import os
import tarfile
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.api import execute, parse_sse
from tests.support.server import ServerFactory, ServerThread

TOKEN = "e2b_" + "7a" * 20
CHECK = (
    "import os, {package}\n"
    "print({package}.VALUE, '|', open('/opt/data/notes.txt').read().strip(), '|', "
    "os.environ['TEMPLATE_GREETING'])"
)


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("docker", pool_size=0, token=TOKEN)


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=120, headers=headers) as c:
        yield c


@pytest.fixture
def template(client: httpx.Client, package_index: tuple[str, str]) -> Iterator[tuple[str, str]]:
    """(its name, the package it installs), built and ready; deleted after."""
    index, package = package_index
    name = f"surfaces-{uuid.uuid4().hex[:8]}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"from the context\n"
        info = tarfile.TarInfo("data/notes.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    response = client.post(
        "/templates",
        json={
            "name": name,
            "steps": [
                {"type": "RUN", "args": [f"pip install --index-url {index} {package}", "root"]},
                {"type": "COPY", "args": ["data", "/opt/data/"]},
                {"type": "ENV", "args": ["TEMPLATE_GREETING", "hello"]},
            ],
            "context": base64.b64encode(buffer.getvalue()).decode(),
        },
    )
    assert response.status_code == 202, response.text
    build = response.json()
    with client.stream("GET", f"/templates/{name}/builds/{build['id']}/logs") as logs:
        ended = [data for event, data in parse_sse(logs.iter_bytes()) if event == "end"]
    assert ended and ended[0]["state"] == "ready", ended
    try:
        yield name, package
    finally:
        client.delete(f"/templates/{name}")


def expected(package: str) -> str:
    """What CHECK prints in a session on the template (the package is in `package`)."""
    return "from the index | from the context | hello"


def test_our_api(client: httpx.Client, template: tuple[str, str]) -> None:
    name, package = template
    session = client.post("/sessions", json={"template": name}).json()
    try:
        out = execute(client, session["id"], CHECK.format(package=package)).stdout.strip()
        assert out == expected(package)
    finally:
        client.delete(f"/sessions/{session['id']}")


def test_e2bs_sdk(server: ServerThread, template: tuple[str, str]) -> None:
    sdk = pytest.importorskip("e2b_code_interpreter")
    name, package = template
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ["E2B_API_URL"] = os.environ["E2B_SANDBOX_URL"] = server.url + "/e2b"
    os.environ["E2B_API_KEY"] = TOKEN
    try:
        sandbox = sdk.Sandbox.create(name)
        try:
            execution = sandbox.run_code(CHECK.format(package=package))
            assert execution.error is None, execution.error
            assert "".join(execution.logs.stdout).strip() == expected(package)
        finally:
            sandbox.kill()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
