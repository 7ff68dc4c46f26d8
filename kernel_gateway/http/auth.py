"""Authentication: who a request acts as; and the Host check that guards a gateway
without a token.

A request carries the admin token (`--token`) or an API key (`tenants/keys.py`); either
way it is given a `Principal` (`principal_of`), which every handler asks before it shows
or touches a resource. Without a token the gateway is open: a request with no credential
acts as the admin, as before keys existed, and one that presents a live key acts as that
key (its quotas and ownership apply). A key's requests are counted against its rate
limit here, and a key revoked or rotated while its request is open (an event stream, a
WebSocket) ends that request at once: its `receive` reports the client gone.

In a cluster the routers authenticate clients and pass their requests on with the
cluster's (admin) token and `Kernel-Gateway-Key: <key id>` (`ACTING_FOR`): a request with
the admin token and that header acts as that key, which the node knows as every node
does (`cluster/keys.py`); the router counted it against the key's rate limit already.

Tokens are compared as SHA-256 digests with `hmac.compare_digest`, so neither
the time taken nor the answer says how much of a guess was right, and a
missing token gets exactly the same reply as a wrong one. Both
`Authorization: Bearer <token>` and Jupyter's `Authorization: token <token>` are
accepted, on HTTP requests and WebSocket handshakes alike.

A browser may open a WebSocket to any origin (no CORS applies), so a handshake
whose `Origin` is not the gateway's own is refused: no web page can drive a
kernel through a gateway on localhost.

Without a token, only requests whose `Host` is a loopback name or address are
answered (`is_loopback_host`), which defeats DNS rebinding.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel_gateway import logs
from kernel_gateway.errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    NodeUnavailable,
    Unauthorized,
)
from kernel_gateway.http.responses import error_response
from kernel_gateway.tenants.principal import ADMIN, Principal
from kernel_gateway.tenants.rate import RateLimiter

AUTH_SCHEMES = frozenset({"bearer", "token"})
PUBLIC_PATHS = frozenset({"/health", "/", "/openapi.json"})
# /e2b/ authenticates by itself, in E2B's shapes: the gateway's token as X-API-KEY on the
# control plane, each sandbox's own access token on the data plane (protocols/e2b/app.py).
PUBLIC_PREFIXES = ("/static/", "/e2b/")
SELF_CHECKED = frozenset({"/files"})
"""Surfaces that check a credential of their own: E2B's signed file URLs, whose signature
is it (protocols/e2b/signed_files.py)."""
# RFC 9110 Host: a bracketed IPv6 literal or a name, then an optional all-digit port.
_HOST = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[^\[\]:@]+))(?::[0-9]{0,5})?")


ACTING_FOR = "kernel-gateway-key"
"""With the admin token: the id of the key a request acts for (a cluster's routers send it;
clients' own are dropped by the router)."""
PRINCIPAL = "kernel_gateway.principal"
"""The scope key a request's principal is kept under."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Keys(Protocol):
    """What authentication needs of the key store (`tenants.keys.KeyStore`)."""

    def resolve(self, secret: str) -> Principal | None: ...

    def watch(self, key_id: str, revoked: Callable[[], None]) -> Callable[[], None]: ...

    def live(self, key_id: str | None) -> bool: ...

    def name_of(self, key_id: str) -> str: ...

    def known(self, key_id: str) -> bool: ...

    def principal(self, key_id: str) -> Principal: ...


class Authenticator:
    """Who a credential stands for: the admin token, a live API key, or nobody."""

    def __init__(
        self,
        token: str | None,
        keys: Keys | None = None,
        look_further: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        """`look_further`: asked about a credential no key holds; True if it found the key
        since (a router reading its cluster's keys)."""
        self._digest = _digest(token) if token else None
        self.keys = keys
        self.look_further = look_further
        self.limiter = RateLimiter()

    @property
    def open(self) -> bool:
        """No token: requests without a credential act as the admin."""
        return self._digest is None

    def principal(self, credential: str) -> Principal | None:
        """The principal `credential` stands for; on an open gateway, anything that is not a
        live key is the admin."""
        if self._digest is not None and hmac.compare_digest(_digest(credential), self._digest):
            return ADMIN
        found = self.keys.resolve(credential) if credential and self.keys is not None else None
        if found is not None:
            return found
        return ADMIN if self._digest is None else None

    def acting_for(self, key_id: str) -> Principal:
        """The principal of a request the admin sends for key `key_id` (a router's)."""
        if self.keys is None or not self.keys.known(key_id):
            # Made through a router a moment ago, and not yet here (a node that was away):
            # the routers bring it within a poll.
            raise NodeUnavailable(
                f"API key {key_id!r} is not known on this node yet; retry", retry_after=1.0
            )
        if not self.keys.live(key_id):
            raise Unauthorized("the API key was revoked")
        return self.keys.principal(key_id)

    def admits(self, credential: str) -> bool:
        """Whether `credential` is the admin token (an open gateway admits anything)."""
        return self._digest is None or hmac.compare_digest(_digest(credential), self._digest)


def credential(headers: Headers) -> str:
    """The token of `Authorization: Bearer <token>` (or Jupyter's `token <token>`), or ""."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() in AUTH_SCHEMES else ""


def principal_of(connection: HTTPConnection | Scope) -> Principal:
    """The principal a request acts as; Unauthorized if no authentication gave it one
    (a route left public by mistake fails closed)."""
    scope = connection.scope if isinstance(connection, HTTPConnection) else connection
    found = scope.get(PRINCIPAL)
    if not isinstance(found, Principal):
        raise Unauthorized("this request is not authenticated")
    return found


def act_as(scope: Scope, principal: Principal) -> None:
    """Give a request its principal (a surface that authenticates by itself: E2B's); its
    log lines name the key (`key`: its name, never its secret)."""
    scope[PRINCIPAL] = principal
    logs.bind(key=principal.name)


class BearerAuth:
    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or (
            scope["path"] in PUBLIC_PATHS
            or scope["path"] in SELF_CHECKED
            or scope["path"].startswith(PUBLIC_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = credential(headers)
        principal = self.auth.principal(given)
        if principal is None and self.auth.look_further and await self.auth.look_further(given):
            principal = self.auth.principal(given)
        if principal is None:
            await refuse(scope, receive, send, Unauthorized("missing or invalid token"))
            return
        try:
            if principal.admin and (key_id := headers.get(ACTING_FOR)):
                principal = self.auth.acting_for(key_id)  # a router's: it counted the rate
            else:
                self.auth.limiter.take(principal)
        except GatewayError as exc:
            await refuse(scope, receive, send, exc)
            return
        act_as(scope, principal)
        if principal.key_id is None or self.auth.keys is None:
            await self.app(scope, receive, send)
            return
        await until_revoked(self.app, self.auth.keys, principal.key_id, scope, receive, send)


async def until_revoked(
    app: ASGIApp, keys: Keys, key_id: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Run the request; if its key is revoked or rotated meanwhile, its `receive` says the
    client left, which ends any stream or WebSocket that listens for that. A response the
    app then leaves unfinished is ended here (a stream's last chunk; a 401 if none began),
    so the client sees a closed response rather than a broken connection."""
    revoked = asyncio.Event()
    stop = keys.watch(key_id, revoked.set)
    gone: Message = (
        {"type": "websocket.disconnect", "code": 1008}
        if scope["type"] == "websocket"
        else {"type": "http.disconnect"}
    )

    async def watched() -> Message:
        if revoked.is_set():
            return gone
        reading = asyncio.ensure_future(receive())
        waiting = asyncio.ensure_future(revoked.wait())
        try:
            await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            if not reading.done():
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading
        return reading.result() if reading.done() and not reading.cancelled() else gone

    started = ended = False

    async def sending(message: Message) -> None:
        nonlocal started, ended
        if message["type"] in ("http.response.start", "websocket.accept"):
            started = True
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            ended = True
        elif message["type"] == "websocket.close":
            ended = True
        await send(message)

    try:
        await app(scope, watched, sending)
    finally:
        stop()
    if not revoked.is_set() or ended or scope["type"] != "http":
        return
    with contextlib.suppress(OSError, RuntimeError):  # the client may be gone meanwhile
        if started:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await error_response(Unauthorized("the API key was revoked"))(scope, receive, send)


async def refuse(scope: Scope, receive: Receive, send: Send, exc: GatewayError) -> None:
    """Answer an HTTP request or a WebSocket handshake with the error's JSON response.

    A handshake is denied with the HTTP response itself where the server can send
    one (the ASGI `websocket.http.response` extension), else closed before accept
    (which the server answers with 403).
    """
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        response = error_response(exc)
        await send(
            {
                "type": "websocket.http.response.start",
                "status": response.status_code,
                "headers": response.raw_headers,
            }
        )
        await send({"type": "websocket.http.response.body", "body": response.body})
        return
    await error_response(exc)(scope, receive, send)


def same_origin(headers: Headers) -> bool:
    """Whether a request's `Origin` (if any) names the host it was sent to.

    Clients that are not browsers (Jupyter Server's gateway client, jupyter_client,
    the MCP SDK) send no Origin at all and pass.
    """
    origin = headers.get("origin")
    if origin is None:
        return True
    _, sep, rest = origin.partition("://")
    return bool(sep) and rest.rstrip("/").lower() == headers.get("host", "").lower()


def is_loopback_host(host: str) -> bool:
    """Whether a `Host` header names this machine's loopback interface, and nothing else.

    Accepted: `localhost`; IPv4 addresses in 127.0.0.0/8 written as four decimal
    numbers; `[::1]` in any IPv6 spelling, and the IPv4-mapped `[::ffff:127.x.x.x]`;
    each with an optional port, in any case, with one trailing dot. None of these
    can be a DNS name an attacker controls. Everything else is refused: other names
    (`127.0.0.1.attacker.example`, `x.localhost`), legacy IPv4 spellings such as
    `127.1` or `0x7f.0.0.1` (browsers canonicalise them to 127.0.0.1 before they
    send `Host`), an unbracketed IPv6 address, and an empty or malformed header.
    """
    match = _HOST.fullmatch(host)
    if match is None:
        return False
    if match["ipv6"] is not None:
        try:
            v6 = ipaddress.IPv6Address(match["ipv6"])
        except ValueError:
            return False
        return v6.is_loopback or (v6.ipv4_mapped is not None and v6.ipv4_mapped.is_loopback)
    name = match["name"].lower()
    name = name[:-1] if name.endswith(".") else name
    if name == "localhost":
        return True
    try:
        return ipaddress.IPv4Address(name).is_loopback
    except ValueError:
        return False


class LoopbackHostGuard:
    """Without a token, answer only requests addressed to a loopback name; and, token
    or not, refuse WebSocket handshakes from another origin.

    A web page can rebind its own domain to 127.0.0.1 and then call this API as
    "same origin"; its requests still carry that domain in `Host`, so they are
    refused here. A page on any origin may also open a WebSocket to localhost
    directly (no CORS applies to WebSockets); the browser says where it comes from
    in `Origin`, so that is refused too.
    """

    def __init__(self, app: ASGIApp, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not same_origin(Headers(scope=scope)):
            origin = Headers(scope=scope).get("origin")
            message = (
                f"WebSocket from origin {origin!r} refused: only same-origin pages may connect"
            )
            await refuse(scope, receive, send, Forbidden(message))
            return
        if self.enabled and scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host", "")
            if not is_loopback_host(host):
                message = (
                    f"Host {host!r} is not a loopback name; a gateway without a token only "
                    "answers localhost. Set --token to serve other names."
                )
                await refuse(scope, receive, send, BadRequest(message))
                return
        await self.app(scope, receive, send)
