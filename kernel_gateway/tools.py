"""The LLM tool helpers' first home: `kernel_gateway.client.tools` is where they live now.

Kept so that `from kernel_gateway import tools` in users' code goes on working.
"""

from __future__ import annotations

from kernel_gateway.client.tools import (
    IMAGE_TYPES,
    MAX_IMAGES,
    MAX_TEXT,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    AsyncRunner,
    Runner,
    ToolCall,
    ToolOutput,
    anthropic_tool,
    arun_tool_calls,
    detect_provider,
    format_results,
    openai_chat_tool,
    openai_responses_tool,
    run_tool_calls,
    summarize,
    tool_calls,
)

__all__ = [
    "IMAGE_TYPES",
    "MAX_IMAGES",
    "MAX_TEXT",
    "TOOL_DESCRIPTION",
    "TOOL_NAME",
    "AsyncRunner",
    "Runner",
    "ToolCall",
    "ToolOutput",
    "anthropic_tool",
    "arun_tool_calls",
    "detect_provider",
    "format_results",
    "openai_chat_tool",
    "openai_responses_tool",
    "run_tool_calls",
    "summarize",
    "tool_calls",
]
