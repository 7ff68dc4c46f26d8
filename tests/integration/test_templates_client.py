"""The Python clients' templates API on a real gateway (Docker, runc, as test_templates_api):
a template built from a folder (COPY, with its `.dockerignore`), an ENV and a RUN, followed
live; sessions and stateless cells on it; a failed build raised as `TemplateBuildError`
with its step; delete. Sync and async alike; the async test builds the same steps again,
so its build comes from the cache."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_gateway.client import (
    AsyncClient,
    BuildLogEntry,
    Client,
    Step,
    TemplateBuildError,
    TemplateConflictError,
    TemplateNotFoundError,
)
from tests.support.server import ServerFactory, ServerThread

TOKEN = "tok"
RUN = "echo built > /opt/built.txt && echo step-ran"
STEPS = [
    Step.copy("data", "/opt/data/"),
    Step.env(DATASET="/opt/data/table.csv"),
    Step.run(RUN, user="root"),
]
CHECK = (
    "import os\n"
    "print(open(os.environ['DATASET']).read().strip().replace(chr(10), '|'))\n"
    "print(open('/opt/built.txt').read().strip())\n"
    "print(os.path.exists('/opt/data/scratch.tmp'))"
)
EXPECTED = ["a,b|1,2", "built", "False"]


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("docker", pool_size=0, token=TOKEN)


@pytest.fixture
def client(server: ServerThread) -> Iterator[Client]:
    with Client(server.url, token=TOKEN, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build context folder: the table COPY takes, and a file its .dockerignore leaves out."""
    folder = tmp_path_factory.mktemp("context")
    (folder / "data").mkdir()
    (folder / "data" / "table.csv").write_text("a,b\n1,2\n")
    (folder / "data" / "scratch.tmp").write_text("not for the image\n")
    (folder / ".dockerignore").write_text("**/*.tmp\n")
    return folder


def name() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def test_sync_build_from_a_folder_then_a_session_on_it(client: Client, context: Path) -> None:
    template = name()
    lines: list[BuildLogEntry] = []
    steps = [*STEPS[:2], Step.run(RUN, user="root", force=True)]  # its output, not CACHED
    build = client.templates.create(
        template, steps=steps, context=context, tags=["v1"], wait=True, on_log=lines.append
    )
    assert build.ready and build.template == template and build.tags == ["v1"], build
    messages = [entry.message for entry in lines]
    assert "step-ran" in messages and any(m.startswith("Step 3/3") for m in messages), messages
    # The log again, once the build ended: every line, then the build.
    logs = client.templates.logs(template, build.id)
    assert [entry.message for entry in logs] == messages
    assert logs.build is not None and logs.build.id == build.id and logs.build.ready
    info = client.templates.get(template)
    assert info.ready_build == build.id and info.language == "python"
    assert template in [t.name for t in client.templates.list()]
    try:
        with client.session(template=f"{template}:v1") as session:
            assert session.run(CHECK).stdout.split() == EXPECTED
            assert session.info()["template"]["build_id"] == build.id
            with pytest.raises(TemplateConflictError):  # sessions run on it
                client.templates.delete(template)
        assert client.run(CHECK, template=template).stdout.split() == EXPECTED  # stateless
    finally:
        client.templates.delete(template)
    with pytest.raises(TemplateNotFoundError):
        client.templates.get(template)


def test_a_failed_build_raises_with_its_step_and_reason(client: Client) -> None:
    template = name()
    failing = [Step.run("true"), Step.run("echo no such package >&2; exit 100")]
    try:
        with pytest.raises(TemplateBuildError) as raised:
            client.templates.create(template, steps=failing, wait=True)
        error = raised.value
        assert error.failed_step == 2 and error.template == template, error
        assert "exited with code 100" in error.reason and "no such package" in error.reason
        assert "at step 2" in str(error)
        with pytest.raises(TemplateConflictError, match="no ready build"):
            client.session(template=template)
        # A build started without waiting is waited for by name (its newest build).
        started = client.templates.build(template, steps=[Step.run("true")])
        assert not started.finished
        assert client.templates.wait(template).id == started.id
    finally:
        client.templates.delete(template)


async def test_async_build_rebuild_and_sessions(server: ServerThread, context: Path) -> None:
    template = name()
    async with AsyncClient(server.url, token=TOKEN, timeout=120) as client:
        started = await client.templates.create(template, steps=STEPS, context=context)
        assert started.state in ("waiting", "building")
        first = await client.templates.wait(started)
        assert first.ready, first
        try:
            lines: list[str] = []
            again = await client.templates.build(
                template,
                steps=[*STEPS, Step.env(STAGE="two")],
                context=context,  # packed again: the same bytes, so COPY is cached too
                wait=True,
                on_log=lambda entry: lines.append(entry.message),
            )
            assert again.ready and again.id != first.id
            assert lines.count("CACHED") >= 3, lines
            assert (await client.templates.get(template)).ready_build == again.id
            async with client.session(template=template) as session:
                out = (await session.run(CHECK + "\nprint(os.environ['STAGE'])")).stdout
                assert out.split() == [*EXPECTED, "two"]
            logs = client.templates.logs(template, again.id, offset=1)
            entries = [entry async for entry in logs]
            assert entries and logs.build is not None and logs.build.ready
            assert logs.offset == 1 + len(entries)
        finally:
            await client.templates.delete(template)
