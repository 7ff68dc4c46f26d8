"""The OpenAPI document: valid 3.1, one entry per route, and true to what a gateway sends.

Schemathesis (test_fuzz.py) checks random requests against the document; these
tests pin what it cannot: that no route is left out, and that every kind of
event a real kernel produces, in SSE and in JSON, matches its schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from openapi_spec_validator import validate
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from kernel_gateway.http.auth import PUBLIC_PATHS, PUBLIC_PREFIXES, SELF_CHECKED
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.server.app import create_app
from kernel_gateway.server.openapi import UNDOCUMENTED, build
from kernel_gateway.server.routes import OPERATIONS, SURFACES
from tests.support.backends import settings_for

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


def test_language_is_an_enum_of_the_gateways_languages(tmp_path: Path) -> None:
    document = build(settings_for("local", tmp_path), ["python", "r"])
    schemas = document["components"]["schemas"]
    for name in ("NewSession", "StatelessExecuteRequest"):
        assert schemas[name]["properties"]["language"]["enum"] == ["python", "r", None]
    plain = build(settings_for("local", tmp_path))
    assert "enum" not in plain["components"]["schemas"]["NewSession"]["properties"]["language"]


def test_the_public_paths_are_the_public_operations() -> None:
    """The token guard's public paths (`http/auth.py`, shared with the router) are exactly
    the operations declared public, and its public prefixes the web UI's files and E2B's
    front door (which checks its own keys)."""
    assert {op.path for op in OPERATIONS if op.public} == PUBLIC_PATHS
    prefixes = {s.prefix + "/" for s in SURFACES if s.prefix in ("/static", "/e2b")}
    assert prefixes == set(PUBLIC_PREFIXES)
    assert SELF_CHECKED == {"/files"} and SELF_CHECKED <= {s.prefix for s in SURFACES}


def test_each_operation_id_and_route_is_declared_once() -> None:
    ids = [op.id for op in OPERATIONS]
    assert len(ids) == len(set(ids))
    keys = [(op.method, op.template) for op in OPERATIONS]
    assert len(keys) == len(set(keys))
    for op in OPERATIONS:
        assert op.method in METHODS, op
        assert all(400 <= status < 600 for status in op.errors), op
        assert op.replies and all(200 <= r.status < 300 for r in op.replies), op


def test_each_handler_answers_the_shape_its_record_declares() -> None:
    """A handler annotated `-> JSONResponse[X]` (mypy checks that it builds an X) is one
    whose record declares X as its JSON answer, and every record that declares a JSON
    shape has such a handler: the document cannot promise one shape while the code
    builds another."""
    for op in OPERATIONS:
        returned = get_type_hints(op.handler)["return"]
        shapes = {reply.shape for reply in op.replies if reply.shape is not None}
        if get_origin(returned) is JSONResponse:
            assert set(get_args(returned)) == shapes, op.id
        else:
            assert not shapes, f"{op.id} declares {shapes} but returns {returned}"
