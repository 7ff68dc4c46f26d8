"""MCP and the Jupyter WebSocket on every backend (local, and Docker when an engine answers).

The Jupyter proxy opens its own ZMQ sockets onto a kernel; in a container those are
ipc sockets in a bind-mounted folder, so this checks they reach it as the gateway's do.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import httpx2
import mcp_types as types
from jupyter_client.session import Session as JupyterSession
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from websockets.asyncio.client import connect

from tests.support.jupyter import execute_content
from tests.support.server import ServerThread

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHART = "import matplotlib.pyplot as plt\nplt.plot([2, 1, 3])\nplt.savefig('c.png')\nplt.show()"


async def test_mcp_chart_and_state(gateway: ServerThread) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        transport = streamable_http_client(f"{gateway.url}/mcp", http_client=http)
        async with Client(transport, mode="legacy") as client:
            await client.call_tool("run_python", {"code": "n = 6"})
            result = await client.call_tool("run_python", {"code": f"{CHART}\nprint(n * 7)"})
    assert not result.is_error
    text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    assert "42\n" in text and "c.png" in text
    images = [c for c in result.content if isinstance(c, types.ImageContent)]
    assert len(images) == 1 and base64.b64decode(images[0].data).startswith(PNG_MAGIC)
    assert [c.name for c in result.content if isinstance(c, types.ResourceLink)] == ["c.png"]


def test_jupyter_websocket_reaches_the_kernel(gateway: ServerThread, client: httpx.Client) -> None:
    created = client.post("/api/kernels", json={"name": "python3"})
    assert created.status_code == 201
    kernel_id = created.json()["id"]
    session = JupyterSession(key=b"")

    async def run(code: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        url = gateway.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels"
        async with connect(url, max_size=None) as ws:
            request = session.msg("execute_request", execute_content(code))
            await ws.send(json.dumps(dict(request, channel="shell"), default=str))
            outputs, reply, idle = [], None, False
            while reply is None or not idle:
                message = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if message["parent_header"].get("msg_id") != request["header"]["msg_id"]:
                    continue
                if message["channel"] == "shell":
                    reply = message
                elif message["msg_type"] == "status":
                    idle = message["content"]["execution_state"] == "idle"
                else:
                    outputs.append(message)
            return outputs, reply

    try:
        outputs, reply = asyncio.run(run(CHART))
        assert reply["content"]["status"] == "ok"
        displays = [o for o in outputs if o["msg_type"] == "display_data"]
        assert base64.b64decode(displays[0]["content"]["data"]["image/png"]).startswith(PNG_MAGIC)
        # What the notebook saved is in the session's files.
        session_id = kernel_id.replace("-", "")
        saved = client.get(f"/sessions/{session_id}/files/c.png")
        assert saved.status_code == 200 and saved.content.startswith(PNG_MAGIC)
    finally:
        client.delete(f"/api/kernels/{kernel_id}")
