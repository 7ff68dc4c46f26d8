from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..http import JSONResponse
from ..registry import Registry


async def health(request: Request) -> Response:
    registry: Registry = request.state.registry
    return JSONResponse(
        {
            "status": "ok",
            "backend": registry.backend.name,
            "instance": registry.instance,
            "isolation": registry.backend.isolation,
            **({"node": node} if (node := registry.settings.node_name) else {}),
            "pool": registry.stats(),
            **registry.stateless_stats(),
        }
    )
