"""`GET /health` and `GET /languages`: what this gateway is and runs."""

from __future__ import annotations

from starlette.requests import Request

from kernel_gateway.http.operations import Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.sessions.pool_reports import languages_json, stateless_stats
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.shapes import responses


async def health(request: Request) -> JSONResponse[responses.Health]:
    registry: Registry = request.state.registry
    stateless = stateless_stats(registry)
    body: responses.Health = {
        "status": "ok",
        "backend": registry.backend.name,
        "instance": registry.instance,
        "isolation": registry.backend.isolation,
        "languages": list(registry.languages),
        "pool": registry.stats(),
        "stateless_mode": stateless["stateless_mode"],
        "keys": request.state.keys.version,
    }
    if node := registry.settings.node_name:
        body["node"] = node
    if "fork_servers" in stateless:
        body["fork_servers"] = stateless["fork_servers"]
    return JSONResponse(body)


async def languages(request: Request) -> JSONResponse[responses.LanguageList]:
    """The languages this gateway runs, with versions, and which warm kernels each has."""
    registry: Registry = request.state.registry
    return JSONResponse({"default": "python", "languages": languages_json(registry)})


OPERATIONS = (
    Operation(
        "get",
        "/health",
        health,
        "health",
        summary="Liveness, the backend in use, and the warm pool (public).",
        tags=("operations",),
        public=True,
        replies=(Reply(200, "The gateway is up.", responses.Health),),
    ),
    Operation(
        "get",
        "/languages",
        languages,
        "listLanguages",
        summary="The languages this gateway runs, with versions and warm kernels.",
        tags=("operations",),
        replies=(Reply(200, "The languages, Python first.", responses.LanguageList),),
    ),
)
