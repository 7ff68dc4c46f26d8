"""Snapshots through the router: each is its node's (its id names the node, as a session's
does), so a snapshot's calls go there, and a list gathers every node's.

Taking a snapshot and forking are calls on a session (`/sessions/{id}/...`), routed to the
session's node with the rest; a session from a snapshot is placed on the snapshot's node
(`routes.create_session`). A snapshot asked for by name (no node in it) is looked for on
each node in turn: the first that has it answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel_gateway.cluster.directory import Node
from kernel_gateway.cluster.proxy import NodeUnreachable, Relayed
from kernel_gateway.cluster.routes import (
    QUICK_ANSWER_SECONDS,
    RETRY_AFTER,
    _no_node,
    _raw_path,
    _state,
    snapshot_node,
)
from kernel_gateway.errors import GatewayError, NodeUnavailable, SnapshotNotFound
from kernel_gateway.http.responses import JSONResponse


async def list_snapshots(request: Request) -> Response:
    """Every node's snapshots, oldest first; `unavailable_nodes` names those not heard."""
    _, directory, proxy, _ = _state(request)
    up = directory.up()
    path = _raw_path(request) + (f"?{request.url.query}" if request.url.query else "")

    async def ask(node: Node) -> list[Any] | None:
        try:
            upstream = await proxy.send(
                node, request, path, None, answer_within=QUICK_ANSWER_SECONDS
            )
        except (NodeUnreachable, GatewayError):
            return None
        try:
            await upstream.aread()
            document = upstream.json() if upstream.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        finally:
            await upstream.aclose()
        found = document.get("snapshots") if isinstance(document, dict) else None
        return found if isinstance(found, list) else None

    answers = await asyncio.gather(*(ask(n) for n in up))
    snapshots = [s for found in answers if found is not None for s in found]
    snapshots.sort(key=lambda s: str(s.get("created_at", "")) if isinstance(s, dict) else "")
    missing = sorted(
        {n.name for n, found in zip(up, answers, strict=True) if found is None}
        | {n.name for n in directory.nodes.values() if n.state != "up"}
    )
    document: dict[str, Any] = {"snapshots": snapshots}
    if missing:
        document["unavailable_nodes"] = missing
    return JSONResponse(document)


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


ROUTES = [
    Route("/snapshots", list_snapshots, methods=["GET"]),
    Route("/snapshots/{snapshot_id}", snapshot_request, methods=["GET", "DELETE"]),
]
