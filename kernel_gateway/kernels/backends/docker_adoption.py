"""What earlier gateways left behind: orphans removed, a predecessor's kernels adopted.

Every container carries its gateway's labels (`labels.py`): its instance, its host and the
path of its instance lock. At startup, the containers of gateways on this host that are
gone (their lock free) and left no sessions for a successor are removed, with their
instances' folders. A successor of the same instance (`--persist-sessions`) adopts the
kernels its sessions name and removes the rest of that instance's containers.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.errors

from kernel_gateway.kernels.backends.base import KernelProcess
from kernel_gateway.kernels.backends.docker_container import read_connection
from kernel_gateway.kernels.backends.docker_kernel import DockerKernel
from kernel_gateway.kernels.backends.labels import (
    LABEL_HOST,
    LABEL_INSTANCE,
    LABEL_LANGUAGE,
    LABEL_LOCK,
    LABEL_MANAGED,
    LABEL_ROLE,
    LABEL_VIEW,
)
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.kernels.runtime_dir import RuntimeDir, owner_gone
from kernel_gateway.tasks import TaskSet

if TYPE_CHECKING:
    from kernel_gateway.kernels.backends.docker import DockerBackend

logger = logging.getLogger(__name__)


async def reclaim_orphans(backend: DockerBackend) -> None:
    """Remove containers left by gateways on this host that are no longer running."""
    runtime = backend.runtime
    containers = await backend.call(
        backend.client.api.containers, all=True, filters={"label": LABEL_MANAGED}
    )

    def judged() -> list[str]:  # file system calls (locks): on a thread
        return [
            c["Id"]
            for c in containers
            if c["Labels"].get(LABEL_HOST) == runtime.hostname
            and c["Labels"].get(LABEL_INSTANCE) != runtime.instance
            and LABEL_LOCK in c["Labels"]
            and owner_gone(Path(c["Labels"][LABEL_LOCK]), c["Labels"].get(LABEL_VIEW), runtime.view)
        ]

    stale = await asyncio.to_thread(judged)
    await asyncio.gather(*(backend.call(backend.remove_container, cid) for cid in stale))
    if stale:
        logger.info("removed %d orphaned kernel containers", len(stale))
    for instance in await backend.call(runtime.orphaned_instances):
        # Its session disks too: unmounted, loop devices detached, images deleted.
        await backend.call(runtime.remove_instance, instance)


async def adopt(
    backend: DockerBackend, kernel_ids: Collection[str], background: TaskSet
) -> dict[str, KernelProcess]:
    """Take over the running containers of `kernel_ids`; remove this instance's others
    (on `background`: while the gateway serves, as stopping a container can take a while).

    A kernel is adopted only with its container running and its connection files in
    place. Each is registered before it is checked again, so a death in between is
    seen either by the check or by the events stream (open since `start`).
    """
    runtime = backend.runtime
    wanted = set(kernel_ids)
    prefix = f"kg-{runtime.instance}-"
    adopted: dict[str, DockerKernel] = {}
    unwanted: list[str] = []
    for container in await backend.containers():
        if (container.get("Labels") or {}).get(LABEL_ROLE) == "egress":
            continue  # the egress proxy this gateway has just started (kernels/egress/)
        name = container["Names"][0].lstrip("/") if container.get("Names") else ""
        kernel_id = name.removeprefix(prefix)
        conn_dir = runtime.path / "k" / kernel_id
        info = None
        if name.startswith(prefix) and kernel_id in wanted and container["State"] == "running":
            info = await backend.call(read_connection, conn_dir)
        if info is None:
            unwanted.append(container["Id"])
            continue
        language = container.get("Labels", {}).get(LABEL_LANGUAGE, PYTHON)
        kernel = DockerKernel(backend, kernel_id, name, conn_dir, info, language)
        backend.register(kernel)
        adopted[kernel_id] = kernel
    background.spawn(_remove_containers(backend, unwanted))
    # Listed again now that all are registered: one that died in between is seen here.
    running = {
        c["Names"][0].lstrip("/")
        for c in await backend.containers()
        if c.get("Names") and c["State"] == "running"
    }
    for kernel in adopted.values():
        if kernel.name not in running:
            kernel.on_die(await backend.call(_exit_code, backend.client, kernel.name))
    keep = {k.id for k in adopted.values()}
    await backend.call(_remove_conn_dirs_but, runtime, keep)
    if unwanted:
        logger.info("removed %d kernel containers no session claimed", len(unwanted))
    return dict(adopted)


async def _remove_containers(backend: DockerBackend, ids: list[str]) -> None:
    results = await asyncio.gather(
        *(backend.call(backend.remove_container, c) for c in ids), return_exceptions=True
    )
    for failure in (r for r in results if isinstance(r, BaseException)):
        logger.warning("could not remove an unclaimed kernel container: %s", failure)


def _exit_code(client: docker.DockerClient, name: str) -> int:
    try:
        return int(client.api.inspect_container(name)["State"].get("ExitCode", -1))
    except docker.errors.NotFound:
        return -1


def _remove_conn_dirs_but(runtime: RuntimeDir, keep: set[str]) -> None:
    for path in (runtime.path / "k").iterdir():
        if path.name not in keep:
            shutil.rmtree(path, ignore_errors=True)
