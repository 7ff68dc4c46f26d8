"""A scripted OpenAI-compatible model server: `POST /v1/chat/completions`, streamed as the
real API streams it (`chat.completion.chunk` objects as server-sent events, text in small
deltas, a tool call's arguments in pieces, `data: [DONE]` at the end).

A test gives it a `script`: a function of the request's JSON that returns the `Reply` to
stream, so it can answer by what the conversation holds (the tool's last output, a file's
columns). It runs under uvicorn on a free loopback port in a thread of its own, and keeps
every request it got (`requests`) for the test to read.

    with ScriptedModel(script) as model:
        settings = ...(llm_url=model.url, llm_model="scripted")
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Reply:
    """What the model answers: text, then tool calls (`code` for each `run_<language>`)."""

    text: str = ""
    code: list[str] = field(default_factory=list)
    tool: str = "run_python"
    raw_arguments: str | None = None
    """Sent as the (only) tool call's arguments as they are: malformed ones, for tests."""
    garbage: bool = False
    """Answer a stream that is not JSON at all."""
    status: int = 200
    """Answer this HTTP status (with an OpenAI-shaped error body) instead of a stream."""
    delay: float = 0.0
    """Seconds to wait before the first byte."""
    usage: int = 100
    """Total tokens the final chunk reports."""


Script = Callable[[dict[str, Any]], Reply]


def last_tool_output(request: dict[str, Any]) -> str | None:
    """The content of the last `tool` message the model was sent, if any."""
    for message in reversed(request.get("messages", [])):
        if message.get("role") == "tool":
            return str(message.get("content"))
        if message.get("role") == "user":
            return None
    return None


def last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages", [])):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    return ""


class ScriptedModel:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        app = Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        """The API's base URL, as `--llm-url` takes it."""
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    def __enter__(self) -> ScriptedModel:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.authorizations.append(request.headers.get("authorization"))
        reply = self.script(body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            error = {"message": "scripted failure", "type": "server_error", "code": None}
            return JSONResponse({"error": error}, status_code=reply.status)
        return StreamingResponse(_chunks(body, reply), media_type="text/event-stream")


async def _chunks(body: dict[str, Any], reply: Reply) -> AsyncIterator[bytes]:
    if reply.garbage:
        yield b"data: this is not json\n\n"
        return
    base = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + json.dumps({**base, "choices": [choice], **extra}).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    text = reply.text
    for start in range(0, len(text), 7):  # small deltas, as models stream them
        yield chunk({"content": text[start : start + 7]})
        await asyncio.sleep(0)
    calls = [json.dumps({"code": code}) for code in reply.code]
    if reply.raw_arguments is not None:
        calls = [reply.raw_arguments]
    for index, arguments in enumerate(calls):
        head = {"id": f"call_{index}_{len(body.get('messages', []))}", "type": "function"}
        function = {"name": reply.tool, "arguments": ""}
        yield chunk({"tool_calls": [{"index": index, **head, "function": function}]})
        for start in range(0, len(arguments), 16):
            piece = {"index": index, "function": {"arguments": arguments[start : start + 16]}}
            yield chunk({"tool_calls": [piece]})
    finish = "tool_calls" if calls else "stop"
    yield chunk({}, finish)
    usage = {
        "prompt_tokens": reply.usage - 10,
        "completion_tokens": 10,
        "total_tokens": reply.usage,
    }
    yield b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
