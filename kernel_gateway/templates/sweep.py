"""Template images nothing can use any more, removed when a gateway starts.

A template's image is removed on `DELETE`; it stays behind only when a kernel still ran
from it then (a stateless kernel being removed, a pool's last), or when the templates it
belonged to went with their runtime dir. A named template image carries the labels of its
build container (`kernels/backends/labels.py`): the host, and the instance lock whose
folder is the runtime dir whose records name it. At startup, on the same host:

- a named image of this runtime dir that no template record names is removed (its
  unnamed ones are cached steps, kept for the next build);
- an image of a runtime dir that no longer exists is removed, named or not (its records
  and its builds went with it), if its gateway saw the file system as this one does (a
  gateway in a container cannot see the host's runtime dirs: it judges none of them);
- an image of another runtime dir that exists is left alone: its gateway, running or
  stopped, keeps its templates across restarts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from pathlib import Path

from kernel_gateway.kernels.backends.labels import LABEL_HOST, LABEL_LOCK, LABEL_VIEW
from kernel_gateway.kernels.images import ImageBuilder, ListedImage, StepFailed
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.templates.build import LABEL_TEMPLATE

logger = logging.getLogger(__name__)


def unused(image: ListedImage, runtime: RuntimeDir, named: Collection[str]) -> bool:
    """Whether nothing can use `image`: see the module's rules. `named`: the images this
    runtime dir's template records name."""
    if image.labels.get(LABEL_HOST) != runtime.hostname or LABEL_LOCK not in image.labels:
        return False
    root = Path(image.labels[LABEL_LOCK]).parent
    if root == runtime.root:
        return bool(image.tags) and not any(tag in named for tag in image.tags)
    try:
        gone = not root.exists()
    except OSError:
        return False
    # Gone, if its gateway saw paths as this one does (a gateway in a container does not
    # see the host's runtime dirs, nor the host its).
    return gone and bool(runtime.view) and image.labels.get(LABEL_VIEW) == runtime.view


async def sweep(images: ImageBuilder, runtime: RuntimeDir, named: Collection[str]) -> int:
    """Remove the template images nothing can use: how many went."""
    try:
        found = await images.listed(LABEL_TEMPLATE)
    except StepFailed as exc:
        logger.warning("could not list template images to remove unused ones: %s", exc.message)
        return 0
    stale = await asyncio.to_thread(lambda: [i for i in found if unused(i, runtime, named)])
    removed = 0
    for image in stale:  # the runtime dirs' existence is read on a thread: file system calls
        gone = [await images.remove(ref) for ref in image.tags or (image.id,)]
        removed += any(gone)
    if removed:
        logger.info("removed %d template image(s) that no template names", removed)
    return removed
