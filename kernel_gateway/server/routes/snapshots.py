"""Snapshots and forks (see kernel_gateway/sessions/snapshots.py).

    POST   /sessions/{id}/snapshots     a snapshot of the session as it is now (201)
    POST   /sessions/{id}/fork          copies of it, each a new session (201)
    GET    /snapshots                   every snapshot (`?session_id=`, `?name=`)
    GET    /snapshots/{id}              one, by id or name
    DELETE /snapshots/{id}              it

A session starts from one with `POST /sessions {"snapshot": id}` (routes/sessions.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway import logs
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.server.routes.fragments import JSON_BODY, KERNEL_START, LOCATION
from kernel_gateway.sessions.snapshots import Restored, SavedSessions
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.requests import ForkRequest, NewSnapshot


def _saved(request: Request) -> SavedSessions:
    saved: SavedSessions = request.state.snapshots
    return saved


def restored_json(restored: Restored) -> responses.RestoredSession:
    return {
        **restored.session.to_json(),
        "restored": {"snapshot": restored.snapshot_id, "lost": restored.lost},
    }


async def create(request: Request) -> JSONResponse[responses.Snapshot]:
    saved = _saved(request)
    session = saved.registry.get(request.path_params["session_id"], principal_of(request))
    settings = saved.settings
    body = await read_model(request, NewSnapshot, settings.max_body_bytes, settings, optional=True)
    snapshot = await saved.take(session, body.name)
    logs.bind(session_id=session.id)
    return JSONResponse(
        snapshot.to_json(), status_code=201, headers={"Location": f"/snapshots/{snapshot.id}"}
    )


async def fork(request: Request) -> JSONResponse[responses.ForkList]:
    saved = _saved(request)
    principal = principal_of(request)
    session = saved.registry.get(request.path_params["session_id"], principal)
    settings = saved.settings
    body = await read_model(request, ForkRequest, settings.max_body_bytes, settings, optional=True)
    results = await saved.fork(session, body.count, owner=principal)
    forks: list[responses.ForkOutcome] = []
    for result in results:
        if isinstance(result, Restored):
            forks.append({"session": restored_json(result)})
        else:
            error: responses.ErrorDetail = {"type": result.error_type, "message": result.message}
            forks.append({"error": error, "status": result.status_code})
    return JSONResponse({"forks": forks}, status_code=201)


async def list_all(request: Request) -> JSONResponse[responses.SnapshotList]:
    found = await _saved(request).find(
        principal_of(request),
        request.query_params.get("session_id"),
        request.query_params.get("name"),
    )
    return JSONResponse({"snapshots": [s.to_json() for s in found]})


async def get(request: Request) -> JSONResponse[responses.Snapshot]:
    snapshot = await _saved(request).get(request.path_params["snapshot_id"], principal_of(request))
    return JSONResponse(snapshot.to_json())


async def delete(request: Request) -> Response:
    await _saved(request).delete(request.path_params["snapshot_id"], principal_of(request))
    return Response(status_code=204)


_FILTER = "Only those "
OPERATIONS = (
    Operation(
        "post",
        "/sessions/{session_id}/snapshots",
        create,
        "createSnapshot",
        summary="Keep a copy of the session as it is now: its files and (Python) variables.",
        description="The session runs on as it was. Sessions start from the snapshot with "
        '`POST /sessions {"snapshot": id}`, as many as asked. The save is bounded by '
        "`--snapshot-timeout`: past it nothing is kept, and the answer is 503 "
        "`hibernation_failed` naming the value that would not save. A session running a cell "
        "answers 409 `session_busy`.",
        tags=("snapshots",),
        body=Body(NewSnapshot, required=False),
        replies=(Reply(201, "The snapshot.", responses.Snapshot, headers=LOCATION),),
        errors=(*JSON_BODY, 404, 409, 410, 429, *KERNEL_START),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/fork",
        fork,
        "forkSession",
        summary="Start copies of the session as it is now, each a new session.",
        description="The session runs on as it was. Each copy succeeds or fails on its own: "
        "`forks` lists, in order, each one's session or error.",
        tags=("snapshots",),
        body=Body(ForkRequest, required=False),
        replies=(Reply(201, "Each copy's session, or why not.", responses.ForkList),),
        errors=(*JSON_BODY, 404, 409, 410, *KERNEL_START),
    ),
    Operation(
        "get",
        "/snapshots",
        list_all,
        "listSnapshots",
        summary="Every snapshot, oldest first.",
        tags=("snapshots",),
        parameters=(
            {
                "name": "session_id",
                "in": "query",
                "required": False,
                "description": _FILTER + "taken from this session.",
                "schema": {"type": "string"},
            },
            {
                "name": "name",
                "in": "query",
                "required": False,
                "description": _FILTER + "of this name (or id).",
                "schema": {"type": "string"},
            },
        ),
        replies=(Reply(200, "The snapshots.", responses.SnapshotList),),
    ),
    Operation(
        "get",
        "/snapshots/{snapshot_id}",
        get,
        "getSnapshot",
        summary="A snapshot, by id or name.",
        tags=("snapshots",),
        replies=(Reply(200, "The snapshot.", responses.Snapshot),),
        errors=(404,),
    ),
    Operation(
        "delete",
        "/snapshots/{snapshot_id}",
        delete,
        "deleteSnapshot",
        summary="Delete a snapshot (sessions started from it keep their copies).",
        tags=("snapshots",),
        replies=(Reply(204, "Deleted."),),
        errors=(404,),
    ),
)
