"""LLM tool helpers: real provider payloads in, provider-shaped tool results out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway import tools

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def test_tool_definitions_have_each_providers_shape() -> None:
    chat = tools.openai_chat_tool()
    assert chat["type"] == "function" and chat["function"]["name"] == "run_python"
    assert chat["function"]["parameters"]["required"] == ["code"]
    responses = tools.openai_responses_tool()
    assert responses["type"] == "function" and responses["name"] == "run_python"
    anthropic = tools.anthropic_tool()
    assert set(anthropic) == {"name", "description", "input_schema"}


@pytest.mark.parametrize(
    ("name", "provider"),
    [
        ("openai_chat_completion.json", "openai-chat"),
        ("openai_responses.json", "openai-responses"),
        ("anthropic_message.json", "anthropic"),
    ],
)
def test_provider_is_detected(name: str, provider: str) -> None:
    assert tools.detect_provider(fixture(name)) == provider


def test_bad_arguments_reach_the_model_not_the_gateway() -> None:
    response = fixture("openai_chat_completion.json")
    response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "{not json"

    class Unused:
        def run(self, code: str) -> Any:
            raise AssertionError("must not run")

    (message,) = tools.run_tool_calls(response, Unused())
    assert message["role"] == "tool" and "not valid JSON" in message["content"]
