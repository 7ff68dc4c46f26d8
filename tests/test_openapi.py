"""The OpenAPI document: valid 3.1, one entry per route, and true to what a gateway sends.

Schemathesis (test_fuzz.py) checks random requests against the document; these
tests pin what it cannot: that no route is left out, and that every kind of
event a real kernel produces, in SSE and in JSON, matches its schema.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from kernel_gateway.server.app import create_app
from kernel_gateway.server.openapi import UNDOCUMENTED, build

from .conftest import settings_for
from .helpers import ServerThread

TOKEN = "openapi-token"
METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (path, method.upper())
        for path, item in document["paths"].items()
        for method in item
        if method in METHODS
    }


def excluded(path: str) -> str | None:
    """The reason a route under `path` is left out of the document, if it is."""
    for prefix, reason in UNDOCUMENTED.items():
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            return reason
    return None


def routed(app: Starlette) -> tuple[set[tuple[str, str]], set[str]]:
    """(path template, method) of every route of the app, and the excluded paths it has."""
    found: set[tuple[str, str]] = set()
    left_out: set[str] = set()
    for route in app.routes:
        path = getattr(route, "path", "")
        if excluded(path) is not None:
            left_out.add(path)
            continue
        assert isinstance(route, Route), f"{path!r} is neither documented nor in UNDOCUMENTED"
        template = path.replace(":path}", "}")
        assert route.methods, route
        found |= {(template, m) for m in route.methods if m != "HEAD"}  # HEAD comes with GET
    return found, left_out


@pytest.mark.parametrize("token", [None, TOKEN])
def test_the_document_is_valid_openapi_3_1(tmp_path: Path, token: str | None) -> None:
    document = build(settings_for("local", tmp_path, token=token))
    assert document["openapi"].startswith("3.1")
    validate(document)  # openapi-spec-validator: raises on any violation
    json.dumps(document)  # and it is plain JSON


def test_every_route_is_documented_and_every_documented_route_exists(tmp_path: Path) -> None:
    settings = settings_for("local", tmp_path)
    routes, left_out = routed(create_app(settings))
    docs = documented(build(settings))
    assert routes - docs == set(), "routes missing from the OpenAPI document"
    assert docs - routes == set(), "documented operations the app does not route"
    # Each exclusion has a reason and still matches a route (no stale entries).
    for prefix, reason in UNDOCUMENTED.items():
        assert len(reason) > 20, prefix
        assert any(excluded(path) == reason for path in left_out), f"{prefix} matches no route"


async def _nothing(request: Request) -> Response:  # pragma: no cover - never called
    return Response()


def test_a_new_route_without_documentation_is_caught(tmp_path: Path) -> None:
    """The check above is not vacuous: an undocumented route or mount makes it fail."""
    settings = settings_for("local", tmp_path)
    app = create_app(settings)
    app.router.routes.append(Route("/sessions/{session_id}/secret", _nothing, methods=["GET"]))
    routes, _ = routed(app)
    assert routes - documented(build(settings)) == {("/sessions/{session_id}/secret", "GET")}
    app.router.routes.append(Mount("/undocumented", app=Starlette()))
    with pytest.raises(AssertionError, match="neither documented nor in UNDOCUMENTED"):
        routed(app)


def test_the_token_is_required_exactly_where_the_document_says(tmp_path: Path) -> None:
    with_token = build(settings_for("local", tmp_path, token=TOKEN))
    without = build(settings_for("local", tmp_path))
    assert with_token["security"] == [{"bearer": []}]
    assert "security" not in without
    public = {
        path
        for path, item in with_token["paths"].items()
        for op in item.values()
        if op.get("security") == []
    }
    assert public == {"/", "/health", "/openapi.json"}
    for path, item in with_token["paths"].items():
        for op in item.values():
            assert ("401" in op["responses"]) == (path not in public), path
    assert all(
        "401" not in op["responses"] for item in without["paths"].values() for op in item.values()
    )


def test_limits_in_force_are_stated(tmp_path: Path) -> None:
    document = build(settings_for("local", tmp_path, max_exec_timeout=7.0, exec_timeout=3.0))
    timeout = document["components"]["schemas"]["ExecuteRequest"]["properties"]["timeout"]
    assert timeout["maximum"] == 7.0
    assert "3" in timeout["description"]


# -- against a live gateway -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    settings = settings_for("local", tmp_path_factory.mktemp("openapi"), token=TOKEN, preload="")
    with ServerThread(settings) as s:
        yield s


@pytest.fixture
def api(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=60, headers=headers) as c:
        yield c


def schema_validator(document: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """A validator for one component, its `$ref`s resolved within the document."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def check(document: dict[str, Any], name: str, value: Any) -> None:
    errors = [e.message for e in schema_validator(document, name).iter_errors(value)]
    assert errors == [], f"{name}: {errors} in {value!r}"


EVERY_EVENT = """
import sys
from IPython.display import display, update_display, clear_output
print("out")
print("err", file=sys.stderr)
display("a", display_id="d1")
update_display("b", display_id="d1")
clear_output(wait=True)
open("made.txt", "w").write("x")
open("dot.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg"/>')
42
"""


def test_the_document_is_served_publicly(server: ServerThread) -> None:
    response = httpx.get(server.url + "/openapi.json")  # no token
    assert response.status_code == 200
    assert response.json() == build(server.settings)
    assert response.headers["x-request-id"]


def test_every_event_matches_its_schema_in_sse_and_json(
    server: ServerThread, api: httpx.Client
) -> None:
    document = api.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    frames = schemas["ServerSentEvent"]["oneOf"]
    data_schema = {f["properties"]["event"]["const"]: f["properties"]["data"] for f in frames}
    session = api.post("/sessions")
    check(document, "Session", session.json())
    sid = session.json()["id"]

    seen: set[str] = set()
    for code in (EVERY_EVENT, "1/0", "import os; os._exit(3)"):
        with api.stream("POST", f"/sessions/{sid}/execute", json={"code": code}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            body = response.read().decode()
        for block in body.strip().split("\n\n"):
            lines = [line for line in block.split("\n") if not line.startswith(":")]
            if not lines:
                continue
            fields = dict(line.split(": ", 1) for line in lines)
            check(document, "ServerSentEvent", fields)
            name = fields["event"]
            content = data_schema[name]["contentSchema"]["$ref"].rsplit("/", 1)[-1]
            check(document, content, json.loads(fields["data"]))
            seen.add(name)
        collected = api.post(
            f"/sessions/{sid}/execute", json={"code": code}, headers={"Accept": "application/json"}
        )
        check(document, "CollectedExecution", collected.json())
    assert seen == set(data_schema), "the cells above should produce every event type"

    stateless = api.post(
        "/execute",
        json={"code": "open('in.txt').read()", "files": [{"path": "in.txt", "data": "aGk="}]},
        headers={"Accept": "application/json"},
    )
    check(document, "CollectedExecution", stateless.json())

    api.put(f"/sessions/{sid}/files/dir/f.csv", content=b"a,b\n")
    check(document, "FileList", api.get(f"/sessions/{sid}/files").json())
    check(document, "ExecutionList", api.get(f"/sessions/{sid}/executions").json())
    check(document, "InterruptedSession", api.post(f"/sessions/{sid}/interrupt").json())
    check(document, "SessionList", api.get("/sessions").json())
    check(document, "Health", api.get("/health").json())
    check(document, "Error", api.get("/sessions/nope").json())
    assert base64.b64decode("aGk=") == b"hi"
    api.delete(f"/sessions/{sid}")
