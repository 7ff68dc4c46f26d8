from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway import logs
from kernel_gateway.errors import InvalidRequest, KernelUnavailable, TooManySessions
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.metrics import Metrics
from kernel_gateway.server.routes.streaming import respond
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.shapes.requests import (
    ExecuteRequest,
    NewSession,
    StatelessExecuteRequest,
    network_asked,
)


def _registry(request: Request) -> Registry:
    registry: Registry = request.state.registry
    return registry


def _session(request: Request) -> Session:
    return _registry(request).get(request.path_params["session_id"])


async def create(request: Request) -> Response:
    registry = _registry(request)
    settings = registry.settings
    body = await read_model(request, NewSession, settings.max_body_bytes, settings, optional=True)
    try:
        session = await registry.create_session(body.language, network_asked(body.network))
    except (TooManySessions, KernelUnavailable) as exc:
        _metrics(request).session_rejections.labels(_rejection(exc)).inc()
        raise
    logs.bind(session_id=session.id)
    return JSONResponse(
        session.to_json(), status_code=201, headers={"Location": f"/sessions/{session.id}"}
    )


async def list_all(request: Request) -> Response:
    return JSONResponse({"sessions": [s.to_json() for s in _registry(request).sessions()]})


async def get(request: Request) -> Response:
    return JSONResponse(_session(request).to_json())


async def delete(request: Request) -> Response:
    await _registry(request).delete_session(request.path_params["session_id"])
    return Response(status_code=204)


async def execute(request: Request) -> Response:
    session = _session(request)
    settings = _registry(request).settings
    body = await read_model(request, ExecuteRequest, settings.max_body_bytes, settings)
    execution = session.submit(body.code, body.timeout)
    logs.bind(execution_id=execution.id)
    return await respond(request, session, execution)


async def list_executions(request: Request) -> Response:
    session = _session(request)
    return JSONResponse({"executions": [e.summary() for e in session.executions()]})


async def execution_events(request: Request) -> Response:
    """An execution's events from its start, or from after `Last-Event-ID` / `?after=`."""
    session = _session(request)
    execution = session.execution(request.path_params["execution_id"])
    return await respond(request, session, execution, after=_resume_point(request))


def _resume_point(request: Request) -> int | None:
    """The event id to resume after: the `after` parameter, else `Last-Event-ID`.

    Both are checked when both are sent: a malformed one is refused even when the
    other would win.
    """
    after = _event_id(request.query_params.get("after"), "the 'after' parameter")
    header = _event_id(request.headers.get("last-event-id"), "Last-Event-ID")
    return after if after is not None else header


def _event_id(raw: str | None, name: str) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise InvalidRequest(f"{name} must be an event id (a non-negative integer), got {raw!r}")
    return int(raw)


async def interrupt(request: Request) -> Response:
    session = _session(request)
    interrupted = await session.interrupt()
    return JSONResponse({**session.to_json(), "interrupted": interrupted})


async def restart(request: Request) -> Response:
    session = _session(request)
    await session.restart()
    return JSONResponse(session.to_json())


async def hibernate(request: Request) -> Response:
    session = await _registry(request).hibernate(request.path_params["session_id"])
    return JSONResponse(session.to_json())


async def resume(request: Request) -> Response:
    session = _session(request)
    resumed = await session.resume()
    return JSONResponse({**session.to_json(), "resumed": resumed})


async def awake_session(request: Request) -> Session:
    """The session, resumed first if it is hibernated (calls that touch its kernel or
    files)."""
    session = _session(request)
    if session.hibernated:
        await session.resume()
    return session


async def execute_stateless(request: Request) -> Response:
    """Run one cell in a fresh kernel that is destroyed once the cell ends."""
    registry = _registry(request)
    settings = registry.settings
    body = await read_model(
        request, StatelessExecuteRequest, settings.max_stateless_body_bytes, settings
    )
    files = [(f.path, f.data) for f in body.files or ()]
    metrics = _metrics(request)
    metrics.stateless_requests.inc()
    try:
        session, execution = await registry.run_stateless(
            body.code, body.timeout, files, body.language, network_asked(body.network)
        )
    except (TooManySessions, KernelUnavailable) as exc:
        metrics.stateless_rejections.labels(_rejection(exc)).inc()
        raise
    logs.bind(session_id=session.id, execution_id=execution.id)
    return await respond(request, session, execution)


def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.state.metrics
    return metrics


def _rejection(exc: TooManySessions | KernelUnavailable) -> str:
    return "capacity" if isinstance(exc, TooManySessions) else "kernel_unavailable"
