"""What MCP tests read from a tool's result, with the official client's types."""

from __future__ import annotations

import mcp_types as types


def text_of(result: types.CallToolResult) -> str:
    """The result's text blocks, joined."""
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def handle_of(result: types.CallToolResult) -> str:
    """The sandbox handle a stateful tool's text names (`session: <id>`)."""
    for line in text_of(result).splitlines():
        if line.startswith("session: "):
            return line.removeprefix("session: ")
    raise AssertionError(f"no session handle in {text_of(result)!r}")
