"""The outermost middleware: a request id, the route template, one access-log line, metrics.

Every response carries `X-Request-Id`: the client's own when it is a sane id
(1-128 characters of letters, digits and `-_.:`), else a new one. The id, and
the session and execution ids in the path, are bound for every log line the
request causes (see `logs.py`).

Requests are counted by route *template* (`/sessions/{session_id}`), matched
against the app's routing table (`scope["app"].routes`, so routes added anywhere
are known) before anything else runs: even a request refused by auth is counted
under its route, and an unknown path is counted as `unmatched`, so label values
stay bounded whatever clients send.

An exception no handler took is answered here as a 500 JSON error (with the
request id) and logged with its traceback; the code and body are not logged.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Sequence
from typing import Protocol

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel_gateway import logs
from kernel_gateway.http.auth import Authenticator, BearerAuth, LoopbackHostGuard
from kernel_gateway.http.responses import REQUEST_ID_HEADER, ConnectionDropped, JSONResponse
from kernel_gateway.settings import is_loopback
from kernel_gateway.types import JSON

logger = logging.getLogger("kernel_gateway.access")
errors = logging.getLogger("kernel_gateway")

SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SANE_PATH_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A session or execution id from the path is logged only if it could be one."""
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
UNMATCHED = "unmatched"
_CONVERTOR = re.compile(r"\{([^}:]+):[^}]+\}")


def template(route: BaseRoute) -> str | None:
    """The route's path template as the OpenAPI document writes it (`{path}`, no convertor)."""
    if isinstance(route, Route):
        return _CONVERTOR.sub(r"{\1}", route.path)
    if isinstance(route, Mount):
        return route.path + "/{path}"
    return None


def match(routes: Sequence[BaseRoute], scope: Scope) -> tuple[str, dict[str, str]]:
    """The template of the route a request goes to, and its path parameters."""
    partial: tuple[str, dict[str, str]] | None = None
    for route in routes:
        found, child = route.matches(scope)
        name = template(route)
        if name is None or found is Match.NONE:
            continue
        params = {k: str(v) for k, v in child.get("path_params", {}).items()}
        if found is Match.FULL:
            return name, params
        if partial is None:
            partial = (name, params)
    return partial or (UNMATCHED, {})


def request_id(headers: Headers) -> str:
    given = headers.get(REQUEST_ID_HEADER, "")
    return given if SANE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


class RequestCounter(Protocol):
    """Where requests are counted: the gateway's `Metrics` or the router's."""

    def request(self, method: str, route: str, status: int) -> None: ...


class ObserveRequests:
    def __init__(self, app: ASGIApp, metrics: RequestCounter) -> None:
        logs.quiet_uvicorn_errors()  # a ConnectionDropped is no error
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        rid = request_id(Headers(scope=scope))
        route, params = match(getattr(scope.get("app"), "routes", ()), scope)
        logs.bind(
            request_id=rid,
            session_id=_sane(params.get("session_id")),
            execution_id=_sane(params.get("execution_id")),
        )
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ConnectionDropped:
            raise  # a stream ended on purpose without its end: uvicorn closes the connection
        except Exception as exc:
            errors.error("unhandled error on %s %s", method, route, exc_info=exc)
            if status != 0:
                raise  # the response has started: only the server can end it now
            status = 500
            await _internal_error(rid)(scope, receive, send)
        finally:
            named = scope.get("state", {}).get(logs.ROUTE_TEMPLATE)
            if isinstance(named, str) and named.startswith(route.removesuffix("{path}")):
                route = named  # a mounted app's own route (logs.ROUTE_TEMPLATE)
            self.metrics.request(method, route, status)
            duration = (time.monotonic() - started) * 1000
            logger.info(
                "%s %s %d %.1f ms",
                method,
                route,
                status,
                duration,
                extra={
                    "fields": {
                        "method": method,
                        "route": route,
                        "status": status,
                        "duration_ms": round(duration, 3),
                    }
                },
            )


def _sane(value: str | None) -> str | None:
    return value if value is not None and SANE_PATH_ID.fullmatch(value) else None


def _internal_error(rid: str) -> JSONResponse[JSON]:
    body = {"error": {"type": "internal_error", "message": "the gateway hit an internal error"}}
    return JSONResponse(body, status_code=500, headers={REQUEST_ID_HEADER: rid})


def front_middleware(metrics: RequestCounter, auth: Authenticator, host: str) -> list[Middleware]:
    """What every request passes first, on a gateway and on a router alike: request ids,
    the access log and HTTP metrics; the Host guard (no token, loopback); the token or key."""
    return [
        Middleware(ObserveRequests, metrics=metrics),
        Middleware(LoopbackHostGuard, enabled=auth.open and is_loopback(host)),
        Middleware(BearerAuth, auth=auth),
    ]
