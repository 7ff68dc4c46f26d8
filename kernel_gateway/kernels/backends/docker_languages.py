"""The languages a docker gateway serves: Python, and those its kernel images declare.

An image declares its languages as kernelspecs under `/opt/kernel/kernelspecs` (see
kernels/languages.py), read at startup from a container created for it ("probe"), never
started, and removed. Which of them are served then follows the settings: `--languages`,
`--language-images`, and a network namespace shared with others (Python only there).
"""

from __future__ import annotations

import asyncio
import logging
import tarfile
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import docker.errors

from kernel_gateway.errors import BackendUnavailable
from kernel_gateway.kernels.backends.labels import container_labels
from kernel_gateway.kernels.languages import (
    BUILTIN_PYTHON,
    FAMILIES,
    KERNELSPECS,
    PYTHON,
    Language,
    Languages,
    family_image,
    family_of,
    parse_kernelspecs,
)
from kernel_gateway.settings import Settings

if TYPE_CHECKING:
    from kernel_gateway.kernels.backends.docker import DockerBackend

logger = logging.getLogger(__name__)

MAX_KERNELSPECS_BYTES = 4 * 2**20  # an image's /opt/kernel/kernelspecs, read at startup

KernelspecsOf = Callable[[str], Awaitable[list[Language] | None]]
"""An image's languages (None: no such image)."""


async def find_languages(settings: Settings, kernelspecs_of: KernelspecsOf) -> Languages:
    """Python, and the languages the language images hold (see kernels/languages.py)."""
    s = settings
    images = [family_image(s.image, family) for family in FAMILIES]
    images += s.language_image_list  # last: they win
    found: dict[str, Language] = {PYTHON: BUILTIN_PYTHON}
    python = await kernelspecs_of(s.image)
    for language in python or []:
        if language.name == PYTHON:
            found[PYTHON] = language
    for image, specs in zip(
        images,
        await asyncio.gather(*(kernelspecs_of(i) for i in images)),
        strict=True,
    ):
        if specs is None and image in s.language_image_list:
            raise BackendUnavailable(f"--language-images: image {image} not found")
        for language in specs or []:
            if language.name != PYTHON:
                found[language.name] = language
    if s.network == "host" or s.network.startswith("container:"):
        # Other languages' kernels listen on the container's loopback (see bridge.py):
        # in the host's (or another container's) network namespace anyone there
        # could reach them. Python's uses ipc sockets only.
        others = sorted(set(found) - {PYTHON})
        if others and s.language_list is None:
            logger.warning(
                "--network %s: serving Python only (%s would listen on a loopback "
                "shared with others)",
                s.network,
                ", ".join(others),
            )
        elif set(s.language_list or ()) - {PYTHON}:
            raise BackendUnavailable(
                f"--network {s.network} shares a loopback with others, where the "
                "kernels of languages other than Python listen: use another network, "
                "or --languages python"
            )
        found = {PYTHON: found[PYTHON]}
    for name in sorted(set(s.language_pool_sizes) - set(found)):
        logger.warning("--language-pool names %s, which this gateway does not serve", name)
    wanted = s.language_list
    if wanted is not None:
        missing = [name for name in wanted if name not in found]
        if missing:
            buildable = [name for name in missing if family_of(name) is not None]
            how = (
                f"build it (kernel-gateway build-image --languages {','.join(buildable)})"
                " or name an image with its kernelspec in --language-images"
                if buildable
                else "name an image with its kernelspec in --language-images"
            )
            raise BackendUnavailable(
                f"--languages asks for {', '.join(missing)}, which no kernel image "
                f"provides: {how} (see docs/languages.md)"
            )
        found = {name: found[name] for name in wanted}
    return Languages(found.values())


async def kernelspecs_of(backend: DockerBackend, image: str) -> list[Language] | None:
    """`read_kernelspecs`, where an image that cannot be read costs only its own
    languages (logged), not the gateway's start; a missing image is None."""
    try:
        return await backend.call(read_kernelspecs, backend, image)
    except (docker.errors.DockerException, OSError, ValueError, tarfile.TarError) as exc:
        logger.warning("could not read the kernelspecs of image %s: %s", image, exc)
        return []


def read_kernelspecs(backend: DockerBackend, image: str) -> list[Language] | None:
    """The languages `image` declares (None: no such image), without running it."""
    api = backend.client.api
    try:
        api.inspect_image(image)  # type: ignore[no-untyped-call]
    except docker.errors.ImageNotFound:
        return None
    container = api.create_container(
        image,
        command=["true"],
        network_disabled=True,
        labels=container_labels(backend.runtime, "probe"),
    )
    try:
        stream, _ = api.get_archive(container["Id"], KERNELSPECS)
        data = bytearray()
        for chunk in stream:
            data += chunk
            if len(data) > MAX_KERNELSPECS_BYTES:
                raise ValueError(f"{KERNELSPECS} is over {MAX_KERNELSPECS_BYTES // 2**20} MiB")
        return parse_kernelspecs(bytes(data), image)
    except docker.errors.NotFound:
        return []
    finally:
        backend.remove_container(container["Id"])
