"""The ASGI application: routes, auth, error handlers, and a lifespan that owns the sessions."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict

import zmq.asyncio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from .auth import BearerAuth, LoopbackHostGuard
from .backends import AUTO, load_backend
from .backends.base import Backend, RuntimeDir
from .errors import BackendUnavailable, GatewayError
from .http import JSONResponse, error_response
from .jupyter_kernels import JupyterKernels
from .mcp_server import McpService
from .protocols import protocol_state
from .registry import Registry
from .routes import routes
from .settings import Settings, is_loopback
from .warm_pool import WarmPool

logger = logging.getLogger("kernel_gateway")

HTTP_ERROR_TYPES = {
    404: "not_found",
    405: "method_not_allowed",
    400: "bad_request",
    413: "payload_too_large",
}


class State(TypedDict):
    registry: Registry
    settings: Settings
    jupyter: JupyterKernels
    mcp: McpService | None


async def select_backend(settings: Settings, runtime: RuntimeDir) -> Backend:
    """The backend named in settings, started; `auto` tries each of `AUTO` in turn.

    So `auto` is docker when an engine answers and the image exists, else local.
    A backend's module is imported only when it is tried.
    """
    names = AUTO if settings.backend == "auto" else (settings.backend,)
    for name, fallback in zip(names, (*names[1:], None), strict=True):
        try:
            backend = load_backend(name)(settings, runtime)
            try:
                await backend.start()
            except BackendUnavailable:
                await backend.close()
                raise
            return backend
        except BackendUnavailable as exc:
            if fallback is None:
                raise
            logger.warning(
                "%s backend unavailable (%s); falling back to %s", name, exc.message, fallback
            )
    raise AssertionError("no backend to try")


def create_app(settings: Settings) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        runtime = RuntimeDir(settings.runtime_dir)
        runtime.open()
        context = zmq.asyncio.Context()
        backend: Backend | None = None
        registry: Registry | None = None
        try:
            backend = await select_backend(settings, runtime)
            logger.info("backend: %s; isolation: %s", backend.name, backend.isolation)
            if backend.startup_warning is not None:
                logger.warning("%s", backend.startup_warning)
            warm = WarmPool(settings, backend, runtime, context)
            registry = Registry(settings, warm, runtime.instance)
            registry.start()
            async with protocol_state(settings, registry) as protocols:
                yield {"registry": registry, "settings": settings, **protocols}
        finally:
            if registry is not None:
                await registry.close()
            if backend is not None:
                await backend.close()
            context.destroy(linger=0)
            runtime.close()
            logger.info("stopped; every kernel this gateway started has been removed")

    return Starlette(
        routes=routes,
        middleware=[
            Middleware(
                LoopbackHostGuard,
                enabled=settings.token is None and is_loopback(settings.host),
            ),
            Middleware(BearerAuth, token=settings.token),
        ],
        exception_handlers={
            GatewayError: _gateway_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
        lifespan=lifespan,
    )


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = HTTP_ERROR_TYPES.get(exc.status_code, "http_error")
    message = exc.detail if exc.status_code != 404 else f"no route for {request.url.path}"
    return JSONResponse(
        {"error": {"type": kind, "message": message}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        {"error": {"type": "internal_error", "message": "the gateway hit an internal error"}},
        status_code=500,
    )
