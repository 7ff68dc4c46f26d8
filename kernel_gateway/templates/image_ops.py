"""What a template's build asks of its images once made: the language version an image
declares, and the removal of a deleted template's image."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kernel_gateway.kernels.images import ImageBuilder, StepFailed
from kernel_gateway.kernels.languages import KERNELSPECS

logger = logging.getLogger(__name__)

VERSION_BYTES = 256
"""Most of a kernelspec's `version` file read (the first line is the version)."""
REMOVE_TRIES = 20


async def version_in(images: ImageBuilder, image: str, language: str) -> str | None:
    """The version of `language` that `image` declares beside its kernelspec
    (`/opt/kernel/kernelspecs/<language>/version`, see kernels/languages.py), if any."""
    try:
        data = await images.read_file(image, f"{KERNELSPECS}/{language}/version", VERSION_BYTES)
    except StepFailed:
        return None
    return (data or b"").decode("utf-8", "replace").strip()[:64] or None


async def remove_image(images: ImageBuilder, ref: str) -> None:
    """Remove a deleted template's image; a kernel of it that is still being removed (a
    stateless one, a pool's last) holds it a moment: try again for a few seconds."""
    for _ in range(REMOVE_TRIES):
        if await images.remove(ref):
            return
        with contextlib.suppress(StepFailed):
            if await images.inspect(ref) is None:
                return
        await asyncio.sleep(0.5)
    logger.warning(
        "the image %s of a deleted template is still in use; the next start removes it", ref
    )
