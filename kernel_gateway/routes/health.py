from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..http import JSONResponse
from ..pool import Pool


async def health(request: Request) -> Response:
    pool: Pool = request.state.pool
    return JSONResponse(
        {
            "status": "ok",
            "backend": pool.backend.name,
            "instance": pool.instance,
            "isolation": pool.backend.isolation,
            "pool": pool.stats(),
        }
    )
