"""The OpenAPI document: valid 3.1, one entry per route, and true to what a gateway sends.

Schemathesis (test_fuzz.py) checks random requests against the document; these
tests pin what it cannot: that no route is left out, and that every kind of
event a real kernel produces, in SSE and in JSON, matches its schema.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from kernel_gateway.server.openapi import build
from tests.support.server import ServerFactory, ServerThread

TOKEN = "openapi-token"


# -- against a live gateway -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("local", token=TOKEN, preload="")


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
    assert response.json() == build(server.settings, ["python"])  # a local gateway: Python
    assert response.headers["x-request-id"]


def test_every_event_matches_its_schema_in_sse_and_json(
    server: ServerThread, api: httpx.Client
) -> None:
    document = api.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    frames = schemas["ServerSentEvent"]["oneOf"]
    data_schema = {f["properties"]["event"]["const"]: f["properties"]["data"] for f in frames}
    session = api.post("/sessions")
    check(document, "RestoredSession", session.json())
    sid = session.json()["id"]

    seen: set[str] = set()
    for code in (EVERY_EVENT, "1/0", "import os; os._exit(3)", "HIBERNATE"):
        if code == "HIBERNATE":  # the next cell resumes it: a `resumed` event, done.resumed
            check(document, "Session", api.post(f"/sessions/{sid}/hibernate").json())
            code = "import socket; s = socket.socket()"  # lost at the next hibernation
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
    hibernated = api.post(f"/sessions/{sid}/hibernate").json()
    check(document, "Session", hibernated)
    assert hibernated["hibernation"]["lost"][0]["name"] == "s"
    check(document, "ResumedSession", api.post(f"/sessions/{sid}/resume").json())
    check(document, "ResumedSession", api.post(f"/sessions/{sid}/resume").json())  # null

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
