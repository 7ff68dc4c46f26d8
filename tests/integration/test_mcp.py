"""The MCP endpoint, driven by the official `mcp` SDK's client over streamable HTTP.

Both protocol eras the SDK speaks are covered: the handshake era (an MCP session,
one sandbox per session, no handle needed) and the sessionless 2026-07-28 era
(the model passes back the `session` handle).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.support.backends import settings_for
from tests.support.mcp import handle_of, text_of
from tests.support.server import ServerFactory, ServerThread

TOKEN = "mcp-test-token"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("local", token=TOKEN, pool_size=2, max_sessions=12)


@asynccontextmanager
async def connect(
    server: ServerThread, mode: str = "auto", token: str = TOKEN
) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
    async with http, Client(transport, mode=mode) as client:
        yield client


def rest(server: ServerThread) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    )


async def test_tools_are_listed_with_schemas(server: ServerThread) -> None:
    async with connect(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"run_python", "upload_file", "list_files", "read_file", "restart_kernel"}
    run = tools["run_python"]
    assert run.input_schema["required"] == ["code"]
    assert set(run.input_schema["properties"]) == {"code", "timeout", "session"}
    assert "matplotlib" in (run.description or "") and "persist" in (run.description or "")
    assert (
        tools["read_file"].annotations is not None and tools["read_file"].annotations.read_only_hint
    )


async def test_sessionless_client_keeps_state_with_the_handle(server: ServerThread) -> None:
    async with connect(server) as client:
        assert client.protocol_version == "2026-07-28"
        first = await client.call_tool("run_python", {"code": "x = 41"})
        assert not first.is_error, text_of(first)
        handle = handle_of(first)
        second = await client.call_tool("run_python", {"code": "print(x + 1)", "session": handle})
        assert not second.is_error
        assert text_of(second).startswith("42\n")
        # The handle is the gateway session's id: the REST API sees the same session.
        with rest(server) as http:
            assert http.get(f"/sessions/{handle}").json()["execution_count"] == 2
            http.delete(f"/sessions/{handle}")
        gone = await client.call_tool("run_python", {"code": "1", "session": handle})
        assert gone.is_error and "without `session`" in text_of(gone)


async def test_mcp_session_gets_its_own_sandbox_removed_at_the_end(server: ServerThread) -> None:
    with rest(server) as http:
        before = {s["id"] for s in http.get("/sessions").json()["sessions"]}
        async with connect(server, mode="legacy") as client:
            await client.call_tool("run_python", {"code": "x = 41"})
            result = await client.call_tool("run_python", {"code": "print(x + 1)\nx"})
            assert text_of(result).startswith("42\n41\n"), text_of(result)
            during = {s["id"] for s in http.get("/sessions").json()["sessions"]} - before
            assert during == {handle_of(result)}
        after = {s["id"] for s in http.get("/sessions").json()["sessions"]}
        assert after == before


async def test_chart_is_an_image_block_of_a_png(server: ServerThread) -> None:
    async with connect(server, mode="legacy") as client:
        result = await client.call_tool(
            "run_python",
            {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')"},
        )
    images = [c for c in result.content if isinstance(c, types.ImageContent)]
    assert not result.is_error and len(images) == 1
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
    assert "[image 1: image/png]" in text_of(result)


async def test_error_is_an_error_result_with_a_plain_traceback(server: ServerThread) -> None:
    async with connect(server, mode="legacy") as client:
        result = await client.call_tool("run_python", {"code": "print('before')\n1 / 0"})
    text = text_of(result)
    assert result.is_error
    assert text.startswith("before\n")
    assert "ZeroDivisionError" in text and "Traceback" in text
    assert "\x1b[" not in text


async def test_upload_then_read_a_csv_and_files_written(server: ServerThread) -> None:
    csv = "city,temp\nOslo,3\nLima,19\n"
    async with connect(server, mode="legacy") as client:
        up = await client.call_tool("upload_file", {"path": "data/t.csv", "content": csv})
        assert not up.is_error, text_of(up)
        run = await client.call_tool(
            "run_python",
            {
                "code": "import pandas as pd\ndf = pd.read_csv('data/t.csv')\n"
                "df.assign(f=df.temp * 9 / 5 + 32).to_csv('out.csv', index=False)\n"
                "print(df.temp.mean())"
            },
        )
        assert text_of(run).startswith("11.0\n"), text_of(run)
        links = [c for c in run.content if isinstance(c, types.ResourceLink)]
        assert [link.name for link in links] == ["out.csv"]
        assert links[0].uri.startswith(server.url + "/sessions/")
        with rest(server) as http:
            assert http.get(links[0].uri).text.startswith("city,temp,f\nOslo,3,37.4")
        read = await client.call_tool("read_file", {"path": "data/t.csv"})
        assert read.content == [types.TextContent(type="text", text=csv)]
        listing = text_of(await client.call_tool("list_files", {}))
        assert "data/t.csv\t25 bytes\ttext/csv" in listing and "out.csv" in listing
        binary = await client.call_tool(
            "upload_file",
            {
                "path": "b.bin",
                "content": base64.b64encode(b"\0\1\2").decode(),
                "encoding": "base64",
            },
        )
        assert not binary.is_error
        blob = (await client.call_tool("read_file", {"path": "b.bin"})).content[0]
        assert isinstance(blob, types.EmbeddedResource)
        assert isinstance(blob.resource, types.BlobResourceContents)
        assert base64.b64decode(blob.resource.blob) == b"\0\1\2"
        await client.call_tool(
            "run_python",
            {"code": "import matplotlib.pyplot as plt\nplt.plot([1]); plt.savefig('p.png')"},
        )
        image = (await client.call_tool("read_file", {"path": "p.png"})).content[0]
        assert isinstance(image, types.ImageContent)
        assert base64.b64decode(image.data).startswith(PNG_MAGIC)
        missing = await client.call_tool("read_file", {"path": "nope.txt"})
        assert missing.is_error and "nope.txt" in text_of(missing)
        escape = await client.call_tool("read_file", {"path": "../../etc/passwd"})
        assert escape.is_error


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_cancelling_a_call_interrupts_the_cell(server: ServerThread, mode: str) -> None:
    """Cancelling: `notifications/cancelled` (legacy), or closing the response stream (2026)."""
    async with connect(server, mode=mode) as client:
        first = await client.call_tool("run_python", {"code": "y = 1"})
        handle = handle_of(first)
        started = time.monotonic()
        with anyio.move_on_after(2):
            code = "import time\ntime.sleep(60)"
            await client.call_tool("run_python", {"code": code, "session": handle})
        assert time.monotonic() - started < 5
        # The cell was stopped in the kernel (not left running): the next one runs at once.
        t0 = time.monotonic()
        after = await client.call_tool("run_python", {"code": "print(y)", "session": handle})
        assert text_of(after).startswith("1\n") and time.monotonic() - t0 < 10
        with rest(server) as http:
            executions = http.get(f"/sessions/{handle}/executions").json()["executions"]
        assert executions[1]["status"] == "interrupted"


async def test_timeout_interrupts_and_progress_is_reported(server: ServerThread) -> None:
    reports: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, message))

    async with connect(server, mode="legacy") as client:
        result = await client.call_tool(
            "run_python",
            {
                "code": "import time\nfor i in range(30):\n"
                "    print('step', i, flush=True)\n    time.sleep(0.2)",
                "timeout": 2.5,
            },
            progress_callback=on_progress,
        )
    assert result.is_error and "timed out" in text_of(result)
    assert text_of(result).startswith("step 0\nstep 1\n")
    assert len(reports) >= 1
    assert any(m and "step" in m for _, m in reports), reports


async def test_bad_input_is_a_clear_tool_error(server: ServerThread) -> None:
    async with connect(server, mode="legacy") as client:
        cases: list[tuple[dict[str, Any], str]] = [
            ({}, "'code' is required"),
            ({"code": 1}, "must be a string"),
            ({"code": "1", "timeout": -1}, "'timeout'"),
            ({"code": "1", "nope": 1}, "unknown argument"),
            ({"code": "1", "session": "f" * 32}, "no sandbox"),
            ({"code": "1", "template": "t"}, "unknown argument 'template'"),  # --mcp-templates
        ]
        for arguments, words in cases:
            result = await client.call_tool("run_python", arguments)
            assert result.is_error and words in text_of(result), (arguments, text_of(result))
        bad = await client.call_tool(
            "upload_file", {"path": "x", "content": "!!", "encoding": "base64"}
        )
        assert bad.is_error and "base64" in text_of(bad)
        with pytest.raises(MCPError, match="unknown tool"):
            await client.call_tool("rm_rf", {})


def test_endpoint_needs_the_token(server: ServerThread) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with httpx.Client(base_url=server.url) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = http.post("/mcp", json=body, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "unauthorized"


async def test_restart_kernel_clears_variables(server: ServerThread) -> None:
    async with connect(server, mode="legacy") as client:
        await client.call_tool("run_python", {"code": "z = 5\nopen('keep.txt', 'w').write('k')"})
        restarted = await client.call_tool("restart_kernel", {})
        assert "restarted" in text_of(restarted)
        result = await client.call_tool("run_python", {"code": "print(open('keep.txt').read())\nz"})
        assert result.is_error and "NameError" in text_of(result)
        assert text_of(result).startswith("k\n")


@pytest.fixture(scope="module")
def stateless_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    settings = settings_for(
        "local", tmp_path_factory.mktemp("rt-mcp-stateless"), token=TOKEN, mcp="stateless"
    )
    with ServerThread(settings) as server:
        yield server


async def test_stateless_mode_runs_each_call_in_a_fresh_kernel(
    stateless_server: ServerThread,
) -> None:
    async with connect(stateless_server, mode="legacy") as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        assert tools == ["run_python"]
        result = await client.call_tool(
            "run_python",
            {
                "code": "print(open('in.txt').read())\n"
                "open('out.txt', 'w').write('written')\nx = 1",
                "files": [{"path": "in.txt", "content": "hello"}],
            },
        )
        assert text_of(result).startswith("hello\n"), text_of(result)
        embedded = [c for c in result.content if isinstance(c, types.EmbeddedResource)]
        assert isinstance(embedded[0].resource, types.TextResourceContents)
        assert embedded[0].resource.text == "written"
        again = await client.call_tool("run_python", {"code": "x"})
        assert again.is_error and "NameError" in text_of(again)
        assert "session:" not in text_of(again)


def test_mcp_off_answers_404(tmp_path: Path) -> None:
    settings = settings_for("local", tmp_path, pool_size=0, mcp="off")
    with ServerThread(settings) as server, httpx.Client(base_url=server.url) as http:
        response = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert response.status_code == 404
        assert "--mcp off" in response.json()["error"]["message"]
