"""Kernels in Docker containers: one container per kernel, no network, no ports.

The gateway reaches each kernel over ZMQ ipc sockets in a bind-mounted folder,
so nothing is published and the container needs no network at all. Deaths
(exit, kill from outside, out of memory) are learnt from one Docker events
stream rather than by polling each container. The Docker SDK is synchronous:
every call runs on this backend's own thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import docker.types

from ..errors import BackendUnavailable
from ..settings import Settings
from ..types import ConnectionInfo
from .base import (
    Backend,
    ExitInfo,
    KernelProcess,
    RuntimeDir,
    SessionStorage,
    ipc_connection,
    lock_is_held,
    mounts_under,
    write_connection_file,
    write_startup_file,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

LABEL_MANAGED = "io.kernel-gateway.managed"
LABEL_INSTANCE = "io.kernel-gateway.instance"
LABEL_HOST = "io.kernel-gateway.host"
LABEL_LOCK = "io.kernel-gateway.lock"  # the owner's instance lock: held while it lives
CONTAINER_UID = 1000  # the image's `sandbox` user


def _exit_info(code: int, oom: bool) -> ExitInfo:
    if oom:
        return ExitInfo(code, "out_of_memory")
    if code == 128 + signal.SIGKILL:
        return ExitInfo(code, "killed")
    if code > 128:
        return ExitInfo(code, "signal")
    return ExitInfo(code, "exited")


class DockerKernel(KernelProcess):
    def __init__(
        self,
        backend: DockerBackend,
        kernel_id: str,
        name: str,
        conn_dir: Path,
        info: ConnectionInfo,
    ) -> None:
        self.id = kernel_id
        self.name = name
        self.connection = info
        self._backend = backend
        self._conn_dir = conn_dir
        self._exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        self._oom = False
        self._removed = False

    def _on_oom(self) -> None:
        self._oom = True

    def _on_die(self, code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(_exit_info(code, self._oom))

    def poll(self) -> ExitInfo | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> ExitInfo:
        return await asyncio.shield(self._exit)

    async def send_signal(self, signum: int) -> None:
        # Docker delivers it to the init process, which forwards it to the kernel.
        await self._backend.call(self._backend.signal_container, self.name, signum)

    async def kill(self) -> None:
        await self.send_signal(signal.SIGKILL)

    async def cleanup(self) -> None:
        if self._removed:
            return
        await self._backend.call(self._backend.remove_container, self.name)
        self._removed = True
        if not self._exit.done():
            self._exit.set_result(ExitInfo(None, "killed"))
        self._backend.forget(self)
        await asyncio.to_thread(shutil.rmtree, self._conn_dir, True)


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, settings: Settings, runtime: RuntimeDir) -> None:
        self._settings = settings
        self._runtime = runtime
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="docker")
        self._client: docker.DockerClient | None = None
        self._kernels: dict[str, DockerKernel] = {}
        self._events: Any = None
        self._watcher: threading.Thread | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cap_workspaces = os.getuid() == 0
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
            f"{s.cpu_limit} CPU, {s.pids_limit} pids, workspace "
            + (f"tmpfs capped at {s.workspace_size}" if self._cap_workspaces else "uncapped")
        )

    @property
    def workspace_owner(self) -> tuple[int, int] | None:
        return self._owner

    async def prepare_storage(self, root: Path) -> SessionStorage:
        """Give the session its own size-capped tmpfs, so code cannot fill the host's disk.

        Its pages are charged to the container's memory cgroup. Needs root; without
        it the storage stays plain folders (the startup log says so).
        """
        if self._cap_workspaces:
            uid = self._owner[0] if self._owner else os.getuid()
            size = self._settings.workspace_size
            options = f"size={size},mode=0700,uid={uid},gid={uid},nosuid,nodev"
            result = await self.call(
                subprocess.run,
                ["mount", "-t", "tmpfs", "-o", options, "kg-workspace", str(root)],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                self._cap_workspaces = False
                logger.warning(
                    "cannot mount a size-capped tmpfs for workspaces (%s); workspaces are "
                    "plain folders on the host's disk",
                    result.stderr.strip(),
                )
        return await super().prepare_storage(root)

    async def release_storage(self, storage: SessionStorage) -> None:
        if self._cap_workspaces or _is_mountpoint(storage.root):
            await self.call(
                subprocess.run, ["umount", "-l", str(storage.root)], capture_output=True
            )

    @property
    def client(self) -> docker.DockerClient:
        assert self._client is not None, "DockerBackend.start() was not awaited"
        return self._client

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
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
        await self.reclaim_orphans()
        # Open the stream before any launch, so no death can be missed.
        self._events = await self.call(
            self.client.events, decode=True, filters=self._event_filters()
        )
        self._watcher = threading.Thread(target=self._watch, name="docker-events", daemon=True)
        self._watcher.start()

    async def reclaim_orphans(self) -> None:
        """Remove containers left by gateways on this host that are no longer running."""
        containers = await self.call(
            self.client.api.containers, all=True, filters={"label": LABEL_MANAGED}
        )
        stale = [
            c["Id"]
            for c in containers
            if c["Labels"].get(LABEL_HOST) == self._runtime.hostname
            and c["Labels"].get(LABEL_INSTANCE) != self._runtime.instance
            and LABEL_LOCK in c["Labels"]
            and not lock_is_held(Path(c["Labels"][LABEL_LOCK]))
        ]
        await asyncio.gather(*(self.call(self.remove_container, cid) for cid in stale))
        if stale:
            logger.info("removed %d orphaned kernel containers", len(stale))
        for instance in self._runtime.stale_instances():
            for mount in mounts_under(self._runtime.root / instance):
                await self.call(subprocess.run, ["umount", "-l", mount], capture_output=True)
            self._runtime.remove_instance(instance)

    async def close(self) -> None:
        self._closing = True
        if self._client is not None:
            containers = await self.call(
                self.client.api.containers,
                all=True,
                filters={"label": f"{LABEL_INSTANCE}={self._runtime.instance}"},
            )
            await asyncio.gather(*(self.call(self.remove_container, c["Id"]) for c in containers))
            for kernel in list(self._kernels.values()):
                kernel._on_die(-1)
            if self._events is not None:
                with contextlib.suppress(Exception):
                    self._events.close()
            await self.call(self.client.close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- kernels -----------------------------------------------------------------------------

    async def launch(self, storage: SessionStorage) -> KernelProcess:
        s = self._settings
        workspace = storage.files
        kernel_id, conn_dir = self._runtime.new_kernel_dir()
        name = f"kg-{self._runtime.instance}-{kernel_id}"
        info = ipc_connection(str(conn_dir / "k"))
        write_connection_file(conn_dir / "kernel.json", ipc_connection_inside(info))
        write_startup_file(conn_dir, self._settings)
        if self._owner is not None:
            for path in (conn_dir, *conn_dir.iterdir()):
                os.chown(path, *self._owner)
        kernel = DockerKernel(self, kernel_id, name, conn_dir, info)
        self._kernels[name] = kernel  # before create: a death event may come at once
        home_tmpfs = f"rw,nosuid,nodev,size=64m,mode=700,uid={self._uid},gid={self._uid}"
        host_config = self.client.api.create_host_config(
            binds={
                str(conn_dir): {"bind": "/conn", "mode": "rw"},
                str(workspace): {"bind": "/workspace", "mode": "rw"},
            },
            network_mode=s.network,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            init=True,
            read_only=True,
            tmpfs={
                "/tmp": f"rw,nosuid,nodev,size={s.workspace_size},mode=1777",
                "/home/sandbox": home_tmpfs,
            },
            mem_limit=s.memory_limit,
            memswap_limit=s.memory_limit,
            nano_cpus=int(s.cpu_limit * 1e9),
            pids_limit=s.pids_limit,
            ulimits=[docker.types.Ulimit(name="nofile", soft=1024, hard=1024)],
            # ipykernel echoes fd-level output to the container's stdout: keep that bounded.
            log_config=docker.types.LogConfig(
                type="json-file", config={"max-size": "1m", "max-file": "1"}
            ),
        )
        if s.runtime:
            host_config["Runtime"] = s.runtime
        try:
            await self.call(
                self._create_and_start,
                name=name,
                image=s.image,
                user=self._user,
                labels={
                    LABEL_MANAGED: "1",
                    LABEL_INSTANCE: self._runtime.instance,
                    LABEL_HOST: self._runtime.hostname,
                    LABEL_LOCK: str(self._runtime.lock_path),
                },
                host_config=host_config,
                environment={"HOME": "/home/sandbox"},
            )
        except BaseException as exc:
            await asyncio.shield(kernel.cleanup())
            if isinstance(exc, Exception):
                raise BackendUnavailable(f"could not start a kernel container: {exc}") from exc
            raise
        return kernel

    @property
    def _uid(self) -> str:
        return self._user.split(":")[0]

    def forget(self, kernel: DockerKernel) -> None:
        self._kernels.pop(kernel.name, None)

    # -- runs on the thread pool -------------------------------------------------------------

    def _create_and_start(self, **kwargs: Any) -> None:
        container = self.client.api.create_container(**kwargs)
        self.client.api.start(container["Id"])

    def signal_container(self, name: str, signum: int) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.api.kill(name, signal=int(signum))

    def remove_container(self, ref: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            try:
                self.client.api.remove_container(ref, force=True, v=True)
            except docker.errors.APIError as exc:
                if "already in progress" not in str(exc):
                    raise

    def _watch(self) -> None:
        """Turn the engine's die/oom events into calls on the event loop.

        If the stream breaks (engine restart, socket error) it is reopened with
        `since` set to the last event seen, so the engine replays what was missed.
        """
        assert self._loop is not None
        since: int | None = None
        while not self._closing:
            try:
                if self._events is None:
                    self._events = self.client.events(
                        decode=True, since=since, filters=self._event_filters()
                    )
                for event in self._events:
                    since = event.get("time", since)
                    self._dispatch(event)
            except Exception as exc:
                if self._closing:
                    return
                logger.warning("Docker events stream broke (%s); reopening", exc)
            self._events = None
            if not self._closing:
                time.sleep(1.0)

    def _event_filters(self) -> dict[str, Any]:
        return {"type": "container", "label": f"{LABEL_INSTANCE}={self._runtime.instance}"}

    def _dispatch(self, event: dict[str, Any]) -> None:
        assert self._loop is not None
        action = event.get("Action") or event.get("status")
        attrs = event.get("Actor", {}).get("Attributes", {})
        kernel = self._kernels.get(attrs.get("name", ""))
        if kernel is None:
            return
        if action == "oom":
            self._loop.call_soon_threadsafe(kernel._on_oom)
        elif action == "die":
            code = int(attrs.get("exitCode", -1))
            self._loop.call_soon_threadsafe(kernel._on_die, code)


def _is_mountpoint(path: Path) -> bool:
    return str(path) in {p for p in mounts_under(path.parent)}


def ipc_connection_inside(info: ConnectionInfo) -> ConnectionInfo:
    """The same connection as the kernel sees it: the folder is mounted at /conn."""
    inside = info.copy()
    inside["ip"] = "/conn/" + Path(info["ip"]).name
    return inside
