"""Bearer-token authentication for every route but `/health`.

Tokens are compared as SHA-256 digests with `hmac.compare_digest`, so neither
the time taken nor the answer says how much of a guess was right, and a
missing token gets exactly the same reply as a wrong one.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import Unauthorized
from .http import error_response

PUBLIC_PATHS = frozenset({"/health"})


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class BearerAuth:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._digest = _digest(token) if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._digest is None or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        scheme, _, value = Headers(scope=scope).get("authorization", "").partition(" ")
        provided = value.strip() if scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(_digest(provided), self._digest):
            response = error_response(Unauthorized("missing or invalid bearer token"))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
