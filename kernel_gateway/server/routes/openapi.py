"""`GET /openapi.json`: the API's contract (public, like /health: it holds no data)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.http.operations import Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.types import JSON


async def openapi_json(request: Request) -> Response:
    """The document the app made for itself (`server/openapi.py`, built from the same records
    as its routes), made at the first call."""
    document: Callable[[], JSON] = request.state.openapi
    return JSONResponse(document())


OPERATIONS = (
    Operation(
        "get",
        "/openapi.json",
        openapi_json,
        "openapi",
        summary="This document (public).",
        tags=("operations",),
        public=True,
        replies=(
            Reply(
                200, "OpenAPI 3.1.", content={"application/json": {"schema": {"type": "object"}}}
            ),
        ),
    ),
)
