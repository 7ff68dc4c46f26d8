"""What the model is told: the system message, its tool, the person's message with what
came with it (files, the person's own cells since), and what each cell gave back.

A cell's output is rendered as MCP's `run_python` renders it (`render.py`: the text a
notebook shows, cut in the middle past 20,000 characters, charts named where they
appeared); the images themselves go to the model only with `--llm-vision`.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Any

from kernel_gateway.render import Rendered, clip, render
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.types import Event

FILE_HEAD_BYTES = 64 * 1024
"""Bytes of an attached file read to tell the model its columns and first rows."""
SNIFF_CHARS = 2_000
"""Characters of an attached table the delimiter is guessed from."""
PERSON_CELL_CHARS = 2_000
"""Characters of each of the person's cells (code, then output) the model is told."""
PERSON_CELLS = 10
"""The person's latest cells the model is told of at most, per turn."""

LANGUAGE_NAMES = {
    "python": "Python",
    "r": "R",
    "bash": "Bash",
    "javascript": "JavaScript",
    "typescript": "TypeScript",
    "java": "Java",
}


def tool_name(language: str) -> str:
    return f"run_{language}"


def tool(language: str) -> dict[str, Any]:
    """The one tool the model has: run code in the session."""
    name = LANGUAGE_NAMES.get(language, language)
    return {
        "type": "function",
        "function": {
            "name": tool_name(language),
            "description": (
                f"Run {name} code in the user's {name} session (a sandboxed Jupyter kernel) "
                "and get back what it printed, the value of the last expression, errors with "
                "tracebacks, and the charts and files it made. Variables, imports and files "
                "persist between calls, and are shared with the cells the user runs."
            ),
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": f"The {name} code."}},
                "required": ["code"],
                "additionalProperties": False,
            },
        },
    }


def system_message(language: str, vision: bool) -> dict[str, Any]:
    name = LANGUAGE_NAMES.get(language, language)
    charts = (
        "Charts you show are sent back to you as images."
        if vision
        else "You do not see charts: you are told each one was shown, and the user sees it."
    )
    python = (
        " pandas, numpy, scipy, matplotlib and seaborn are installed; show charts with "
        "plt.show() (do not save them unless asked)."
        if language == "python"
        else ""
    )
    return {
        "role": "system",
        "content": (
            f"You are a data analyst working in a {name} notebook the user can see. To answer, "
            f"write {name} code and run it with the {tool_name(language)} tool; read its "
            "output, fix errors and run again, then answer in a few sentences of Markdown. "
            f"The user sees every cell you run and its output.{python} {charts} The "
            "working directory holds the user's files. There may be no internet access. "
            "Never print secrets or credentials."
        ),
    }


def user_message(
    message: str, files: list[tuple[str, bytes | None, int]], person_cells: list[Execution]
) -> dict[str, Any]:
    """The person's message, after what they did since the last turn and the files they
    attached (`(path, first bytes or None if unreadable, size)` each)."""
    parts: list[str] = []
    if person_cells:
        parts.append("Since your last answer the user ran these cells themselves:")
        for execution in person_cells[-PERSON_CELLS:]:
            output = rendered_cell(execution).text
            parts.append(
                f"```\n{clip(execution.code, PERSON_CELL_CHARS)}\n```\n"
                f"status: {execution.status}\n{clip(output, PERSON_CELL_CHARS)}"
            )
    for path, head, size in files:
        parts.append(describe_file(path, head, size))
    parts.append(message)
    return {"role": "user", "content": "\n\n".join(parts)}


def describe_file(path: str, head: bytes | None, size: int) -> str:
    """What the model is told of an attached file: its name and size, and for a table its
    columns and first rows."""
    name = f"The user attached `{path}` ({size} bytes, in the working directory)."
    if head is None:
        return name
    extension = os.path.splitext(path)[1].lower()
    if extension not in (".csv", ".tsv", ".txt"):
        return name
    text = head.decode("utf-8", errors="replace")
    lines = text.splitlines()
    if len(head) >= FILE_HEAD_BYTES and lines:
        lines = lines[:-1]  # the last line may be cut
    if not lines:
        return name
    dialect: type[csv.Dialect] | csv.Dialect = csv.excel_tab if extension == ".tsv" else csv.excel
    try:  # on a little of it: the sniffer's time grows fast with odd quoting
        dialect = csv.Sniffer().sniff("\n".join(lines[:5])[:SNIFF_CHARS], delimiters=",;\t|")
    except csv.Error:
        pass
    rows = list(csv.reader(io.StringIO("\n".join(lines[:6])), dialect))
    if not rows:
        return name
    columns = ", ".join(clip(c, 80) for c in rows[0][:100])
    sample = "\n".join(clip(",".join(r), 300) for r in rows[1:6])
    return f"{name} Its columns: {columns}. First rows:\n```\n{sample}\n```"


def rendered_cell(execution: Execution) -> Rendered:
    """A finished cell as the model reads it."""
    return render((e.name, e.data) for e in _events(execution))


def _events(execution: Execution) -> list[Event]:
    return [record.event for record in execution.kept_records()]


def tool_result(call_id: str, rendered: Rendered) -> dict[str, Any]:
    """What the model reads back from one call: the text a notebook shows."""
    return {"role": "tool", "tool_call_id": call_id, "content": rendered.text or "(no output)"}


def images_message(rendered: list[Rendered]) -> dict[str, Any] | None:
    """With `--llm-vision`, the images the step's cells showed, as one user message after
    all of its tool messages (Chat Completions' tool messages hold text only, and nothing
    may come between the answers to one message's calls)."""
    images = [i for r in rendered for i in r.images]
    if not images:
        return None
    content: list[dict[str, Any]] = [{"type": "text", "text": "The images the cells showed:"}]
    content += [
        {"type": "image_url", "image_url": {"url": f"data:{i.mime};base64,{i.data}"}}
        for i in images
    ]
    return {"role": "user", "content": content}


def tool_refusal(call_id: str, why: str) -> dict[str, Any]:
    """The tool's answer to a call it could not run (bad arguments, another tool)."""
    return {"role": "tool", "tool_call_id": call_id, "content": f"Not run: {why}"}
