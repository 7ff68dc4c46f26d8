"""E2B's signed file URLs: `sandbox.download_url(path)` and `upload_url(path)`, used with no
other credential (a browser, `curl`, another service).

The SDKs build them as `<E2B_SANDBOX_URL's origin>/files?path=…&username=…&signature=v1_…
[&signature_expiration=…]`: `urljoin` with the absolute `/files` drops any path of the URL,
so they arrive at the gateway's root, without the `/e2b` prefix and without the sandbox's
id (E2B's edge reads that from the host name). The signature names the sandbox instead: it
is `v1_` and the unpadded base64 of SHA-256 over `path:operation:user:access token`
(`:expiration` when it has one), so only the sandbox whose access token it was made with
matches it; each sandbox's expected signature is computed and compared in constant time.
An expired signature is refused with E2B's 401 `signature is already expired`; one that
matches no sandbox with 401 too. `GET` reads (`read`), `POST` writes (`write`), as envd's
`/files` does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel_gateway.protocols.e2b.envd_api import SANDBOX_USER
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.replies import e2b_error, gone
from kernel_gateway.protocols.e2b.sandbox import Sandbox

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

PATH = "/files"


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    """E2B's v1 signature (e2b's `sandbox/signature.py`)."""
    raw = f"{path}:{operation}:{user}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def signed_sandbox(
    sandboxes: list[Sandbox],
    path: str,
    operation: str,
    user: str,
    given: str,
    expiration: int | None,
) -> Sandbox | None:
    """The sandbox whose access token `given` was made with, if any."""
    found = None
    for sandbox in sandboxes:  # every one compared: the time says nothing of which matched
        expected = signature(path, operation, user, sandbox.token, expiration)
        if hmac.compare_digest(expected.encode(), given.encode()):
            found = sandbox
    return found


async def signed_files(request: Request) -> Response:
    service: E2BService = request.state.e2b
    query = request.query_params
    given = query.get("signature")
    path = query.get("path") or ""
    user = query.get("username") or ""
    if not given:
        return e2b_error(401, "a signature is required (use the sandbox's download_url/upload_url)")
    expiration: int | None = None
    if (raw := query.get("signature_expiration")) is not None:
        try:
            expiration = int(raw)
        except ValueError:
            return e2b_error(400, "'signature_expiration' must be a Unix time in seconds")
    operation = "read" if request.method == "GET" else "write"
    sandbox = signed_sandbox(
        list(service.sandboxes.all()), path, operation, user, given, expiration
    )
    if sandbox is None:
        return e2b_error(401, "the signature matches no sandbox here (wrong or for another path)")
    if expiration is not None and expiration < time.time():
        return e2b_error(401, "signature is already expired")
    if user not in ("", SANDBOX_USER):
        return e2b_error(400, f"user {user!r} is not available here: only {SANDBOX_USER!r}")
    if sandbox.paused and not service.sandboxes.resume_on_demand(sandbox):
        return gone(sandbox.id)
    try:
        session = service.sandboxes.session(sandbox)
    except SandboxError:
        return gone(sandbox.id)
    service.sandboxes.touch(sandbox)
    envd = service.envd(sandbox)
    if operation == "read":
        return await envd.download(request, session)
    settings = service.settings
    return await envd.upload(
        request, session, settings.max_upload_bytes, settings.workspace_size_bytes
    )


ROUTES = [Route(PATH, signed_files, methods=["GET", "POST"])]
