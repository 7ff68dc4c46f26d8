from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway import logs
from kernel_gateway.errors import InvalidRequest, KernelUnavailable, TooManySessions
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.metrics import Metrics
from kernel_gateway.server.routes.fragments import (
    EXECUTION_ID,
    JSON_BODY,
    KERNEL_START,
    LOCATION,
    RESUME_AT,
    RESUME_PARAMETERS,
    SESSION_LINKS,
    STREAM,
)
from kernel_gateway.server.routes.snapshots import restored_json
from kernel_gateway.server.routes.streaming import respond
from kernel_gateway.sessions import network_policy
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.sessions.snapshots import SavedSessions
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.requests import (
    ExecuteRequest,
    NewSession,
    StatelessExecuteRequest,
    network_asked,
)
from kernel_gateway.tenants.principal import ADMIN
from kernel_gateway.tenants.secrets import PLACEHOLDER


def _registry(request: Request) -> Registry:
    registry: Registry = request.state.registry
    return registry


def _session(request: Request) -> Session:
    return _registry(request).get(request.path_params["session_id"], principal_of(request))


async def create(request: Request) -> JSONResponse[responses.RestoredSession]:
    registry = _registry(request)
    settings = registry.settings
    body = await read_model(request, NewSession, settings.max_body_bytes, settings, optional=True)
    mounts = await request.state.volumes.mounts(body.volumes or {}, principal_of(request))
    try:
        if body.snapshot is not None:
            saved: SavedSessions = request.state.snapshots
            restored = await saved.start(
                body.snapshot,
                network_asked(body.network),
                body.language,
                body.template,
                mounts,
                owner=principal_of(request),
            )
            await _with_secrets(request, registry, restored.session, body.secrets)
            answer = restored_json(restored)
        else:
            session = await registry.create_session(
                body.language,
                network_asked(body.network),
                body.template,
                mounts,
                owner=principal_of(request),
            )
            await _with_secrets(request, registry, session, body.secrets)
            answer = {**session.to_json(), "restored": None}
    except (TooManySessions, KernelUnavailable) as exc:
        _metrics(request).session_rejections.labels(_rejection(exc)).inc()
        raise
    logs.bind(session_id=answer["id"])
    return JSONResponse(answer, status_code=201, headers={"Location": f"/sessions/{answer['id']}"})


async def _with_secrets(
    request: Request, registry: Registry, session: Session, names: list[str] | None
) -> None:
    """The secrets the new session may use; a session they cannot be given is not kept."""
    if not names:
        return
    try:
        await network_policy.use_secrets(session, names, request.state.secrets, PLACEHOLDER)
    except BaseException:
        await registry.delete_session(session.id, ADMIN)
        raise


async def list_all(request: Request) -> JSONResponse[responses.SessionList]:
    sessions = _registry(request).visible(principal_of(request))
    return JSONResponse({"sessions": [s.to_json() for s in sessions]})


async def get(request: Request) -> JSONResponse[responses.Session]:
    return JSONResponse(_session(request).to_json())


async def delete(request: Request) -> Response:
    await _registry(request).delete_session(
        request.path_params["session_id"], principal_of(request)
    )
    return Response(status_code=204)


async def execute(request: Request) -> Response:
    session = _session(request)
    settings = _registry(request).settings
    body = await read_model(request, ExecuteRequest, settings.max_body_bytes, settings)
    execution = session.submit(body.code, body.timeout)
    logs.bind(execution_id=execution.id)
    return await respond(request, session, execution)


async def list_executions(request: Request) -> JSONResponse[responses.ExecutionList]:
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


async def interrupt(request: Request) -> JSONResponse[responses.InterruptedSession]:
    session = _session(request)
    interrupted = await session.interrupt()
    return JSONResponse({**session.to_json(), "interrupted": interrupted})


async def restart(request: Request) -> JSONResponse[responses.Session]:
    session = _session(request)
    await session.restart()
    return JSONResponse(session.to_json())


async def hibernate(request: Request) -> JSONResponse[responses.Session]:
    session = await _registry(request).hibernate(
        request.path_params["session_id"], principal_of(request)
    )
    return JSONResponse(session.to_json())


async def resume(request: Request) -> JSONResponse[responses.ResumedSession]:
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
            body.code,
            body.timeout,
            files,
            body.language,
            network_asked(body.network),
            body.template,
            owner=principal_of(request),
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


_EVENTS = "The execution's events."

OPERATIONS = (
    Operation(
        "post",
        "/execute",
        execute_stateless,
        "executeStateless",
        summary="Run one cell in a fresh kernel that is destroyed afterwards.",
        description="Answers with the events as `text/event-stream`, or as one collected JSON "
        "document with `Accept: application/json`. Stateless executions cannot be resumed. "
        "Bodies may be up to KG_MAX_STATELESS_BODY_BYTES.",
        tags=("stateless",),
        body=Body(StatelessExecuteRequest),
        replies=(Reply(200, _EVENTS, content=STREAM, headers=EXECUTION_ID),),
        errors=(*JSON_BODY, 403, 404, 409, 429, *KERNEL_START),
    ),
    Operation(
        "post",
        "/sessions",
        create,
        "createSession",
        summary="Start a session, on a warm kernel when one is ready.",
        tags=("sessions",),
        body=Body(NewSession, required=False),
        replies=(
            Reply(
                201,
                "The new session (`restored`: the snapshot it started from).",
                responses.RestoredSession,
                headers=LOCATION,
                links=SESSION_LINKS,
            ),
        ),
        errors=(*JSON_BODY, 403, 404, 409, 429, 501, *KERNEL_START),
    ),
    Operation(
        "get",
        "/sessions",
        list_all,
        "listSessions",
        summary="Every session.",
        tags=("sessions",),
        replies=(Reply(200, "The sessions.", responses.SessionList),),
    ),
    Operation(
        "get",
        "/sessions/{session_id}",
        get,
        "getSession",
        tags=("sessions",),
        replies=(Reply(200, "The session.", responses.Session),),
        errors=(404, 410),
    ),
    Operation(
        "delete",
        "/sessions/{session_id}",
        delete,
        "deleteSession",
        summary="Remove the session, its kernel and its files.",
        tags=("sessions",),
        replies=(Reply(204, "Deleted."),),
        errors=(404, 410),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/execute",
        execute,
        "executeInSession",
        summary="Run a cell in the session; cells run one at a time, in order.",
        description="Answers with the events as `text/event-stream`, or as one collected JSON "
        "document with `Accept: application/json`.",
        tags=("sessions",),
        body=Body(ExecuteRequest),
        replies=(
            Reply(
                200,
                _EVENTS,
                content=STREAM,
                headers={**EXECUTION_ID, **RESUME_AT},
                links={
                    "Resume": {
                        "operationId": "executionEvents",
                        "parameters": {
                            "session_id": "$request.path.session_id",
                            "execution_id": "$response.header.Execution-Id",
                        },
                    }
                },
            ),
        ),
        errors=(*JSON_BODY, 404, 409, 410, 503),
    ),
    Operation(
        "get",
        "/sessions/{session_id}/executions",
        list_executions,
        "listExecutions",
        summary="The executions whose events are kept, oldest first.",
        tags=("sessions",),
        replies=(Reply(200, "The executions.", responses.ExecutionList),),
        errors=(404, 410),
    ),
    Operation(
        "get",
        "/sessions/{session_id}/executions/{execution_id}/events",
        execution_events,
        "executionEvents",
        summary="An execution's events, from its start or from after an event id, then live "
        "ones, ending with its `done`.",
        tags=("sessions",),
        parameters=RESUME_PARAMETERS,
        replies=(Reply(200, _EVENTS, content=STREAM, headers={**EXECUTION_ID, **RESUME_AT}),),
        errors=(404, 410, 422),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/interrupt",
        interrupt,
        "interruptSession",
        summary="Interrupt the running cell, if any.",
        tags=("sessions",),
        replies=(Reply(200, "The session.", responses.InterruptedSession),),
        errors=(404, 410),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/restart",
        restart,
        "restartSession",
        summary="Replace the kernel (state is lost, files are kept); queued cells end "
        "`interrupted`.",
        tags=("sessions",),
        replies=(Reply(200, "The session, on a fresh kernel.", responses.Session),),
        errors=(404, 410, *KERNEL_START),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/hibernate",
        hibernate,
        "hibernateSession",
        summary="Save the session's variables to disk and stop its kernel; it resumes by "
        "itself on its next call (Python sessions).",
        description="Waits until it is saved. 409 `session_busy` while a cell runs or waits "
        "(or the session is used while it is saved: the use wins); 409 `conflict` for a "
        "session of another language, or with a notebook connected; 503 `hibernation_failed` "
        "when it could not be saved (it runs on as it was). `hibernation.lost` names what the "
        "snapshot could not keep.",
        tags=("sessions",),
        replies=(Reply(200, "The session, hibernated.", responses.Session),),
        errors=(404, 409, 410, 503),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/resume",
        resume,
        "resumeSession",
        summary="Bring a hibernated session back now (any call that needs its kernel does "
        "this by itself).",
        tags=("sessions",),
        replies=(
            Reply(
                200,
                "The session, running, with what resuming it reported.",
                responses.ResumedSession,
            ),
        ),
        errors=(404, 409, 410, *KERNEL_START),
    ),
)
"""The sessions' endpoints and stateless `POST /execute`, each routed and documented from
its record."""
