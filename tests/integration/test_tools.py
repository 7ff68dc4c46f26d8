"""LLM tool helpers: real provider payloads in, provider-shaped tool results out."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

from kernel_gateway import tools
from kernel_gateway.client import AsyncClient, Client
from tests.support.server import ServerThread

FIXTURES = Path(__file__).parents[1] / "fixtures"
PNG = b"\x89PNG\r\n\x1a\n"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def png_of_data_url(url: str) -> bytes:
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    return base64.b64decode(url[len(prefix) :])


def test_openai_chat_tool_call(gateway: ServerThread) -> None:
    with Client(gateway.url) as client, client.session() as session:
        messages = tools.run_tool_calls(fixture("openai_chat_completion.json"), session)
    tool_message, image_message = messages  # get_weather is not ours: left alone
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "call_FthC9qRpsL5kBpwwyw6c7j4k"
    assert "total 8" in tool_message["content"]
    assert image_message["role"] == "user"
    image_part = image_message["content"][1]
    assert image_part["type"] == "image_url"
    assert png_of_data_url(image_part["image_url"]["url"]).startswith(PNG)


def test_openai_responses_tool_call(gateway: ServerThread) -> None:
    with Client(gateway.url) as client:  # stateless this time
        (item,) = tools.run_tool_calls(fixture("openai_responses.json"), client)
    assert item["type"] == "function_call_output"
    assert item["call_id"] == "call_unLAR8MvFNptuiZK6K6HCy5k"
    text, image = item["output"]
    assert text["type"] == "input_text" and "total 8" in text["text"]
    assert image["type"] == "input_image"
    assert png_of_data_url(image["image_url"]).startswith(PNG)


def test_anthropic_tool_use(gateway: ServerThread) -> None:
    with Client(gateway.url) as client, client.session() as session:
        (message,) = tools.run_tool_calls(fixture("anthropic_message.json"), session)
    assert message["role"] == "user"
    (result,) = message["content"]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == "toolu_01A09q90qw90lq917835lq9"
    assert result["is_error"] is False
    text, image = result["content"]
    assert text["type"] == "text" and "total 8" in text["text"]
    assert image["type"] == "image"
    assert image["source"]["type"] == "base64" and image["source"]["media_type"] == "image/png"
    assert base64.b64decode(image["source"]["data"]).startswith(PNG)


def test_errors_are_reported_as_errors(gateway: ServerThread) -> None:
    response = fixture("anthropic_message.json")
    response["content"][1]["input"] = {"code": "1/0"}
    with Client(gateway.url) as client:
        (message,) = tools.run_tool_calls(response, client)
    result = message["content"][0]
    assert result["is_error"] is True
    assert "ZeroDivisionError: division by zero" in result["content"][0]["text"]
    assert "\x1b[" not in result["content"][0]["text"]  # no ANSI colour codes for the model


def test_async_helper(gateway: ServerThread) -> None:
    async def main() -> list[Any]:
        async with AsyncClient(gateway.url) as client, client.session() as session:
            return await tools.arun_tool_calls(fixture("openai_responses.json"), session)

    (item,) = asyncio.run(main())
    assert item["type"] == "function_call_output"
    assert item["output"][1]["type"] == "input_image"
