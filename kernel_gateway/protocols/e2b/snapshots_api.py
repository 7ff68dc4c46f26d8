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

import secrets
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.auth import principal_of
from kernel_gateway.protocols.e2b.errors import SandboxError, status_for
from kernel_gateway.protocols.e2b.replies import ControlHandler, Handler, guarded, json_body
from kernel_gateway.protocols.e2b.sandbox import Sandbox
from kernel_gateway.protocols.e2b.sandboxes import timeout_seconds
from kernel_gateway.protocols.e2b.sandboxes_api import integer, sandbox_json
from kernel_gateway.sessions.snapshots import MAX_FORKS, Snapshot
from kernel_gateway.tenants.principal import Principal

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
    """A snapshot of the sandbox: its files and variables, and its environment (which a
    sandbox made from it gets again)."""
    body = await json_body(request)
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise SandboxError(400, "'name' must be a string")
    sandboxes = service.sandboxes
    sandbox = sandboxes.get(request.path_params["id"], principal_of(request))
    extra = {"e2b": {"env": sandbox.env}}
    snapshot = await sandboxes.snapshots.take(sandboxes.session(sandbox), name or None, extra)
    return JSONResponse(info(snapshot), status_code=201)


async def list_snapshots(request: Request, service: E2BService) -> Response:
    query = request.query_params
    name = query.get("name")
    found = await service.sandboxes.snapshots.find(
        principal_of(request),
        query.get("sandboxID") or None,
        name.removesuffix(TAG) if name else None,
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
    results = await copies(
        service,
        request.path_params["id"],
        count,
        integer(body, "timeout"),
        principal_of(request),
    )
    answer: list[dict[str, Any]] = []
    for result in results:
        if isinstance(result, Sandbox):
            answer.append({"sandbox": sandbox_json(result)})
        else:
            answer.append({"error": {"code": result.status, "message": result.message}})
    return JSONResponse(answer, status_code=201)


async def copies(
    service: E2BService, sandbox_id: str, count: int, lifetime: int | None, owner: Principal
) -> list[Sandbox | SandboxError]:
    """`count` copies of the sandbox as it is now (it runs on), each a sandbox of its own
    (and `owner`'s) with its metadata and environment, or why it could not start."""
    seconds = timeout_seconds(lifetime)
    sandboxes = service.sandboxes
    source = sandboxes.get(sandbox_id, owner)
    results = await sandboxes.snapshots.fork(sandboxes.session(source), count, owner=owner)
    forks: list[Sandbox | SandboxError] = []
    for result in results:
        if isinstance(result, GatewayError):
            forks.append(SandboxError(status_for(result), result.message))
            continue
        copy = Sandbox(
            id=result.session.id,
            template=source.template,
            alias=source.alias,
            language=source.language,
            token=secrets.token_urlsafe(32),
            started_at=datetime.now(UTC),
            end_at=time.time() + seconds,
            metadata=dict(source.metadata),
            env=dict(source.env),
            lifetime=seconds,
            auto_pause=source.auto_pause,
            auto_resume=source.auto_resume,
        )
        try:
            forks.append(await sandboxes.around(result.session, copy))
        except SandboxError as exc:
            forks.append(exc)
    return forks
