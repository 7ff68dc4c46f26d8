"""Snapshots through the router: each is its node's (its id names the node, as a session's
does), so a snapshot's calls go there, and a list gathers every node's.

Taking a snapshot and forking are calls on a session (`/sessions/{id}/...`), routed to the
session's node with the rest; a session from a snapshot is placed on the snapshot's node
(`routes.create_session`). A snapshot asked for by name (no node in it) is looked for on
each node in turn: the first that has it answers.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel_gateway.cluster.e2b_templates import to_every_node
from kernel_gateway.cluster.proxy import NodeUnreachable, Relayed
from kernel_gateway.cluster.routes import (
    QUICK_ANSWER_SECONDS,
    RETRY_AFTER,
    _no_node,
    _raw_path,
    _state,
    _to_session_node,
    e2b_answers,
    e2b_pages,
    oldest_first,
    snapshot_node,
)
from kernel_gateway.errors import NodeUnavailable, SnapshotNotFound
from kernel_gateway.http.responses import JSONResponse


async def list_snapshots(request: Request) -> Response:
    """Every node's snapshots, oldest first; `unavailable_nodes` names those not heard."""
    return await oldest_first(request, "snapshots")


async def snapshot_request(request: Request) -> Response:
    """`GET` or `DELETE /snapshots/{id}`: to the node its id names; by name, to the first
    node that has one of that name."""
    _, directory, proxy, _ = _state(request)
    reference = request.path_params["snapshot_id"]
    path = _raw_path(request)
    home = snapshot_node(reference)
    nodes = [n for n in directory.up() if home is None or n.name == home]
    if not nodes:
        if home is not None and directory.get(home) is None and not directory.young():
            raise SnapshotNotFound(f"no snapshot {reference!r} (no node {home!r})")
        raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)
    for node in nodes:
        try:
            upstream = await proxy.send(
                node, request, path, None, answer_within=QUICK_ANSWER_SECONDS
            )
        except NodeUnreachable:
            continue
        if upstream.status_code == 404 and len(nodes) > 1:
            await upstream.aclose()
            continue
        return Relayed(upstream)
    raise SnapshotNotFound(f"no snapshot {reference!r} on any node that answers")


async def e2b_delete(request: Request) -> Response:
    """E2B's `DELETE /templates/{id}`: a snapshot's id goes to its node; anything else (a
    template, or a snapshot's name) to every node, as a template's delete does."""
    reference = request.path_params["id"].removesuffix(":default")
    if snapshot_node(reference) is not None:
        return await _to_session_node(request, reference)
    return await to_every_node(request)


async def e2b_list(request: Request) -> Response:
    """E2B's `GET /snapshots`: every node's, paged here (`limit`, `nextToken`)."""
    _, directory, _, _ = _state(request)
    params = [
        (k, v) for k, v in request.query_params.multi_items() if k not in ("limit", "nextToken")
    ]
    answers = await asyncio.gather(
        *(e2b_pages(request, n, request.url.path, params) for n in directory.up())
    )
    found = [s for listed in answers for s in listed if isinstance(s, dict)]
    try:
        limit = max(1, min(int(request.query_params.get("limit") or 100), 100))
    except ValueError:
        limit = 100
    ids = [str(s.get("snapshotID")) for s in found]
    token = request.query_params.get("nextToken")
    start = ids.index(token) if token in ids else 0
    page = found[start : start + limit]
    headers = {"X-Next-Token": ids[start + limit]} if start + limit < len(found) else {}
    return JSONResponse(page, headers=headers)


E2B_ROUTES = [
    # Before e2b_templates.py's routes: its `DELETE /templates/{id}` goes to every node.
    Route("/e2b/templates/{id}", e2b_answers(e2b_delete), methods=["DELETE"]),
    Route("/e2b/snapshots", e2b_answers(e2b_list), methods=["GET"]),
]
ROUTES = [
    Route("/snapshots", list_snapshots, methods=["GET"]),
    Route("/snapshots/{snapshot_id}", snapshot_request, methods=["GET", "DELETE"]),
]
