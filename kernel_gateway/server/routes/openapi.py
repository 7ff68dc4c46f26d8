"""`GET /openapi.json`: the API's contract (public, like /health: it holds no data)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.server.openapi import build
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings


async def openapi_json(request: Request) -> Response:
    settings: Settings = request.state.settings
    registry: Registry = request.state.registry
    return JSONResponse(build(settings, list(registry.languages)))
