"""The pure parts of MCP and Jupyter support: framing, and a cell's events as MCP content."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import mcp_types as types
import pytest
from jupyter_client.session import Session as JupyterSession
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)

from kernel_gateway.protocols.jupyter.kernels import kernel_id, session_id
from kernel_gateway.protocols.jupyter.wire import (
    V1_PROTOCOL,
    BadFrame,
    WireMessage,
    from_client,
    make,
    pack,
    to_client,
)
from kernel_gateway.protocols.mcp.tools import (
    MAX_IMAGES,
    CellReport,
    ToolInputError,
    UploadFileArguments,
    clip,
    file_content,
    file_tools,
    parse_arguments,
    run_python_tool,
)
from kernel_gateway.settings import Settings
from kernel_gateway.types import Event

SESSION = JupyterSession(key=b"")


def _request() -> dict[str, object]:
    return SESSION.msg("execute_request", {"code": "1"})


# -- Jupyter framing, checked against Jupyter Server's own functions ---------------------------


def test_v1_frames_round_trip_with_jupyter_servers_functions() -> None:
    request = _request()
    message = from_client(serialize_msg_to_ws_v1(request, "shell", SESSION.pack), V1_PROTOCOL)
    assert message.channel == "shell"
    assert json.loads(message.parts[0])["msg_id"] == request["header"]["msg_id"]  # type: ignore[index]
    with_buffer = WireMessage("iopub", [*message.parts, b"\x00raw"])
    channel, parts = deserialize_msg_from_ws_v1(to_client(with_buffer, V1_PROTOCOL))
    assert channel == "iopub" and parts == with_buffer.parts


def test_json_and_legacy_binary_frames_round_trip() -> None:
    request = _request()
    text = json.dumps(dict(request, channel="control"), default=str)
    message = from_client(text, None)
    assert message.channel == "control" and len(message.parts) == 4
    decoded = json.loads(to_client(message, None))
    assert decoded["msg_type"] == "execute_request" and decoded["channel"] == "control"
    assert decoded["msg_id"] == request["header"]["msg_id"]  # type: ignore[index]

    binary = serialize_binary_message(dict(request, channel="shell", buffers=[b"ab", b"c"]))
    message = from_client(binary, None)
    assert message.parts[4:] == [b"ab", b"c"]
    back = deserialize_binary_message(to_client(message, None))
    assert back["buffers"] == [b"ab", b"c"] and back["channel"] == "shell"


@pytest.mark.parametrize(
    ("frame", "protocol", "words"),
    [
        ("not json", None, "not JSON"),
        ("[1, 2]", None, "not a JSON object"),
        (json.dumps({"header": {"msg_type": "x"}}), None, "msg_id"),
        (json.dumps({"header": {"msg_id": "1"}}), None, "msg_type"),
        (json.dumps({"header": {"msg_id": "1", "msg_type": "x"}, "content": []}), None, "content"),
        (json.dumps({"header": {"msg_id": "1", "msg_type": "x"}, "channel": 3}), None, "channel"),
        (b"\x00\x00\x00\x05", None, "offset"),
        (struct.pack("!II", 1, 2), None, "offset"),
        ("text", V1_PROTOCOL, "binary"),
        (b"\x01", V1_PROTOCOL, "short"),
        ((99).to_bytes(8, "little") + b"\0" * 16, V1_PROTOCOL, "offset"),
    ],
)
def test_bad_frames_are_refused(frame: str | bytes, protocol: str | None, words: str) -> None:
    with pytest.raises(BadFrame, match=words):
        from_client(frame, protocol)


def test_v1_frame_with_a_broken_part_is_refused() -> None:
    request = _request()
    parts = [SESSION.pack(request["header"]), b"{", b"{}", b"{}"]
    with pytest.raises(BadFrame, match="parent_header"):
        from_client(serialize_msg_to_ws_v1(parts, "shell"), V1_PROTOCOL)


def test_made_messages_and_packing() -> None:
    message = make("iopub", {"msg_id": "a", "msg_type": "status"}, {}, {"execution_state": "dead"})
    assert json.loads(to_client(message, None))["content"] == {"execution_state": "dead"}
    assert pack({"t": "\ud800"}) == b'{"t":"\\ud800"}'  # a lone surrogate cannot break encoding


def test_kernel_ids_are_session_uuids_with_dashes() -> None:
    sid = "6f1c0e2a9b8d4c7e8f00112233445566"
    kid = kernel_id(sid)
    assert kid == "6f1c0e2a-9b8d-4c7e-8f00-112233445566"
    assert session_id(kid) == sid and session_id(sid) == sid
    assert session_id("not-a-uuid") == "not-a-uuid" and kernel_id("x") == "x"


# -- a cell's events as MCP content ------------------------------------------------------------

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def _report(*events: tuple[str, Mapping[str, object]]) -> CellReport:
    report = CellReport("http://gw")
    for name, data in events:
        report.add(Event(name, dict(data)))
    return report


def _text(blocks: Iterable[object]) -> str:
    return "".join(b.text for b in blocks if isinstance(b, types.TextContent))


def test_outputs_fold_like_a_notebook() -> None:
    report = _report(
        ("stdout", {"text": "a\n"}),
        ("stderr", {"text": "\x1b[31mwarn\x1b[0m\n"}),
        ("display", {"data": {"text/plain": "<Figure>", "image/png": PNG}, "display_id": None}),
        ("display", {"data": {"text/plain": "v1"}, "display_id": "d"}),
        ("display", {"data": {"text/plain": "v2"}, "display_id": "d", "update": True}),
        ("result", {"data": {"text/plain": "42"}}),
        (
            "file",
            {"path": "o.csv", "size": 3, "mime": "text/csv", "url": "/sessions/s/files/o.csv"},
        ),
        ("done", {"status": "ok", "restarted": False}),
    )
    blocks = report.content("s")
    text = _text(blocks)
    assert text.startswith("a\nwarn\n[image 1: image/png]\nv2\n42\n")
    assert "o.csv (3 bytes, text/csv): http://gw/sessions/s/files/o.csv" in text
    assert text.endswith("session: s\n")
    images = [b for b in blocks if isinstance(b, types.ImageContent)]
    assert [i.data for i in images] == [PNG]
    links = [b for b in blocks if isinstance(b, types.ResourceLink)]
    assert links[0].uri == "http://gw/sessions/s/files/o.csv"


def test_clear_output_drops_what_came_before() -> None:
    report = _report(
        ("stdout", {"text": "old\n"}),
        ("clear", {"wait": False}),
        ("stdout", {"text": "new\n"}),
        ("done", {"status": "ok"}),
    )
    assert _text(report.content(None)) == "new\n"


@pytest.mark.parametrize(
    ("done", "words"),
    [
        ({"status": "timeout", "restarted": True}, "timed out"),
        ({"status": "interrupted", "restarted": False}, "interrupted"),
        ({"status": "died", "reason": "out_of_memory"}, "out_of_memory"),
        ({"status": "ok", "restarted": True}, "earlier variables are gone"),
    ],
)
def test_status_notes(done: dict[str, object], words: str) -> None:
    report = _report(("done", done))
    assert words in _text(report.content(None))
    assert (report.status != "ok") == (done["status"] != "ok")


def test_images_and_text_are_bounded() -> None:
    events = [("display", {"data": {"image/png": PNG}}) for _ in range(MAX_IMAGES + 3)]
    report = _report(*events, ("stdout", {"text": "x" * 100_000}), ("done", {"status": "ok"}))
    blocks = report.content(None)
    assert len([b for b in blocks if isinstance(b, types.ImageContent)]) == MAX_IMAGES
    text = _text(blocks)
    assert "3 more images not shown" in text and "characters omitted" in text
    assert len(clip("y" * 10, 4)) > 4 and clip("short") == "short"


def test_a_traceback_is_plain_text() -> None:
    report = _report(
        ("error", {"ename": "E", "evalue": "v", "traceback": ["\x1b[0;31mE\x1b[0m: v"]}),
        ("done", {"status": "error"}),
    )
    assert _text(report.content(None)) == "E: v\n"
    gateway_error = _report(("error", {"ename": "KernelDied", "evalue": "gone", "traceback": []}))
    assert "KernelDied: gone" in _text(gateway_error.content(None))


def test_inline_files_by_kind() -> None:
    assert isinstance(file_content("a.png", "image/png", PNG), types.ImageContent)
    text = file_content("a.txt", "text/plain", base64.b64encode(b"hi").decode())
    assert isinstance(text, types.EmbeddedResource)
    assert isinstance(text.resource, types.TextResourceContents) and text.resource.text == "hi"
    blob = file_content("a.bin", "application/octet-stream", base64.b64encode(b"\0\xff").decode())
    assert isinstance(blob, types.EmbeddedResource)
    assert isinstance(blob.resource, types.BlobResourceContents)


def decode_content(arguments: Mapping[str, object]) -> bytes:
    """upload_file's `content`, as its arguments model decodes it."""
    upload = parse_arguments(UploadFileArguments, {"path": "f", **arguments}, Settings())
    return upload.content


def test_content_decoding() -> None:
    assert decode_content({"content": "hé"}) == "hé".encode()
    assert decode_content({"content": "AAE=", "encoding": "base64"}) == b"\0\1"
    for arguments in (
        {"content": "!", "encoding": "base64"},
        {"content": "x", "encoding": "rot13"},
        {"content": 3},
        {"content": "\ud800"},
    ):
        with pytest.raises(ToolInputError):
            decode_content(arguments)


def test_run_python_schema() -> None:
    stateful = run_python_tool(3600, 60, stateless=False)
    assert stateful.input_schema["properties"]["timeout"]["maximum"] == 3600
    assert "session" in stateful.input_schema["properties"]
    stateless = run_python_tool(3600, 60, stateless=True)
    assert "files" in stateless.input_schema["properties"]
    assert "session" not in stateless.input_schema["properties"]
    assert stateless.input_schema["additionalProperties"] is False


def test_template_is_offered_only_where_allowed_naming_the_templates() -> None:
    tools = [run_python_tool(3600, 60, stateless=s) for s in (False, True)] + file_tools(1024)
    for tool in tools:  # off (the default): no tool shows it
        assert "template" not in tool.input_schema["properties"], tool.name
    names = [f"t{i} (python)" for i in range(35)]
    on = [run_python_tool(3600, 60, stateless=s, templates=names) for s in (False, True)]
    on += file_tools(1024, names)
    for tool in on:
        template = tool.input_schema["properties"]["template"]
        assert template["type"] == ["string", "null"] and template["maxLength"] == 200
        assert "t0 (python), t1 (python)" in template["description"]
        assert "t29 (python) and 5 more." in template["description"]
    empty = run_python_tool(3600, 60, stateless=False, templates=[])
    assert "no templates yet" in empty.input_schema["properties"]["template"]["description"]


def test_a_fifo_in_the_workspace_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    import os

    from kernel_gateway.errors import NotFound
    from kernel_gateway.kernels.workspace import Workspace

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(NotFound):
        Workspace(tmp_path).open_read("pipe")  # without a writer, a plain open blocks forever
