"""Token authentication, and the Host check that guards a gateway without a token.

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

import hashlib
import hmac
import ipaddress
import re

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from kernel_gateway.errors import BadRequest, Forbidden, GatewayError, Unauthorized
from kernel_gateway.http.responses import error_response

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


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class BearerAuth:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._digest = _digest(token) if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or self._digest is None
            or scope["path"] in PUBLIC_PATHS
            or scope["path"] in SELF_CHECKED
            or scope["path"].startswith(PUBLIC_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        scheme, _, value = Headers(scope=scope).get("authorization", "").partition(" ")
        provided = value.strip() if scheme.lower() in AUTH_SCHEMES else ""
        if not hmac.compare_digest(_digest(provided), self._digest):
            await refuse(scope, receive, send, Unauthorized("missing or invalid token"))
            return
        await self.app(scope, receive, send)


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
