"""Templates through the router: built on every node, found where they are.

Each node builds a template itself, from the same steps and files: the router sends a
build (and a files upload, and a delete) to every node that is up, so no image has to
move between engines and no registry is needed. A build's steps are cached per node,
so a node that joins later gets the template the next time it is built (or with
`POST /templates/{name}/builds`). Sessions on a template are placed only where it is
ready: a node that answers `template_not_found` or `template_conflict` is passed over
like a full one (see `routes._offer`).

The answer to a write is the first node's; if the nodes disagree (one refused what
another took), the router answers 502 `bad_gateway` naming each node's status, since
the cluster is then not what the client asked for. Reads go to the first node that
knows the template (or the build: its id is that node's), and a list gathers them all,
once per name.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
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
    _read,
    _replay,
    _state,
)
from kernel_gateway.errors import BadGateway, NodeUnavailable
from kernel_gateway.http.responses import JSONResponse

KEPT_UPLOAD_BYTES = 256 * 1024 * 1024
"""A template's body (its files) is kept whole to be sent to every node: at most this."""
WRITE_ANSWER_SECONDS = 120.0


async def every_node(request: Request) -> Response:
    """A build, an upload or a delete: to every node that is up."""
    _, directory, _, _ = _state(request)
    body = await _read(request, KEPT_UPLOAD_BYTES)
    answered = await ask_nodes(request, directory.up(), _raw_path(request), body)
    return _replay(agreed(answered, missing_ok=request.method == "DELETE"))


async def ask_nodes(
    request: Request,
    nodes: list[Node],
    path: str,
    body: bytes | None,
    *,
    queries: Mapping[str, str] | None = None,
    answer_within: float = WRITE_ANSWER_SECONDS,
) -> list[tuple[Node, httpx.Response]]:
    """`request` sent to `path` on each of `nodes` at once (with the query `queries` names
    for it, else the request's), each answer read whole: the nodes that answered, with
    their answers, in the order of `nodes`. `NodeUnavailable` when none did."""
    _, directory, proxy, _ = _state(request)

    async def ask(node: Node) -> httpx.Response | None:
        query = queries.get(node.name) if queries is not None else None
        try:
            upstream = await proxy.send(
                node, request, path, body, answer_within=answer_within, query=query
            )
        except NodeUnreachable:
            return None
        await upstream.aread()
        await upstream.aclose()
        return upstream

    answers = await asyncio.gather(*(ask(node) for node in nodes))
    answered = [(n, a) for n, a in zip(nodes, answers, strict=True) if a is not None]
    if not answered:
        raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)
    return answered


def agreed(answered: list[tuple[Node, httpx.Response]], *, missing_ok: bool) -> httpx.Response:
    """The one answer of nodes that all did the same: the first node's. With `missing_ok`,
    a node that has no such template or build (404) is left out when another took it: it
    is not one of the template's nodes. `BadGateway`, naming each node's status, when some
    took it and others refused: the cluster is then not what the client asked for."""
    if missing_ok and any(a.is_success for _, a in answered):
        answered = [(n, a) for n, a in answered if a.status_code != 404]
    kinds = {a.status_code // 100 for _, a in answered}
    if len(kinds) > 1:
        statuses = ", ".join(f"{n.name} {a.status_code}" for n, a in answered)
        raise BadGateway(
            f"the nodes did not all take it ({statuses}): the template differs between "
            "nodes now; build it again, or delete it"
        )
    return answered[0][1]


async def first_knowing(request: Request) -> Response:
    """A template, a build or its log: from the first node that knows it."""
    _, directory, proxy, _ = _state(request)
    path = _raw_path(request)
    last: httpx.Response | None = None
    for node in directory.up():
        try:
            upstream = await proxy.send(
                node, request, path, None, answer_within=QUICK_ANSWER_SECONDS
            )
        except NodeUnreachable:
            continue
        if upstream.status_code == 404:
            await upstream.aread()
            await upstream.aclose()
            last = upstream
            continue
        return Relayed(upstream)
    if last is not None:
        return _replay(last)
    raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)


async def list_all(request: Request) -> Response:
    """Every node's templates, once per name (the first node's record of it)."""
    _, directory, proxy, _ = _state(request)

    async def ask(node: Node) -> list[Any]:
        try:
            upstream = await proxy.send(
                node, request, "/templates", None, answer_within=QUICK_ANSWER_SECONDS
            )
        except NodeUnreachable:
            return []
        await upstream.aread()
        await upstream.aclose()
        if upstream.status_code != 200:
            return []
        try:
            found = json.loads(upstream.content).get("templates", [])
        except (ValueError, AttributeError):
            return []
        return found if isinstance(found, list) else []

    seen: dict[str, Any] = {}
    for found in await asyncio.gather(*(ask(node) for node in directory.up())):
        for template in found:
            if isinstance(template, dict) and isinstance(template.get("name"), str):
                seen.setdefault(template["name"], template)
    return JSONResponse({"templates": sorted(seen.values(), key=lambda t: t["name"])})


routes = [
    Route("/templates", every_node, methods=["POST"]),
    Route("/templates", list_all, methods=["GET"]),
    Route("/templates/files/{hash}", every_node, methods=["PUT"]),
    Route("/templates/files/{hash}", first_knowing, methods=["GET"]),
    Route("/templates/{name}", first_knowing, methods=["GET"]),
    Route("/templates/{name}", every_node, methods=["DELETE"]),
    Route("/templates/{name}/builds", every_node, methods=["POST"]),
    Route("/templates/{name}/builds/{rest:path}", first_knowing, methods=["GET"]),
]
