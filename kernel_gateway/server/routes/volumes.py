"""Volumes (see kernel_gateway/kernels/volumes.py): disks that outlive sessions.

    POST   /volumes                         a new volume (201)
    GET    /volumes                         every volume, with the sessions mounting it
    GET    /volumes/{volume}                one, by id or name
    DELETE /volumes/{volume}                it and its files (409 while a session mounts it)
    GET    /volumes/{volume}/entries        what a folder holds (`?path=`, `?depth=`)
    GET    /volumes/{volume}/files/{path}   a file's bytes
    PUT    /volumes/{volume}/files/{path}   write a file (folders are made)
    DELETE /volumes/{volume}/files/{path}   a file, or a folder with all it holds

A session mounts volumes with `POST /sessions {"volumes": {"name": "/mnt/data"}}`.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kernel_gateway.errors import BadRequest, Forbidden, InvalidRequest
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import check_declared_length, read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse, file_chunks
from kernel_gateway.kernels.volumes import MIN_SIZE, Volume, Volumes
from kernel_gateway.kernels.workspace import Entry, Workspace, guess_mime, iso_time, write_stream
from kernel_gateway.server.routes.fragments import JSON_BODY, LOCATION
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings, values
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.requests import NewVolume

MAX_DEPTH = 32


def _volumes(request: Request) -> Volumes:
    volumes: Volumes = request.state.volumes
    return volumes


def _registry(request: Request) -> Registry:
    registry: Registry = request.state.registry
    return registry


def mounted_by(registry: Registry, volume: Volume) -> dict[str, str]:
    """The sessions (and E2B contexts' owners) that mount `volume`: id → mount path."""
    return {
        s.id: m.target for s in registry.sessions() for m in s.mounts if m.volume_id == volume.id
    }


def volume_size(settings: Settings, asked: int | str | None) -> int:
    """A new volume's size cap in bytes: `asked` (bytes or `2g`), else the default."""
    if asked is None:
        return settings.volume_size_bytes
    try:
        size = asked if isinstance(asked, int) else values.parse_size(asked)
    except ValueError as exc:
        raise InvalidRequest(f"size: {exc}") from None
    if size > settings.max_volume_size_bytes:
        raise Forbidden(
            f"size: volumes here are at most {settings.max_volume_size} (--max-volume-size)"
        )
    return max(size, MIN_SIZE)


async def volume_json(request: Request, volume: Volume) -> responses.VolumeInfo:
    volumes = _volumes(request)
    return {
        "id": volume.id,
        "name": volume.name,
        "size": volume.size,
        "used": await volumes.used_bytes(volume),
        "capped": volumes.capped,
        "created_at": volume.created_at,
        "mounted_by": mounted_by(_registry(request), volume),
    }


async def create(request: Request) -> JSONResponse[responses.VolumeInfo]:
    settings = _registry(request).settings
    body = await read_model(request, NewVolume, settings.max_body_bytes, settings)
    volume = await _volumes(request).create(
        body.name, volume_size(settings, body.size), principal_of(request)
    )
    return JSONResponse(
        await volume_json(request, volume),
        status_code=201,
        headers={"Location": f"/volumes/{volume.id}"},
    )


async def list_all(request: Request) -> JSONResponse[responses.VolumeList]:
    found = await _volumes(request).all(principal_of(request))
    return JSONResponse({"volumes": [await volume_json(request, v) for v in found]})


async def get(request: Request) -> JSONResponse[responses.VolumeInfo]:
    volume = await _volumes(request).get(request.path_params["volume"], principal_of(request))
    return JSONResponse(await volume_json(request, volume))


async def delete(request: Request) -> Response:
    volumes, viewer = _volumes(request), principal_of(request)
    volume = await volumes.get(request.path_params["volume"], viewer)
    await volumes.delete(volume.id, sorted(mounted_by(_registry(request), volume)), viewer)
    return Response(status_code=204)


# -- its files, as the gateway writes them (owned by the kernels' user) ----------------------


async def content(request: Request) -> Workspace:
    """The volume's files, reached without following links (as a session's workspace)."""
    volumes = _volumes(request)
    volume = await volumes.get(request.path_params["volume"], principal_of(request))
    return Workspace(volumes.data(volume), _registry(request).backend.workspace_owner)


def entry_json(entry: Entry) -> responses.VolumeEntry:
    kind = entry.kind if entry.kind in ("file", "dir", "symlink") else "other"
    return {
        "path": entry.path,
        "type": kind,  # type: ignore[typeddict-item]
        "size": entry.size,
        "mode": entry.mode,
        "modified": iso_time(entry.modified),
        "target": entry.link_target,
    }


async def entries(request: Request) -> JSONResponse[responses.VolumeListing]:
    workspace = await content(request)
    path = request.query_params.get("path", "")
    raw_depth = request.query_params.get("depth", "1")
    if not raw_depth.isdigit() or not 1 <= int(raw_depth) <= MAX_DEPTH:
        raise BadRequest(f"depth must be a whole number from 1 to {MAX_DEPTH}")
    found = await asyncio.to_thread(workspace.list_dir, path, int(raw_depth))
    return JSONResponse({"entries": [entry_json(e) for e in found]})


async def download(request: Request) -> Response:
    workspace = await content(request)
    path = request.path_params["path"]
    fd, info = await asyncio.to_thread(workspace.open_read, path)
    headers = {
        "Content-Length": str(info.st_size),
        "Content-Disposition": "attachment",
        "Content-Security-Policy": "sandbox; default-src 'none'",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }
    return StreamingResponse(
        file_chunks(fd, info.st_size), media_type=guess_mime(path), headers=headers
    )


async def upload(request: Request) -> JSONResponse[responses.VolumeEntry]:
    workspace = await content(request)
    limit = _registry(request).settings.max_upload_bytes
    check_declared_length(request, limit)
    info = await write_stream(workspace, request.path_params["path"], request.stream(), limit)
    written = await asyncio.to_thread(workspace.entry, info.path)
    return JSONResponse(entry_json(written), status_code=201)


async def delete_file(request: Request) -> Response:
    workspace = await content(request)
    await asyncio.to_thread(workspace.remove, request.path_params["path"])
    return Response(status_code=204)


OPERATIONS = (
    Operation(
        "post",
        "/volumes",
        create,
        "createVolume",
        summary="A new volume: a disk of its own that outlives sessions.",
        tags=("volumes",),
        body=Body(NewVolume),
        replies=(Reply(201, "The new volume.", responses.VolumeInfo, headers=LOCATION),),
        errors=(*JSON_BODY, 403, 409, 429),
    ),
    Operation(
        "get",
        "/volumes",
        list_all,
        "listVolumes",
        summary="Every volume, oldest first, with the sessions mounting it.",
        tags=("volumes",),
        replies=(Reply(200, "The volumes.", responses.VolumeList),),
    ),
    Operation(
        "get",
        "/volumes/{volume}",
        get,
        "getVolume",
        summary="A volume, by id or name.",
        tags=("volumes",),
        replies=(Reply(200, "The volume.", responses.VolumeInfo),),
        errors=(404,),
    ),
    Operation(
        "delete",
        "/volumes/{volume}",
        delete,
        "deleteVolume",
        summary="Delete a volume and every file on it.",
        description="Refused with 409 `volume_in_use` while a session mounts it.",
        tags=("volumes",),
        replies=(Reply(204, "Deleted."),),
        errors=(404, 409),
    ),
    Operation(
        "get",
        "/volumes/{volume}/entries",
        entries,
        "listVolumeEntries",
        summary="What a folder of the volume holds, `depth` levels down.",
        tags=("volumes",),
        parameters=(
            {
                "name": "path",
                "in": "query",
                "required": False,
                "description": "The folder, relative to the volume's root (default: the root).",
                "schema": {"type": "string"},
            },
            {
                "name": "depth",
                "in": "query",
                "required": False,
                "description": f"Levels to list, 1 to {MAX_DEPTH} (default 1).",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH},
            },
        ),
        replies=(
            Reply(200, "The entries, links listed and never followed.", responses.VolumeListing),
        ),
        errors=(400, 403, 404, 409),
    ),
    Operation(
        "get",
        "/volumes/{volume}/files/{path:path}",
        download,
        "downloadVolumeFile",
        summary="A file's bytes.",
        tags=("volumes",),
        replies=(Reply(200, "The file (an attachment).", content={"*/*": {"schema": {}}}),),
        errors=(400, 403, 404, 409),
    ),
    Operation(
        "put",
        "/volumes/{volume}/files/{path:path}",
        upload,
        "uploadVolumeFile",
        summary="Write a file (raw body); folders are made.",
        tags=("volumes",),
        body=Body(
            required=False,
            content={
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        ),
        replies=(Reply(201, "Written.", responses.VolumeEntry),),
        errors=(400, 403, 404, 409, 413),
    ),
    Operation(
        "delete",
        "/volumes/{volume}/files/{path:path}",
        delete_file,
        "deleteVolumeFile",
        summary="Delete a file, a symlink, or a folder with all it holds.",
        tags=("volumes",),
        replies=(Reply(204, "Deleted."),),
        errors=(400, 403, 404),
    ),
)
"""Volumes, each endpoint routed and documented from its record."""
