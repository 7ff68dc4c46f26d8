"""`/mcp`: the MCP streamable-HTTP endpoint (see `mcp_server`)."""

from __future__ import annotations

from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from kernel_gateway.errors import NotFound
from kernel_gateway.http.auth import refuse
from kernel_gateway.server.lazy_mcp import LazyMcp


class McpEndpoint:
    """An ASGI app, so the SDK's transport gets the raw request (it answers GET, POST, DELETE)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service: LazyMcp | None = scope["state"].get("mcp")
        if service is None:
            await refuse(scope, receive, send, NotFound("the MCP endpoint is off (--mcp off)"))
            return
        await service(scope, receive, send)


routes: list[BaseRoute] = [Route("/mcp", McpEndpoint())]
