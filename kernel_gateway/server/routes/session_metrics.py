"""`GET /sessions/{id}/metrics`: what a session's kernel used, sampled every 5 s (see
kernel_gateway/sessions/usage.py); the gateway's own metrics are `GET /metrics`."""

from __future__ import annotations

from starlette.requests import Request

from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import query_seconds
from kernel_gateway.http.operations import Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.usage import UsageSampler
from kernel_gateway.shapes import responses


async def metrics(request: Request) -> JSONResponse[responses.SessionMetrics]:
    registry: Registry = request.state.registry
    sampler: UsageSampler = request.state.usage
    session = registry.get(request.path_params["session_id"], principal_of(request))
    start, end = query_seconds(request, "start"), query_seconds(request, "end")
    found = await sampler.samples(session, start, end)
    return JSONResponse({"metrics": [s.to_json() for s in found]})


def _bound(name: str, what: str) -> dict[str, object]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": f"Only samples {what} this Unix time (seconds).",
        "schema": {"type": "number", "minimum": 0},
    }


OPERATIONS = (
    Operation(
        "get",
        "/sessions/{session_id}/metrics",
        metrics,
        "sessionMetrics",
        summary="What the session's kernel used: CPU, memory, disk, every 5 s for an hour.",
        description="Sampled while its kernel runs (none while it is hibernated); one with "
        "no sample yet is sampled at once. Empty where the backend cannot tell (the local "
        "backend).",
        tags=("sessions",),
        parameters=(_bound("start", "from"), _bound("end", "up to")),
        replies=(Reply(200, "The samples, oldest first.", responses.SessionMetrics),),
        errors=(404, 410, 422),
    ),
)
