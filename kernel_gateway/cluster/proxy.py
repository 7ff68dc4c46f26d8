"""One request passed to a node gateway, and its answer streamed back unchanged.

The router never parses what a node says beyond its status: bodies, event streams
(SSE, with their ids and pings), `Execution-Id`, `Content-Location` and `Location`
(node gateways send paths, which mean the same through the router) pass through as
they come. The client's token stays at the router; nodes get the cluster's token, and for a client
that is an API key, the key's id (`ACTING_FOR`: the node acts as that key).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from urllib.parse import unquote

import h11
import httpx
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kernel_gateway import logs
from kernel_gateway.cluster.directory import Node
from kernel_gateway.errors import BadGateway
from kernel_gateway.http.auth import ACTING_FOR, PRINCIPAL, PUBLIC_PATHS, PUBLIC_PREFIXES
from kernel_gateway.tenants.principal import Principal

logger = logging.getLogger("kernel_gateway.cluster")

# Hop-by-hop headers (RFC 9110 7.6.1) and what the router sets itself.
DROPPED_REQUEST = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "x-request-id",
        ACTING_FOR,  # only the router says whom a request acts for
        # httpx sets these for the body it sends (a GET's stray body is not forwarded)
        "content-length",
        "expect",
    }
)
DROPPED_RESPONSE = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "trailer",
        "upgrade",
        "x-request-id",
        "date",
        "server",
    }
)


IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


class NodeUnreachable(Exception):
    """No connection to the node could be made: nothing was sent to it."""


Body = bytes | AsyncIterator[bytes] | None


class Proxy:
    def __init__(self, http: httpx.AsyncClient, token: str | None) -> None:
        self._http = http
        self._token = token

    async def send(
        self,
        node: Node,
        request: Request,
        path: str,
        body: Body,
        *,
        answer_within: float | None = None,
        query: str | None = None,
        method: str | None = None,
    ) -> httpx.Response:
        """The node's answer to `request` sent to `path`, its body not yet read.

        `answer_within` bounds the wait for the answer to start (None: no bound, for streams
        and cells that may run for an hour). `query`, `method`: instead of the request's.
        Raises `NodeUnreachable` when no connection could be made, `BadGateway` when the
        node did not answer with HTTP (or refused the cluster's token: a misconfiguration,
        not the client's fault), or not within `answer_within`.
        """
        # E2B's API checks its own credentials (a volume's token is a bearer token there): the
        # client's Authorization goes through; elsewhere it is the cluster's token.
        # Decided on the path as the node will read it (`/%652b/…` is `/e2b/…` there), and the
        # cluster's token only for a request this router authenticated.
        public = _public(unquote(path))
        principal = request.scope.get(PRINCIPAL)
        authenticated = isinstance(principal, Principal)
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k.lower() not in DROPPED_REQUEST or (public and k.lower() == "authorization")
        ]
        if body is not None and not isinstance(body, bytes):
            # A streamed body keeps its declared length (else httpx would send it chunked).
            if declared := request.headers.get("content-length"):
                headers.append(("content-length", declared))
        if self._token and not public and authenticated:
            headers.append(("authorization", f"Bearer {self._token}"))
        acting = isinstance(principal, Principal) and principal.key_id is not None
        if acting and not public:
            assert isinstance(principal, Principal) and principal.key_id is not None
            headers.append((ACTING_FOR, principal.key_id))
        if rid := logs.current().get("request_id"):
            headers.append(("x-request-id", rid))
        if query is None:
            query = request.scope.get("query_string", b"").decode("latin-1")
        upstream = self._http.build_request(
            method or request.method,
            f"{node.url}{path}" + (f"?{query}" if query else ""),
            headers=headers,
            content=body,
            timeout=httpx.Timeout(answer_within, connect=self._http.timeout.connect),
        )
        try:
            response = await self._http.send(upstream, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise NodeUnreachable(f"node {node.name} at {node.url}: {exc}") from exc
        except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
            # The connection broke before any answer (the node died, or closed a kept-alive
            # connection). A request that changes nothing may be sent again; a POST may
            # have been carried out, which only the client can judge.
            if request.method in IDEMPOTENT:
                raise NodeUnreachable(f"node {node.name} at {node.url}: {exc!r}") from exc
            raise BadGateway(
                f"node {node.name} did not answer the request ({type(exc).__name__}); "
                "it may or may not have been carried out"
            ) from exc
        except (httpx.HTTPError, h11.LocalProtocolError) as exc:
            raise BadGateway(
                f"node {node.name} did not answer the request ({type(exc).__name__}: {exc}); "
                "it may or may not have been carried out"
            ) from exc
        # A key's 401 (revoked meanwhile) or 403 (an admin's route) is the key's own answer.
        if (
            response.status_code in (401, 403)
            and self._token
            and not public
            and authenticated
            and not acting
        ):
            await response.aclose()
            logger.error(
                "node %s refused the cluster's token (%d)", node.name, response.status_code
            )
            raise BadGateway(
                f"node {node.name} refused the router's token: the router and the node "
                "gateways must share one token"
            )
        return response


def _public(path: str) -> bool:
    """Whether a node answers `path` without the cluster's token (E2B's API checks its own
    keys and tokens): a 401 or 403 there is the client's, not the router's."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


class Relayed(StreamingResponse):
    """A node's answer, streamed through; the node's response is closed however this
    one ends (finished, the client gone, or never started)."""

    def __init__(self, upstream: httpx.Response, on_close: Callable[[], None] | None = None):
        super().__init__(_chunks(upstream), status_code=upstream.status_code)
        self.raw_headers = [
            (k.lower(), v)
            for k, v in upstream.headers.raw
            if k.decode("latin-1").lower() not in DROPPED_RESPONSE
        ]
        self._upstream = upstream
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._upstream.aclose()
            if self._on_close is not None:
                self._on_close()


async def _chunks(upstream: httpx.Response) -> AsyncIterator[bytes]:
    # A node that goes away mid-answer breaks this answer too (the error reaches the
    # server, which aborts the connection rather than end it cleanly): a cut body must
    # not look complete. An execution stream carries `Content-Location`, and clients
    # resume it from their last event id.
    async for chunk in upstream.aiter_raw():
        yield chunk
