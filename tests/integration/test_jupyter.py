"""Jupyter's kernel API, driven by clients none of us wrote.

- a real `jupyter server --gateway-url=<our gateway>` process (its own GatewayClient
  makes every kernel call to us, with `Authorization: token …`);
- nbclient executing a notebook through that server (its gateway kernel manager and
  client), compared with nbclient running the same notebook on a local kernel;
- jupyter_client's client API (`execute`, `get_iopub_msg`, `get_shell_msg`) over the
  WebSocket through that server, in jupyter_server's gateway kernel client:
  interrupt, restart, and a kernel that dies mid-cell;
- the `websockets` client on our own WebSocket, framing messages with Jupyter
  Server's own v1 and legacy functions.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from jupyter_client.session import Session as JupyterSession
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.gateway.managers import GatewayKernelManager
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)
from nbclient import NotebookClient
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.backends import settings_for
from tests.support.jupyter import (
    Outputs,
    execute_content,
    gateway_client_for,
    jupyter_process,
    run_cell,
)
from tests.support.server import ServerThread

TOKEN = "gateway-token"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
V1 = "v1.kernel.websocket.jupyter.org"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    settings = settings_for(
        "local", tmp_path_factory.mktemp("rt-jupyter"), token=TOKEN, pool_size=2, max_sessions=10
    )
    with ServerThread(settings) as server:
        yield server


@pytest.fixture(scope="module")
def jupyter_server(
    gateway: ServerThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`jupyter server --gateway-url` pointing at our gateway, as a separate process."""
    root = tmp_path_factory.mktemp("jupyter-root")
    with jupyter_process("jupyter_server", gateway.url, TOKEN, root) as url:
        yield url


@pytest.fixture
def through_server(jupyter_server: str) -> GatewayClient:
    """jupyter_server's gateway client in this process, pointed at the Jupyter server."""
    client: GatewayClient = gateway_client_for(jupyter_server)
    return client


def async_http(gateway: ServerThread) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=gateway.url, headers={"Authorization": f"token {TOKEN}"}, timeout=60
    )


def gateway_http(gateway: ServerThread) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"token {TOKEN}"}, timeout=60
    )


# -- the REST API ------------------------------------------------------------------------------


def test_rest_api_shapes_and_errors(gateway: ServerThread) -> None:
    with gateway_http(gateway) as http:
        assert http.get("/api").json()["version"]
        specs = http.get("/api/kernelspecs").json()
        assert specs["default"] == "python3"
        assert specs["kernelspecs"]["python3"]["spec"]["language"] == "python"
        assert http.get("/api/kernelspecs/python3").json()["name"] == "python3"
        missing = http.get("/api/kernelspecs/julia")
        assert missing.status_code == 404 and missing.json()["reason"] == "Not Found"
        bad = http.post("/api/kernels", json={"name": "julia"})
        assert bad.status_code == 404 and "julia" in bad.json()["message"]
        for body in ({"env": "x"}, {"nope": 1}, {"env": {"A": 1}}):
            response = http.post("/api/kernels", json=body)
            assert response.status_code == 422, body
        assert (
            http.post(
                "/api/kernels", content=b"{", headers={"Content-Type": "application/json"}
            ).status_code
            == 400
        )

        created = http.post(
            "/api/kernels", json={"name": "python3", "env": {"KERNEL_USERNAME": "u"}}
        )
        assert created.status_code == 201
        kernel = created.json()
        assert set(kernel) == {"id", "name", "last_activity", "execution_state", "connections"}
        assert kernel["execution_state"] == "idle" and kernel["connections"] == 0
        assert created.headers["location"] == f"/api/kernels/{kernel['id']}"
        assert kernel["id"] in [k["id"] for k in http.get("/api/kernels").json()]
        # The kernel is a session of the gateway's own API: the same UUID, without dashes.
        session = kernel["id"].replace("-", "")
        assert len(kernel["id"]) == 36 and http.get(f"/sessions/{session}").status_code == 200
        assert http.get(f"/api/kernels/{session}").json()["id"] == kernel["id"]
        assert http.post(f"/api/kernels/{kernel['id']}/interrupt").status_code == 204
        assert http.post(f"/api/kernels/{kernel['id']}/restart").json()["id"] == kernel["id"]
        assert http.delete(f"/api/kernels/{kernel['id']}").status_code == 204
        for method, path in [
            ("GET", ""),
            ("DELETE", ""),
            ("POST", "/interrupt"),
            ("POST", "/restart"),
        ]:
            response = http.request(method, f"/api/kernels/{kernel['id']}{path}")
            assert response.status_code == 404
            assert response.json()["error"]["type"] == "session_not_found"


def test_rest_and_websocket_need_the_token(gateway: ServerThread) -> None:
    with httpx.Client(base_url=gateway.url) as http:
        assert http.get("/api/kernels").status_code == 401
        assert http.get("/api/kernels", headers={"Authorization": "token nope"}).status_code == 401

    async def attempt(headers: dict[str, str]) -> int:
        url = gateway.url.replace("http", "ws") + "/api/kernels/x/channels"
        try:
            async with connect(url, additional_headers=headers):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    assert asyncio.run(attempt({})) == 401
    assert asyncio.run(attempt({"Authorization": f"token {TOKEN}"})) == 404
    cross_site = {"Authorization": f"token {TOKEN}", "Origin": "http://evil.example"}
    assert asyncio.run(attempt(cross_site)) == 403


# -- our WebSocket, framed by Jupyter Server's own functions -----------------------------------


async def _collect(
    ws: Any, decode: Any, msg_id: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """IOPub messages of a request (until idle) and its shell reply."""
    outputs: list[dict[str, Any]] = []
    reply: dict[str, Any] | None = None
    idle = False
    while reply is None or not idle:
        message = decode(await asyncio.wait_for(ws.recv(), 30))
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if message["channel"] == "shell":
            reply = message
        elif message["msg_type"] == "status":
            idle = message["content"]["execution_state"] == "idle"
        elif message["msg_type"] != "execute_input":
            outputs.append(message)
    return outputs, reply


def _decode_v1(raw: bytes) -> dict[str, Any]:
    channel, parts = deserialize_msg_from_ws_v1(raw)
    header = json.loads(parts[0])
    return {
        "channel": channel,
        "header": header,
        "msg_type": header["msg_type"],
        "parent_header": json.loads(parts[1]),
        "content": json.loads(parts[3]),
        "buffers": parts[4:],
    }


def _decode_json(raw: str | bytes) -> dict[str, Any]:
    message = deserialize_binary_message(raw) if isinstance(raw, bytes) else json.loads(raw)
    assert isinstance(message, dict)
    return message


def test_websocket_v1_and_json_framings(gateway: ServerThread) -> None:
    session = JupyterSession(key=b"")

    async def scenario(kernel_id: str) -> None:
        url = gateway.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with connect(url, additional_headers=headers, subprotocols=[V1]) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == V1
            request = session.msg("execute_request", execute_content("v = 6 * 7\nprint(v)\nv"))
            await ws.send(serialize_msg_to_ws_v1(request, "shell", session.pack))
            outputs, reply = await _collect(ws, _decode_v1, request["header"]["msg_id"])
            assert reply["content"]["status"] == "ok"
            assert [o["msg_type"] for o in outputs] == ["stream", "execute_result"]
            assert outputs[0]["content"]["text"] == "42\n"
            # A comm message with a binary buffer reaches the kernel and comes back intact.
            code = (
                "from ipykernel.comm import Comm\n"
                "c = Comm(target_name='t', data={}, buffers=[b'\\x00\\x01raw'])"
            )
            request = session.msg("execute_request", execute_content(code))
            await ws.send(serialize_msg_to_ws_v1(request, "shell", session.pack))
            outputs, reply = await _collect(ws, _decode_v1, request["header"]["msg_id"])
            assert reply["content"]["status"] == "ok", reply
            comm = [o for o in outputs if o["msg_type"] == "comm_open"]
            assert comm and comm[0]["buffers"] == [b"\x00\x01raw"]
            # Garbage closes the socket with 1007 rather than reaching the kernel.
            await ws.send(b"\x01\x00")
            await asyncio.wait_for(ws.wait_closed(), 10)
            assert ws.close_code == 1007

        async with connect(url, additional_headers=headers) as ws:
            assert ws.subprotocol is None
            request = session.msg("execute_request", execute_content("v + 1"))
            message = dict(request, channel="shell")
            await ws.send(json.dumps(message, default=str))
            outputs, reply = await _collect(ws, _decode_json, request["header"]["msg_id"])
            assert outputs[0]["content"]["data"]["text/plain"] == "43"
            assert reply["msg_id"] and reply["msg_type"] == "execute_reply"
            # The legacy binary framing (a message with buffers) is understood too.
            request = session.msg("execute_request", execute_content("v + 2"))
            await ws.send(serialize_binary_message(dict(request, channel="shell", buffers=[b"b"])))
            outputs, _ = await _collect(ws, _decode_json, request["header"]["msg_id"])
            assert outputs[0]["content"]["data"]["text/plain"] == "44"

    with gateway_http(gateway) as http:
        kernel_id = http.post("/api/kernels", json={}).json()["id"]
        try:
            asyncio.run(scenario(kernel_id))
        finally:
            http.delete(f"/api/kernels/{kernel_id}")


# -- nbclient through a real Jupyter server ----------------------------------------------------

CELLS = [
    "x = 41",
    "print(x + 1)",
    "import sys\nprint('to stderr', file=sys.stderr)",
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
    "1 / 0",
    "x",
    "open('from_notebook.txt', 'w').write('saved by a notebook')",
    "from IPython.display import display, HTML\ndisplay(HTML('<b>bold</b>'))",
]


def _notebook() -> nbformat.NotebookNode:
    nb: nbformat.NotebookNode = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def _summary(nb: nbformat.NotebookNode) -> list[list[dict[str, Any]]]:
    """What each cell showed, with images reduced to a check that they are PNGs."""
    cells = []
    for cell in nb.cells:
        outputs = []
        for output in cell.outputs:
            kind = output["output_type"]
            if kind == "stream":
                outputs.append({"stream": output["name"], "text": output["text"]})
            elif kind == "error":
                outputs.append({"error": output["ename"], "evalue": output["evalue"]})
            else:
                data = dict(output["data"])
                data.pop("application/vnd.e2b.chart+json", None)  # ours: a local kernel has none
                png = data.pop("image/png", None)
                if png is not None:
                    data["image/png"] = base64.b64decode(png).startswith(PNG_MAGIC)
                if "text/plain" in data and data["text/plain"].startswith("<Figure size"):
                    data["text/plain"] = "<Figure>"
                outputs.append({kind: data})
        cells.append(outputs)
    return cells


def test_nbclient_through_jupyter_server_matches_a_local_kernel(
    gateway: ServerThread, through_server: GatewayClient, tmp_path: Path
) -> None:
    remote = _notebook()
    NotebookClient(
        remote,
        km=GatewayKernelManager(),
        allow_errors=True,
        timeout=120,
        startup_timeout=120,
    ).execute()
    local = _notebook()
    NotebookClient(
        local, allow_errors=True, timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert _summary(remote) == _summary(local)
    summary = _summary(remote)
    assert summary[1] == [{"stream": "stdout", "text": "42\n"}]
    assert summary[3] == [{"display_data": {"text/plain": "<Figure>", "image/png": True}}]
    assert summary[4] == [{"error": "ZeroDivisionError", "evalue": "division by zero"}]
    assert summary[5] == [{"execute_result": {"text/plain": "41"}}]
    assert [c.execution_count for c in remote.cells] == list(range(1, len(CELLS) + 1))


def test_notebook_files_reach_the_files_api(
    gateway: ServerThread, through_server: GatewayClient
) -> None:
    async def scenario() -> str:
        km = GatewayKernelManager()
        await km.start_kernel(kernel_name="python3")
        kc = km.client()
        await kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            reply = await run_cell(kc, "open('report.txt', 'w').write('nb')")
            assert reply["content"]["status"] == "ok"
            assert km.kernel_id is not None
            return km.kernel_id
        finally:
            kc.stop_channels()

    kernel_id = asyncio.run(scenario())
    with gateway_http(gateway) as http:
        session = kernel_id.replace("-", "")
        assert http.get(f"/sessions/{session}/files/report.txt").text == "nb"
        http.delete(f"/api/kernels/{kernel_id}")


# -- jupyter_client's client API over the WebSocket, through the Jupyter server ---------------


def test_interrupt_restart_and_a_dying_kernel(
    gateway: ServerThread, through_server: GatewayClient
) -> None:
    async def scenario() -> None:
        km = GatewayKernelManager()
        await km.start_kernel(kernel_name="python3")
        kc = km.client()
        await kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            await run_cell(kc, "state = 'kept'")

            # Interrupt: the REST call reaches the kernel as SIGINT.
            outputs = Outputs()
            running = asyncio.ensure_future(run_cell(kc, "import time\ntime.sleep(60)", outputs))
            await asyncio.sleep(2)
            started = time.monotonic()
            await km.interrupt_kernel()
            reply = await asyncio.wait_for(running, 20)
            assert time.monotonic() - started < 10
            assert reply["content"]["status"] == "error"
            assert outputs.of("error")[0]["ename"] == "KeyboardInterrupt"
            survived = Outputs()
            await run_cell(kc, "print(state)", survived)
            assert survived.of("stream")[0]["text"] == "kept\n"

            # A kernel that dies mid-cell: the cell gets an error reply, never a hang, and
            # a fresh kernel takes the next cell.
            outputs = Outputs()
            reply = await asyncio.wait_for(
                run_cell(kc, "import os\nos._exit(3)", outputs),
                30,
            )
            assert reply["content"]["status"] == "error"
            assert reply["content"]["ename"] == "DeadKernelError"
            assert "exit status 3" in reply["content"]["evalue"]
            assert "restarting" in [s["execution_state"] for s in outputs.of("status")]
            fresh = Outputs()
            deadline = time.monotonic() + 60
            while True:  # the replacement kernel may still be starting
                fresh = Outputs()
                reply = await run_cell(kc, "print('state' in dir())", fresh)
                if reply["content"]["status"] == "ok" or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            assert fresh.of("stream")[0]["text"] == "False\n"

            # Restart through the REST API: variables are gone, the connection carries on.
            await run_cell(kc, "again = 1")
            await km.restart_kernel()
            after = Outputs()
            deadline = time.monotonic() + 60
            while True:
                after = Outputs()
                reply = await run_cell(kc, "print('again' in dir())", after)
                if reply["content"]["status"] == "ok" or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            assert after.of("stream")[0]["text"] == "False\n"
        finally:
            kc.stop_channels()
            await km.shutdown_kernel()

    asyncio.run(scenario())


# -- deaths, the restart budget and idle reaping, over our WebSocket ---------------------------


class KernelSocket:
    """A JSON-framed connection to /api/kernels/{id}/channels, as a Jupyter client speaks it."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.session = JupyterSession(key=b"")
        self.kernel_states: list[str] = []
        """IOPub statuses for no request: the kernel's own state (restarting, dead, idle)."""

    async def execute(self, code: str) -> str:
        request = self.session.msg("execute_request", execute_content(code))
        await self.ws.send(json.dumps(dict(request, channel="shell"), default=str))
        return str(request["header"]["msg_id"])

    async def next(self, seconds: float = 60) -> dict[str, Any]:
        message = _decode_json(await asyncio.wait_for(self.ws.recv(), seconds))
        if message["msg_type"] == "status" and not message["parent_header"]:
            self.kernel_states.append(message["content"]["execution_state"])
        return message

    async def reply(self, msg_id: str, seconds: float = 60) -> dict[str, Any]:
        while True:
            message = await self.next(seconds)
            if message["channel"] == "shell" and message["parent_header"].get("msg_id") == msg_id:
                return message

    async def until_state(self, state: str, seconds: float = 60) -> None:
        while state not in self.kernel_states:
            await self.next(seconds)


def _ws_url(server: ServerThread, kernel_id: str) -> str:
    return server.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels"


def test_a_failed_kernel_is_dead_until_restarted(tmp_path: Path) -> None:
    settings = settings_for("local", tmp_path, token=TOKEN, restart_budget=0, pool_size=1)

    async def scenario(server: ServerThread) -> None:
        async with async_http(server) as http:
            await inner(server, http)

    async def inner(server: ServerThread, http: httpx.AsyncClient) -> None:
        kernel_id = (await http.post("/api/kernels", json={})).json()["id"]
        headers = {"Authorization": f"token {TOKEN}"}
        async with connect(_ws_url(server, kernel_id), additional_headers=headers) as ws:
            kernel = KernelSocket(ws)
            assert (await http.get(f"/api/kernels/{kernel_id}")).json()["connections"] == 1
            msg_id = await kernel.execute("import os\nos._exit(1)")
            reply = await kernel.reply(msg_id)
            assert reply["content"]["ename"] == "DeadKernelError"
            await kernel.until_state("dead")  # past the restart budget: no new kernel
            model = (await http.get(f"/api/kernels/{kernel_id}")).json()
            assert model["execution_state"] == "dead"
            restarted = await http.post(f"/api/kernels/{kernel_id}/restart")
            assert restarted.status_code == 200
            assert restarted.json()["execution_state"] == "idle"
            kernel.kernel_states.clear()
            await kernel.until_state("idle")  # the connection moved to the new kernel
            msg_id = await kernel.execute("1 + 1")
            assert (await kernel.reply(msg_id))["content"]["status"] == "ok"

    with ServerThread(settings) as server:
        asyncio.run(scenario(server))


def test_a_running_cell_keeps_its_kernel_from_idle_reaping(tmp_path: Path) -> None:
    settings = settings_for("local", tmp_path, token=TOKEN, idle_timeout=1.5, pool_size=1)

    async def scenario(server: ServerThread) -> None:
        async with async_http(server) as http:
            await inner(server, http)

    async def inner(server: ServerThread, http: httpx.AsyncClient) -> None:
        kernel_id = (await http.post("/api/kernels", json={})).json()["id"]
        headers = {"Authorization": f"token {TOKEN}"}
        async with connect(_ws_url(server, kernel_id), additional_headers=headers) as ws:
            kernel = KernelSocket(ws)
            msg_id = await kernel.execute("import time\ntime.sleep(4)\nprint('done')")
            reply = await kernel.reply(msg_id)
            assert reply["content"]["status"] == "ok"
            # Idle now: reaped like any session; the client is told, then disconnected.
            await kernel.until_state("dead", seconds=15)
            await asyncio.wait_for(ws.wait_closed(), 10)
        assert (await http.get(f"/api/kernels/{kernel_id}")).status_code == 404

    with ServerThread(settings) as server:
        asyncio.run(scenario(server))


def test_connections_per_kernel_are_capped(gateway: ServerThread) -> None:
    from kernel_gateway.protocols.jupyter.kernels import MAX_CONNECTIONS

    async def scenario(kernel_id: str) -> int:
        headers = {"Authorization": f"token {TOKEN}"}
        # These clients never read: with an unbounded queue their close handshake still
        # completes at once (a full queue stops reading and waits out close_timeout).
        sockets = [
            await connect(_ws_url(gateway, kernel_id), additional_headers=headers, max_queue=None)
            for _ in range(MAX_CONNECTIONS)
        ]
        try:
            async with connect(_ws_url(gateway, kernel_id), additional_headers=headers):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code
        finally:
            for ws in sockets:
                await ws.close()

    with gateway_http(gateway) as http:
        kernel_id = http.post("/api/kernels", json={}).json()["id"]
        try:
            assert asyncio.run(scenario(kernel_id)) == 429
        finally:
            http.delete(f"/api/kernels/{kernel_id}")


def test_connecting_while_an_api_cell_runs(gateway: ServerThread) -> None:
    """The proxy's readiness check goes through control, which answers while shell is busy."""
    import threading

    async def scenario(kernel_id: str) -> float:
        headers = {"Authorization": f"token {TOKEN}"}
        async with connect(_ws_url(gateway, kernel_id), additional_headers=headers) as ws:
            kernel = KernelSocket(ws)
            request = kernel.session.msg("kernel_info_request", {})
            started = time.monotonic()
            await ws.send(json.dumps(dict(request, channel="control"), default=str))
            while True:
                message = await kernel.next()
                if message["msg_type"] == "kernel_info_reply":
                    return time.monotonic() - started

    with gateway_http(gateway) as http:
        kernel_id = http.post("/api/kernels", json={}).json()["id"]
        session = kernel_id.replace("-", "")
        body = {"code": "import time\ntime.sleep(5)"}
        cell = threading.Thread(
            target=http.post, args=(f"/sessions/{session}/execute",), kwargs={"json": body}
        )
        try:
            cell.start()
            time.sleep(1)
            assert asyncio.run(scenario(kernel_id)) < 3
            assert http.get(f"/api/kernels/{kernel_id}").json()["execution_state"] == "busy"
        finally:
            cell.join()
            http.delete(f"/api/kernels/{kernel_id}")
