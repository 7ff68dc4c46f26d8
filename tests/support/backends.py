"""Which backends the tests may use here: Docker and gVisor found (or required by CI), and
settings for a test gateway on each. The Docker SDK is imported only when asked about, so
the unit tier never loads it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernel_gateway.settings import DEFAULT_IMAGE, Settings

REQUIRE_DOCKER = os.environ.get("KG_REQUIRE_DOCKER") == "1"
REQUIRE_GVISOR = os.environ.get("KG_REQUIRE_GVISOR") == "1"
REQUIRE_LANGUAGES = os.environ.get("KG_REQUIRE_LANGUAGES") == "1"
# Test backend name -> (settings backend, OCI runtime)
BACKENDS: dict[str, tuple[str, str | None]] = {
    "local": ("local", None),
    "docker": ("docker", None),
    "gvisor": ("docker", "runsc"),
}
IMAGE = os.environ.get("KG_TEST_IMAGE", DEFAULT_IMAGE)


def docker_unavailable_reason() -> str | None:
    """Why Docker tests cannot run here, or None when they can."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=10)
        try:
            client.ping()
            client.images.get(IMAGE)
        finally:
            client.close()
    except docker.errors.ImageNotFound:
        return f"kernel image {IMAGE} is missing (run `kernel-gateway build-image`)"
    except docker.errors.DockerException as exc:
        return f"no Docker engine answers ({exc})"
    return None


def require_docker() -> None:
    reason = docker_unavailable_reason()
    if reason is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"KG_REQUIRE_DOCKER=1 but Docker tests cannot run: {reason}")
    pytest.skip(reason)


def require_gvisor() -> None:
    import docker

    require_docker()
    client = docker.from_env(timeout=10)
    try:
        runtimes = client.info().get("Runtimes", {})
    finally:
        client.close()
    if "runsc" in runtimes:
        return
    reason = "gVisor's runsc is not registered with Docker (see .ci/run)"
    if REQUIRE_GVISOR:
        pytest.fail(f"KG_REQUIRE_GVISOR=1 but {reason}")
    pytest.skip(reason)


def require_languages(*languages: str) -> None:
    """Docker, and the language images `build-image` makes for `languages`."""
    import docker
    import docker.errors

    from kernel_gateway.kernels.languages import family_image, family_of

    require_docker()
    client = docker.from_env(timeout=10)
    try:
        missing = []
        for language in languages:
            family = family_of(language)
            image = family_image(IMAGE, family) if family else f"(no image for {language})"
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                missing.append(image)
    finally:
        client.close()
    if not missing:
        return
    reason = f"language images missing: {', '.join(missing)} (run `kernel-gateway build-image`)"
    if REQUIRE_LANGUAGES:
        pytest.fail(f"KG_REQUIRE_LANGUAGES=1 but {reason}")
    pytest.skip(reason)


def require_backend(name: str) -> None:
    if name == "docker":
        require_docker()
    elif name == "gvisor":
        require_gvisor()


def backend_settings(name: str, tmp: Path, **overrides: object) -> Settings:
    backend, runtime = BACKENDS[name]
    if runtime == "runsc":
        # gVisor delivers an interrupt's signal through its sentry: on a loaded 2-core CI
        # machine that took over a second now and then, and the kernel was restarted.
        overrides.setdefault("interrupt_grace", 3.0)
    return settings_for(backend, tmp, runtime=runtime, **overrides)


def settings_for(backend: str, tmp: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "backend": backend,
        "image": IMAGE,
        "pool_size": 1,
        "fork_servers": 1,
        "max_sessions": 8,
        "max_upload_bytes": 1024 * 1024,
        "runtime_dir": tmp,
        "interrupt_grace": 1.0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]
