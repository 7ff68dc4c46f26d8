"""`kernel-gateway mcp`, driven by the official `mcp` SDK's client over stdio.

The client starts the command as a desktop MCP client does; the command relays
to a gateway (given by `--url`, or one it starts itself).
"""

from __future__ import annotations

import base64
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from tests.support.backends import settings_for
from tests.support.mcp import text_of
from tests.support.server import ServerThread

TOKEN = "stdio-token"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    settings = settings_for("local", tmp_path_factory.mktemp("rt-stdio"), token=TOKEN)
    with ServerThread(settings) as server:
        yield server


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KG_")}
    env.update(extra)
    return env


@asynccontextmanager
async def stdio(args: list[str], env: dict[str, str]) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "kernel_gateway", "mcp", *args], env=env
    )
    async with Client(params) as client:
        yield client


def sessions(gateway: ServerThread) -> set[str]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    response = httpx.get(f"{gateway.url}/sessions", headers=headers)
    return {s["id"] for s in response.json()["sessions"]}


async def test_stdio_relays_to_a_running_gateway(gateway: ServerThread) -> None:
    before = sessions(gateway)
    args = ["--url", gateway.url, "--token", TOKEN]
    async with stdio(args, _environment()) as client:
        tools = [tool.name for tool in (await client.list_tools()).tools]
        assert tools == ["run_python", "upload_file", "list_files", "read_file", "restart_kernel"]
        # One sandbox for the whole stdio session: no handle needed.
        await client.call_tool("run_python", {"code": "x = 41"})
        result = await client.call_tool("run_python", {"code": "print(x + 1)"})
        assert text_of(result).startswith("42\n")
        assert len(sessions(gateway) - before) == 1

        chart = await client.call_tool(
            "run_python", {"code": "import matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 1])"}
        )
        images = [c for c in chart.content if isinstance(c, types.ImageContent)]
        assert len(images) == 1 and base64.b64decode(images[0].data).startswith(PNG_MAGIC)

        error = await client.call_tool("run_python", {"code": "undefined_name"})
        assert error.is_error and "NameError" in text_of(error)

        up = await client.call_tool("upload_file", {"path": "in.csv", "content": "a,b\n1,2\n"})
        assert not up.is_error
        read = await client.call_tool("read_file", {"path": "in.csv"})
        assert text_of(read) == "a,b\n1,2\n"
        total = await client.call_tool(
            "run_python", {"code": "import pandas as pd\nint(pd.read_csv('in.csv').sum().sum())"}
        )
        assert text_of(total).startswith("3\n"), text_of(total)

        started = time.monotonic()
        with anyio.move_on_after(2):
            await client.call_tool("run_python", {"code": "import time\ntime.sleep(60)"})
        assert time.monotonic() - started < 5
        # The cancellation reached the gateway: the cell was interrupted, so the next call
        # does not wait out the minute-long sleep.
        started = time.monotonic()
        quick = await client.call_tool("run_python", {"code": "print(x)"})
        assert text_of(quick).startswith("41\n")
        assert time.monotonic() - started < 20
    # The client went away: its sandbox went with it.
    for _ in range(100):
        if sessions(gateway) == before:
            break
        await anyio.sleep(0.1)
    assert sessions(gateway) == before


async def test_stdio_starts_its_own_gateway(tmp_path: Path) -> None:
    env = _environment(
        KG_BACKEND="local", KG_RUNTIME_DIR=str(tmp_path), KG_POOL_SIZE="1", KG_PRELOAD=""
    )
    async with stdio([], env) as client:
        result = await client.call_tool("run_python", {"code": "print(sum(range(10)))"})
        assert text_of(result).startswith("45\n")
    # Stopped with it: its instance folder and lock are gone from the runtime dir.
    instances = [name for name in os.listdir(tmp_path) if len(name.split(".")[0]) == 12]
    assert instances == []


def test_a_gateway_that_does_not_answer_is_one_line_on_stderr(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "kernel_gateway", "mcp", "--url", "http://127.0.0.1:9"],
        input=b"",
        capture_output=True,
        timeout=60,
        env=_environment(),
    )
    assert done.returncode == 2
    assert done.stdout == b""
    assert b"kernel-gateway mcp:" in done.stderr
