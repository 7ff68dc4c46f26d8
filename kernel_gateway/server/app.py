"""The ASGI application: routes, auth, error handlers, and a lifespan that owns the sessions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict

import zmq.asyncio
from starlette.applications import Starlette

from kernel_gateway.errors import BackendUnavailable
from kernel_gateway.kernels.backends import AUTO, load_backend
from kernel_gateway.kernels.backends.base import Backend, RuntimeDir
from kernel_gateway.kernels.pools.fork import fork_pool
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.metrics import Metrics
from kernel_gateway.protocols.jupyter.kernels import JupyterKernels
from kernel_gateway.protocols.mcp.server import McpService
from kernel_gateway.server.error_handlers import exception_handlers
from kernel_gateway.server.middleware import front_middleware
from kernel_gateway.server.protocols import protocol_state
from kernel_gateway.server.routes import routes
from kernel_gateway.sessions.gauges import RegistryGauges
from kernel_gateway.sessions.persistence import SessionStore
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings

logger = logging.getLogger("kernel_gateway")


class State(TypedDict):
    registry: Registry
    settings: Settings
    metrics: Metrics
    jupyter: JupyterKernels
    mcp: McpService | None


class Lifecycle:
    """What the server tells the app about stopping, before its lifespan ends.

    uvicorn runs the lifespan's shutdown only after it has waited for open
    connections. With persisted sessions the drain must start at the signal, so
    that no cell whose client goes away meanwhile is interrupted: `GatewayServer`
    calls `stop_requested` from its signal handler.
    """

    def __init__(self, drain_timeout: float) -> None:
        self.registry: Registry | None = None
        self.persist = False
        self.drain_timeout = drain_timeout
        self.stop_requested_at: float | None = None

    def stop_requested(self) -> None:
        """The first stop signal: drain, and at the drain's end let streams go."""
        if self.stop_requested_at is not None:
            return
        self.stop_requested_at = time.monotonic()
        registry = self.registry
        if self.persist and registry is not None:
            registry.begin_drain()
            asyncio.get_running_loop().call_later(self.drain_timeout, registry.end_streams)


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
    lifecycle = Lifecycle(settings.drain_timeout)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        started = time.monotonic()
        runtime = RuntimeDir(settings.runtime_dir)
        # A predecessor's persisted sessions live in docker containers: only a backend
        # that may be docker takes its folder over.
        await asyncio.to_thread(
            runtime.open,
            adopt=settings.backend != "local",
            wait_for_predecessor=settings.adopt_wait if settings.persist_sessions else 0.0,
        )
        context = zmq.asyncio.Context()
        backend: Backend | None = None
        registry: Registry | None = None
        gauges: RegistryGauges | None = None
        persist = False
        try:
            backend = await select_backend(settings, runtime)
            backend_ready = time.monotonic()
            logger.info("backend: %s; isolation: %s", backend.name, backend.isolation)
            if backend.startup_warning is not None:
                logger.warning("%s", backend.startup_warning)
            persist = settings.persist_sessions and backend.persists
            if settings.persist_sessions and not persist:
                logger.warning(
                    "--persist-sessions: the %s backend cannot keep kernels running without "
                    "the gateway; sessions end when it stops",
                    backend.name,
                )
            store = None
            if persist or runtime.adopted:
                store = SessionStore(runtime.sessions_path)
                await asyncio.to_thread(store.open)
            warm = WarmPool(settings, backend, runtime, context, metrics)
            forks = fork_pool(settings, backend, runtime, warm, context, metrics)
            registry = Registry(settings, warm, runtime.instance, store, forks)
            if runtime.adopted:
                await registry.adopt()
            registry.start()
            gauges = RegistryGauges(registry)
            metrics.register(gauges)
            lifecycle.registry, lifecycle.persist = registry, persist
            logger.info(
                "ready in %.2f s (backend %.2f s%s)",
                time.monotonic() - started,
                backend_ready - started,
                f", adopting {time.monotonic() - backend_ready:.2f} s" if runtime.adopted else "",
            )
            async with protocol_state(settings, registry) as protocols:
                yield {"registry": registry, "settings": settings, "metrics": metrics, **protocols}
        finally:
            if gauges is not None:
                metrics.unregister(gauges)
            lifecycle.registry = None
            if persist and registry is not None and backend is not None:
                begun = lifecycle.stop_requested_at or time.monotonic()
                await registry.drain(begun + settings.drain_timeout)
                left = await registry.suspend()
                await (backend.detach() if left else backend.close())
                context.destroy(linger=0)
                runtime.close(keep=left > 0)
                logger.info(
                    "stopped; %d sessions' kernels keep running for the next gateway to adopt "
                    "(runtime dir %s)",
                    left,
                    settings.runtime_dir,
                )
            else:
                if registry is not None:
                    await registry.close()
                if backend is not None:
                    await backend.close()
                context.destroy(linger=0)
                runtime.close()
                logger.info("stopped; every kernel this gateway started has been removed")

    app = Starlette(
        routes=routes,
        middleware=front_middleware(metrics, settings.token, settings.host),
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.lifecycle = lifecycle
    return app
