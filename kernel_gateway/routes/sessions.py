from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from ..http import (
    JSONResponse,
    files_field,
    number_field,
    read_json,
    reject_unknown,
    string_field,
)
from ..pool import Pool
from ..session import Session
from ..settings import Settings
from .streaming import respond


def _pool(request: Request) -> Pool:
    pool: Pool = request.state.pool
    return pool


def _session(request: Request) -> Session:
    return _pool(request).get(request.path_params["session_id"])


async def create(request: Request) -> Response:
    pool = _pool(request)
    body = await read_json(request, pool.settings.max_body_bytes, optional=True)
    reject_unknown(body, set())
    session = await pool.create_session()
    return JSONResponse(
        session.to_json(), status_code=201, headers={"Location": f"/sessions/{session.id}"}
    )


async def list_all(request: Request) -> Response:
    return JSONResponse({"sessions": [s.to_json() for s in _pool(request).sessions()]})


async def get(request: Request) -> Response:
    return JSONResponse(_session(request).to_json())


async def delete(request: Request) -> Response:
    await _pool(request).delete_session(request.path_params["session_id"])
    return Response(status_code=204)


async def execute(request: Request) -> Response:
    session = _session(request)
    settings: Settings = _pool(request).settings
    body = await read_json(request, settings.max_body_bytes)
    reject_unknown(body, {"code", "timeout"})
    code = string_field(body, "code")
    timeout = number_field(body, "timeout", minimum=0, maximum=settings.max_exec_timeout)
    execution = session.submit(code, timeout)
    return await respond(request, session, execution)


async def interrupt(request: Request) -> Response:
    session = _session(request)
    interrupted = await session.interrupt()
    return JSONResponse({**session.to_json(), "interrupted": interrupted})


async def restart(request: Request) -> Response:
    session = _session(request)
    await session.restart()
    return JSONResponse(session.to_json())


async def execute_stateless(request: Request) -> Response:
    """Run one cell in a fresh kernel that is destroyed afterwards."""
    pool = _pool(request)
    settings = pool.settings
    body = await read_json(request, settings.max_stateless_body_bytes)
    reject_unknown(body, {"code", "timeout", "files"})
    code = string_field(body, "code")
    timeout = number_field(body, "timeout", minimum=0, maximum=settings.max_exec_timeout)
    files = files_field(body, "files", settings.max_upload_bytes)
    session = await pool.ephemeral_session()
    try:
        for path, data in files:
            await asyncio.to_thread(_write_file, session, path, data, settings.max_upload_bytes)
            session.note_upload(path)
        execution = session.submit(code, timeout)
    except BaseException:
        pool.release(session)
        raise
    return await respond(request, session, execution, on_close=lambda: pool.release(session))


def _write_file(session: Session, path: str, data: bytes, limit: int) -> None:
    upload = session.files.begin_upload(path, limit)
    try:
        upload.write(data)
        upload.commit()
    except BaseException:
        upload.abort()
        raise
