"""The client's templates API against httpx.MockTransport: the requests both clients build,
a build's log followed (and resumed where it broke), a failed build raised with its step,
and a folder packed as a build's context (its `.dockerignore` applied, the same bytes for
the same files)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel_gateway.client import (
    AsyncClient,
    BuildLogEntry,
    Client,
    Step,
    StreamEnded,
    TemplateBuild,
    TemplateBuildError,
    TemplateConflictError,
)
from kernel_gateway.client.templates import DockerIgnore, pack_folder
from kernel_gateway.http.sse import encode
from kernel_gateway.types import Event

Handler = Callable[[httpx.Request], httpx.Response]


def build_json(state: str = "building", **fields: Any) -> dict[str, Any]:
    return {
        "id": "b1",
        "template_id": "t" * 20,
        "template": "tpl",
        "state": state,
        "reason": None,
        "failed_step": None,
        "base": "python",
        "steps": 2,
        "created_at": "2025-01-02T03:04:05.123456Z",
        "started_at": None,
        "finished_at": None,
        "image": None,
        "size_bytes": 0,
        "tags": [],
        **fields,
    }


def log(message: str, step: str | None = None) -> Event:
    entry = {"timestamp": "2025-01-02T03:04:06Z", "level": "info", "message": message}
    return Event("log", entry if step is None else {**entry, "step": step})


def log_stream(*events: Event, first: int = 0, tail: bytes = b"") -> httpx.Response:
    body = b": ping\n\n"
    for number, event in enumerate(events, start=first + 1):
        body += encode(event, number if event.name == "log" else None)
    return httpx.Response(200, content=body + tail, headers={"content-type": "text/event-stream"})


def both(handler: Handler, sync: Callable[[Client], Any], run_async: Any) -> list[Any]:
    """What `sync(client)` and `await run_async(async_client)` returned or raised."""
    outcomes: list[Any] = []
    with Client("http://gw", token="t", transport=httpx.MockTransport(handler)) as client:
        try:
            outcomes.append(sync(client))
        except Exception as exc:
            outcomes.append(exc)

    async def main() -> None:
        transport = httpx.MockTransport(handler)
        async with AsyncClient("http://gw", token="t", transport=transport) as client:
            try:
                outcomes.append(await run_async(client))
            except Exception as exc:
                outcomes.append(exc)

    asyncio.run(main())
    return outcomes


def test_create_sends_steps_context_and_options_and_waits_for_the_ready_build(
    tmp_path: Path,
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.csv").write_text("a,b\n")
    seen: list[tuple[str, str, Any]] = []
    lines: list[str] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, str(request.url.raw_path.decode()), body))
        if request.method == "POST":
            return httpx.Response(202, json=build_json())
        ready = build_json("ready", image="sha256:1", tags=["v1"])
        return log_stream(log("Step 1/2", "1"), log("Step 2/2", "2"), Event("end", ready))

    def sync(client: Client) -> TemplateBuild:
        return client.templates.create(
            "tpl",
            steps=[
                Step.copy("data", "/opt/data/", mode=0o644),
                {"type": "ENV", "args": ["A", "1"]},
            ],
            context=tmp_path,
            tags=["v1"],
            ready_cmd="true",
            wait=True,
            on_log=lambda entry: lines.append(str(entry)),
        )

    async def run_async(client: AsyncClient) -> TemplateBuild:
        return await client.templates.create(
            "tpl",
            steps=[
                Step.copy("data", "/opt/data/", mode=0o644),
                {"type": "ENV", "args": ["A", "1"]},
            ],
            context=tmp_path,
            tags=["v1"],
            ready_cmd="true",
            wait=True,
            on_log=lambda entry: lines.append(str(entry)),
        )

    for outcome in both(gateway, sync, run_async):
        assert isinstance(outcome, TemplateBuild) and outcome.ready, outcome
        assert outcome.tags == ["v1"] and outcome.image == "sha256:1"
    assert lines == ["Step 1/2", "Step 2/2"] * 2
    post = seen[0][2]
    assert seen[0][:2] == ("POST", "/templates") and seen[1][:2] == (
        "GET",
        "/templates/tpl/builds/b1/logs",
    )
    assert seen[2:] == seen[:2]  # the async client sent the same
    assert post["steps"] == [
        {"type": "COPY", "args": ["data", "/opt/data/", "", "0644"]},
        {"type": "ENV", "args": ["A", "1"]},
    ]
    assert (post["name"], post["tags"], post["ready_cmd"]) == ("tpl", ["v1"], "true")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(post["context"]))) as tar:
        assert tar.getnames() == ["data", "data/t.csv"]


def test_a_failed_build_raises_with_its_reason_and_step() -> None:
    failed = build_json("error", reason="RUN exit 100: no such package", failed_step=2)

    def gateway(request: httpx.Request) -> httpx.Response:
        return log_stream(log("Step 2/2", "2"), log("Build failed", "2"), Event("end", failed))

    outcomes = both(
        gateway,
        lambda client: client.templates.wait("tpl", "b1"),
        lambda client: client.templates.wait("tpl", "b1"),
    )
    for outcome in outcomes:
        assert isinstance(outcome, TemplateBuildError), outcome
        assert outcome.failed_step == 2 and outcome.reason == "RUN exit 100: no such package"
        assert outcome.template == "tpl" and outcome.build.failed
        assert "at step 2" in str(outcome) and "no such package" in str(outcome)


def test_logs_iterate_live_and_give_the_build_at_the_end() -> None:
    ready = build_json("ready")

    def gateway(request: httpx.Request) -> httpx.Response:
        assert request.url.params.get("offset") == "1"
        assert request.headers["accept"] == "text/event-stream"
        return log_stream(log("two"), log("three", "3"), Event("end", ready), first=1)

    with Client("http://gw", transport=httpx.MockTransport(gateway)) as client:
        logs = client.templates.logs("tpl", "b1", offset=1)
        entries = list(logs)
    assert [e.message for e in entries] == ["two", "three"]
    assert entries[1] == BuildLogEntry(entries[1].timestamp, "info", "three", "3")
    assert logs.build is not None and logs.build.ready and logs.offset == 3

    async def main() -> list[str]:
        transport = httpx.MockTransport(gateway)
        async with AsyncClient("http://gw", transport=transport) as client:
            logs = client.templates.logs("tpl", "b1", offset=1)
            messages = [entry.message async for entry in logs]
            assert logs.build is not None and logs.offset == 3
            return messages

    assert asyncio.run(main()) == ["two", "three"]


def test_a_broken_log_is_read_again_from_the_line_it_broke_at() -> None:
    offsets: list[str | None] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        offsets.append(request.url.params.get("offset"))
        if len(offsets) % 2:  # the first connection of each client ends after one line
            return log_stream(log("one"))
        return log_stream(log("two"), Event("end", build_json("ready")), first=1)

    lines: list[str] = []
    outcomes = both(
        gateway,
        lambda client: client.templates.wait("tpl", "b1", on_log=lambda e: lines.append(e.message)),
        lambda client: client.templates.wait("tpl", "b1", on_log=lambda e: lines.append(e.message)),
    )
    assert all(isinstance(o, TemplateBuild) and o.ready for o in outcomes), outcomes
    assert offsets == [None, "1"] * 2 and lines == ["one", "two"] * 2


def test_a_log_that_keeps_breaking_without_progress_is_an_error() -> None:
    def gateway(request: httpx.Request) -> httpx.Response:
        return log_stream()

    with (
        Client("http://gw", transport=httpx.MockTransport(gateway), resume_retries=2) as client,
        pytest.raises(StreamEnded),
    ):
        client.templates.wait("tpl", "b1")


def test_list_get_delete_rebuild_and_errors() -> None:
    seen: list[tuple[str, str]] = []
    info = {
        "id": "t" * 20,
        "name": "tpl",
        "language": "python",
        "state": "ready",
        "ready_build": "b1",
        "tags": {"default": "b1"},
        "created_at": "2025-01-02T03:04:05Z",
        "updated_at": "2025-01-02T03:04:05Z",
        "sessions": 0,
        "warm": 1,
        "spawn_count": 3,
        "last_spawned_at": None,
        "builds": [build_json("ready")],
    }

    def gateway(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.method == "DELETE":
            body = {"error": {"type": "template_conflict", "message": "in use"}}
            return httpx.Response(409, json=body)
        if request.url.path == "/templates":
            return httpx.Response(200, json={"templates": [info]})
        if request.method == "POST":
            assert json.loads(request.content) == {"force": True, "base": "template:tpl"}
            return httpx.Response(202, json=build_json(id="b2"))
        return httpx.Response(200, json=info)

    with Client("http://gw", transport=httpx.MockTransport(gateway)) as client:
        [listed] = client.templates.list()
        assert listed.name == "tpl" and listed.latest is not None and listed.latest.ready
        assert listed.created_at is not None and listed.created_at.year == 2025
        assert client.templates.get("tpl").tags == {"default": "b1"}
        assert client.templates.build("tpl", base="template:tpl", force=True).id == "b2"
        with pytest.raises(TemplateConflictError):
            client.templates.delete("tpl")
    assert seen == [
        ("GET", "/templates"),
        ("GET", "/templates/tpl"),
        ("POST", "/templates/tpl/builds"),
        ("DELETE", "/templates/tpl"),
    ]


def test_sessions_and_stateless_cells_name_their_template() -> None:
    bodies: list[Any] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if request.url.path == "/sessions":
            return httpx.Response(201, json={"id": "s1"})
        done = {"status": "ok", "execution_count": 1, "duration_ms": 1.0, "restarted": False}
        return httpx.Response(
            200,
            content=encode(Event("done", done)),
            headers={"content-type": "text/event-stream"},
        )

    with Client("http://gw", transport=httpx.MockTransport(gateway)) as client:
        assert client.create_session(template="tpl:v1").id == "s1"
        client.run("1", template="tpl")

    async def main() -> None:
        async with AsyncClient("http://gw", transport=httpx.MockTransport(gateway)) as client:
            assert (await client.session(template="tpl:v1")).id == "s1"

    asyncio.run(main())
    assert bodies == [
        {"template": "tpl:v1"},
        {"code": "1", "template": "tpl"},
        {"template": "tpl:v1"},
    ]


def test_dockerignore_rules_as_docker_reads_them() -> None:
    ignore = DockerIgnore.parse(
        "# comment\n*.pyc\n/build\n**/secret*\nlogs\n!logs/keep.txt\ndocs/?.md\n"
    )
    assert ignore.ignored("a.pyc") and not ignore.ignored("sub/a.pyc")  # `*` stays in a folder
    assert ignore.ignored("build") and ignore.ignored("build/x/y")  # a folder takes its contents
    assert ignore.ignored("secret.txt") and ignore.ignored("a/b/secret.key")
    assert ignore.ignored("logs/x.log") and not ignore.ignored("logs/keep.txt")
    assert ignore.ignored("docs/a.md") and not ignore.ignored("docs/ab.md")
    assert not ignore.ignored("src/main.py")


def test_a_folder_packs_to_the_same_bytes_minus_what_it_ignores(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print(1)\n")
    (tmp_path / "src" / "app.pyc").write_bytes(b"\0")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / ".dockerignore").write_text("**/*.pyc\n.dockerignore\n")
    packed = pack_folder(tmp_path)
    assert packed == pack_folder(tmp_path)  # no times of packing, no owners: cache-friendly
    with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
        assert tar.getnames() == ["run.sh", "src", "src/app.py"]
        assert tar.getmember("run.sh").mode & 0o777 == 0o755
        assert tar.getmember("src/app.py").uid == 0
        member = tar.extractfile("src/app.py")
        assert member is not None and member.read() == b"print(1)\n"
