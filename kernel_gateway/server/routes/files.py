"""The file API: list, download, upload and delete files in a session's workspace.

Downloads carry `Content-Security-Policy: sandbox` and `nosniff`, and anything
but an image is sent as an attachment, so an HTML file the code wrote can never
run as a page on the gateway's own origin.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kernel_gateway.http.bodies import check_declared_length
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse, file_chunks
from kernel_gateway.kernels.workspace import (
    INLINE_IMAGE_TYPES,
    FileInfo,
    file_url,
    guess_mime,
    iso_time,
)
from kernel_gateway.server.routes.sessions import _registry, awake_session
from kernel_gateway.shapes import responses


async def list_files(request: Request) -> JSONResponse[responses.FileList]:
    session = await awake_session(request)
    files = await session.files.listing()
    return JSONResponse({"files": [_file_json(session.id, f) for f in files]})


def _file_json(session_id: str, info: FileInfo) -> responses.FileInfo:
    return {
        "path": info.path,
        "size": info.size,
        "modified": iso_time(info.modified),
        "mime": info.mime,
        "url": file_url(session_id, info.path),
    }


async def download(request: Request) -> Response:
    session = await awake_session(request)
    path = request.path_params["path"]
    fd, info = await session.files.open_read(path)
    mime = guess_mime(path)
    disposition = "inline" if mime in INLINE_IMAGE_TYPES else "attachment"
    name = quote(path.rsplit("/", 1)[-1])
    headers = {
        "Content-Length": str(info.st_size),
        "Content-Disposition": f"{disposition}; filename*=UTF-8''{name}",
        "Content-Security-Policy": "sandbox; default-src 'none'; img-src 'self' data:; "
        "style-src 'unsafe-inline'",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }
    return StreamingResponse(file_chunks(fd, info.st_size), media_type=mime, headers=headers)


async def upload(request: Request) -> JSONResponse[responses.FileInfo]:
    session = await awake_session(request)
    path = request.path_params["path"]
    limit = _registry(request).settings.max_upload_bytes
    check_declared_length(request, limit)
    info = await session.files.upload(path, request.stream(), limit)
    return JSONResponse(_file_json(session.id, info), status_code=201)


async def delete(request: Request) -> Response:
    session = await awake_session(request)
    await session.files.delete(request.path_params["path"])
    return Response(status_code=204)


def _links(*names: tuple[str, str]) -> dict[str, dict[str, object]]:
    return {
        name: {
            "operationId": op,
            "parameters": {"session_id": "$request.path.session_id", "path": "$request.path.path"},
        }
        for name, op in names
    }


OPERATIONS = (
    Operation(
        "get",
        "/sessions/{session_id}/files",
        list_files,
        "listFiles",
        tags=("files",),
        replies=(Reply(200, "The files.", responses.FileList),),
        errors=(404, 410),
    ),
    Operation(
        "get",
        "/sessions/{session_id}/files/{path:path}",
        download,
        "downloadFile",
        summary="The file's bytes, with its Content-Type.",
        tags=("files",),
        replies=(
            Reply(
                200,
                "The file (an attachment unless it is an image).",
                content={"*/*": {"schema": {}}},
            ),
        ),
        errors=(400, 403, 404, 410),
    ),
    Operation(
        "put",
        "/sessions/{session_id}/files/{path:path}",
        upload,
        "uploadFile",
        summary="Write a file (raw body); folders are created.",
        tags=("files",),
        body=Body(
            required=False,
            content={
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        ),
        replies=(
            Reply(
                201,
                "Written.",
                responses.FileInfo,
                links=_links(("Download", "downloadFile"), ("Delete", "deleteFile")),
            ),
        ),
        errors=(400, 403, 404, 410, 409, 413),
    ),
    Operation(
        "delete",
        "/sessions/{session_id}/files/{path:path}",
        delete,
        "deleteFile",
        tags=("files",),
        replies=(Reply(204, "Deleted."),),
        errors=(400, 403, 404, 410, 409),
    ),
)
"""The file API, each endpoint routed and documented from its record."""
