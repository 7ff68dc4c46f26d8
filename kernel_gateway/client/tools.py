"""Wire the gateway into an LLM's tool calls: OpenAI Chat Completions, OpenAI Responses, Anthropic.

    from kernel_gateway.client import Client
    from kernel_gateway.client import tools

    with Client() as client, client.session() as session:
        reply = anthropic.messages.create(..., tools=[tools.anthropic_tool()])
        messages += [{"role": "assistant", "content": reply.content},
                     *tools.run_tool_calls(reply, session)]

`run_tool_calls` takes the model's response (a dict, or an SDK object with
`model_dump()`), runs every `run_python` call in it on a session (state kept)
or a client (stateless), and returns what to append to the conversation, in
that provider's own format: text for output and errors, charts as image
content where the provider accepts images in tool results. The text and its limits are
`render`'s, the same as the gateway's MCP tools give.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kernel_gateway.render import (
    IMAGE_TYPES as IMAGE_TYPES,  # the limits, kept importable from here
)
from kernel_gateway.render import MAX_IMAGES as MAX_IMAGES
from kernel_gateway.render import MAX_TEXT as MAX_TEXT
from kernel_gateway.render import render

from . import models
from .errors import ClientError
from .models import Execution

TOOL_NAME = "run_python"
TOOL_DESCRIPTION = (
    "Run Python code in a sandboxed IPython kernel and get back what it printed, the value "
    "of the last expression, errors with tracebacks, and charts as images. Variables, "
    "imports and files persist between calls in the same conversation. numpy, pandas, "
    "scipy, matplotlib and seaborn are installed; there is no internet access. Show charts "
    "with plt.show(); files written to the working directory are reported back."
)
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "The Python code to run."}},
    "required": ["code"],
    "additionalProperties": False,
}
Provider = Literal["openai-chat", "openai-responses", "anthropic"]


def openai_chat_tool() -> dict[str, Any]:
    """For `tools=[...]` of OpenAI Chat Completions."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": PARAMETERS,
            "strict": True,
        },
    }


def openai_responses_tool() -> dict[str, Any]:
    """For `tools=[...]` of the OpenAI Responses API."""
    return {
        "type": "function",
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": PARAMETERS,
        "strict": True,
    }


def anthropic_tool() -> dict[str, Any]:
    """For `tools=[...]` of the Anthropic Messages API."""
    return {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": PARAMETERS}


class Runner(Protocol):
    def run(self, code: str) -> Execution: ...


class AsyncRunner(Protocol):
    def run(self, code: str) -> Awaitable[Execution]: ...


@dataclass(frozen=True)
class ToolCall:
    id: str
    code: str | None
    problem: str | None = None
    """Why the call cannot run (bad arguments); reported back to the model as an error."""


@dataclass(frozen=True)
class ToolOutput:
    text: str
    images: list[tuple[str, str]]  # (media type, base64)
    is_error: bool


# -- reading responses -------------------------------------------------------------------------


def _as_dict(response: Any) -> dict[str, Any]:
    if isinstance(response, dict):
        return response
    dump = getattr(response, "model_dump", None)
    if callable(dump):
        result: dict[str, Any] = dump()
        return result
    raise TypeError("expected a response dict or an SDK object with model_dump()")


def detect_provider(response: dict[str, Any]) -> Provider:
    if "choices" in response:
        return "openai-chat"
    if response.get("object") == "response" or "output" in response:
        return "openai-responses"
    if response.get("type") == "message" and isinstance(response.get("content"), list):
        return "anthropic"
    raise ValueError("cannot tell which provider this response comes from")


def _parse_arguments(call_id: str, arguments: Any) -> ToolCall:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return ToolCall(call_id, None, "the tool arguments are not valid JSON")
    if not isinstance(arguments, dict) or not isinstance(arguments.get("code"), str):
        return ToolCall(call_id, None, "the tool arguments must be an object with a 'code' string")
    return ToolCall(call_id, arguments["code"])


def tool_calls(response: dict[str, Any], provider: Provider) -> list[ToolCall]:
    """The `run_python` calls in a response; calls of other tools are left to the caller."""
    calls = []
    if provider == "openai-chat":
        message = response["choices"][0]["message"]
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            if function.get("name") == TOOL_NAME:
                calls.append(_parse_arguments(call["id"], function.get("arguments")))
    elif provider == "openai-responses":
        for item in response.get("output", []):
            if item.get("type") == "function_call" and item.get("name") == TOOL_NAME:
                calls.append(_parse_arguments(item["call_id"], item.get("arguments")))
    else:
        for block in response.get("content", []):
            if block.get("type") == "tool_use" and block.get("name") == TOOL_NAME:
                calls.append(_parse_arguments(block["id"], block.get("input")))
    return calls


# -- what the model reads back -----------------------------------------------------------------


def summarize(execution: Execution) -> ToolOutput:
    """An execution as text for a model, plus its images (`render`'s, within its limits)."""
    rendered = render(_wire_events(execution), inline_files=False)
    images = [(image.mime, image.data) for image in rendered.images]
    return ToolOutput(rendered.text, images, execution.status != "ok")


def _wire_events(execution: Execution) -> Iterator[tuple[str, dict[str, Any]]]:
    """The execution's typed events as they came over the wire: what `render` reads."""
    for event in execution.events:
        if isinstance(event, models.Stdout):
            yield "stdout", {"text": event.text}
        elif isinstance(event, models.Stderr):
            yield "stderr", {"text": event.text}
        elif isinstance(event, models.Display):
            update = {"display_id": event.display_id, "update": event.update}
            yield "display", {"data": event.data, **update}
        elif isinstance(event, models.Result):
            yield "result", {"data": event.data}
        elif isinstance(event, models.Clear):
            yield "clear", {"wait": event.wait}
        elif isinstance(event, models.Error):
            error = {"ename": event.ename, "evalue": event.evalue}
            yield "error", {**error, "traceback": event.traceback}
        elif isinstance(event, models.File):
            data = base64.b64encode(event.data).decode() if event.data is not None else None
            file = {"path": event.path, "size": event.size, "mime": event.mime}
            yield "file", {**file, "url": event.url, "data": data}
        elif isinstance(event, models.Resumed):
            lost = [{"name": x.name, "reason": x.reason} for x in event.lost]
            yield "resumed", {"lost": lost}
        elif isinstance(event, models.Done):
            done = {"status": event.status, "restarted": event.restarted}
            yield "done", {**done, "reason": event.reason}


def _failure(text: str) -> ToolOutput:
    return ToolOutput(text, [], True)


def format_results(provider: Provider, results: list[tuple[ToolCall, ToolOutput]]) -> list[Any]:
    """Tool results in the provider's format: what to append to the conversation."""
    if provider == "anthropic":
        blocks = []
        for call, out in results:
            content: list[dict[str, Any]] = [{"type": "text", "text": out.text}]
            content += [
                {"type": "image", "source": {"type": "base64", "media_type": m, "data": d}}
                for m, d in out.images
            ]
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": content,
                    "is_error": out.is_error,
                }
            )
        return [{"role": "user", "content": blocks}] if blocks else []
    if provider == "openai-responses":
        items = []
        for call, out in results:
            output: Any = out.text
            if out.images:
                output = [{"type": "input_text", "text": out.text}] + [
                    {"type": "input_image", "image_url": f"data:{m};base64,{d}"}
                    for m, d in out.images
                ]
            items.append({"type": "function_call_output", "call_id": call.id, "output": output})
        return items
    # Chat Completions: tool messages hold text only, so images follow in a user message.
    messages: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": call.id, "content": out.text} for call, out in results
    ]
    images = [(call, m, d) for call, out in results for m, d in out.images]
    if images:
        content = [{"type": "text", "text": f"Images produced by {TOOL_NAME}:"}]
        content += [
            {"type": "image_url", "image_url": {"url": f"data:{m};base64,{d}"}}
            for _, m, d in images
        ]
        messages.append({"role": "user", "content": content})
    return messages


# -- running -----------------------------------------------------------------------------------


def run_tool_calls(response: Any, runner: Runner, *, provider: Provider | None = None) -> list[Any]:
    """Run every `run_python` call in `response` on `runner` (a Session or a Client)."""
    data = _as_dict(response)
    provider = provider or detect_provider(data)
    results = [(call, _run_one(call, runner.run)) for call in tool_calls(data, provider)]
    return format_results(provider, results)


async def arun_tool_calls(
    response: Any, runner: AsyncRunner, *, provider: Provider | None = None
) -> list[Any]:
    """`run_tool_calls` for an AsyncSession or AsyncClient."""
    data = _as_dict(response)
    provider = provider or detect_provider(data)
    results = []
    for call in tool_calls(data, provider):
        if call.code is None:
            results.append((call, _failure(f"error: {call.problem}")))
            continue
        try:
            results.append((call, summarize(await runner.run(call.code))))
        except ClientError as exc:
            results.append((call, _failure(f"error: the code could not be run: {exc}")))
    return format_results(provider, results)


def _run_one(call: ToolCall, run: Callable[[str], Execution]) -> ToolOutput:
    if call.code is None:
        return _failure(f"error: {call.problem}")
    try:
        return summarize(run(call.code))
    except ClientError as exc:
        return _failure(f"error: the code could not be run: {exc}")
