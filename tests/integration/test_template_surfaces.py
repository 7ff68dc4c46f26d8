"""One template, every way in: built through the API with a package from a wheel (served
here, on the host's loopback: no internet), a file and an environment variable; then a
session on it through the API, E2B's SDK, MCP and Jupyter's API each sees all three."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import tarfile
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
from jupyter_client.session import Session as JupyterSession
from jupyter_server.gateway.managers import GatewayKernelManager
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client
from websockets.asyncio.client import connect

from tests.support.api import execute, parse_sse
from tests.support.jupyter import execute_content, gateway_client_for
from tests.support.mcp import handle_of, text_of
from tests.support.server import ServerFactory, ServerThread

TOKEN = "e2b_" + "7a" * 20
CHECK = (
    "import os, {package}\n"
    "print({package}.VALUE, '|', open('/opt/data/notes.txt').read().strip(), '|', "
    "os.environ['TEMPLATE_GREETING'])"
)


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("docker", pool_size=0, token=TOKEN, mcp_templates=True)


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


def session_ids(client: httpx.Client, template: str | None = None) -> set[str]:
    """The gateway's sessions (those on `template`, if given)."""
    sessions = client.get("/sessions").json()["sessions"]
    return {
        s["id"]
        for s in sessions
        if template is None or (s["template"] or {}).get("name") == template
    }


async def test_mcp(server: ServerThread, client: httpx.Client, template: tuple[str, str]) -> None:
    """With --mcp-templates: the tools offer `template`, naming the templates there are; an
    MCP session gets a sandbox per template (and keeps it), all removed when it ends."""
    name, package = template
    before = session_ids(client)
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
    async with http, McpClient(transport, mode="legacy") as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
        for tool in tools.values():
            assert "template" in tool.input_schema["properties"], tool.name
        described = tools["run_python"].input_schema["properties"]["template"]["description"]
        assert f"{name} (python)" in described
        arguments = {"code": CHECK.format(package=package) + "\nkept = 1", "template": name}
        first = await mcp.call_tool("run_python", arguments)
        assert not first.is_error and text_of(first).startswith(expected(package)), text_of(first)
        handle = handle_of(first)
        assert session_ids(client, name) == {handle}
        # The same template again: the same sandbox; none: the connection's plain one.
        again = await mcp.call_tool("run_python", {"code": "print(kept)", "template": name})
        assert handle_of(again) == handle and text_of(again).startswith("1\n")
        plain = await mcp.call_tool("run_python", {"code": "print('kept' in dir())"})
        assert handle_of(plain) != handle and text_of(plain).startswith("False\n")
        files = await mcp.call_tool("list_files", {"template": name})
        assert handle_of(files) == handle
        refused = await mcp.call_tool(
            "run_python", {"code": "1", "session": handle_of(plain), "template": name}
        )
        assert refused.is_error and "runs on no template" in text_of(refused), text_of(refused)
        missing = await mcp.call_tool("run_python", {"code": "1", "template": "no-such-one"})
        assert missing.is_error and "no-such-one" in text_of(missing)
        during = session_ids(client) - before
        assert during == {handle, handle_of(plain)}
    # Both sandboxes go with the MCP session (deleted once its DELETE is answered).
    for _ in range(200):
        if not session_ids(client) - before:
            break
        await asyncio.sleep(0.1)
    assert session_ids(client) == before


def test_jupyters_api(server: ServerThread, template: tuple[str, str]) -> None:
    """`KERNEL_TEMPLATE` in the env jupyter_server's gateway kernel manager sends starts the
    kernel on the template; the model names it; a notebook's cell on it sees all three."""
    name, package = template
    gateway = gateway_client_for(server.url)
    gateway.auth_token = TOKEN
    session = JupyterSession(key=b"")

    async def scenario() -> None:
        manager = GatewayKernelManager()
        await manager.start_kernel(kernel_name="python3", env={"KERNEL_TEMPLATE": name})
        try:
            model: dict[str, Any] | None = manager.kernel
            assert model is not None
            assert model["name"] == "python3" and model["template"]["name"] == name, model
            assert (await manager.refresh_model())["template"] == model["template"]
            url = server.url.replace("http", "ws") + f"/api/kernels/{model['id']}/channels"
            headers = {"Authorization": f"token {TOKEN}"}
            async with connect(url, additional_headers=headers) as ws:
                code = CHECK.format(package=package)
                request = session.msg("execute_request", execute_content(code))
                await ws.send(json.dumps(dict(request, channel="shell"), default=str))
                printed = ""
                while True:
                    message = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    if message["parent_header"].get("msg_id") != request["header"]["msg_id"]:
                        continue
                    if message["msg_type"] == "stream":
                        printed += message["content"]["text"]
                    if message["msg_type"] == "execute_reply":
                        assert message["content"]["status"] == "ok", message
                        break
            assert printed.strip() == expected(package)
        finally:
            await manager.shutdown_kernel()

    asyncio.run(scenario())
    with httpx.Client(base_url=server.url, headers={"Authorization": f"token {TOKEN}"}) as http:
        wrong = http.post("/api/kernels", json={"name": "bash", "env": {"KERNEL_TEMPLATE": name}})
        assert wrong.status_code in (404, 409) and wrong.json()["reason"], wrong.text
        missing = http.post("/api/kernels", json={"env": {"KERNEL_TEMPLATE": "no-such-one"}})
        assert (
            missing.status_code == 404 and missing.json()["error"]["type"] == "template_not_found"
        )
