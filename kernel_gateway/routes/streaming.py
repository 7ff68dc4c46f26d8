"""Sending an execution's events: live SSE, or one JSON document on request.

Either way a client that goes away gets its cell interrupted, so nothing runs
on for nobody. That is ensured around the whole response, not inside its body
generator: a generator torn down before its first step never runs its
`finally`.
"""

from __future__ import annotations

import asyncio

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..execution import Execution
from ..http import JSONResponse, wants_json
from ..session import Session
from ..sse import as_sse, collect

PING_SECONDS = 10
SEND_TIMEOUT_SECONDS = 60


class _ExecutionStream(EventSourceResponse):
    """SSE of one execution; when the response ends, however it ends, an unfinished
    cell is abandoned (interrupted)."""

    def __init__(self, session: Session, execution: Execution) -> None:
        super().__init__(
            as_sse(execution.stream()), ping=PING_SECONDS, send_timeout=SEND_TIMEOUT_SECONDS
        )
        self._session = session
        self._execution = execution

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._execution.finished:
                self._session.abandon(self._execution)


async def respond(request: Request, session: Session, execution: Execution) -> Response:
    """Send the execution's events, live or collected."""
    if wants_json(request):
        return await _collected(request, session, execution)
    return _ExecutionStream(session, execution)


async def _collected(request: Request, session: Session, execution: Execution) -> Response:
    collector = asyncio.ensure_future(collect(execution.stream()))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collector, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collector.done():
            collector.cancel()
            session.abandon(execution)
    if collector.done() and not collector.cancelled():
        return JSONResponse(collector.result())
    return Response(status_code=499)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
