"""`PUT /sessions/{id}/network`: a running session's allowlist, replaced (see
kernel_gateway/sessions/network_policy.py and docs/network.md)."""

from __future__ import annotations

from starlette.requests import Request

from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.server.routes.fragments import JSON_BODY
from kernel_gateway.sessions import network_policy
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.requests import NetworkChange, network_asked


async def change(request: Request) -> JSONResponse[responses.Session]:
    registry: Registry = request.state.registry
    session = registry.get(request.path_params["session_id"], principal_of(request))
    settings = registry.settings
    body = await read_model(request, NetworkChange, settings.max_body_bytes, settings)
    asked = network_asked(body.network)
    await network_policy.change(session, asked, settings, registry.egress, request.state.metrics)
    return JSONResponse(session.to_json())


OPERATIONS = (
    Operation(
        "put",
        "/sessions/{session_id}/network",
        change,
        "changeSessionNetwork",
        summary="Replace a running session's network policy.",
        description='`{"network": {"allow": [...]}}` or `{"network": "none"}`, checked as a '
        "new session's (within `--egress-allow`, else 403 `network_not_allowed`). A session "
        "that had no network gets its way out at once; one that had one keeps it with the new "
        "list. A new connection is judged by the new policy at once where it widens it, and "
        "within 5 s where it narrows it (the proxy remembers an allowing decision that "
        "long); a connection already open stays open until it closes.",
        tags=("sessions",),
        body=Body(NetworkChange),
        replies=(Reply(200, "The session, with its new `network`.", responses.Session),),
        errors=(*JSON_BODY, 403, 404, 409, 410, 503),
    ),
)
