"""`/e2b`: E2B's API for E2B's own SDKs (see `protocols/e2b/app.py`)."""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount
from starlette.types import Receive, Scope, Send

from kernel_gateway.protocols.e2b.app import E2BService


class E2BEndpoint:
    """An ASGI app: the front door reads the raw request (it routes by header)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service: E2BService = scope["state"]["e2b"]
        await service(scope, receive, send)


routes: list[BaseRoute] = [Mount("/e2b", app=E2BEndpoint())]
