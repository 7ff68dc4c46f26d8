"""Bearer-token authentication for every route but `/health` and the UI's static page.

Tokens are compared as SHA-256 digests with `hmac.compare_digest`, so neither
the time taken nor the answer says how much of a guess was right, and a
missing token gets exactly the same reply as a wrong one.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import BadRequest, Unauthorized
from .http import error_response

PUBLIC_PATHS = frozenset({"/health", "/"})
PUBLIC_PREFIXES = ("/static/",)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class BearerAuth:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._digest = _digest(token) if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or self._digest is None
            or scope["path"] in PUBLIC_PATHS
            or scope["path"].startswith(PUBLIC_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        scheme, _, value = Headers(scope=scope).get("authorization", "").partition(" ")
        provided = value.strip() if scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(_digest(provided), self._digest):
            response = error_response(Unauthorized("missing or invalid bearer token"))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class LoopbackHostGuard:
    """Without a token, answer only requests addressed to a loopback name.

    A web page can rebind its own domain to 127.0.0.1 and then call this API as
    "same origin"; its requests still carry that domain in `Host`, so they are
    refused here.
    """

    def __init__(self, app: ASGIApp, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enabled and scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name.lower() not in LOOPBACK_NAMES and not name.startswith("127."):
                message = (
                    f"Host {host!r} is not a loopback name; a gateway without a token only "
                    "answers localhost. Set --token to serve other names."
                )
                await error_response(BadRequest(message))(scope, receive, send)
                return
        await self.app(scope, receive, send)
