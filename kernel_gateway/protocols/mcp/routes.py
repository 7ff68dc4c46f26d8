"""`/mcp`: the MCP streamable-HTTP endpoint (the service: `server.py`, made lazily: `lazy.py`)."""

from __future__ import annotations

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kernel_gateway.errors import NotFound
from kernel_gateway.http.auth import refuse
from kernel_gateway.http.operations import Surface
from kernel_gateway.protocols.mcp.lazy import LazyMcp


class McpEndpoint:
    """An ASGI app, so the SDK's transport gets the raw request (it answers GET, POST, DELETE)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service: LazyMcp | None = scope["state"].get("mcp")
        if service is None:
            await refuse(scope, receive, send, NotFound("the MCP endpoint is off (--mcp off)"))
            return
        await service(scope, receive, send)


SURFACE = Surface(
    "/mcp",
    "the Model Context Protocol's streamable-HTTP endpoint: its contract is the MCP "
    "specification, and its tools describe themselves (tools/list)",
    [Route("/mcp", McpEndpoint())],
)
