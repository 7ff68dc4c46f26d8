"""`/e2b`: E2B's API for E2B's own SDKs (the app: `app.py`), as a surface of the gateway."""

from __future__ import annotations

from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from kernel_gateway.http.operations import Surface
from kernel_gateway.protocols.e2b import signed_files
from kernel_gateway.protocols.e2b.app import E2BService


class E2BEndpoint:
    """An ASGI app: the front door reads the raw request (it routes by header)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service: E2BService = scope["state"]["e2b"]
        await service(scope, receive, send)


SURFACE = Surface(
    "/e2b",
    "E2B's API (sandboxes, the code interpreter, envd) for E2B's own SDKs: its contract is "
    "E2B's OpenAPI and envd specifications",
    [Mount("/e2b", app=E2BEndpoint())],
)

SIGNED_FILES = Surface(
    signed_files.PATH,
    "E2B's signed file URLs (`download_url`, `upload_url`): the SDKs send them to the root, "
    "the signature names the sandbox (protocols/e2b/signed_files.py)",
    signed_files.ROUTES,
)
