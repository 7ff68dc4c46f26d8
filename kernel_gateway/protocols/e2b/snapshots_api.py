"""E2B's snapshots and forks, over the gateway's (sessions/snapshots.py).

In E2B a snapshot is a template: `Sandbox.create(snapshot_id)` starts a sandbox from it and
`Sandbox.delete_snapshot` is `DELETE /templates/{id}`. Here a snapshot keeps its own id
(`snapshotID`); its name, when it has one, is listed as E2B writes a snapshot template's
name (`name:default`), and either starts a sandbox. A template and a snapshot of the same
name: the snapshot is meant (it is what the SDK's snapshot calls make).

    POST   /sandboxes/{id}/snapshots    {"name"?} → 201 {"snapshotID", "names"}
    GET    /snapshots                   ?sandboxID, ?name, ?limit, ?nextToken (X-Next-Token)
    DELETE /templates/{id}              a snapshot's id or name: it (templates_api.py)
    POST   /sandboxes/{id}/fork         {"count", "timeout"} → 201 [{"sandbox"} | {"error"}]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernel_gateway.protocols.e2b.replies import ControlHandler, Handler, guarded, json_body
from kernel_gateway.protocols.e2b.sandboxes import Sandbox, SandboxError
from kernel_gateway.protocols.e2b.sandboxes_api import integer, sandbox_json
from kernel_gateway.sessions.snapshots import MAX_FORKS, Snapshot

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

TAG = ":default"
PAGE = 100


def snapshot_routes(service: E2BService) -> list[Route]:
    """The snapshots' own routes (their `DELETE /templates/{id}` is the templates')."""

    def guard(handler: ControlHandler) -> Handler:
        return guarded(service, handler)

    return [
        Route("/sandboxes/{id}/snapshots", guard(create), methods=["POST"]),
        Route("/snapshots", guard(list_snapshots), methods=["GET"]),
        Route("/sandboxes/{id}/fork", guard(fork), methods=["POST"]),
    ]


def info(snapshot: Snapshot) -> dict[str, Any]:
    """E2B's `SnapshotInfo`."""
    names = [snapshot.name + TAG] if snapshot.name else [snapshot.id + TAG]
    return {"snapshotID": snapshot.id, "names": names}


async def create(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise SandboxError(400, "'name' must be a string")
    snapshot = await service.sandboxes.snapshot(request.path_params["id"], name or None)
    return JSONResponse(info(snapshot), status_code=201)


async def list_snapshots(request: Request, service: E2BService) -> Response:
    query = request.query_params
    name = query.get("name")
    found = await service.sandboxes.snapshots.find(
        query.get("sandboxID") or None, name.removesuffix(TAG) if name else None
    )
    try:
        limit = int(query.get("limit") or PAGE)
    except ValueError:
        raise SandboxError(400, "'limit' must be a number") from None
    if not 1 <= limit <= PAGE:
        raise SandboxError(400, f"'limit' must be between 1 and {PAGE}")
    start = 0
    token = query.get("nextToken")
    if token:
        ids = [s.id for s in found]
        if token not in ids:
            raise SandboxError(400, "'nextToken' does not name a snapshot of this listing")
        start = ids.index(token)
    page = found[start : start + limit]
    headers = {}
    if start + limit < len(found):
        headers["X-Next-Token"] = found[start + limit].id
    return JSONResponse([info(s) for s in page], headers=headers)


async def fork(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    count = integer(body, "count")
    if count is None:
        count = 1
    if not 1 <= count <= MAX_FORKS:
        raise SandboxError(400, f"'count' must be between 1 and {MAX_FORKS}")
    results = await service.sandboxes.fork(
        request.path_params["id"], count, integer(body, "timeout")
    )
    answer: list[dict[str, Any]] = []
    for result in results:
        if isinstance(result, Sandbox):
            answer.append({"sandbox": sandbox_json(result)})
        else:
            answer.append({"error": {"code": result.status, "message": result.message}})
    return JSONResponse(answer, status_code=201)
