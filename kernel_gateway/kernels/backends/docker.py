"""Kernels in Docker containers: one container per kernel, no network, no ports.

The gateway reaches each kernel over ZMQ ipc sockets in a bind-mounted folder,
so nothing is published and the container needs no network at all. Deaths
(exit, kill from outside, out of memory) are learnt from one Docker events
stream rather than by polling each container. The Docker SDK is synchronous:
every call runs on this backend's own thread pool, never on the event loop.

The backend, here, owns the client, the thread pool and its kernels; the rest is beside it:
    docker_kernel.py     one kernel in its container (`KernelProcess`)
    docker_container.py  a container as created: connection folder, mounts, limits
    docker_events.py     deaths, from the events stream
    docker_adoption.py   orphans removed at startup, a predecessor's kernels adopted
    docker_languages.py  the languages the kernel images declare
    docker_exec.py       commands beside a kernel (`docker exec`)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import subprocess
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors

from kernel_gateway.errors import BackendUnavailable, KernelUnavailable
from kernel_gateway.kernels.backends import docker_adoption
from kernel_gateway.kernels.backends.base import (
    Backend,
    ForkServerHost,
    KernelProcess,
    ipc_connection,
    to_the_end,
)
from kernel_gateway.kernels.backends.docker_container import (
    CONTAINER_UID,
    HOME_TMPFS_SIZE,
    container_options,
    make_conn_dir,
    make_fork_server_dir,
)
from kernel_gateway.kernels.backends.docker_events import DeathWatcher
from kernel_gateway.kernels.backends.docker_images import DockerImages
from kernel_gateway.kernels.backends.docker_kernel import DockerKernel
from kernel_gateway.kernels.backends.docker_languages import find_languages, kernelspecs_of
from kernel_gateway.kernels.backends.labels import LABEL_INSTANCE, container_labels
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, Language
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.storage import (
    PlainStorage,
    SessionStorage,
    StorageProvider,
    carry,
    choose_provider,
    share,
    uncarry,
)
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet
from kernel_gateway.types import JSON

logger = logging.getLogger(__name__)
T = TypeVar("T")


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, settings: Settings, runtime: RuntimeDir) -> None:
        self._settings = settings
        self._runtime = runtime
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="docker")
        self._client: docker.DockerClient | None = None
        self._kernels: dict[str, DockerKernel] = {}
        """By container name: what the events stream reports deaths to."""
        self._background = TaskSet()
        self._images = DockerImages(self, settings, runtime)
        self._watcher: DeathWatcher | None = None
        # Chosen in start(): a capped disk per session when it works here.
        self._storage: StorageProvider = PlainStorage(settings.workspace_size_bytes)
        if os.getuid() == 0:
            self._user = f"{CONTAINER_UID}:{CONTAINER_UID}"
            self._owner: tuple[int, int] | None = (CONTAINER_UID, CONTAINER_UID)
        else:
            # Run as the gateway's own (non-root) user so both sides can use the sockets.
            self._user = f"{os.getuid()}:{os.getgid()}"
            self._owner = None

    @property
    def isolation(self) -> str:
        s = self._settings
        network = "no network" if s.network == "none" else f"network {s.network!r}"
        runtime = f"runtime {s.runtime}" if s.runtime else "runtime runc (shares the host kernel)"
        return (
            f"docker containers from {s.image}, {runtime}: {network}, user {self._user}, all "
            "capabilities "
            f"dropped, no-new-privileges, read-only root, memory {s.memory_limit} (no swap), "
            f"{s.cpu_limit} CPU, {s.pids_limit} pids; storage: " + self._storage_description
        )

    @property
    def _storage_description(self) -> str:
        size = self._settings.workspace_size
        if self._storage.capped:
            return (
                f"/home/user, /tmp and home on the session's own ext4 disk, capped at {size} "
                "in all (disk, not memory)"
            )
        return (
            "/home/user a plain folder on the host's disk (UNCAPPED); /tmp and home tmpfs "
            f"capped at {size} and {HOME_TMPFS_SIZE} (they count as memory)"
        )

    @property
    def workspace_owner(self) -> tuple[int, int] | None:
        return self._owner

    @property
    def images(self) -> DockerImages:
        return self._images

    async def prepare_storage(self, root: Path) -> SessionStorage:
        """Make `root` the session's storage with the provider chosen at startup."""
        return await to_the_end(self.call(self._storage.prepare, root, self._owner))

    @property
    def volumes(self) -> str | None:
        return None  # bind mounts, under runc and gVisor alike

    @property
    def disks_capped(self) -> bool:
        return self._storage.capped

    @property
    def can_carry(self) -> bool:
        """On its own disks under runc: each a shared mount, bound into the kernel's container
        so that mounts made below it reach the container. gVisor serves binds through its
        gofer, which does not see them: kernels there are started on a session's disk."""
        return self._storage.capped and self._settings.runtime in (None, "", "runc")

    async def carry(self, carrier: SessionStorage, storage: SessionStorage) -> dict[str, int]:
        try:
            await to_the_end(self.call(carry, carrier, storage))
            return {
                inside: (await asyncio.to_thread(os.stat, host)).st_dev
                for inside, host in (
                    ("/home/user", storage.files),
                    ("/tmp", storage.tmp),
                    ("/home/sandbox", storage.home),
                )
            }
        except (OSError, subprocess.SubprocessError) as exc:
            raise KernelUnavailable(
                f"could not move a kernel onto the session's disk: {exc}"
            ) from exc

    async def uncarry(self, carrier: SessionStorage) -> None:
        try:
            await asyncio.shield(self.call(uncarry, carrier))
        except Exception:
            logger.exception("unmounting the storage carried at %s failed", carrier.root)

    async def release_storage(self, storage: SessionStorage) -> None:
        try:
            await asyncio.shield(self.call(self._storage.release, storage.root))
        except Exception:
            logger.exception("releasing the storage at %s failed", storage.root)

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def client(self) -> docker.DockerClient:
        assert self._client is not None, "DockerBackend.start() was not awaited"
        return self._client

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._client = await self.call(docker.from_env, timeout=30, max_pool_size=32)
            await self.call(self.client.ping)
        except docker.errors.DockerException as exc:
            raise BackendUnavailable(f"no Docker engine answers: {exc}") from exc
        try:
            await self.call(self.client.api.inspect_image, self._settings.image)
        except docker.errors.ImageNotFound as exc:
            raise BackendUnavailable(
                f"kernel image {self._settings.image} not found; run `kernel-gateway build-image`"
            ) from exc
        # Independent: done at once (each takes a while on a busy host).
        _, self._storage, self.languages = await asyncio.gather(
            docker_adoption.reclaim_orphans(self),
            self.call(choose_provider, self._storage.size, self._runtime.path / "w"),
            find_languages(self._settings, functools.partial(kernelspecs_of, self)),
        )
        # Open the stream before any launch, so no death can be missed.
        self._watcher = DeathWatcher(self.client, self._runtime.instance, self._kernels)
        await self.call(self._watcher.open)
        self._watcher.start(loop)

    async def close(self) -> None:
        await self._stop(remove=True)

    persists = True

    async def detach(self) -> None:
        await self._stop(remove=False)

    async def _stop(self, *, remove: bool) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        await self._background.join()
        if self._client is not None:
            if remove:
                containers = await self.containers()
                await asyncio.gather(
                    *(self.call(self.remove_container, c["Id"]) for c in containers)
                )
            for kernel in list(self._kernels.values()):
                kernel.on_die(-1)
            if self._watcher is not None:
                self._watcher.close()
            await self.call(self.client.close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def containers(self) -> list[dict[str, Any]]:
        """This instance's containers, running or not."""
        filters = {"label": f"{LABEL_INSTANCE}={self._runtime.instance}"}
        result: list[dict[str, Any]] = await self.call(
            self.client.api.containers, all=True, filters=filters
        )
        return result

    async def adopt(self, kernel_ids: Collection[str]) -> dict[str, KernelProcess]:
        """Take over the running containers of `kernel_ids`; remove this instance's others
        (see docker_adoption.py)."""
        return await docker_adoption.adopt(self, kernel_ids, self._background)

    # -- kernels -----------------------------------------------------------------------------

    async def launch(
        self, storage: SessionStorage, language: Language = BUILTIN_PYTHON
    ) -> KernelProcess:
        """Start a kernel container on `storage`; raises only `KernelUnavailable`."""
        try:
            return await self._launch(storage, language=language)
        except (docker.errors.DockerException, OSError, TimeoutError) as exc:
            raise KernelUnavailable(
                f"could not start a kernel container: {exc}", retry_after=5
            ) from exc

    @property
    def fork_servers(self) -> str | None:
        if os.getuid() != 0:
            return (
                "fork servers need a root gateway (each request runs under a uid of its own, "
                "and the gateway must reach its sockets)"
            )
        return None

    @property
    def fork_servers_by_default(self) -> str | None:
        if self._settings.runtime not in (None, "runc"):
            return (
                f"under --runtime {self._settings.runtime} a fork server was seen to end "
                "unexpectedly now and then (it is replaced, but a request can fail): "
                "--stateless-mode fork to use them anyway"
            )
        return self.fork_servers

    async def launch_fork_server(self, storage: SessionStorage, config: JSON) -> ForkServerHost:
        """A container running `zygote.py` as root with only the capabilities it needs to
        give each request a uid of its own and clean up after it (see zygote.py)."""
        try:
            kernel_id, conn_dir = await self.call(
                make_fork_server_dir, self._runtime, self._settings, config
            )
            process = await self._launch(storage, fork_server=(kernel_id, conn_dir))
        except (docker.errors.DockerException, OSError, TimeoutError) as exc:
            raise KernelUnavailable(
                f"could not start a fork-server container: {exc}", retry_after=5
            ) from exc
        return ForkServerHost(process, conn_dir)

    async def _launch(
        self,
        storage: SessionStorage,
        fork_server: tuple[str, Path] | None = None,
        language: Language = BUILTIN_PYTHON,
    ) -> KernelProcess:
        if fork_server is None:
            kernel_id, conn_dir, info = await self.call(
                make_conn_dir, self._runtime, self._settings, language, self._owner
            )
        else:
            kernel_id, conn_dir = fork_server
            info = ipc_connection(str(conn_dir / "unused"))
        name = f"kg-{self._runtime.instance}-{kernel_id}"
        kernel = DockerKernel(self, kernel_id, name, conn_dir, info, language.name)
        self.register(kernel)  # before create: a death event may come at once
        # Binds of a session's disk receive mounts made below it (see `carry`).
        shared = self.can_carry and not fork_server
        try:
            if shared:
                try:
                    await self.call(share, storage.root)
                except (OSError, subprocess.SubprocessError) as exc:
                    raise KernelUnavailable(f"the session's disk cannot be shared: {exc}") from exc
            options = container_options(
                self.client.api,
                self._settings,
                conn_dir=conn_dir,
                storage=storage,
                on_disk=self._storage.capped,
                shared=shared,
                user=self._user,
                language=language,
                fork_server=fork_server is not None,
            )
            labels = container_labels(
                self._runtime, "fork-server" if fork_server else "kernel", language.name
            )
            await self.call(self._create_and_start, name=name, labels=labels, **options)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(kernel.cleanup())
            raise
        return kernel

    @property
    def user(self) -> str:
        """uid:gid the kernels run as."""
        return self._user

    @property
    def owner(self) -> tuple[int, int] | None:
        """uid, gid given to what the gateway writes for containers (None: keep ours)."""
        return self._owner

    @property
    def runtime(self) -> RuntimeDir:
        return self._runtime

    def register(self, kernel: DockerKernel) -> None:
        """Watch `kernel`'s container for its death (a launched kernel, or an adopted one)."""
        self._kernels[kernel.name] = kernel

    def forget(self, kernel: DockerKernel) -> None:
        self._kernels.pop(kernel.name, None)

    # -- runs on the thread pool -------------------------------------------------------------

    def exec_detached(self, name: str, argv: list[str]) -> None:
        """Start `argv` in container `name` as the kernels' user, not waiting for it."""
        created = self.client.api.exec_create(name, argv, user=self._user)
        self.client.api.exec_start(created["Id"], detach=True)

    def _create_and_start(self, **kwargs: Any) -> None:
        container = self.client.api.create_container(**kwargs)
        self.client.api.start(container["Id"])

    def signal_container(self, name: str, signum: int) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.api.kill(name, signal=int(signum))

    def container_log(self, ref: str, lines: int = 20) -> str:
        """The last lines a container wrote (for the log when a fork server is lost)."""
        try:
            data = self.client.api.logs(ref, tail=lines)
        except docker.errors.DockerException as exc:
            return f"(no log: {exc})"
        return bytes(data).decode("utf-8", "replace")

    def remove_container(self, ref: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            try:
                self.client.api.remove_container(ref, force=True, v=True)
            except docker.errors.APIError as exc:
                if "already in progress" not in str(exc):
                    raise
