"""What ships for templates (templates/builtin.py): the `python3.11` base's names and image,
the shipped definitions as `POST /templates` reads them, `--builtin-templates` checked."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from kernel_gateway.cli.image import language_families
from kernel_gateway.errors import BackendUnavailable, InvalidRequest
from kernel_gateway.kernels.backends.base import Backend
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, Languages
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.wheels import wheel_target
from kernel_gateway.settings import Settings
from kernel_gateway.templates.builtin import (
    _build_one,
    definition,
    python311,
    python311_image,
    shipped,
    spec_of,
    start_builtin,
)
from kernel_gateway.templates.model import Build, BuildSpec, BuildState, Template
from kernel_gateway.templates.pip import parse_pip_install
from kernel_gateway.templates.service import Templates
from kernel_gateway.tenants.principal import ADMIN, Principal


def test_the_python311_image_is_named_after_the_kernel_image() -> None:
    assert python311_image("kernel-gateway-kernel:latest") == "kernel-gateway-kernel-py311:latest"
    language = python311(BUILTIN_PYTHON, "registry:5000/kg/kernel:v2")
    assert language.name == "python" and language.builtin
    assert language.image == "registry:5000/kg/kernel-py311:v2"
    assert language.version == "3.11"


def test_python_classic_is_shipped_as_a_post_templates_body() -> None:
    assert "python-classic" in shipped()
    body = definition("python-classic")
    assert body["name"] == "python-classic" and body["base"] == "python3.11"
    spec = spec_of(body)
    assert spec.base == "image:python3.11"
    # Its pip step is one the gateway does through the host (containers have no network).
    pip = parse_pip_install(spec.steps[0].args[0])
    assert pip is not None
    assert {p.split("==")[0] for p in pip.packages} == {
        "pandas",
        "numpy",
        "scipy",
        "matplotlib",
        "pyarrow",
    }
    with pytest.raises(KeyError):
        definition("nope")


def test_wheels_for_python311_fit_debian_12s_glibc() -> None:
    platforms = wheel_target("amd64", "3.11")
    assert "manylinux_2_36_x86_64" in platforms and "manylinux_2_37_x86_64" not in platforms
    assert "manylinux_2_41_x86_64" in wheel_target("amd64", "3.13")


def test_build_image_takes_python311_as_an_image_apart() -> None:
    assert language_families(["python3.11"]) == []
    assert language_families(["python3.11", "r"]) == ["r"]
    assert "python3.11" not in language_families(None)


def test_builtin_templates_setting_and_its_checks(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(builtin_templates=" python-classic, ")
    assert settings.builtin_template_list == ["python-classic"]
    start_builtin(None, [], "local")  # nothing asked: nothing said
    with pytest.raises(BackendUnavailable, match="no shipped template 'nope'"):
        start_builtin(None, ["nope"], "docker")
    with caplog.at_level(logging.WARNING):
        start_builtin(None, ["python-classic"], "local")
    assert "the local backend builds no templates" in caplog.text


class FakeImages:
    def __init__(self, present: set[str]) -> None:
        self.present = present

    async def inspect(self, ref: str) -> object | None:
        return object() if ref in self.present else None


class FakeTemplates:
    """What `_build_one` uses of `Templates`: builds start and end at once, ready."""

    def __init__(self, present: set[str]) -> None:
        self.images = FakeImages(present)
        self.by_name: dict[str, Template] = {}
        self.started: list[BuildSpec] = []

    def find(self, name: str, viewer: Principal) -> Template | None:
        assert viewer is ADMIN  # the operator's templates: shared with every key
        return self.by_name.get(name)

    def base_image(self, base: str, viewer: Principal) -> str:
        assert base == "image:python3.11" and viewer is ADMIN
        return "kernel-gateway-kernel-py311:latest"

    def create(self, name: str, *, exist_ok: bool, owner: Principal) -> Template:
        assert owner is ADMIN
        return self.by_name.setdefault(name, Template.new(name))

    def new_build(self, template: Template, tags: list[str] | None = None) -> Build:
        build = Build.new()
        template.builds.append(build)
        return build

    def start(self, template: Template, build: Build, spec: BuildSpec) -> None:
        build.spec, build.state, build.image = spec, BuildState.READY, "sha256:new"
        self.started.append(spec)

    async def follow(self, build: Build) -> AsyncIterator[dict[str, object]]:
        yield {"message": "Build finished"}


async def test_a_shipped_template_is_built_once_and_again_when_its_definition_changed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing = FakeTemplates(present=set())
    with caplog.at_level(logging.WARNING):
        await _build_one(cast(Templates, missing), "python-classic")
    assert not missing.by_name and "build-image --languages python3.11" in caplog.text

    fake = FakeTemplates(present={"kernel-gateway-kernel-py311:latest"})
    await _build_one(cast(Templates, fake), "python-classic")
    await _build_one(cast(Templates, fake), "python-classic")  # built: left as it is
    assert len(fake.started) == 1
    shipped_spec = fake.started[0]
    old = fake.by_name["python-classic"].builds[0]
    old.spec = dataclasses.replace(shipped_spec, steps=shipped_spec.steps[:1])
    await _build_one(cast(Templates, fake), "python-classic")  # an older definition's build
    assert fake.started == [shipped_spec, shipped_spec]


class FakeBackend:
    name = "docker"
    languages = Languages([BUILTIN_PYTHON])


def test_python311_is_a_base_in_our_api_and_e2bs(tmp_path: Path) -> None:
    settings = Settings(runtime_dir=tmp_path)
    service = Templates(settings, cast(Backend, FakeBackend()), RuntimeDir(tmp_path), None)  # type: ignore[arg-type]
    for base in ("image:python3.11", "image:python:3.11"):  # ours, E2B's from_python_image
        assert service.base_image(base, ADMIN) == "kernel-gateway-kernel-py311:latest"
    assert service.base_image("image:e2bdev/base", ADMIN) == settings.image
    with pytest.raises(InvalidRequest, match="`python3.11`"):
        service.base_image("image:python:3.12", ADMIN)


def test_a_templates_kernels_report_their_images_python_version(tmp_path: Path) -> None:
    settings = Settings(runtime_dir=tmp_path)
    service = Templates(settings, cast(Backend, FakeBackend()), RuntimeDir(tmp_path), None)  # type: ignore[arg-type]
    build = Build.new()
    build.image, build.language = "sha256:built", "python"
    build.spec = BuildSpec("image:python3.11")
    # Recorded before builds kept a version (an older gateway's): its base's.
    assert service.language_of(build).version == "3.11"
    build.language_version = "3.11.2"  # what the built image's kernelspec says
    assert service.language_of(build).version == "3.11.2"
    build.spec, build.language_version = BuildSpec("python"), None
    assert service.language_of(build).version == BUILTIN_PYTHON.version
