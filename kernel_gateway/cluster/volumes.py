"""Volumes through the router: each is its node's disk (its id names the node, as a
session's does), so a volume's calls go there, a list gathers every node's, and a session
that mounts volumes is placed where they are (`routes.create_session`).

A new volume is placed by load. A volume asked for by name (no node in it) is looked for on
each node in turn: the first that has one of that name answers (names are unique per node).
E2B's routes (`/e2b/volumes`, `/e2b/volumecontent/{id}/...`) go the same ways.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel_gateway.cluster import placement
from kernel_gateway.cluster.directory import Node
from kernel_gateway.cluster.proxy import Body, NodeUnreachable, Relayed
from kernel_gateway.cluster.routes import (
    QUICK_ANSWER_SECONDS,
    RETRY_AFTER,
    _no_node,
    _offer,
    _raw_path,
    _replay,
    _state,
    e2b_answers,
    gather,
    oldest_first,
    volume_node,
)
from kernel_gateway.errors import GatewayError, NodeUnavailable, VolumeNotFound
from kernel_gateway.http.responses import JSONResponse


async def _home(request: Request, reference: str, probe: str) -> Node:
    """The node that has the volume `reference`: the one its id names, else the first that
    answers `GET probe` with 200 (a name)."""
    _, directory, proxy, _ = _state(request)
    named = volume_node(reference)
    if named is not None:
        node = directory.get(named)
        if node is None and not directory.young():
            raise VolumeNotFound(f"no volume {reference!r} (no node {named!r})")
        if node is None or node.state != "up":
            raise NodeUnavailable(
                f"volume {reference}'s node {named} does not answer now; retry shortly",
                retry_after=RETRY_AFTER,
            )
        return node
    up = directory.up()
    if not up:
        raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)
    for node in up:
        try:
            answer = await proxy.send(
                node,
                request,
                probe,
                None,
                answer_within=QUICK_ANSWER_SECONDS,
                query="",
                method="GET",
            )
        except (NodeUnreachable, GatewayError):
            continue
        await answer.aclose()
        if answer.status_code == 200:
            return node
    raise VolumeNotFound(f"no volume {reference!r} on any node that answers")


def _body(request: Request) -> Body:
    if request.method in ("POST", "PUT", "PATCH", "DELETE") and (
        request.headers.get("content-length") not in (None, "0")
        or "chunked" in request.headers.get("transfer-encoding", "")
    ):
        stream: AsyncIterator[bytes] = request.stream()
        return stream
    return None


async def _to_volume_node(request: Request, reference: str, probe: str) -> Response:
    _, _, proxy, _ = _state(request)
    node = await _home(request, reference, probe)
    try:
        upstream = await proxy.send(node, request, _raw_path(request), _body(request))
    except NodeUnreachable:
        raise NodeUnavailable(
            f"volume {reference}'s node {node.name} does not answer now; retry shortly",
            retry_after=RETRY_AFTER,
        ) from None
    return Relayed(upstream)


async def volume_request(request: Request) -> Response:
    """`/volumes/{volume}...`: to the node that has it."""
    reference = request.path_params["volume"]
    return await _to_volume_node(request, reference, f"/volumes/{reference}")


async def e2b_volume_request(request: Request) -> Response:
    """E2B's `/volumes/{id}` and `/volumecontent/{id}/...`: to the node that has it."""
    reference = request.path_params["volume"]
    return await _to_volume_node(request, reference, f"/e2b/volumes/{reference}")


async def create_volume(request: Request) -> Response:
    """A new volume, on the least loaded node that takes it (ours and E2B's alike)."""
    _, directory, _, _ = _state(request)
    nodes = placement.for_session(directory.up())
    offered = await _offer(request, "volume", _raw_path(request), nodes, QUICK_ANSWER_SECONDS)
    if isinstance(offered, tuple):
        return Relayed(offered[1])
    if offered is not None:
        return _replay(offered)
    raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)


async def list_volumes(request: Request) -> Response:
    """Every node's volumes, oldest first; `unavailable_nodes` names those not heard."""
    return await oldest_first(request, "volumes")


async def e2b_list_volumes(request: Request) -> Response:
    found, _ = await gather(request, None)
    return JSONResponse(found)


ROUTES = [
    Route("/volumes", create_volume, methods=["POST"]),
    Route("/volumes", list_volumes, methods=["GET"]),
    Route("/volumes/{volume}", volume_request, methods=["GET", "DELETE"]),
    Route("/volumes/{volume}/{rest:path}", volume_request, methods=["GET", "PUT", "DELETE"]),
]
E2B_ROUTES = [
    Route("/e2b/volumes", e2b_answers(create_volume), methods=["POST"]),
    Route("/e2b/volumes", e2b_answers(e2b_list_volumes), methods=["GET"]),
    Route("/e2b/volumes/{volume}", e2b_answers(e2b_volume_request), methods=["GET", "DELETE"]),
    Route(
        "/e2b/volumecontent/{volume}/{rest:path}",
        e2b_answers(e2b_volume_request),
        methods=["GET", "PUT", "POST", "PATCH", "DELETE"],
    ),
]
