"""Asking a model: one streamed call to an OpenAI-compatible chat-completions API.

`Model.ask` posts the conversation and the tool, reads the answer as it streams
(`chat.completion.chunk` server-sent events), hands each piece of text to `on_text` as it
comes, and returns the whole `Answer`: its text, its tool calls (their arguments put back
together from their pieces), the tokens it used. The failures, each a `ModelError` with
its `type` (the `end` event's `error.type`):

    ModelError                 model_error        the API refused the call (4xx, 5xx)
    ├── ModelUnavailable       model_unavailable  no connection, or it broke
    ├── ModelTimeout           model_timeout      past --llm-timeout, first byte to last
    └── ModelMalformed         model_malformed    the answer is not a chat completion

The key (`--llm-key-file`) goes only into this call's `Authorization` header; an error
says what went wrong without the request's headers or body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

MAX_ANSWER_CHARS = 200_000
"""Characters of text and tool arguments one answer may have; a longer one is malformed."""


class ModelError(Exception):
    type = "model_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelUnavailable(ModelError):
    type = "model_unavailable"


class ModelTimeout(ModelError):
    type = "model_timeout"


class ModelMalformed(ModelError):
    type = "model_malformed"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class Answer:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: int = 0
    """Total tokens of the call as the API reported them (0: it did not)."""

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        return message


class Model:
    """An OpenAI-compatible API at `url` (`…/v1`) and the model to ask there."""

    def __init__(self, url: str, model: str, key: str | None, timeout: float) -> None:
        self.url = url.rstrip("/") + "/chat/completions"
        split = urlsplit(url)
        self.where = f"{split.scheme}://{split.hostname}" + (f":{split.port}" if split.port else "")
        """The API as errors name it: no path, query or credentials of the URL's."""
        self.name = model
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            follow_redirects=False,
            trust_env=False,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def ask(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: Callable[[str], Awaitable[None]],
    ) -> Answer:
        body = {
            "model": self.name,
            "messages": messages,
            "tools": tools,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        deadline = time.monotonic() + self.timeout
        try:
            async with self._http.stream("POST", self.url, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise ModelError(_refusal(response))
                return await _read(response, on_text, deadline, self.timeout)
        except httpx.TimeoutException:
            raise ModelTimeout(f"the model did not answer within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise ModelUnavailable(
                f"the model API at {self.where} could not be reached: {type(exc).__name__}"
            ) from None


def _refusal(response: httpx.Response) -> str:
    """What the API said when it refused the call (its error's message, when it gave one)."""
    detail = ""
    try:
        error = response.json().get("error")
        if isinstance(error, dict):
            detail = str(error.get("message") or "")[:500]
        elif isinstance(error, str):
            detail = error[:500]
    except (ValueError, AttributeError):
        detail = ""
    return f"the model API answered {response.status_code}" + (f": {detail}" if detail else "")


async def _read(
    response: httpx.Response,
    on_text: Callable[[str], Awaitable[None]],
    deadline: float,
    allowed: float,
) -> Answer:
    answer = Answer()
    calls: dict[int, ToolCall] = {}
    size = 0
    seen_data = False
    async for line in response.aiter_lines():
        if time.monotonic() > deadline:
            raise ModelTimeout(f"the model's answer took longer than {allowed:g} s")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ModelMalformed(
                f"the model API's stream is not chat-completion chunks: {data[:120]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise ModelMalformed("the model API sent a chunk that is not an object")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise ModelError(f"the model API failed mid-answer: {str(message)[:500]}")
        seen_data = True
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
            answer.tokens = usage["total_tokens"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                raise ModelMalformed("the model API sent a choice without a delta")
            text = delta.get("content")
            if isinstance(text, str) and text:
                size += len(text)
                answer.text += text
                await on_text(text)
            for piece in delta.get("tool_calls") or []:
                size += _add_call_piece(calls, piece)
            if size > MAX_ANSWER_CHARS:
                raise ModelMalformed(f"the model's answer is over {MAX_ANSWER_CHARS} characters")
    if not seen_data:
        raise ModelMalformed("the model API's answer had no chat-completion chunk")
    answer.tool_calls = [calls[i] for i in sorted(calls)]
    if not answer.text and not answer.tool_calls:
        raise ModelMalformed("the model answered nothing: no text and no tool call")
    return answer


def _add_call_piece(calls: dict[int, ToolCall], piece: Any) -> int:
    """Fold one streamed piece of a tool call into `calls`; the characters it added."""
    if not isinstance(piece, dict):
        raise ModelMalformed("the model API sent a tool call that is not an object")
    index = piece.get("index", len(calls))
    if not isinstance(index, int) or not 0 <= index < 64:
        raise ModelMalformed(f"the model API sent a tool call with index {index!r}")
    call = calls.setdefault(index, ToolCall(f"call_{index}", "", ""))
    if isinstance(piece.get("id"), str) and piece["id"]:
        call.id = piece["id"]
    function = piece.get("function") or {}
    if not isinstance(function, dict):
        raise ModelMalformed("the model API sent a tool call whose function is not an object")
    name, arguments = function.get("name"), function.get("arguments")
    if isinstance(name, str):
        call.name += name if call.name != name else ""
    if isinstance(arguments, str):
        call.arguments += arguments
        return len(arguments)
    if isinstance(arguments, dict):  # some servers send the arguments whole, as an object
        call.arguments = json.dumps(arguments)
        return len(call.arguments)
    return 0
