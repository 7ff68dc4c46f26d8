"""The router's ASGI app: the same auth, Host guard and request log as a node gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict

import httpx
from starlette.applications import Starlette

from kernel_gateway.cluster import e2b_templates, keys, secrets, snapshots, templates, volumes
from kernel_gateway.cluster.directory import NodeDirectory
from kernel_gateway.cluster.metrics import RouterMetrics
from kernel_gateway.cluster.proxy import Proxy
from kernel_gateway.cluster.routes import routes
from kernel_gateway.cluster.settings import RouterSettings
from kernel_gateway.http.auth import Authenticator
from kernel_gateway.http.errors import exception_handlers
from kernel_gateway.http.middleware import front_middleware


class RouterState(TypedDict):
    settings: RouterSettings
    directory: NodeDirectory
    proxy: Proxy
    metrics: RouterMetrics
    keys: keys.KeyReplica


def create_router_app(settings: RouterSettings) -> Starlette:
    metrics = RouterMetrics()
    replica: list[keys.KeyReplica] = []  # made with the lifespan's HTTP client

    async def look_further(secret: str) -> bool:
        return bool(replica) and await replica[0].resolve(secret)

    auth = Authenticator(settings.token, look_further=look_further)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[RouterState]:
        # Streams (SSE) may stay open for as long as a cell runs: no read timeout.
        timeout = httpx.Timeout(None, connect=settings.connect_timeout)
        # Kept-alive connections expire before a node gateway's own keep-alive (uvicorn:
        # 5 s) would close them under a request.
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0
        )
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
            directory = NodeDirectory(settings, http)
            directory.start()
            metrics.watch(directory)
            key_replica = keys.KeyReplica(directory, http, settings.token)
            auth.keys = key_replica.store
            replica.append(key_replica)
            try:
                await key_replica.start()
                await directory.first_poll(settings.connect_timeout + 2)
                await key_replica.sync()
                yield {
                    "settings": settings,
                    "directory": directory,
                    "proxy": Proxy(http, settings.token),
                    "metrics": metrics,
                    "keys": key_replica,
                }
            finally:
                replica.clear()
                auth.keys = None
                await key_replica.close()
                metrics.watch(None)
                await directory.close()

    return Starlette(
        routes=[
            *snapshots.E2B_ROUTES,
            *volumes.E2B_ROUTES,
            *secrets.E2B_ROUTES,
            *e2b_templates.routes,
            *routes,
            *snapshots.ROUTES,
            *volumes.ROUTES,
            *templates.routes,
            *secrets.ROUTES,
            *keys.routes,
        ],
        middleware=front_middleware(metrics, auth, settings.host),
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
