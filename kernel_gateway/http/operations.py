"""An endpoint declared once: the record its route and its OpenAPI operation are both built from.

An `Operation` names the path, the method, the handler, the request body's model, each
success answer's shape and the error statuses it can answer with. `route()` makes the
starlette route; `kernel_gateway.server.openapi` makes the operation of the API's document
from the same record (as `starlette.schemas` reads routes). A route cannot be added without
its documentation, nor documented without existing.

A `Surface` is a group of routes whose contract is another specification (MCP, Jupyter's
REST API, E2B's API, the web UI's files): they are routed as given and left out of the
document under their prefix, with the reason.

Shapes are the classes of `kernel_gateway.shapes` (a response TypedDict, a request model),
named here by the class: the document refers to them by name, and a test checks that a
handler annotated `-> JSONResponse[X]` answers the shape its record declares.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

Endpoint = Callable[[Request], Awaitable[Response]]
JSON = dict[str, Any]

_PARAM = re.compile(r"\{([^}:]+)(?::[^}]+)?\}")


@dataclass(frozen=True)
class Reply:
    """One success answer: its status, what it means, and its body.

    `shape` is a response TypedDict sent as `application/json`; `content` gives other media
    types by hand (an event stream, a file's bytes, HTML). `headers` and `links` are
    OpenAPI's, as written.
    """

    status: int
    description: str
    shape: type | None = None
    content: Mapping[str, JSON] | None = None
    headers: Mapping[str, JSON] = field(default_factory=dict)
    links: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass(frozen=True)
class Body:
    """The request body: a request model sent as JSON, or other media types by hand."""

    model: type | None = None
    required: bool = True
    content: Mapping[str, JSON] | None = None


@dataclass(frozen=True)
class Operation:
    """One endpoint: routed and documented from this record alone.

    `errors` are the error statuses it answers with besides 400 (any request can be
    malformed) and 401 (behind a token, unless `public`). Path parameters are read from
    `path`; `parameters` adds query and header ones.
    """

    method: str
    path: str
    handler: Endpoint
    id: str
    summary: str = ""
    description: str = ""
    tags: tuple[str, ...] = ()
    body: Body | None = None
    replies: tuple[Reply, ...] = ()
    errors: tuple[int, ...] = ()
    parameters: tuple[JSON, ...] = ()
    public: bool = False

    def route(self) -> Route:
        return Route(self.path, self.handler, methods=[self.method.upper()], name=self.id)

    @property
    def template(self) -> str:
        """The path as OpenAPI writes it: `{path}`, without starlette's convertor."""
        return _PARAM.sub(r"{\1}", self.path)

    @property
    def path_parameters(self) -> list[str]:
        return _PARAM.findall(self.path)


@dataclass(frozen=True)
class Surface:
    """Routes whose contract is another specification, left out of the API's document."""

    prefix: str
    reason: str
    routes: Sequence[BaseRoute]


def routes(operations: Sequence[Operation], surfaces: Sequence[Surface] = ()) -> list[BaseRoute]:
    """The routing table: every operation's route, then every surface's routes."""
    table: list[BaseRoute] = [op.route() for op in operations]
    for surface in surfaces:
        table.extend(surface.routes)
    return table
