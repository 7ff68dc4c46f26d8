"""The Python 3.11 kernel image: `build-image --languages python3.11`.

The kernel image's own Dockerfile and lock, built on Debian 12 (bookworm) instead of 13:
bookworm's `python3` is 3.11, the newest Python with wheels for pandas 1.5 and NumPy 1.26
(the classic stack of the shipped `python-classic` template, templates/builtin.py). It is
an image apart (not FROM the kernel image, as the language images are), named after it:
`kernel-gateway-kernel:latest` -> `kernel-gateway-kernel-py311:latest`; templates call it
the base `python3.11`.

The steps are the kernel image's (cli/image.py): the context staged in a folder of its
own, with `requirements-py311.lock` as its lock; the locked wheels fetched on the host for
CPython 3.11 and glibc 2.36; the base made with debootstrap when no registry answers; then
`docker build` with `BASE_IMAGE=debian:bookworm-slim`. The lock is requirements.lock's pins
resolved again for bookworm's Python, 3.11.2 (`make lock-py311`): the same versions, but
where one needs a later 3.11 (soupsieve 4 needs 3.11.5).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from kernel_gateway.cli import image
from kernel_gateway.cli.image import (
    Printer,
    docker_build,
    ensure_base_image,
    folder_name,
    print_line,
    stage_context,
    stage_wheels,
)
from kernel_gateway.templates.builtin import PYTHON311_VERSION, python311_image

if TYPE_CHECKING:
    import docker

BASE = "debian:bookworm-slim"
LOCK = "requirements-py311.lock"


def build_python311_image(
    client: docker.DockerClient,
    python_tag: str,
    context: Path,
    cache_dir: Path,
    out: Printer = print_line,
    *,
    arch: str,
    download: bool = True,
    requirements: Path | None = None,
) -> str:
    """Build `context` (kernel-image/) on Debian bookworm as the Python 3.11 image that goes
    with `python_tag`; its name."""
    started = time.monotonic()
    tag = python311_image(python_tag)
    stage = stage_context(context, cache_dir / folder_name(tag), requirements)
    lock = (stage / LOCK).read_bytes()
    if (stage / image.LOCK).read_bytes() != lock:  # what the Dockerfile installs
        (stage / image.LOCK).write_bytes(lock)
    out(f"{tag}: context staged in {stage}, with {LOCK}")
    stage_wheels(stage, arch, out, download=download)
    ensure_base_image(client, BASE, out)
    docker_build(client, stage, tag, out, {"BASE_IMAGE": BASE})
    size = client.images.get(tag).attrs.get("Size", 0) / 1e6
    elapsed = time.monotonic() - started
    out(f"built {tag} ({size:.0f} MB, Python {PYTHON311_VERSION}) in {elapsed:.1f} s")
    return tag
