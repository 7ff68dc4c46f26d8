"""`GET /metrics`: the Prometheus exposition, behind the token like the rest of the API."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.http.operations import Operation, Reply
from kernel_gateway.metrics import Metrics


async def metrics(request: Request) -> Response:
    registry: Metrics = request.state.metrics
    body, content_type = registry.render(request.headers.get("accept"))
    return Response(body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})


OPERATIONS = (
    Operation(
        "get",
        "/metrics",
        metrics,
        "metrics",
        summary="Prometheus metrics, in the text exposition format (or OpenMetrics when the "
        "`Accept` header asks for it).",
        tags=("operations",),
        replies=(
            Reply(
                200,
                "The metrics.",
                content={
                    "text/plain": {"schema": {"type": "string"}},
                    "application/openmetrics-text": {"schema": {"type": "string"}},
                },
            ),
        ),
    ),
)
