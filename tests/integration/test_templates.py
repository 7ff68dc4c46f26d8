"""Templates built on the real engine: steps, files, cache, failures named by step,
the gateway's closing step, removal. (The HTTP API and E2B's SDK: their own tests.)"""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
import pytest_asyncio
import zmq.asyncio

from kernel_gateway.errors import InvalidRequest, TemplateConflict, TooManyTemplates
from kernel_gateway.kernels.backends.docker import DockerBackend
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.templates.model import Build, BuildSpec, BuildState, Template
from kernel_gateway.templates.service import Templates
from kernel_gateway.templates.steps import parse_steps
from kernel_gateway.tenants.principal import ADMIN
from tests.support.backends import IMAGE, require_gvisor, settings_for


@pytest_asyncio.fixture
async def templates(tmp_path: Path) -> AsyncIterator[Templates]:
    require_gvisor()
    settings = settings_for("docker", tmp_path / "rt", runtime="runsc")
    runtime = RuntimeDir(tmp_path / "rt")
    runtime.open()
    backend = DockerBackend(settings, runtime)
    await backend.start()
    context = zmq.asyncio.Context()
    service = Templates(settings, backend, runtime, context)
    service.open()
    try:
        yield service
    finally:
        for template in service.all(ADMIN):
            if template.building is None or template.building.state is not BuildState.BUILDING:
                await service.delete(template)
        await service.close()
        await backend.close()
        context.destroy(linger=0)
        runtime.close()


def upload(service: Templates, files: dict[str, bytes]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    files_hash = hashlib.sha256(buffer.getvalue()).hexdigest()
    service.files.partial(files_hash).write_bytes(buffer.getvalue())
    service.files.commit(files_hash)
    return files_hash


async def build(
    service: Templates, steps: list[dict[str, object]], name: str | None = None
) -> tuple[Template, Build, list[str]]:
    template = service.create(name or f"t-{uuid.uuid4().hex[:8]}", exist_ok=True, owner=ADMIN)
    started = service.new_build(template)
    service.start(template, started, BuildSpec("image:e2bdev/base", tuple(parse_steps(steps))))
    lines = [f"{e.get('step', '-')} {e['message']}" async for e in service.follow(started)]
    return template, started, lines


def image_config(ref: str) -> dict[str, object]:
    client = docker.from_env()
    try:
        config: dict[str, object] = client.api.inspect_image(ref)["Config"]  # type: ignore[no-untyped-call]
        return config
    finally:
        client.close()


async def test_a_template_gets_its_files_env_and_packages_and_keeps_the_kernel_settings(
    templates: Templates,
) -> None:
    files = upload(templates, {"data/hello.txt": b"hello from the context\n"})
    _, done, lines = await build(
        templates,
        [
            {"type": "RUN", "args": ["echo made-by-$(whoami) > /opt/marker", "root"]},
            {"type": "ENV", "args": ["GREETING", 'hi "there" $HOME']},
            {"type": "COPY", "args": ["data", "/opt/data", "", "0640"], "filesHash": files},
            {"type": "RUN", "args": ["cat /opt/data/hello.txt /opt/marker; echo $GREETING"]},
            {"type": "WORKDIR", "args": ["/app"]},
            {"type": "USER", "args": ["root"]},
        ],
    )
    assert done.state is BuildState.READY, (done.reason, lines)
    assert "4 hello from the context" in lines
    assert "4 made-by-root" in lines
    assert '4 hi "there" $HOME' in lines  # the value as given: no expansion
    assert any("The kernel answered" in line for line in lines)
    assert done.image is not None
    config = image_config(done.image)
    base = image_config(IMAGE)
    # The template's WORKDIR and USER were its steps'; the kernel's own are put back.
    assert (config["User"], config["WorkingDir"], config["Cmd"]) == (
        base["User"],
        base["WorkingDir"],
        base["Cmd"],
    )
    assert 'GREETING=hi "there" $HOME' in config["Env"]  # type: ignore[operator]


async def test_a_second_build_reuses_the_cached_steps(templates: Templates) -> None:
    marker = uuid.uuid4().hex
    steps: list[dict[str, object]] = [{"type": "RUN", "args": [f"echo {marker}"]}]
    _, first, first_lines = await build(templates, steps)
    assert first.state is BuildState.READY, first.reason
    assert f"1 {marker}" in first_lines
    _, second, second_lines = await build(templates, steps)
    assert second.state is BuildState.READY, second.reason
    assert "1 CACHED" in second_lines and f"1 {marker}" not in second_lines
    forced = [{**steps[0], "force": True}]
    _, third, third_lines = await build(templates, forced)
    assert f"1 {marker}" in third_lines


async def test_a_failed_step_is_named_with_its_output_and_leaves_no_image(
    templates: Templates,
) -> None:
    template, failed, _ = await build(
        templates,
        [
            {"type": "ENV", "args": ["A", "1"]},
            {"type": "RUN", "args": ["echo about to fail; exit 3"]},
            {"type": "RUN", "args": ["echo never"]},
        ],
    )
    assert failed.state is BuildState.ERROR
    assert failed.failed_step == 2
    assert failed.reason is not None
    assert "RUN echo about to fail; exit 3: exited with code 3" in failed.reason
    assert "about to fail" in failed.reason
    assert failed.image is None and template.ready is None
    # Nothing the build made is left behind.
    client = docker.from_env()
    try:
        filters = {"label": f"io.kernel-gateway.template={template.id}"}
        assert client.api.images(filters=filters, all=True, quiet=True) == []
    finally:
        client.close()
    with pytest.raises(TemplateConflict, match="no ready build"):
        templates.resolve(template.name, ADMIN)


async def test_an_unknown_user_fails_in_e2bs_words(templates: Templates) -> None:
    _, failed, _ = await build(templates, [{"type": "RUN", "args": ["whoami", "root123"]}])
    assert failed.state is BuildState.ERROR
    assert (
        "failed to run command 'whoami': command failed: unauthenticated: invalid username: "
        "'root123'" in (failed.reason or "")
    )


async def test_e2bs_user_is_the_kernels_user(templates: Templates) -> None:
    _, done, lines = await build(templates, [{"type": "RUN", "args": ["id -u", "user"]}])
    assert done.state is BuildState.READY, done.reason
    assert "1 1000" in lines


async def test_a_step_past_the_time_limit_is_killed(templates: Templates) -> None:
    templates.settings = settings_for(
        "docker", templates.settings.runtime_dir, runtime="runsc", template_build_timeout=3.0
    )
    _, failed, _ = await build(templates, [{"type": "RUN", "args": ["sleep 60"]}])
    assert failed.state is BuildState.ERROR
    assert "ran out of time" in (failed.reason or "")


async def test_bases_that_are_not_the_gateways_are_refused(templates: Templates) -> None:
    template = templates.create(f"t-{uuid.uuid4().hex[:8]}", exist_ok=False, owner=ADMIN)
    pending = templates.new_build(template)
    with pytest.raises(InvalidRequest, match="ubuntu:22.04.*not one of this gateway's"):
        templates.start(template, pending, BuildSpec("image:ubuntu:22.04"))


async def test_delete_removes_the_image_and_refuses_a_running_build(
    templates: Templates,
) -> None:
    template, done, _ = await build(templates, [{"type": "RUN", "args": ["true"]}])
    assert done.image is not None
    running = templates.new_build(template)
    templates.start(
        template,
        running,
        BuildSpec(
            "image:python",
            tuple(parse_steps([{"type": "RUN", "args": ["sleep 5"], "force": True}])),
        ),
    )
    with pytest.raises(TemplateConflict, match="is building"):
        await templates.delete(template)
    async for _ in templates.follow(running):
        pass
    await templates.delete(template)
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.ImageNotFound):
            client.api.inspect_image(done.image)  # type: ignore[no-untyped-call]
    finally:
        client.close()
    assert templates.find(template.name, ADMIN) is None
    await asyncio.sleep(0)


async def test_more_templates_than_max_templates_are_refused_with_429(
    templates: Templates,
) -> None:
    templates.settings = settings_for(
        "docker", templates.settings.runtime_dir, runtime="runsc", max_templates=2
    )
    first = templates.create(f"t-{uuid.uuid4().hex[:8]}", exist_ok=False, owner=ADMIN)
    templates.create(f"t-{uuid.uuid4().hex[:8]}", exist_ok=False, owner=ADMIN)
    with pytest.raises(TooManyTemplates, match=r"at most 2 templates \(--max-templates\)") as info:
        templates.create(f"t-{uuid.uuid4().hex[:8]}", exist_ok=False, owner=ADMIN)
    assert (info.value.status_code, info.value.error_type) == (429, "too_many_templates")
    assert len(templates.all(ADMIN)) == 2  # the refused one was not kept
    await templates.delete(first)
    templates.create(f"t-{uuid.uuid4().hex[:8]}", exist_ok=False, owner=ADMIN)  # room again


def template_images(template: Template) -> list[str]:
    """Every image (named, or a cached step) a build of `template` made."""
    client = docker.from_env()
    try:
        filters = {"label": f"io.kernel-gateway.template={template.id}"}
        found: list[str] = client.api.images(filters=filters, all=True, quiet=True)
        return found
    finally:
        client.close()


async def test_an_image_over_the_size_cap_fails_its_build_and_is_removed(
    templates: Templates,
) -> None:
    # Every image holds its base (about 1.3 GB here): every build is over a 100 MiB cap.
    templates.settings = settings_for(
        "docker", templates.settings.runtime_dir, runtime="runsc", template_max_size="100m"
    )
    template, failed, lines = await build(
        templates, [{"type": "RUN", "args": [f"echo {uuid.uuid4().hex} > /opt/mark", "root"]}]
    )
    assert failed.state is BuildState.ERROR, lines
    assert failed.reason is not None
    assert "over the limit of 100 MiB (--template-max-size)" in failed.reason, failed.reason
    assert failed.image is None and template.ready is None
    assert not any("The kernel answered" in line for line in lines)  # no readiness check
    assert template_images(template) == []  # neither the closing image nor the step's
