"""`kernel-gateway mcp`: an MCP server over stdio, for desktop clients that start a command.

It relays every request to a gateway's `/mcp` endpoint with the official SDK's
client, so the tools, their descriptions and their results are exactly the
gateway's. The relay holds one MCP session upstream for as long as it runs: one
sandbox per stdio client, deleted when the client closes the pipe. Progress
notifications travel back, and a cancelled call is cancelled upstream (which
interrupts the cell).

With `--url` (or `KG_URL`; its settings are `settings.client.McpSettings`) it talks to a
running gateway. Without, it starts a gateway inside this process on a random loopback
port with a random token, configured from the `KG_*` variables like `serve`
(`KG_BACKEND=docker`, ...), and stops it on exit. Stdout carries only MCP messages; logs
go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

from kernel_gateway import __version__
from kernel_gateway.settings.client import McpSettings, client_settings

logger = logging.getLogger("kernel_gateway.mcp")


def main(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    try:
        settings = client_settings(McpSettings, args, environ)
    except ValueError as exc:
        print(f"kernel-gateway mcp: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        stream=sys.stderr,
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    try:
        asyncio.run(serve(settings.url, settings.token, environ))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line on stderr: the client shows it as the server's log
        print(f"kernel-gateway mcp: {exc}", file=sys.stderr)
        return 2
    return 0


async def serve(url: str | None, token: str | None, environ: Mapping[str, str]) -> None:
    async with AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(stdio_server())
        if url is None:
            url, token = await stack.enter_async_context(local_gateway(environ))
        assert url is not None
        upstream = await stack.enter_async_context(connect(url, token))
        server = relay(upstream)
        await server.run(read, write, server.create_initialization_options())


@asynccontextmanager
async def connect(url: str, token: str | None) -> AsyncIterator[Client]:
    """One MCP session on the gateway (the handshake era: the gateway keeps its sandbox)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=None))
    transport = streamable_http_client(f"{url.rstrip('/')}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy") as client:
        yield client


def relay(upstream: Client) -> Server[Any]:
    """An MCP server whose every tool is the gateway's, called through `upstream`."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return await upstream.list_tools()

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        async def progress(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        return await upstream.call_tool(
            params.name, dict(params.arguments or {}), progress_callback=progress
        )

    return Server(
        "kernel-gateway",
        version=__version__,
        title="kernel-gateway: sandboxed Python",
        instructions=upstream.instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


@asynccontextmanager
async def local_gateway(environ: Mapping[str, str]) -> AsyncIterator[tuple[str, str]]:
    """A gateway in this process on a free loopback port; yields its URL and token."""
    import uvicorn

    from kernel_gateway.kernels.runtime_dir import secure_runtime_root
    from kernel_gateway.server.app import create_app
    from kernel_gateway.settings import from_env

    token = secrets.token_urlsafe(24)
    settings = from_env(environ, host="127.0.0.1", port=0, token=token)
    secure_runtime_root(settings.runtime_dir)
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=0,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the local gateway did not start")
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        logger.warning("started a local gateway on 127.0.0.1:%d (pid %d)", port, os.getpid())
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
