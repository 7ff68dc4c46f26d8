"""The API's models (`kernel_gateway.shapes`) without a server: the messages a bad
body gets, the schemas the OpenAPI document and the MCP tools share, and that what the
gateway produces fits the models that document it."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from kernel_gateway import errors
from kernel_gateway.kernels.events import OutputLimiter, error_event, translate
from kernel_gateway.protocols.mcp.tools import (
    RunPythonArguments,
    StatelessRunPythonArguments,
    ToolInputError,
    UploadFileArguments,
    file_tools,
    parse_arguments,
    run_python_tool,
)
from kernel_gateway.server.openapi import build
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import events, requests, responses
from kernel_gateway.shapes.requests import (
    ExecuteRequest,
    NewSession,
    StartKernelRequest,
    StatelessExecuteRequest,
    validate,
)
from kernel_gateway.types import EVENT_NAMES

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = Settings(exec_timeout=3.0, max_exec_timeout=7.0, max_upload_bytes=10)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (ExecuteRequest, {}, "'code' is required"),
        (ExecuteRequest, {"code": None}, "'code' is required"),
        (ExecuteRequest, {"code": 5}, "'code' must be a string"),
        (ExecuteRequest, {"code": "\ud800"}, "'code' is not valid Unicode (lone surrogate)"),
        (ExecuteRequest, {"code": "1", "timeout": "soon"}, "'timeout' must be a number"),
        (ExecuteRequest, {"code": "1", "timeout": True}, "'timeout' must be a number"),
        (ExecuteRequest, {"code": "1", "timeout": -1}, "'timeout' must be greater than 0"),
        (ExecuteRequest, {"code": "1", "timeout": 0}, "'timeout' must be greater than 0"),
        (ExecuteRequest, {"code": "1", "timeout": 7.5}, "'timeout' must be at most 7"),
        (ExecuteRequest, {"code": "1", "timeout": 10**400}, "'timeout' must be a finite number"),
        (ExecuteRequest, {"code": "1", "timeout": float("nan")}, "must be a finite number"),
        (ExecuteRequest, {"code": "1", "timeout": float("inf")}, "must be a finite number"),
        (
            ExecuteRequest,
            {"code": "1", "extra": 1, "another": 2},
            "unknown field(s): another, extra; allowed: code, timeout",
        ),
        (ExecuteRequest, {"extra": 1}, "unknown field(s): extra; allowed: code, timeout"),
        (NewSession, {"x": 1}, "unknown field(s): x; allowed: language"),
        (NewSession, {"language": 3}, "'language' must be a string"),
        (
            StatelessExecuteRequest,
            {"code": "1", "files": "nope"},
            "'files' must be a list of {path, data} objects",
        ),
        (
            StatelessExecuteRequest,
            {"code": "1", "files": [5]},
            "'files[0]' must be an object with 'path' and 'data'",
        ),
        (StatelessExecuteRequest, {"code": "1", "files": [{"path": "a"}]}, "'files[0].data'"),
        (
            StatelessExecuteRequest,
            {"code": "1", "files": [{"path": "a", "data": ""}, {"path": "../x", "data": ""}]},
            "'files[1].path': file paths may not contain '..'",
        ),
        (
            StatelessExecuteRequest,
            {"code": "1", "files": [{"path": "\ud800", "data": ""}]},
            "'files[0].path': file paths must be valid Unicode",
        ),
        (
            StatelessExecuteRequest,
            {"code": "1", "files": [{"path": "a", "data": "***"}]},
            "'files[0].data' is not valid base64",
        ),
        (
            StatelessExecuteRequest,
            {"code": "1", "files": [{"path": "a", "data": "", "mode": 1}]},
            "'files[0]': unknown field(s): mode; allowed: data, path",
        ),
        (StartKernelRequest, {"env": "x"}, "'env' must be an object"),
        (StartKernelRequest, {"env": {"A": 1}}, "'env.A' must be a string"),
        (StartKernelRequest, {"nope": 1}, "unknown field(s): nope; allowed: env, name, path"),
    ],
)
def test_a_bad_body_is_422_naming_the_field(
    model: type[BaseModel], body: dict[str, Any], message: str
) -> None:
    with pytest.raises(errors.InvalidRequest) as caught:
        validate(model, body, SETTINGS)
    assert caught.value.status_code == 422
    assert caught.value.error_type == "invalid_request"
    assert message in caught.value.message


def test_unknown_fields_are_reported_before_anything_else() -> None:
    with pytest.raises(errors.InvalidRequest, match="unknown field"):
        validate(ExecuteRequest, {"code": 5, "timeout": "x", "extra": 1}, SETTINGS)


def test_a_file_over_the_upload_limit_is_413() -> None:
    body = {"code": "1", "files": [{"path": "a", "data": b64(b"x" * 11)}]}
    with pytest.raises(errors.PayloadTooLarge, match="10-byte upload limit") as caught:
        validate(StatelessExecuteRequest, body, SETTINGS)
    assert caught.value.status_code == 413
    assert "'files[0].data'" in caught.value.message


def test_good_bodies() -> None:
    assert validate(ExecuteRequest, {"code": "1", "timeout": 7}, SETTINGS).timeout == 7.0
    assert validate(ExecuteRequest, {"code": "1", "timeout": None}, SETTINGS).timeout is None
    assert validate(NewSession, {}, SETTINGS) == NewSession()
    body = {"code": "1", "files": [{"path": "./d/in.txt", "data": b64(b"hi")}]}
    stateless = validate(StatelessExecuteRequest, body, SETTINGS)
    assert [(f.path, f.data) for f in stateless.files or ()] == [("./d/in.txt", b"hi")]
    assert validate(StartKernelRequest, {"env": {"KERNEL_X": "1"}}, SETTINGS).env == {
        "KERNEL_X": "1"
    }


def test_the_limits_come_from_the_validation_context() -> None:
    with pytest.raises(TypeError, match="context"):
        ExecuteRequest.model_validate({"code": "1", "timeout": 1})
    roomy = Settings(exec_timeout=3.0, max_exec_timeout=100.0)
    assert validate(ExecuteRequest, {"code": "1", "timeout": 50}, roomy).timeout == 50.0


def test_validation_is_fast() -> None:
    """The hot path: a small body in microseconds (the models are built at import)."""
    body = {"code": "print(1)", "timeout": 5}
    validate(ExecuteRequest, body, SETTINGS)
    rounds = 2000
    started = time.perf_counter()
    for _ in range(rounds):
        validate(ExecuteRequest, body, SETTINGS)
    assert (time.perf_counter() - started) / rounds < 200e-6


# -- MCP arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "arguments", "message"),
    [
        (RunPythonArguments, {}, "'code' is required"),
        (RunPythonArguments, {"code": 1}, "'code' must be a string"),
        (RunPythonArguments, {"code": "1", "timeout": 8}, "'timeout' must be at most 7"),
        (
            RunPythonArguments,
            {"code": "1", "nope": 1},
            "unknown argument(s): nope; allowed: code, language, network, session, template, "
            "timeout",
        ),
        (RunPythonArguments, {"code": "1", "session": "../x"}, "'session' must match"),
        (
            UploadFileArguments,
            {"path": "x", "content": "!!", "encoding": "base64"},
            "'content' is not valid base64",
        ),
        (UploadFileArguments, {"path": "x", "content": "a", "encoding": "rot13"}, "'encoding'"),
        (UploadFileArguments, {"path": "/etc/x", "content": "a"}, "'path': file paths must be"),
        (UploadFileArguments, {"path": "x", "content": "a" * 11}, "10-byte upload limit"),
        (
            StatelessRunPythonArguments,
            {"code": "1", "files": [{"path": "a", "content": "x", "data": "x"}]},
            "'files[0]': unknown argument(s): data; allowed: content, encoding, path",
        ),
        (
            StatelessRunPythonArguments,
            {"code": "1", "files": "x"},
            "'files' must be a list of {path, encoding?, content} objects",
        ),
    ],
)
def test_bad_tool_arguments_are_a_tool_input_error(
    model: type[BaseModel], arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolInputError) as caught:
        parse_arguments(model, arguments, SETTINGS)
    assert message in str(caught.value)


def test_tool_arguments() -> None:
    handle = "node-1." + "ab" * 16
    run = parse_arguments(RunPythonArguments, {"code": "1", "session": handle}, SETTINGS)
    assert run.session == handle
    upload = parse_arguments(
        UploadFileArguments, {"path": "a", "content": b64(b"\0"), "encoding": "base64"}, SETTINGS
    )
    assert upload.content == b"\0"
    text = parse_arguments(UploadFileArguments, {"path": "a", "content": "hé"}, SETTINGS)
    assert text.content == "hé".encode()


# -- one model, three uses ---------------------------------------------------------------------


def test_openapi_and_mcp_schemas_come_from_the_same_fields() -> None:
    document = build(SETTINGS)
    schemas = document["components"]["schemas"]
    tool = run_python_tool(SETTINGS.max_exec_timeout, SETTINGS.exec_timeout, stateless=False)
    stateless = run_python_tool(SETTINGS.max_exec_timeout, SETTINGS.exec_timeout, stateless=True)
    for request in ("ExecuteRequest", "StatelessExecuteRequest"):
        for name in ("code", "timeout"):
            http = schemas[request]["properties"][name]
            assert http == tool.input_schema["properties"][name], (request, name)
            assert http == stateless.input_schema["properties"][name], (request, name)
    timeout = tool.input_schema["properties"]["timeout"]
    assert timeout["maximum"] == 7.0 and timeout["exclusiveMinimum"] == 0
    assert timeout["type"] == ["number", "null"]
    assert "default 3" in timeout["description"]
    # A file path is the same type in both, with the same pattern and bounds.
    (upload, *_) = file_tools(SETTINGS.max_upload_bytes)
    assert upload.input_schema["$defs"]["FilePath"] == schemas["FilePath"]
    assert upload.input_schema["properties"]["path"]["$ref"] == "#/$defs/FilePath"


def test_the_schemas_say_what_validation_does() -> None:
    schemas = build(SETTINGS)["components"]["schemas"]
    for request in ("NewSession", "ExecuteRequest", "StatelessExecuteRequest", "StatelessFile"):
        assert schemas[request]["additionalProperties"] is False, request
    assert schemas["ExecuteRequest"]["required"] == ["code"]
    assert schemas["StatelessFile"]["properties"]["data"]["pattern"] == requests.BASE64_PATTERN
    for tool in (run_python_tool(7, 3, stateless=False), *file_tools(10)):
        assert tool.input_schema["additionalProperties"] is False, tool.name


def test_the_document_is_built_from_cached_schemas_with_the_limits_of_each_gateway() -> None:
    small = build(Settings(exec_timeout=1.0, max_exec_timeout=2.0))
    large = build(Settings(exec_timeout=10.0, max_exec_timeout=20.0))
    assert (
        small["components"]["schemas"]["ExecuteRequest"]["properties"]["timeout"]["maximum"] == 2.0
    )
    assert (
        large["components"]["schemas"]["ExecuteRequest"]["properties"]["timeout"]["maximum"] == 20.0
    )


# -- what the gateway produces fits the models that document it --------------------------------


def _message(msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"header": {"msg_type": msg_type}, "content": content}


def test_events_fit_their_data_models() -> None:
    resumed = {
        "lost": [{"name": "sock", "reason": "TypeError: cannot pickle 'socket' object"}],
        "hibernated_seconds": 12.5,
        "resume_ms": 180.2,
    }
    too_long = translate(_message("stream", {"name": "stdout", "text": "long"}))
    assert too_long is not None
    produced: list[tuple[str, dict[str, Any]] | None] = [
        translate(_message("stream", {"name": "stdout", "text": "hi\n"})),
        translate(_message("stream", {"name": "stderr", "text": "oops\n"})),
        translate(
            _message(
                "display_data",
                {"data": {"text/plain": "x"}, "metadata": {}, "transient": {"display_id": "d"}},
            )
        ),
        translate(_message("update_display_data", {"data": {}, "transient": {}})),
        translate(_message("execute_result", {"data": {}, "execution_count": 3})),
        translate(_message("clear_output", {"wait": True})),
        translate(_message("error", {"ename": "E", "evalue": "v", "traceback": ["t"]})),
        error_event("KernelDied", "gone"),
        OutputLimiter(max_output_bytes=1, max_display_bytes=1).limit(too_long),
    ]
    produced += [
        ("file", {"path": "a.png", "size": 3, "mime": "image/png", "url": None, "data": "AAA="}),
        ("done", {"status": "died", "execution_count": None, "duration_ms": 1.5,
                  "restarted": True, "reason": "out_of_memory", "truncated": True}),
        ("resumed", resumed),
        ("done", {"status": "ok", "execution_count": 2, "duration_ms": 1.5,
                  "restarted": False, "resumed": resumed}),
    ]  # fmt: skip
    seen = set()
    for event in produced:
        assert event is not None
        name, data = event
        assert name in EVENT_NAMES, name
        TypeAdapter(events.EVENT_DATA[name]).validate_python(data, strict=True)
        seen.add(name)
    assert seen == set(EVENT_NAMES)
    with pytest.raises(ValueError):
        TypeAdapter(events.DoneData).validate_python({"status": "ok", "surprise": 1})


def test_every_error_body_fits_the_error_model() -> None:
    adapter = TypeAdapter(responses.Error)
    pending: list[type[errors.GatewayError]] = [errors.GatewayError]
    while pending:
        cls = pending.pop()
        adapter.validate_python(cls("message").to_json(), strict=True)
        pending.extend(cls.__subclasses__())
    with pytest.raises(ValueError):
        adapter.validate_python({"error": {"type": "made_up", "message": "x"}})


def test_the_router_does_not_load_pydantic() -> None:
    code = "import sys, kernel_gateway.cluster.app; print('pydantic' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "False"


def test_the_schemas_are_plain_json() -> None:
    json.dumps(build(SETTINGS)["components"]["schemas"])
