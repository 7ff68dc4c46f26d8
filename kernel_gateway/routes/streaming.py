"""Sending an execution's events: live SSE, or one JSON document on request.

Either way a client that goes away gets its cell interrupted, so nothing runs
on for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from ..execution import Execution
from ..http import JSONResponse, wants_json
from ..session import Session
from ..sse import as_sse, collect

PING_SECONDS = 10
SEND_TIMEOUT_SECONDS = 60


async def respond(
    request: Request,
    session: Session,
    execution: Execution,
    on_close: Callable[[], None] | None = None,
) -> Response:
    """Send the execution's events; `on_close` runs once the client has them or is gone."""
    if wants_json(request):
        return await _collected(request, session, execution, on_close)
    return EventSourceResponse(
        _live(session, execution, on_close), ping=PING_SECONDS, send_timeout=SEND_TIMEOUT_SECONDS
    )


async def _live(
    session: Session, execution: Execution, on_close: Callable[[], None] | None
) -> AsyncIterator[bytes]:
    try:
        async for chunk in as_sse(execution.stream()):
            yield chunk
    finally:
        session.abandon(execution)
        if on_close is not None:
            on_close()


async def _collected(
    request: Request,
    session: Session,
    execution: Execution,
    on_close: Callable[[], None] | None,
) -> Response:
    collector = asyncio.ensure_future(collect(execution.stream()))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collector, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collector.done():
            collector.cancel()
            session.abandon(execution)
        if on_close is not None:
            on_close()
    if collector.done() and not collector.cancelled():
        return JSONResponse(collector.result())
    return Response(status_code=499)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
