"""Errors as `{"error": {"type", "message"}}` with their status, on a gateway and a router alike.

`GatewayError` (the one hierarchy, `kernel_gateway.errors`) carries its own status and
type; starlette's `HTTPException` (no route, wrong method) is given a type here; anything
else is logged and answered as a 500 `internal_error`, never a bare page.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ExceptionHandler

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.responses import JSONResponse, error_response

logger = logging.getLogger("kernel_gateway")

HTTP_ERROR_TYPES = {
    404: "not_found",
    405: "method_not_allowed",
    400: "bad_request",
    413: "payload_too_large",
}


def exception_handlers() -> dict[Any, ExceptionHandler]:
    """Errors as `{"error": {"type", "message"}}` with their status; never a bare 500 page."""
    return {
        GatewayError: _gateway_error,
        HTTPException: _http_error,
        Exception: _unexpected_error,
    }


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = HTTP_ERROR_TYPES.get(exc.status_code, "http_error")
    message = exc.detail if exc.status_code != 404 else f"no route for {request.url.path}"
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return JSONResponse(
        {"error": {"type": kind, "message": message}},
        status_code=exc.status_code,
        headers=headers,
    )


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at this path (starlette's 405 names only one route's)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods:
            if route.matches(request.scope)[0] is not Match.NONE:
                methods |= route.methods
    return sorted(methods)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    if not getattr(exc, "quiet", False):  # a ConnectionDropped is no error
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        {"error": {"type": "internal_error", "message": "the gateway hit an internal error"}},
        status_code=500,
    )
