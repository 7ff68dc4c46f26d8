"""E2B's template API through the router: `Template.build` and its kin, on every node.

Each node builds a template itself (templates.py says why); E2B's SDK builds in calls of
its own (protocols/e2b/templates_api.py), which the router makes cluster-wide:

    POST /v3/templates                    to the first node that answers, then to the others
                                          with the `templateID` and `buildID` it gave: one
                                          template id and one build id on every node (a node
                                          that had the template under another id keeps its
                                          own; the answer's `templateID` is then the name,
                                          which every node knows it by)
    GET  /templates/{id}/files/{hash}     every node: `present` once every node has the
                                          files; the upload URL is the router's, carrying
                                          each node's own signed token (`token=<node>:<t>`)
    PUT  .../files/{hash}/upload?token=   the tar, kept whole, to each node named, with its
                                          token (each node checks its own)
    POST /v2/templates/{id}/builds/{b}    every node: the build runs on each
    GET  .../builds/{b}/status            every node: `ready` once every node that has the
                                          build is ready, `error` once one failed (its
                                          reason, naming the node), else `building`; the log
                                          entries are one node's, the first that has it
    GET  .../builds/{b}/logs, /templates/{id}, /templates/{id}/tags, /templates/aliases/{n}
                                          the first node that knows it
    GET  /v2/templates, /templates        every node's, once per name, paged here
    DELETE /templates/{id}, POST|DELETE /templates/tags
                                          every node

A write that some nodes take and others refuse is a 502 naming each node's status (as with
the gateway's own template API); a node that answers 404 to a write on an existing template
(it joined since the template was made) is left out. `Sandbox.create("name")` is placed as
any sandbox: a node that lacks the template (or its ready build) says so in the header
`Gateway-Error-Type`, and is passed over (`routes._elsewhere`). The router's own
refusals are E2B's `{"code", "message"}` (`routes.e2b_answers`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel_gateway.cluster.directory import Node
from kernel_gateway.cluster.proxy import NodeUnreachable
from kernel_gateway.cluster.routes import (
    KEPT_BODY_BYTES,
    QUICK_ANSWER_SECONDS,
    RETRY_AFTER,
    Endpoint,
    _no_node,
    _raw_path,
    _read,
    _replay,
    _state,
    e2b_answers,
    e2b_pages,
)
from kernel_gateway.cluster.templates import (
    KEPT_UPLOAD_BYTES,
    WRITE_ANSWER_SECONDS,
    agreed,
    ask_nodes,
    first_knowing,
)
from kernel_gateway.errors import BadGateway, BadRequest, Forbidden, NodeUnavailable
from kernel_gateway.http.responses import JSONResponse

MAX_PAGE = 100
"""Most templates one list answers (E2B's `limit` maximum)."""


# -- a build: requested, its files uploaded, started, followed -------------------------------


async def create(request: Request) -> Response:
    """`POST /v3/templates`: the first node makes the template and the build, the others
    the same with its ids."""
    _, directory, _, _ = _state(request)
    body = await _read(request, KEPT_BODY_BYTES)
    path = _raw_path(request)
    nodes = directory.up()
    node, upstream = await _first_answer(request, nodes, path, body)
    made = _document(upstream) if upstream.status_code == 202 else None
    if not isinstance(made, dict) or not {"templateID", "buildID"} <= made.keys():
        return _replay(upstream)  # refused: nothing was done on any node
    answered = [(node, upstream)]
    ids = {"templateID": made["templateID"], "buildID": made["buildID"]}
    others = nodes[nodes.index(node) + 1 :]
    if others:
        try:
            answered += await ask_nodes(request, others, path, with_ids(body, ids))
        except NodeUnavailable:
            pass  # the first node is the only one that answers
    agreed(answered, missing_ok=False)
    given = {str((_document(a) or {}).get("templateID")) for _, a in answered}
    names = made.get("names") or made.get("aliases")
    if len(given) > 1 and isinstance(names, list) and names:
        made = {**made, "templateID": names[0]}  # ids differ between nodes; names do not
    return JSONResponse(made, status_code=202)


async def _first_answer(
    request: Request, nodes: list[Node], path: str, body: bytes
) -> tuple[Node, httpx.Response]:
    """The first of `nodes` that answers `request`, and its answer (read whole)."""
    _, directory, proxy, _ = _state(request)
    for node in nodes:
        try:
            upstream = await proxy.send(
                node, request, path, body, answer_within=WRITE_ANSWER_SECONDS
            )
        except NodeUnreachable:
            continue
        await upstream.aread()
        await upstream.aclose()
        return node, upstream
    raise NodeUnavailable(_no_node(directory), retry_after=RETRY_AFTER)


def with_ids(body: bytes, ids: Mapping[str, str]) -> bytes:
    """E2B's build request `body` with the ids the first node gave (`templateID`,
    `buildID`), for the others (the first node read it as a JSON object)."""
    try:
        document = json.loads(body) if body.strip() else {}
    except ValueError:
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(document, dict):
        raise BadRequest("the request body is not a JSON object")
    return json.dumps({**document, **ids}).encode()


async def files_status(request: Request) -> Response:
    """`GET /templates/{id}/files/{hash}`: 201 `{present, url}`, `present` once every node
    has the files, `url` the router's, with each node's token."""
    _, directory, _, _ = _state(request)
    path = _raw_path(request)
    answered = await ask_nodes(
        request, directory.up(), path, None, answer_within=QUICK_ANSWER_SECONDS
    )
    answer = agreed(answered, missing_ok=True)
    if answer.status_code != 201:
        return _replay(answer)
    present = True
    tokens: list[tuple[str, str]] = []
    for node, upstream in answered:
        found = _document(upstream)
        if upstream.status_code != 201 or not isinstance(found, dict):
            continue
        token = _token_of(found.get("url"))
        if token is None:
            raise BadGateway(f"node {node.name} gave no upload URL for these files")
        present = present and found.get("present") is True
        tokens.append(("token", f"{node.name}:{token}"))
    url = request.url.replace(path=path + "/upload", query=urlencode(tokens))
    return JSONResponse({"present": present, "url": str(url)}, status_code=201)


def _token_of(url: object) -> str | None:
    """The `token` of a node's upload URL."""
    if not isinstance(url, str):
        return None
    return dict(parse_qsl(urlsplit(url).query)).get("token")


def node_tokens(values: Iterable[str]) -> dict[str, str]:
    """`token=<node>:<token>` values (the router's upload URL) by node name; a token that
    names no node (a node's own URL) is for every node, under ""."""
    tokens: dict[str, str] = {}
    for value in values:
        name, colon, token = value.partition(":")
        if colon:
            tokens[name] = token
        else:
            tokens[""] = value
    return tokens


async def upload(request: Request) -> Response:
    """`PUT .../files/{hash}/upload?token=`: the tar, to each node the URL has a token for
    (no API key: each node checks its own token)."""
    _, directory, _, _ = _state(request)
    tokens = node_tokens(request.query_params.getlist("token"))
    if not tokens:
        raise Forbidden("this upload URL is not valid (it carries no token)")
    body = await _read(request, KEPT_UPLOAD_BYTES)
    queries = {
        node.name: urlencode({"token": token})
        for node in directory.up()
        if (token := tokens.get(node.name, tokens.get(""))) is not None
    }
    nodes = [node for node in directory.up() if node.name in queries]
    answered = await ask_nodes(request, nodes, _raw_path(request), body, queries=queries)
    return _replay(agreed(answered, missing_ok=True))


async def to_every_node(request: Request) -> Response:
    """A write on an existing template (its build started, a delete, tags): to every node
    that is up, those that do not have it left out."""
    _, directory, _, _ = _state(request)
    body = await _read(request, KEPT_BODY_BYTES)
    answered = await ask_nodes(request, directory.up(), _raw_path(request), body)
    return _replay(agreed(answered, missing_ok=True))


def combined(states: Iterable[object]) -> str:
    """One state of a build made on several nodes: `error` if it failed on one, `ready`
    once ready on all, `waiting` while waiting on all, else `building`."""
    seen = list(states)
    if "error" in seen:
        return "error"
    for state in ("ready", "waiting"):
        if seen and all(s == state for s in seen):
            return state
    return "building"


async def build_status(request: Request) -> Response:
    """E2B's `TemplateBuildInfo` of a build on every node (see `combined`); the log entries
    of the first node that has the build."""
    _, directory, _, _ = _state(request)
    answered = await ask_nodes(
        request, directory.up(), _raw_path(request), None, answer_within=QUICK_ANSWER_SECONDS
    )
    answer = agreed(answered, missing_ok=True)
    found = [
        (node, document)
        for node, upstream in answered
        if upstream.status_code == 200 and isinstance(document := _document(upstream), dict)
    ]
    if answer.status_code != 200 or not found:
        return _replay(answer)
    return JSONResponse(status_json(found))


def status_json(found: list[tuple[Node, dict[str, Any]]]) -> dict[str, Any]:
    """The nodes' `TemplateBuildInfo`s as one: the first's, its status the combined one,
    and the reason of the first that failed, naming its node."""
    shown = dict(found[0][1])
    shown["status"] = combined(document.get("status") for _, document in found)
    shown.pop("reason", None)
    failed = next(((n, d) for n, d in found if d.get("status") == "error"), None)
    if failed is not None:
        node, document = failed
        reason = document.get("reason")
        reason = dict(reason) if isinstance(reason, dict) else {"logEntries": []}
        message = reason.get("message") or "the build failed"
        reason["message"] = f"on node {node.name}: {message}" if len(found) > 1 else message
        shown["reason"] = reason
    return shown


# -- templates listed ----------------------------------------------------------------------------


async def list_templates(request: Request) -> Response:
    """`GET /v2/templates` (and `/templates`): every node's templates, once per name (the
    first node's record, its `buildStatus` the nodes' combined), oldest first, paged here
    (`limit`, `nextToken`: the id that starts the next page, `X-Next-Token`)."""
    _, directory, _, _ = _state(request)
    path = _raw_path(request)
    params = [
        (k, v) for k, v in request.query_params.multi_items() if k not in ("limit", "nextToken")
    ]
    listed = await asyncio.gather(
        *(e2b_pages(request, node, path, params) for node in directory.up())
    )
    merged = merge_templates(listed)
    try:
        limit = max(1, min(int(request.query_params.get("limit") or MAX_PAGE), MAX_PAGE))
    except ValueError:
        raise BadRequest("'limit' must be a number") from None
    ids = [str(t.get("templateID")) for t in merged]
    token = request.query_params.get("nextToken")
    start = ids.index(token) if token in ids else 0
    page = merged[start : start + limit]
    headers = {"X-Next-Token": ids[start + limit]} if start + limit < len(merged) else {}
    return JSONResponse(page, headers=headers)


def merge_templates(listed: Iterable[list[Any]]) -> list[dict[str, Any]]:
    """Each node's E2B `Template`s as one list: once per name, the first node's record
    with the `buildStatus` of all (`combined`), oldest first."""
    records: dict[str, dict[str, Any]] = {}
    states: dict[str, list[object]] = {}
    for templates in listed:
        for template in templates:
            if not isinstance(template, dict):
                continue
            names = template.get("names") or template.get("aliases") or []
            key = str(names[0] if isinstance(names, list) and names else template.get("templateID"))
            records.setdefault(key, template)
            states.setdefault(key, []).append(template.get("buildStatus"))
    merged = [{**record, "buildStatus": combined(states[key])} for key, record in records.items()]
    return sorted(merged, key=lambda t: (str(t.get("createdAt", "")), str(t.get("templateID"))))


def _document(upstream: httpx.Response) -> Any:
    """A node's JSON answer (None: not JSON)."""
    try:
        return json.loads(upstream.content)
    except ValueError:
        return None


def _e2b(path: str, handler: Endpoint, methods: list[str]) -> Route:
    return Route("/e2b" + path, e2b_answers(handler), methods=methods)


routes = [
    # Before the router's other `/e2b` routes; `/templates/tags` and `/templates/aliases/...`
    # before `/templates/{id}`, which would take them.
    _e2b("/v3/templates", create, ["POST"]),
    _e2b("/v2/templates", list_templates, ["GET"]),
    _e2b("/templates", list_templates, ["GET"]),
    _e2b("/templates/tags", to_every_node, ["POST", "DELETE"]),
    _e2b("/templates/aliases/{alias}", first_knowing, ["GET"]),
    _e2b("/templates/{id}", first_knowing, ["GET"]),
    _e2b("/templates/{id}", to_every_node, ["DELETE"]),
    _e2b("/templates/{id}/tags", first_knowing, ["GET"]),
    _e2b("/templates/{id}/files/{hash}", files_status, ["GET"]),
    _e2b("/templates/{id}/files/{hash}/upload", upload, ["PUT"]),
    _e2b("/v2/templates/{id}/builds/{build}", to_every_node, ["POST"]),
    _e2b("/templates/{id}/builds/{build}/status", build_status, ["GET"]),
    _e2b("/templates/{id}/builds/{build}/logs", first_knowing, ["GET"]),
]
