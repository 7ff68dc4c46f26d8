"""E2B's volumes, over the gateway's (kernels/volumes.py; docs/volumes.md).

The control plane (`X-API-KEY`, as every other route):

    POST   /volumes              {"name"} → 201 {"volumeID", "name", "token"}
    GET    /volumes              [{"volumeID", "name"}]
    GET    /volumes/{volumeID}   {"volumeID", "name", "token"} (an id or a name)
    DELETE /volumes/{volumeID}   204; 409 while a sandbox mounts it

The content API (`spec/openapi-volumecontent.yml`), with the volume's token as a bearer
token; the SDKs send it to `E2B_VOLUME_API_URL` (set it to the gateway's E2B address):

    GET|PATCH|DELETE /volumecontent/{volumeID}/path?path=   stat, chown/chmod, remove
    GET|POST         /volumecontent/{volumeID}/dir?path=    list (`depth`), make (`force`)
    GET|PUT          /volumecontent/{volumeID}/file?path=   read, write (`uid`, `gid`, `mode`)

A volume's token is an HMAC of its id under a key made from the gateway's token: it names
that volume only, and holds across restarts. Paths are the volume's own (`/` its root);
links are never followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import posixpath
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.responses import file_chunks
from kernel_gateway.kernels.volumes import Volume, Volumes
from kernel_gateway.kernels.workspace import Entry, Workspace, write_stream
from kernel_gateway.protocols.e2b.errors import SandboxError, status_for
from kernel_gateway.protocols.e2b.replies import (
    ControlHandler,
    Handler,
    answered,
    e2b_error,
    guarded,
    json_body,
)
from kernel_gateway.tenants.principal import ADMIN, Principal

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

T = TypeVar("T")
KEY_LABEL = b"kernel-gateway e2b volume token"
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
MAX_DEPTH = 32
TYPES = {"file": "file", "dir": "directory", "symlink": "symlink"}


class VolumeTokens:
    """Signs and checks volumes' tokens."""

    def __init__(self, token: str | None) -> None:
        self._open = token is None
        """A gateway without a token: any bearer token is accepted (as any API key is)."""
        secret = token.encode() if token else secrets.token_bytes(32)
        self._key = hmac.new(secret, KEY_LABEL, hashlib.sha256).digest()

    def token(self, volume_id: str) -> str:
        return "vt_" + hmac.new(self._key, volume_id.encode(), hashlib.sha256).hexdigest()

    def accepts(self, volume_id: str, given: str | None) -> bool:
        if given is None:
            return False
        if self._open:
            return True
        return hmac.compare_digest(given.encode(), self.token(volume_id).encode())


def volume_routes(service: E2BService) -> list[Route]:
    def guard(handler: ControlHandler) -> Handler:
        return guarded(service, handler)

    def content(handler: ControlHandler) -> Handler:
        return _with_volume_token(service, handler)

    return [
        Route("/volumes", guard(create), methods=["POST"]),
        Route("/volumes", guard(list_volumes), methods=["GET"]),
        Route("/volumes/{volume}", guard(get), methods=["GET"]),
        Route("/volumes/{volume}", guard(delete), methods=["DELETE"]),
        Route("/volumecontent/{volume}/path", content(stat_path), methods=["GET"]),
        Route("/volumecontent/{volume}/path", content(update_path), methods=["PATCH"]),
        Route("/volumecontent/{volume}/path", content(remove_path), methods=["DELETE"]),
        Route("/volumecontent/{volume}/dir", content(list_dir), methods=["GET"]),
        Route("/volumecontent/{volume}/dir", content(make_dir), methods=["POST"]),
        Route("/volumecontent/{volume}/file", content(read_file), methods=["GET"]),
        Route("/volumecontent/{volume}/file", content(write_file), methods=["PUT"]),
    ]


def _with_volume_token(service: E2BService, handler: ControlHandler) -> Handler:
    inner = answered(service, handler)

    async def endpoint(request: Request) -> Response:
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else None
        if not service.volume_tokens.accepts(request.path_params["volume"], given):
            return e2b_error(401, "invalid volume token: use the token the volume was given")
        return await inner(request)

    return endpoint


async def _volume(service: E2BService, ref: str, viewer: Principal) -> Volume:
    try:
        return await service.volumes.get(ref, viewer)
    except GatewayError as exc:
        raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc


def _and_token(service: E2BService, volume: Volume) -> dict[str, Any]:
    return {
        "volumeID": volume.id,
        "name": volume.name,
        "token": service.volume_tokens.token(volume.id),
    }


# -- the control plane ---------------------------------------------------------------------


async def create(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise SandboxError(400, "'name': 1 to 128 letters, digits, '-' and '_'")
    try:
        volume = await service.volumes.create(
            name, service.settings.volume_size_bytes, principal_of(request)
        )
    except GatewayError as exc:
        raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc
    return JSONResponse(_and_token(service, volume), status_code=201)


async def list_volumes(request: Request, service: E2BService) -> Response:
    found = await service.volumes.all(principal_of(request))
    return JSONResponse([{"volumeID": v.id, "name": v.name} for v in found])


async def get(request: Request, service: E2BService) -> Response:
    volume = await _volume(service, request.path_params["volume"], principal_of(request))
    return JSONResponse(_and_token(service, volume))


async def delete(request: Request, service: E2BService) -> Response:
    viewer = principal_of(request)
    volume = await _volume(service, request.path_params["volume"], viewer)
    users = sorted(
        s.id for s in service.registry.sessions() for m in s.mounts if m.volume_id == volume.id
    )
    try:
        await service.volumes.delete(volume.id, users, viewer)
    except GatewayError as exc:
        raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc
    return Response(status_code=204)


# -- the content API -----------------------------------------------------------------------


async def _content(request: Request, service: E2BService) -> tuple[Workspace, str]:
    """The volume's files and the asked path, relative to its root ("" for the root)."""
    volumes: Volumes = service.volumes
    # Its token was made for this id (`_with_volume_token`): whoever holds it may use it.
    volume = await _volume(service, request.path_params["volume"], ADMIN)
    path = request.query_params.get("path")
    if not path:
        raise SandboxError(400, "'path' is required")
    relative = posixpath.normpath("/" + path).lstrip("/")
    if relative == ".":
        relative = ""
    return Workspace(volumes.data(volume), service.registry.backend.workspace_owner), relative


def _stat_json(entry: Entry) -> dict[str, Any]:
    def rfc3339(seconds: float) -> str:
        return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")

    answer: dict[str, Any] = {
        "name": posixpath.basename(entry.path) or "/",
        "type": TYPES.get(entry.kind, "unknown"),
        "path": "/" + entry.path,
        "size": entry.size,
        "mode": entry.mode,
        "uid": entry.uid,
        "gid": entry.gid,
        "atime": rfc3339(entry.accessed),
        "mtime": rfc3339(entry.modified),
        "ctime": rfc3339(entry.changed),
    }
    if entry.link_target is not None:
        answer["target"] = entry.link_target
    return answer


async def _call(function: Callable[..., T], *args: Any) -> T:
    """A blocking Workspace call in a thread, its gateway errors as E2B's."""
    try:
        return await asyncio.to_thread(function, *args)
    except GatewayError as exc:
        raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc


def _number(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise SandboxError(400, f"'{name}' must be a whole number")
    return int(raw)


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").lower() in ("true", "1")


async def _set_metadata(
    workspace: Workspace, relative: str, uid: int | None, gid: int | None, mode: int | None
) -> Entry:
    """chown/chmod a path of the volume (links not followed), then stat it."""

    def change() -> Entry:
        target = workspace.root / relative
        if target.is_symlink():
            raise SandboxError(400, "a symlink's metadata is not changed here")
        if mode is not None:
            if mode > 0o7777:
                raise SandboxError(400, "'mode' must be permission bits (at most 0o7777)")
            os.chmod(target, mode & 0o777)  # never setuid, setgid or sticky bits
        if uid is not None or gid is not None:
            os.chown(target, -1 if uid is None else uid, -1 if gid is None else gid)
        return workspace.entry(relative)

    try:
        return await _call(change)
    except FileNotFoundError:
        raise SandboxError(404, "path not found") from None
    except OSError as exc:
        raise SandboxError(400, f"cannot change the metadata: {exc.strerror}") from None


async def stat_path(request: Request, service: E2BService) -> Response:
    workspace, relative = await _content(request, service)
    return JSONResponse(_stat_json(await _call(workspace.entry, relative)))


async def update_path(request: Request, service: E2BService) -> Response:
    workspace, relative = await _content(request, service)
    body = await json_body(request)
    values: dict[str, int | None] = {}
    for name in ("uid", "gid", "mode"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or not 0 <= value < 2**32):
            raise SandboxError(400, f"'{name}' must be a whole number")
        values[name] = value
    await _call(workspace.entry, relative)  # 404 first
    entry = await _set_metadata(workspace, relative, values["uid"], values["gid"], values["mode"])
    return JSONResponse(_stat_json(entry))


async def remove_path(request: Request, service: E2BService) -> Response:
    workspace, relative = await _content(request, service)
    if not relative:
        raise SandboxError(400, "the volume's root cannot be removed")
    await _call(workspace.remove, relative)
    return Response(status_code=204)


async def list_dir(request: Request, service: E2BService) -> Response:
    workspace, relative = await _content(request, service)
    depth = _number(request, "depth") or 1
    if not 1 <= depth <= MAX_DEPTH:
        raise SandboxError(400, f"'depth' must be from 1 to {MAX_DEPTH}")
    found = await _call(workspace.list_dir, relative, depth)
    return JSONResponse([_stat_json(e) for e in found])


async def make_dir(request: Request, service: E2BService) -> Response:
    workspace, relative = await _content(request, service)
    if not relative:
        raise SandboxError(409, "the volume's root exists already")
    parent = posixpath.dirname(relative)
    force = _flag(request, "force")
    if parent and not force:
        try:
            await _call(workspace.entry, parent)
        except SandboxError as exc:
            if exc.status == 404:
                raise SandboxError(404, f"path not found: /{parent} (force makes it)") from None
            raise
    made = await _call(workspace.make_dir, relative)
    if not made and not force:
        raise SandboxError(409, f"/{relative} exists already")
    entry = await _metadata_asked(request, workspace, relative)
    return JSONResponse(_stat_json(entry), status_code=201)


async def _metadata_asked(request: Request, workspace: Workspace, relative: str) -> Entry:
    uid, gid, mode = (_number(request, n) for n in ("uid", "gid", "mode"))
    if uid is None and gid is None and mode is None:
        return await _call(workspace.entry, relative)
    return await _set_metadata(workspace, relative, uid, gid, mode)


async def read_file(request: Request, service: E2BService) -> Response:
    workspace, relative = await _content(request, service)
    if not relative:
        raise SandboxError(400, "the volume's root is a folder")
    fd, info = await _call(workspace.open_read, relative)
    return StreamingResponse(
        file_chunks(fd, info.st_size),
        media_type="application/octet-stream",
        headers={"Content-Length": str(info.st_size)},
    )


async def write_file(request: Request, service: E2BService) -> Response:
    """Write a file, replacing one there, making its folders (as E2B's SDK says it does)."""
    workspace, relative = await _content(request, service)
    if not relative:
        raise SandboxError(400, "the volume's root is a folder")
    limit = service.settings.max_upload_bytes
    try:
        await write_stream(workspace, relative, request.stream(), limit)
    except GatewayError as exc:
        raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc
    entry = await _metadata_asked(request, workspace, relative)
    return JSONResponse(_stat_json(entry), status_code=201)
