"""Sending an execution's events: live SSE, or one JSON document on request.

Only the HTTP part: the reading is `sessions.follow`'s. Every response names its
execution in an `Execution-Id` header. A client that goes away leaves with the
`GRACE` policy: with no client left the session gives the cell `--reconnect-grace`
seconds to come back (`GET .../events` with `Last-Event-ID`) before interrupting it.
The client follows the execution around the whole response, not inside its body
generator (see `sessions/follow.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from kernel_gateway.http.bodies import wants_json
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.http.sse import collect, encode
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.sessions.follow import Disconnect, Following, follow
from kernel_gateway.sessions.session import Session
from kernel_gateway.types import Record

PING_SECONDS = 10
SEND_TIMEOUT_SECONDS = 60


def _headers(session: Session, execution: Execution) -> dict[str, str]:
    """The execution's id, and where to resume its stream (a stateless one cannot be)."""
    headers = {"Execution-Id": execution.id}
    if not session.ephemeral:
        headers["Content-Location"] = f"/sessions/{session.id}/executions/{execution.id}/events"
    return headers


class _ExecutionStream(EventSourceResponse):
    """SSE of one execution from after an event id; the client is attached to the
    execution for exactly as long as the response lasts."""

    def __init__(self, following: Following, metrics: Metrics) -> None:
        super().__init__(
            _frames(following, metrics),
            ping=PING_SECONDS,
            send_timeout=SEND_TIMEOUT_SECONDS,
            headers=_headers(following.session, following.execution),
        )
        self._following = following

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self._following:
            await super().__call__(scope, receive, send)


async def _frames(records: AsyncIterable[Record], metrics: Metrics) -> AsyncIterator[bytes]:
    """SSE frames of the records, each counted as it is handed to the server."""
    async for record in records:
        frame = encode(record.event, record.id)
        metrics.sent(record.event.name, len(frame), "sse")
        yield frame


async def respond(
    request: Request, session: Session, execution: Execution, after: int | None = None
) -> Response:
    """Send the execution's events from after event id `after`, live or collected."""
    if wants_json(request):
        return await _collected(request, session, execution, after)
    return _ExecutionStream(follow(session, execution, after, Disconnect.GRACE), session.metrics)


async def _collected(
    request: Request, session: Session, execution: Execution, after: int | None
) -> Response:
    async with follow(session, execution, after, Disconnect.GRACE) as records:
        collector = asyncio.ensure_future(collect(r.event async for r in records))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({collector, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collector.done():
                collector.cancel()
    if collector.done() and not collector.cancelled():
        document = {"execution_id": execution.id, **collector.result()}
        response = JSONResponse(document, headers=_headers(session, execution))
        session.metrics.sent_document((e["event"] for e in document["events"]), len(response.body))
        return response
    return Response(status_code=499)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
