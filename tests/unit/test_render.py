"""The one renderer of a cell for a model (`render.py`), as the client's tool helpers
and the MCP tools use it."""

from __future__ import annotations

import base64
from typing import Any

from kernel_gateway import render as render_module
from kernel_gateway.client.models import Execution, event_from
from kernel_gateway.client.tools import summarize
from kernel_gateway.protocols.mcp import tools as mcp_tools
from kernel_gateway.render import MAX_IMAGES, MAX_TEXT, render
from kernel_gateway.types import Event

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
CSV = base64.b64encode(b"a,b\n").decode()

EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("stdout", {"text": "a\n"}),
    ("stderr", {"text": "\x1b[31mwarn\x1b[0m\n"}),
    ("display", {"data": {"image/png": PNG}, "metadata": {}, "update": False}),
    ("result", {"data": {"text/plain": "42"}, "metadata": {}, "execution_count": 1}),
    (
        "error",
        {"ename": "E", "evalue": "v", "traceback": ["\x1b[0;31mE\x1b[0m: v"]},
    ),
    ("file", {"path": "o.csv", "size": 4, "mime": "text/csv", "url": "/sessions/s/files/o.csv"}),
    ("file", {"path": "p.png", "size": 12, "mime": "image/png", "url": None, "data": PNG}),
    ("file", {"path": "i.csv", "size": 4, "mime": "text/csv", "url": None, "data": CSV}),
    (
        "done",
        {"status": "error", "execution_count": 1, "duration_ms": 1.0, "restarted": False},
    ),
]


def _execution(events: list[tuple[str, dict[str, Any]]]) -> Execution:
    execution = Execution()
    for name, data in events:
        event = event_from(name, data)
        assert event is not None
        execution.add(event)
    return execution


def test_a_cell_reads_like_a_notebook_with_its_files() -> None:
    rendered = render(EVENTS, base_url="http://gw")
    assert rendered.text == (
        "a\nwarn\n[image 1: image/png]\n42\nE: v\n"
        "Files written:\n"
        "  o.csv (4 bytes, text/csv): http://gw/sessions/s/files/o.csv\n"
        "  p.png (12 bytes, image/png): (image 2, below)\n"
        "  i.csv (4 bytes, text/csv): (returned below)\n"
    )
    assert [i.mime for i in rendered.images] == ["image/png", "image/png"]
    assert rendered.status == "error"
    assert "(not returned)" in render(EVENTS, inline_files=False).text


def test_the_clients_tool_output_is_the_renderers() -> None:
    output = summarize(_execution(EVENTS))
    rendered = render(EVENTS, inline_files=False)
    assert output.text == rendered.text
    assert output.images == [(i.mime, i.data) for i in rendered.images]
    assert output.is_error


def test_mcp_content_is_the_renderers() -> None:
    report = mcp_tools.CellReport("http://gw")
    for name, data in EVENTS:
        report.add(Event(name, data))
    blocks = report.content("s")
    text = render(EVENTS, base_url="http://gw", session_id="s").text
    assert blocks[0] == mcp_tools.text_block(text)
    kinds = [type(b).__name__ for b in blocks[1:]]
    assert kinds == ["ImageContent", "ImageContent", "EmbeddedResource", "ResourceLink"]


def test_one_set_of_limits() -> None:
    assert mcp_tools.MAX_TEXT == MAX_TEXT and mcp_tools.MAX_IMAGES == MAX_IMAGES
    many = [("display", {"data": {"image/png": PNG}}) for _ in range(MAX_IMAGES + 2)]
    rendered = render([*many, ("stdout", {"text": "x" * (2 * MAX_TEXT)})])
    assert len(rendered.images) == MAX_IMAGES
    assert "2 more images not shown" in rendered.text
    assert len(rendered.text) < MAX_TEXT + 100 and "characters omitted" in rendered.text


def test_a_cell_whose_end_was_not_seen_says_so() -> None:
    rendered = render([("stdout", {"text": "partial\n"})])
    assert rendered.status == "incomplete"
    assert rendered.text == "partial\n[the cell's end was not seen: its output may be cut short]\n"


def test_a_resumed_session_names_what_it_lost() -> None:
    lost = {"lost": [{"name": "conn", "reason": "cannot be pickled"}]}
    text = render([("resumed", lost), ("done", {"status": "ok"})]).text
    assert text == "[the session resumed from hibernation; not kept: conn (cannot be pickled)]\n"
    assert render_module.resumed_note({"lost": []}) is None


def test_a_sessions_saved_chart_is_a_link_not_a_second_image() -> None:
    """`plt.savefig` in a session: the chart is shown once (its display), and the file it
    saved is named with its URL even when its bytes came inline for chat UIs."""
    events: list[tuple[str, dict[str, Any]]] = [
        ("display", {"data": {"image/png": PNG}, "metadata": {}, "update": False}),
        (
            "file",
            {"path": "c.png", "size": 12, "mime": "image/png", "url": "/f/c.png", "data": PNG},
        ),
        ("done", {"status": "ok", "execution_count": 1, "duration_ms": 1.0, "restarted": False}),
    ]
    rendered = render(events, base_url="http://gw")
    assert len(rendered.images) == 1
    assert "c.png (12 bytes, image/png): http://gw/f/c.png\n" in rendered.text
