"""The files of E2B's COPY steps: asked after, then uploaded to a URL the gateway signs.

E2B's SDK hashes each COPY step's files, asks `GET /templates/{id}/files/{hash}` whether
they are there, and if not (or with `force_upload`) PUTs a tar of them to the `url` it is
given, with a plain HTTP client and *no API key* (E2B hands out a storage bucket's signed
URL). So the gateway hands out a URL of its own, `/e2b/templates/{id}/files/{hash}/upload?
token=...`, and the token is that URL's only credential:

    token = "<expires>.<hex HMAC-SHA256(key, template id, files hash, expires)>"

valid for one template's one hash, for an hour (`UPLOAD_TTL`). The key is derived from
the gateway's token (so every gateway with that token, and a restarted one, takes the
URL), or random for the process when the gateway has no token. A bad or expired token is
a 403, whatever the rest of the request.

The body is streamed to disk under the cap `--template-upload-max` (413 past it, nothing
kept) and must be a tar, gzipped or not (400 otherwise); two uploads of one hash at once
are a 409 (they would share the half-written file). Uploads are kept by hash for every
template (`FileStore`), so a later build, of any template, with the same files uploads
nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import check_declared_length
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.template_views import plain_name, template_named, templates_of
from kernel_gateway.templates.files import CopyError
from kernel_gateway.templates.steps import FILES_HASH
from kernel_gateway.tenants.principal import ADMIN

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

UPLOAD_TTL = 3600
"""Seconds an upload URL is good for (the SDK starts its PUT right after asking)."""
KEY_LABEL = b"kernel-gateway: E2B template upload URLs, v1"


class Uploads:
    """Signs and checks upload URLs; knows which hashes are being received now."""

    def __init__(self, token: str | None) -> None:
        self._key = (
            hmac.new(token.encode(), KEY_LABEL, hashlib.sha256).digest()
            if token
            else secrets.token_bytes(32)
        )
        self.receiving: set[str] = set()

    def _signature(self, template_id: str, files_hash: str, expires: int) -> str:
        message = f"{template_id}\n{files_hash}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def token(self, template_id: str, files_hash: str, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + UPLOAD_TTL)
        return f"{expires}.{self._signature(template_id, files_hash, expires)}"

    def accepts(
        self, template_id: str, files_hash: str, token: str | None, now: float | None = None
    ) -> bool:
        """Whether `token` was signed here for this template and hash, and is not expired."""
        expires_text, _, signature = (token or "").partition(".")
        if not expires_text.isdigit() or len(expires_text) > 12:
            return False
        expires = int(expires_text)
        wanted = self._signature(template_id, files_hash, expires)
        fresh = expires >= (time.time() if now is None else now)
        return hmac.compare_digest(signature.encode(), wanted.encode()) and fresh


def _files_hash(request: Request) -> str:
    files_hash = str(request.path_params["hash"])
    if not FILES_HASH.match(files_hash):
        raise SandboxError(400, "invalid files hash: 64 lowercase hex digits (a SHA-256)")
    return files_hash


async def files_status(request: Request, service: E2BService) -> Response:
    """`GET /templates/{id}/files/{hash}`: 201 `{present, url}` (E2B answers 201). The URL
    comes even when the files are there: `force_upload` uploads them again."""
    template = template_named(
        service, request.path_params["id"], principal_of(request), changing=True
    )
    files_hash = _files_hash(request)
    present = templates_of(service).files.has(files_hash)
    root = request.scope.get("root_path", "")
    url = request.url.replace(
        path=f"{root}/templates/{template.id}/files/{files_hash}/upload",
        query=f"token={service.uploads.token(template.id, files_hash)}",
    )
    return JSONResponse({"present": present, "url": str(url)}, status_code=201)


async def upload(request: Request, service: E2BService) -> Response:
    """`PUT .../files/{hash}/upload?token=`: the tar, streamed to disk (no API key: the
    token signed by `files_status` is the credential)."""
    reference = str(request.path_params["id"])
    files_hash = str(request.path_params["hash"])
    # Signed for the template's id; the path may name it (a router's URL does when the
    # nodes gave the template different ids). Found quietly: a bad token is a 403 alone.
    templates = service.registry.templates
    # Found as the admin: the signed token is the credential, for this template's id.
    found = templates.find(plain_name(reference), ADMIN) if templates is not None else None
    template_id = found.id if found is not None else reference
    if not service.uploads.accepts(template_id, files_hash, request.query_params.get("token")):
        raise SandboxError(403, "this upload URL is not valid (expired or not signed here)")
    template = template_named(service, reference, ADMIN)
    files = templates_of(service).files
    limit = service.settings.template_upload_max_bytes
    check_declared_length(request, limit)
    if files_hash in service.uploads.receiving:
        raise SandboxError(409, f"these files ({files_hash[:12]}…) are being uploaded already")
    service.uploads.receiving.add(files_hash)
    try:
        await files.receive(files_hash, request.stream(), limit)
    except CopyError as exc:
        raise SandboxError(400, f"template {template.name!r}: {exc}") from None
    finally:
        service.uploads.receiving.discard(files_hash)
    return Response(status_code=200)
