"""The router's endpoints: place new work, pass the rest to the node named in the id."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlencode

import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from kernel_gateway.cluster import placement
from kernel_gateway.cluster.directory import Node, NodeDirectory
from kernel_gateway.cluster.metrics import RouterMetrics
from kernel_gateway.cluster.proxy import Body, NodeUnreachable, Proxy, Relayed
from kernel_gateway.cluster.settings import RouterSettings
from kernel_gateway.errors import (
    BadRequest,
    Conflict,
    GatewayError,
    NodeLost,
    NodeUnavailable,
    NotFound,
    SessionNotFound,
    TooManySessions,
    Unauthorized,
)
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import check_declared_length, read_body
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.protocols.e2b.paths import ERROR_TYPE_HEADER, is_control
from kernel_gateway.settings import NODE_NAME
from kernel_gateway.tenants.principal import ADMIN

# Bodies up to this size are kept, so that a request can be sent again when its node
# could not be reached; larger ones (file uploads) stream through once.
KEPT_BODY_BYTES = 2 * 1024 * 1024
RETRY_AFTER = 2.0
# A create waits for a warm kernel, or for one to start (--kernel-start-timeout, 30 s).
CREATE_ANSWER_SECONDS = 60.0
# Lists and pages answer at once; a node that takes longer is skipped (lists) or failed.
QUICK_ANSWER_SECONDS = 10.0
Endpoint = Callable[[Request], Awaitable[Response]]
SNAPSHOT_ID = re.compile(r"snap-[0-9a-f]{20}")
"""A snapshot id after its node's name (sessions/snapshots.py)."""
VOLUME_ID = re.compile(r"vol-[0-9a-f]{20}")
"""A volume id after its node's name (kernels/volumes.py)."""


def _state(request: Request) -> tuple[RouterSettings, NodeDirectory, Proxy, RouterMetrics]:
    s = request.state
    return s.settings, s.directory, s.proxy, s.metrics


async def health(request: Request) -> Response:
    _, directory, _, _ = _state(request)
    summary = directory.summary()
    return JSONResponse(summary, status_code=200 if summary["status"] != "down" else 503)


async def metrics(request: Request) -> Response:
    _, _, _, router_metrics = _state(request)
    body, content_type = router_metrics.render(request.headers.get("accept"))
    return Response(body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})


async def _offer(
    request: Request,
    kind: str,
    path: str,
    nodes: list[Node],
    answer_within: float | None,
    body: bytes | None = None,
) -> tuple[Node, httpx.Response] | httpx.Response | None:
    """New work offered to `nodes` in turn: the node that took it and its answer, else
    the last refusal (429 full, 503 draining: nothing was done there), else None. `body`:
    the request's, when it was read already."""
    settings, _, proxy, router_metrics = _state(request)
    if body is None:
        body = await _read(request, settings.max_body_bytes)
    refused: httpx.Response | None = None
    for node in nodes:
        # A session is counted on its node from the moment it is asked for, so that a
        # burst of creates spreads before any of them is answered.
        creating = 1 if kind == "session" else 0
        node.creating += creating
        try:
            upstream = await proxy.send(node, request, path, body, answer_within=answer_within)
        except NodeUnreachable:
            router_metrics.placement(kind, node.name, "unreachable")
            continue
        finally:
            node.creating -= creating
        if creating and upstream.status_code == 201:
            node.placed += 1  # until the node's next answer counts it
        if upstream.status_code in (429, 503) or await _elsewhere(upstream):
            router_metrics.placement(kind, node.name, "refused")
            await upstream.aread()
            await upstream.aclose()
            refused = upstream
            continue
        router_metrics.placement(kind, node.name, "placed")
        return node, upstream
    return refused


async def _elsewhere(upstream: httpx.Response) -> bool:
    """Whether the node refused because it lacks the template asked for (not built there
    yet, or not ready: cluster/templates.py) or the snapshot (another node's, asked for by
    name): another node may have it. E2B's answers name the gateway's error type in a
    header (their body has none)."""
    if upstream.status_code not in (404, 409):
        return False
    kind = upstream.headers.get(ERROR_TYPE_HEADER)
    if kind is None:
        await upstream.aread()
        try:
            kind = json.loads(upstream.content)["error"]["type"]
        except (ValueError, KeyError, TypeError):
            return False
    return kind in (
        "template_not_found",
        "template_conflict",
        "snapshot_not_found",
        "volume_not_found",
    )


async def create_session(request: Request) -> Response:
    """Placed by load; one from a snapshot on the snapshot's node, one mounting volumes on
    theirs (named in their ids; by name, on the first node that has them)."""
    settings, directory, _, _ = _state(request)
    body = await _read(request, settings.max_body_bytes)
    nodes = placement.for_session(directory.up())
    snapshot, volumes = _asked(body)
    homes = {snapshot_node(snapshot)} | {volume_node(v) for v in volumes}
    homes.discard(None)
    if len(homes) > 1:
        raise Conflict(
            "the snapshot and volumes asked for are on different nodes "
            f"({', '.join(sorted(h for h in homes if h))}): a session runs on one"
        )
    if homes:
        (home,) = homes
        nodes = [n for n in directory.up() if n.name == home]
        if not nodes:
            raise NodeUnavailable(
                f"the node {home} of the snapshot or volumes does not answer now; retry shortly",
                retry_after=RETRY_AFTER,
            )
    async with request.state.keys.session_for(principal_of(request)):
        offered = await _offer(request, "session", "/sessions", nodes, CREATE_ANSWER_SECONDS, body)
    if isinstance(offered, tuple):
        return Relayed(offered[1])
    if offered is not None and offered.status_code != 429:
        return _replay(offered)  # every node that answered is draining or cannot start kernels
    if offered is not None:
        capacity = sum(n.max_sessions for n in directory.up())
        raise TooManySessions(
            f"every node of the cluster is full ({capacity} sessions in all); delete a "
            "session or retry later",
            retry_after=5,
        )
    raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)


def _asked(body: bytes) -> tuple[str | None, list[str]]:
    """The `snapshot` and `volumes` a create's body names, if it is readable (the node
    judges the rest)."""
    try:
        document = json.loads(body) if body.strip() else {}
    except ValueError:
        return None, []
    if not isinstance(document, dict):
        return None, []
    snapshot = document.get("snapshot")
    volumes = document.get("volumes")
    return (
        snapshot if isinstance(snapshot, str) else None,
        [v for v in volumes if isinstance(v, str)] if isinstance(volumes, dict) else [],
    )


def volume_node(reference: str | None) -> str | None:
    """The node a volume id (`<node>.vol-<hex>`) names; None for a name (any node)."""
    if reference is None:
        return None
    name, dot, rest = reference.partition(".")
    if dot and VOLUME_ID.fullmatch(rest) and NODE_NAME.fullmatch(name):
        return name
    return None


def snapshot_node(reference: str | None) -> str | None:
    """The node a snapshot id (`<node>.snap-<hex>`) names; None for a name (any node)."""
    if reference is None:
        return None
    name, dot, rest = reference.partition(".")
    if dot and SNAPSHOT_ID.fullmatch(rest) and NODE_NAME.fullmatch(name):
        return name
    return None


async def execute_stateless(request: Request) -> Response:
    directory = request.state.directory
    nodes = placement.for_stateless(directory.up())
    offered = await _offer(request, "stateless", "/execute", nodes, None)
    if isinstance(offered, tuple):
        node, upstream = offered
        node.stateless += 1

        def done() -> None:
            node.stateless -= 1

        return Relayed(upstream, on_close=done)
    if offered is not None:
        return _replay(offered)
    raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)


async def list_sessions(request: Request) -> Response:
    sessions, missing = await gather(request, "sessions")
    document: dict[str, Any] = {"sessions": sessions}
    if missing:
        document["unavailable_nodes"] = missing
    return JSONResponse(document)


async def session_request(request: Request) -> Response:
    """Any request on `/sessions/{id}...`: sent to the node named in the id."""
    return await _to_session_node(request, request.path_params["session_id"])


async def _to_session_node(request: Request, session_id: str) -> Response:
    """The request, sent as it is to the node named in `session_id`."""
    settings, directory, proxy, router_metrics = _state(request)
    path = _raw_path(request)
    name, dot, rest = session_id.partition(".")
    if not (dot and rest and NODE_NAME.fullmatch(name)):
        raise SessionNotFound(f"no session with id {session_id!r}")
    check_declared_length(request, 1 << 62)  # a bad Content-Length is refused here
    body: Body = None
    resend = True
    if request.method in ("POST", "PUT", "PATCH", "DELETE"):
        declared = request.headers.get("content-length")
        if declared is not None and int(declared) <= KEPT_BODY_BYTES:
            body = await _read(request, KEPT_BODY_BYTES)
        elif declared is not None or "chunked" in request.headers.get("transfer-encoding", ""):
            body, resend = request.stream(), False
    deadline = time.monotonic() + settings.node_wait
    while True:
        node = directory.get(name)
        if node is None and not directory.young():
            # A node this router has polled for long enough without meeting: not ours.
            raise SessionNotFound(f"no session with id {session_id!r} (no node {name!r})")
        if node is not None and node.state == "lost":
            router_metrics.lost_session()
            raise NodeLost(
                f"session {session_id}'s node {name} has not answered for "
                f"{time.monotonic() - node.last_seen:.0f} s and is presumed lost, with its "
                "sessions; create a new session"
            )
        if node is not None and node.state == "up":
            try:
                upstream = await proxy.send(node, request, path, body)
            except NodeUnreachable:
                if not resend:
                    break
            except ClientDisconnect:
                raise BadRequest("the client went away before its request body was read") from None
            else:
                if request.method == "DELETE" and upstream.status_code == 204:
                    if path.rstrip("/") == f"/sessions/{session_id}":
                        node.placed -= 1  # counted until the node's next report
                return Relayed(upstream)
        if not await directory.next_poll(deadline):
            break
    raise NodeUnavailable(
        f"session {session_id}'s node {name} does not answer now (its gateway may be "
        "restarting); nothing was done, retry shortly",
        retry_after=RETRY_AFTER,
    )


async def gather(request: Request, key: str | None) -> tuple[list[Any], list[str]]:
    """Every answering node's list (its answer to the request, as it is): the items (of the
    document's `key`, or the document itself when None), and the names of the nodes not
    heard (not up, or no good answer within QUICK_ANSWER_SECONDS)."""
    _, directory, proxy, _ = _state(request)
    up = directory.up()
    path = _raw_path(request)

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
        if key is not None:
            document = document.get(key) if isinstance(document, dict) else None
        return document if isinstance(document, list) else None

    answers = await asyncio.gather(*(ask(n) for n in up))
    found = [item for listed in answers if listed is not None for item in listed]
    missing = sorted(
        {n.name for n, listed in zip(up, answers, strict=True) if listed is None}
        | {n.name for n in directory.nodes.values() if n.state != "up"}
    )
    return found, missing


async def oldest_first(request: Request, key: str) -> Response:
    """Every node's list of `key` (snapshots, volumes), oldest first; `unavailable_nodes`
    names the nodes not heard."""
    found, missing = await gather(request, key)
    found.sort(key=lambda item: str(item.get("created_at", "")) if isinstance(item, dict) else "")
    document: dict[str, Any] = {key: found}
    if missing:
        document["unavailable_nodes"] = missing
    return JSONResponse(document)


async def any_node(request: Request) -> Response:
    """What every node serves alike (the web UI, the OpenAPI document, the languages)."""
    _, directory, proxy, _ = _state(request)
    path = _raw_path(request)
    for node in sorted(directory.up(), key=lambda n: n.sessions):
        try:
            upstream = await proxy.send(
                node, request, path, None, answer_within=QUICK_ANSWER_SECONDS
            )
            return Relayed(upstream)
        except NodeUnreachable:
            continue
    raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)


async def not_routed(request: Request) -> Response:
    raise NotFound(
        f"{request.url.path} is not served through the router: the MCP endpoint and "
        "Jupyter's kernel API are served by each node gateway (see docs/cluster.md in "
        "the gateway's documentation)"
    )


def _raw_path(request: Request) -> str:
    """The path as the client sent it, still percent-encoded (`files/a%2Fb` stays one
    name); one with `.` or `..` segments, which would be resolved on the way to the
    node into another route, is refused."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else request.url.path
    if any(unquote(segment) in (".", "..") for segment in path.split("/")):
        raise BadRequest("a path with '.' or '..' segments is not routed")
    return path


async def _read(request: Request, limit: int) -> bytes:
    try:
        return await read_body(request, limit)
    except ClientDisconnect:
        raise BadRequest("the client went away before its request body was read") from None


def _no_node(directory: NodeDirectory) -> str:
    known = len(directory.nodes)
    return (
        f"no node of the cluster answers now ({known} known, none up); retry shortly"
        if known
        else "no node gateway has been found yet (check --nodes); retry shortly"
    )


def _replay(upstream: httpx.Response) -> Response:
    headers = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() in ("content-type", "retry-after", "www-authenticate")
    }
    return Response(upstream.content, status_code=upstream.status_code, headers=headers)


# -- E2B's API (`/e2b`, protocols/e2b on each node) --------------------------------------------

E2B_SANDBOX_PATH = re.compile(r"^/e2b/+(?:v2/+)?sandboxes/+(?P<id>[^/?]+)")
E2B_COLLECTION = re.compile(r"^/e2b/+(?:v2/+)?sandboxes/*$")


def e2b_answers(handler: Endpoint) -> Endpoint:
    """`handler` as an `/e2b` endpoint: the router's own refusals in E2B's shape,
    `{"code": status, "message"}` (a data-plane call for a sandbox that is not there: the
    502 E2B's edge answers)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except GatewayError as exc:
            data_plane = not is_control(request.url.path.removeprefix("/e2b"))
            sandbox_call = request.headers.get("e2b-sandbox-id") and data_plane
            if sandbox_call and exc.status_code in (404, 410):
                body = {"code": 502, "message": "The sandbox was not found: " + exc.message}
                return JSONResponse(body, status_code=502)
            headers = {"Retry-After": str(int(exc.retry_after))} if exc.retry_after else {}
            return JSONResponse(
                {"code": exc.status_code, "message": exc.message},
                status_code=exc.status_code,
                headers=headers,
            )

    return endpoint


async def _e2b(request: Request) -> Response:
    path = request.url.path
    sandbox_id = request.headers.get("e2b-sandbox-id")
    if sandbox_id is None and (match := E2B_SANDBOX_PATH.match(path)):
        sandbox_id = match["id"]
    if sandbox_id is not None:
        return await _to_session_node(request, sandbox_id)
    if E2B_COLLECTION.match(path) and request.method == "POST":
        directory = request.state.directory
        nodes = placement.for_session(directory.up())
        # E2B's API is authenticated by the node; a key this router knows is counted here.
        key = request.state.keys.store.resolve(request.headers.get("x-api-key", ""))
        async with request.state.keys.session_for(key or ADMIN):
            offered = await _offer(
                request, "session", _raw_path(request), nodes, CREATE_ANSWER_SECONDS
            )
        if isinstance(offered, tuple):
            return Relayed(offered[1])
        if offered is not None:
            return _replay(offered)
        raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)
    if E2B_COLLECTION.match(path) and request.method == "GET":
        return await _e2b_list(request)
    raise NotFound(f"{request.method} {path} is not routed: it names no sandbox")


e2b_request = e2b_answers(_e2b)
"""`/e2b/...`: a sandbox's calls go to its node (its id names it, in the E2b-Sandbox-Id
header or the path), creates are placed as sessions are, lists gather every node's; the
template calls are e2b_templates.py's."""


def _e2b_message(text: str) -> str:
    """The message of a node's E2B error (`{"code", "message"}`), or its text."""
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if isinstance(message, str) else text[:500]


async def e2b_pages(
    request: Request, node: Node, path: str, params: list[tuple[str, str]]
) -> list[Any]:
    """Every item of one node's E2B list at `path` with the query `params`, page after page
    (100 at a time, following `X-Next-Token`); what it gave before it stopped answering.
    A 400 or 401 would be the same from every node: raised, in the node's words."""
    _, _, proxy, _ = _state(request)
    collected: list[Any] = []
    token: str | None = None
    while True:
        query = urlencode([*params, ("limit", "100"), *([("nextToken", token)] if token else [])])
        try:
            upstream = await proxy.send(
                node, request, path, None, answer_within=QUICK_ANSWER_SECONDS, query=query
            )
        except NodeUnreachable:
            return collected
        try:
            await upstream.aread()
            found = upstream.json() if upstream.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            found = None
        finally:
            await upstream.aclose()
        if not isinstance(found, list):
            if upstream.status_code in (400, 401):  # the same for every node: passed on
                error = Unauthorized if upstream.status_code == 401 else BadRequest
                raise error(_e2b_message(upstream.text))
            return collected
        collected += found
        token = upstream.headers.get("x-next-token")
        if not token:
            return collected


async def _e2b_list(request: Request) -> Response:
    """Every node's sandboxes, merged and paged here (`limit`, `nextToken` = the id that
    starts the next page, `X-Next-Token`)."""
    _, directory, _, _ = _state(request)
    params = [
        (k, v) for k, v in request.query_params.multi_items() if k not in ("limit", "nextToken")
    ]
    answers = await asyncio.gather(
        *(e2b_pages(request, n, request.url.path, params) for n in directory.up())
    )
    found = sorted(
        (s for listed in answers for s in listed if isinstance(s, dict)),
        key=lambda s: (str(s.get("startedAt", "")), str(s.get("sandboxID", ""))),
        reverse=request.query_params.get("order", "desc") != "asc",  # E2B's: newest first
    )
    try:
        limit = int(request.query_params.get("limit") or 100)
    except ValueError:
        raise BadRequest("'limit' must be a number") from None
    ids = [str(s.get("sandboxID")) for s in found]
    start = ids.index(token) if (token := request.query_params.get("nextToken")) in ids else 0
    page = found[start : start + max(1, min(limit, 100))]
    headers = {}
    if start + len(page) < len(found):
        headers["X-Next-Token"] = ids[start + len(page)]
    return JSONResponse(page, headers=headers)


SESSION_METHODS = ["GET", "POST", "PUT", "DELETE"]

routes = [
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/", any_node, methods=["GET"]),
    Route("/openapi.json", any_node, methods=["GET"]),
    Route("/languages", any_node, methods=["GET"]),
    Route("/chat", any_node, methods=["GET"]),
    Route("/static/{path:path}", any_node, methods=["GET"]),
    Route("/execute", execute_stateless, methods=["POST"]),
    Route("/sessions", create_session, methods=["POST"]),
    Route("/sessions", list_sessions, methods=["GET"]),
    Route("/sessions/{session_id}", session_request, methods=SESSION_METHODS),
    Route("/sessions/{session_id}/{rest:path}", session_request, methods=SESSION_METHODS),
    Route("/mcp", not_routed),
    Route("/mcp/{rest:path}", not_routed),
    Route("/api/{rest:path}", not_routed),
    Route("/e2b/{rest:path}", e2b_request, methods=["GET", "HEAD", "POST", "PUT", "DELETE"]),
]
