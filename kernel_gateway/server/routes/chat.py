"""The chat's endpoints: ask in words, read the turn's stream (live or resumed), its history,
stop it, forget it (docs/chat.md). The work is `kernel_gateway.chat`'s."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.chat.service import Chat
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.http.sse import encode
from kernel_gateway.server.routes.fragments import JSON_BODY, RESUME_PARAMETERS, ref
from kernel_gateway.server.routes.sessions import _resume_point, _session
from kernel_gateway.server.routes.streaming import PING_SECONDS, SEND_TIMEOUT_SECONDS
from kernel_gateway.sessions.conversation import Turn
from kernel_gateway.sessions.session import Session
from kernel_gateway.shapes import chat as shapes
from kernel_gateway.tenants.principal import ADMIN


def _chat(request: Request) -> Chat:
    chat: Chat = request.state.chat
    return chat


async def info(request: Request) -> JSONResponse[shapes.ChatInfo]:
    data = _chat(request).info()
    answer: shapes.ChatInfo = {
        "enabled": bool(data["enabled"]),
        "model": data["model"],
        "max_steps": int(data["max_steps"]),
        "max_tokens": int(data["max_tokens"]),
        "vision": bool(data["vision"]),
    }
    return JSONResponse(answer)


async def ask(request: Request) -> Response:
    chat = _chat(request)
    session = _session(request)
    settings = chat.settings
    body = await read_model(request, shapes.ChatRequest, settings.max_body_bytes, settings)
    principal = principal_of(request)
    caller = principal.key_id or ADMIN.name
    turn = await chat.ask(session, body.message, list(body.files or ()), caller, principal.name)
    return _stream(session, turn, None)


async def events(request: Request) -> Response:
    session = _session(request)
    after = _resume_point(request)
    return _stream(session, session.conversation.events(), after)


async def history(request: Request) -> JSONResponse[shapes.ChatConversation]:
    conversation = _session(request).conversation
    turns: list[shapes.ChatTurn] = [
        {
            "turn": t.turn,
            "message": t.message,
            "files": list(t.files),
            "status": t.status,
            "text": t.text,
            "cells": [
                {"execution_id": c.execution_id, "code": c.code, "status": c.status}
                for c in t.cells
            ],
            "tokens": t.tokens,
            "started_at": t.started_at,
        }
        for t in conversation.turns
    ]
    return JSONResponse({"running": conversation.running, "turns": turns})


async def stop(request: Request) -> JSONResponse[shapes.ChatStopped]:
    return JSONResponse({"stopped": _session(request).conversation.stop()})


async def forget(request: Request) -> Response:
    _session(request).conversation.clear()
    return Response(status_code=204)


def _stream(session: Session, turn: Turn, after: int | None) -> Response:
    headers = {
        "Turn-Id": str(turn.number),
        "Content-Location": f"/sessions/{session.id}/chat/events",
    }
    return EventSourceResponse(
        _frames(session, turn, after),
        ping=PING_SECONDS,
        send_timeout=SEND_TIMEOUT_SECONDS,
        headers=headers,
    )


async def _frames(session: Session, turn: Turn, after: int | None) -> AsyncIterator[bytes]:
    async for record in turn.records(after):
        frame = encode(record.event, record.id)
        session.metrics.sent(record.event.name, len(frame), "sse")
        yield frame


STREAM = {"text/event-stream": {"schema": ref("ChatEvent")}}
TURN_HEADERS = {
    "Turn-Id": {
        "description": "The turn's number in the session's chat.",
        "required": True,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    },
    "Content-Location": {
        "description": "Where to read this turn's events again.",
        "required": True,
        "schema": {"type": "string"},
    },
}

OPERATIONS = (
    Operation(
        "get",
        "/chat",
        info,
        "chatInfo",
        summary="Whether this gateway has a model for the chat, and a turn's limits.",
        tags=("chat",),
        replies=(Reply(200, "The chat's settings.", shapes.ChatInfo),),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/chat",
        ask,
        "chat",
        summary="Ask in words: the model answers, writing and running code in the session.",
        description="Streams the turn: `turn`, the model's `text` as it is generated, each "
        "`cell` it runs followed by that cell's own events (as `execute` streams them), and "
        "one `end`. One turn at a time per session (409 `turn_running`); 501 "
        "`chat_not_configured` without a model; 429 when the key's model calls for the hour "
        "are used up.",
        tags=("chat",),
        body=Body(shapes.ChatRequest),
        replies=(Reply(200, "The turn's events.", content=STREAM, headers=TURN_HEADERS),),
        errors=(*JSON_BODY, 404, 409, 410, 429, 501, 503),
    ),
    Operation(
        "get",
        "/sessions/{session_id}/chat",
        history,
        "chatHistory",
        summary="The session's conversation: each turn's message, answer and cells.",
        tags=("chat",),
        replies=(Reply(200, "The conversation.", shapes.ChatConversation),),
        errors=(404, 410),
    ),
    Operation(
        "delete",
        "/sessions/{session_id}/chat",
        forget,
        "forgetChat",
        summary="Forget the conversation (the session's variables stay).",
        tags=("chat",),
        replies=(Reply(204, "Forgotten."),),
        errors=(404, 409, 410),
    ),
    Operation(
        "get",
        "/sessions/{session_id}/chat/events",
        events,
        "chatEvents",
        summary="The latest turn's events, from its start or from after an event id, then "
        "live ones until its `end`.",
        tags=("chat",),
        parameters=RESUME_PARAMETERS,
        replies=(Reply(200, "The turn's events.", content=STREAM, headers=TURN_HEADERS),),
        errors=(404, 410, 422),
    ),
    Operation(
        "post",
        "/sessions/{session_id}/chat/stop",
        stop,
        "stopChat",
        summary="Stop the running turn: its model call is cancelled, its cell interrupted.",
        tags=("chat",),
        replies=(Reply(200, "Whether a turn was stopped.", shapes.ChatStopped),),
        errors=(404, 410),
    ),
)
"""The chat's endpoints, each routed and documented from its record."""
