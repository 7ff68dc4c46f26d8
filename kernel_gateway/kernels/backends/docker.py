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
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import docker.types

from kernel_gateway.errors import BackendUnavailable, KernelUnavailable
from kernel_gateway.kernels.backends.base import (
    Backend,
    Command,
    ExitInfo,
    ForkServerHost,
    KernelProcess,
    RuntimeDir,
    in_kernel_source,
    ipc_connection,
    lock_is_held,
    persisted,
    to_the_end,
    write_connection_file,
    write_in_kernel_program,
    write_startup_file,
)
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
from kernel_gateway.types import JSON, ConnectionInfo

logger = logging.getLogger(__name__)
T = TypeVar("T")

LABEL_MANAGED = "io.kernel-gateway.managed"
LABEL_INSTANCE = "io.kernel-gateway.instance"
FORWARDER_READY_SECONDS = 10.0  # a kernel's egress forwarder: up and listening by then
LABEL_HOST = "io.kernel-gateway.host"
LABEL_LOCK = "io.kernel-gateway.lock"  # the owner's instance lock: held while it lives
LABEL_ROLE = "io.kernel-gateway.role"  # "kernel", "fork-server" (stateless), "probe" (specs)
LABEL_LANGUAGE = "io.kernel-gateway.language"  # what a kernel container runs
CONTAINER_UID = 1000  # the image's `sandbox` user
FORK_SERVER_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]
"""What a fork server (root in its container, never running user code) keeps: enough to
give each request a uid of its own, and to kill and clean up after it."""
MAX_KERNELSPECS_BYTES = 4 * 2**20  # an image's /opt/kernel/kernelspecs, read at startup
HOME_TMPFS_SIZE = "64m"  # home as a tmpfs, only when sessions have no disk of their own


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
        language: str = PYTHON,
    ) -> None:
        self.id = kernel_id
        self.language = language
        self.name = name
        self.connection = info
        self._backend = backend
        self._conn_dir = conn_dir
        self._exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        self._oom = False
        self._removed = False
        self._egress_fd: int | None = None
        """A descriptor of `/conn/egress/` once a network policy gave the kernel one."""
        self.handover = (conn_dir, "/conn")

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

    async def last_output(self) -> str:
        return await self._backend.call(self._backend.container_log, self.name)

    async def run_command(
        self, argv: list[str], env: dict[str, str], cwd: str | None, stdin: bool
    ) -> Command:
        """`docker exec` in this kernel's container, as its user (see docker_exec.py)."""
        from kernel_gateway.kernels.backends.docker_exec import DockerCommand

        if self._exit.done():
            raise KernelUnavailable("the kernel's container has ended")
        command = DockerCommand(
            self._backend.client, self._backend.call, self.name, self._backend.user
        )
        await command.start(argv, env, cwd, stdin)
        return command

    async def start_egress_forwarder(self, port: int) -> Path:
        """See `KernelProcess`. The socket and the forwarder live in `/conn/egress/`, a
        folder the gateway makes and the kernel cannot write (with a root gateway), reached
        only through a descriptor of it: the kernel's own `/conn` is the kernel's to change
        (symlinks planted there are never followed)."""
        if self._exit.done():
            raise KernelUnavailable("the kernel's container has ended")
        ready = f"egress-ready-{secrets.token_hex(8)}"  # unguessable: not planted in advance
        folder = await asyncio.to_thread(self._egress_folder)
        argv = ["/opt/venv/bin/python", "/conn/egress/egress_forward.py", str(port)]
        try:
            await self._backend.call(
                self._backend.exec_detached,
                self.name,
                [*argv, "/conn/egress/egress.sock", f"/conn/{ready}"],
            )
        except docker.errors.DockerException as exc:
            raise KernelUnavailable(f"could not start the egress forwarder: {exc}") from exc
        deadline = time.monotonic() + FORWARDER_READY_SECONDS
        while not await asyncio.to_thread(os.path.lexists, self._conn_dir / ready):
            if self._exit.done() or time.monotonic() > deadline:
                raise KernelUnavailable("the egress forwarder did not start")
            await asyncio.sleep(0.02)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(os.unlink, self._conn_dir / ready)  # never follows links
        return folder / "egress.sock"

    def _egress_folder(self) -> Path:
        """`/conn/egress/`, checked, with the forwarder in it; its path through this
        process's descriptor of it (`/proc/self/fd/N`), which no later rename can redirect."""
        if self._egress_fd is None:
            path = self._conn_dir / "egress"
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o755)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                raise KernelUnavailable(f"the kernel's egress folder is not usable: {exc}") from exc
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o022:
                os.close(fd)
                raise KernelUnavailable("the kernel's egress folder is not the gateway's own")
            self._egress_fd = fd
        fd = self._egress_fd
        with contextlib.suppress(FileNotFoundError):
            os.unlink("egress_forward.py", dir_fd=fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open("egress_forward.py", flags, 0o644, dir_fd=fd)
        with os.fdopen(out, "wb") as f:
            f.write(in_kernel_source("egress_forward.py"))
        return Path(f"/proc/self/fd/{fd}")

    async def cleanup(self) -> None:
        if self._removed:
            return
        await self._backend.call(self._backend.remove_container, self.name)
        self._removed = True
        if not self._exit.done():
            self._exit.set_result(ExitInfo(None, "killed"))
        self._backend.forget(self)
        if self._egress_fd is not None:
            os.close(self._egress_fd)
            self._egress_fd = None
        await asyncio.to_thread(shutil.rmtree, self._conn_dir, True)


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, settings: Settings, runtime: RuntimeDir) -> None:
        self._settings = settings
        self._runtime = runtime
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="docker")
        self._client: docker.DockerClient | None = None
        self._kernels: dict[str, DockerKernel] = {}
        self._background = TaskSet()
        self._events: Any = None
        self._watcher: threading.Thread | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
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
                f"/workspace, /tmp and home on the session's own ext4 disk, capped at {size} "
                "in all (disk, not memory)"
            )
        return (
            "/workspace a plain folder on the host's disk (UNCAPPED); /tmp and home tmpfs "
            f"capped at {size} and {HOME_TMPFS_SIZE} (they count as memory)"
        )

    @property
    def workspace_owner(self) -> tuple[int, int] | None:
        return self._owner

    async def prepare_storage(self, root: Path) -> SessionStorage:
        """Make `root` the session's storage with the provider chosen at startup."""
        return await to_the_end(self.call(self._storage.prepare, root, self._owner))

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
                    ("/workspace", storage.files),
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
        # Independent: done at once (each takes a while on a busy host).
        _, self._storage, self.languages = await asyncio.gather(
            self.reclaim_orphans(),
            self.call(choose_provider, self._storage.size, self._runtime.path / "w"),
            self._find_languages(),
        )
        # Open the stream before any launch, so no death can be missed.
        self._events = await self.call(
            self.client.events, decode=True, filters=self._event_filters()
        )
        self._watcher = threading.Thread(target=self._watch, name="docker-events", daemon=True)
        self._watcher.start()

    async def _find_languages(self) -> Languages:
        """Python, and the languages the language images hold (see kernels/languages.py)."""
        s = self._settings
        images = [family_image(s.image, family) for family in FAMILIES]
        images += s.language_image_list  # last: they win
        found: dict[str, Language] = {PYTHON: BUILTIN_PYTHON}
        python = await self._kernelspecs_of(s.image)
        for language in python or []:
            if language.name == PYTHON:
                found[PYTHON] = language
        for image, specs in zip(
            images,
            await asyncio.gather(*(self._kernelspecs_of(i) for i in images)),
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

    async def _kernelspecs_of(self, image: str) -> list[Language] | None:
        """`_read_kernelspecs`, where an image that cannot be read costs only its own
        languages (logged), not the gateway's start; a missing image is None."""
        try:
            return await self.call(self._read_kernelspecs, image)
        except (docker.errors.DockerException, OSError, ValueError, tarfile.TarError) as exc:
            logger.warning("could not read the kernelspecs of image %s: %s", image, exc)
            return []

    def _read_kernelspecs(self, image: str) -> list[Language] | None:
        """The languages `image` declares (None: no such image), without running it."""
        try:
            self.client.api.inspect_image(image)  # type: ignore[no-untyped-call]
        except docker.errors.ImageNotFound:
            return None
        container = self.client.api.create_container(
            image,
            command=["true"],
            network_disabled=True,
            labels={
                LABEL_MANAGED: "1",
                LABEL_INSTANCE: self._runtime.instance,
                LABEL_HOST: self._runtime.hostname,
                LABEL_LOCK: str(self._runtime.lock_path),
                LABEL_ROLE: "probe",
            },
        )
        try:
            stream, _ = self.client.api.get_archive(container["Id"], KERNELSPECS)
            data = bytearray()
            for chunk in stream:
                data += chunk
                if len(data) > MAX_KERNELSPECS_BYTES:
                    raise ValueError(f"{KERNELSPECS} is over {MAX_KERNELSPECS_BYTES // 2**20} MiB")
            return parse_kernelspecs(bytes(data), image)
        except docker.errors.NotFound:
            return []
        finally:
            self.remove_container(container["Id"])

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
            and not persisted(Path(c["Labels"][LABEL_LOCK]))
        ]
        await asyncio.gather(*(self.call(self.remove_container, cid) for cid in stale))
        if stale:
            logger.info("removed %d orphaned kernel containers", len(stale))
        for instance in await self.call(self._runtime.orphaned_instances):
            # Its session disks too: unmounted, loop devices detached, images deleted.
            await self.call(self._runtime.remove_instance, instance)

    async def close(self) -> None:
        await self._stop(remove=True)

    persists = True

    async def detach(self) -> None:
        await self._stop(remove=False)

    async def _stop(self, *, remove: bool) -> None:
        self._closing = True
        await self._background.join()
        if self._client is not None:
            if remove:
                containers = await self._containers()
                await asyncio.gather(
                    *(self.call(self.remove_container, c["Id"]) for c in containers)
                )
            for kernel in list(self._kernels.values()):
                kernel._on_die(-1)
            if self._events is not None:
                with contextlib.suppress(Exception):
                    self._events.close()
            await self.call(self.client.close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _containers(self) -> list[dict[str, Any]]:
        """This instance's containers, running or not."""
        filters = {"label": f"{LABEL_INSTANCE}={self._runtime.instance}"}
        result: list[dict[str, Any]] = await self.call(
            self.client.api.containers, all=True, filters=filters
        )
        return result

    async def adopt(self, kernel_ids: Collection[str]) -> dict[str, KernelProcess]:
        """Take over the running containers of `kernel_ids`; remove this instance's others.

        A kernel is adopted only with its container running and its connection files in
        place. Each is registered before it is checked again, so a death in between is
        seen either by the check or by the events stream (open since `start`).
        """
        wanted = set(kernel_ids)
        prefix = f"kg-{self._runtime.instance}-"
        adopted: dict[str, DockerKernel] = {}
        unwanted: list[str] = []
        for container in await self._containers():
            if (container.get("Labels") or {}).get(LABEL_ROLE) == "egress":
                continue  # the egress proxy this gateway has just started (kernels/egress/)
            name = container["Names"][0].lstrip("/") if container.get("Names") else ""
            kernel_id = name.removeprefix(prefix)
            conn_dir = self._runtime.path / "k" / kernel_id
            info = None
            if name.startswith(prefix) and kernel_id in wanted and container["State"] == "running":
                info = await self.call(_read_connection, conn_dir)
            if info is None:
                unwanted.append(container["Id"])
                continue
            language = container.get("Labels", {}).get(LABEL_LANGUAGE, PYTHON)
            kernel = DockerKernel(self, kernel_id, name, conn_dir, info, language)
            self._kernels[name] = kernel
            adopted[kernel_id] = kernel
        # Removed while the gateway serves (stopping a container can take a while).
        self._background.spawn(self._remove_containers(unwanted))
        # Listed again now that all are registered: one that died in between is seen here.
        running = {
            c["Names"][0].lstrip("/")
            for c in await self._containers()
            if c.get("Names") and c["State"] == "running"
        }
        for kernel in adopted.values():
            if kernel.name not in running:
                kernel._on_die(await self.call(self._exit_code, kernel.name))
        keep = {k.id for k in adopted.values()}
        await self.call(self._remove_conn_dirs_but, keep)
        if unwanted:
            logger.info("removed %d kernel containers no session claimed", len(unwanted))
        return dict(adopted)

    async def _remove_containers(self, ids: list[str]) -> None:
        results = await asyncio.gather(
            *(self.call(self.remove_container, c) for c in ids), return_exceptions=True
        )
        for failure in (r for r in results if isinstance(r, BaseException)):
            logger.warning("could not remove an unclaimed kernel container: %s", failure)

    def _exit_code(self, name: str) -> int:
        try:
            return int(self.client.api.inspect_container(name)["State"].get("ExitCode", -1))
        except docker.errors.NotFound:
            return -1

    def _remove_conn_dirs_but(self, keep: set[str]) -> None:
        for path in (self._runtime.path / "k").iterdir():
            if path.name not in keep:
                shutil.rmtree(path, ignore_errors=True)

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
            kernel_id, conn_dir = await self.call(self._make_fork_server_dir, config)
            process = await self._launch(storage, fork_server=(kernel_id, conn_dir))
        except (docker.errors.DockerException, OSError, TimeoutError) as exc:
            raise KernelUnavailable(
                f"could not start a fork-server container: {exc}", retry_after=5
            ) from exc
        return ForkServerHost(process, conn_dir)

    def _make_fork_server_dir(self, config: JSON) -> tuple[str, Path]:
        kernel_id, conn_dir = self._runtime.new_kernel_dir()
        try:
            conn_dir.chmod(0o755)  # request uids traverse it to reach their own r<N>/
            write_in_kernel_program(conn_dir, "zygote")  # zygote.py and the modules it imports
            write_startup_file(conn_dir, self._settings, offline=self._settings.network == "none")
            (conn_dir / "zygote.json").write_text(json.dumps(config))
        except BaseException:
            shutil.rmtree(conn_dir, ignore_errors=True)
            raise
        return kernel_id, conn_dir

    async def _launch(
        self,
        storage: SessionStorage,
        fork_server: tuple[str, Path] | None = None,
        language: Language = BUILTIN_PYTHON,
    ) -> KernelProcess:
        s = self._settings
        if fork_server is None:
            kernel_id, conn_dir, info = await self.call(self._make_conn_dir, language)
        else:
            kernel_id, conn_dir = fork_server
            info = ipc_connection(str(conn_dir / "unused"))
        name = f"kg-{self._runtime.instance}-{kernel_id}"
        kernel = DockerKernel(self, kernel_id, name, conn_dir, info, language.name)
        self._kernels[name] = kernel  # before create: a death event may come at once
        # Binds of a session's disk receive mounts made below it (see `carry`).
        disk = "rw,rslave" if self.can_carry and not fork_server else "rw"
        binds: dict[str, Mapping[str, str]] = {
            str(conn_dir): {"bind": "/conn", "mode": "rw"},
            str(storage.files): {"bind": "/workspace", "mode": disk},
        }
        tmpfs: dict[str, str] = {}
        owner = "uid=0,gid=0" if fork_server else f"uid={self._uid},gid={self._uid}"
        if self._storage.capped:  # one disk, one cap: files, /tmp and home
            binds[str(storage.tmp)] = {"bind": "/tmp", "mode": disk}
            binds[str(storage.home)] = {"bind": "/home/sandbox", "mode": disk}
        else:  # no disk of its own: keep /tmp and home off the host's disk, as memory
            tmpfs = {
                "/tmp": f"rw,nosuid,nodev,size={s.workspace_size},mode=1777",
                "/home/sandbox": f"rw,nosuid,nodev,size={HOME_TMPFS_SIZE},mode=700,{owner}",
            }
        extra: dict[str, Any] = {}
        if not language.builtin:  # any kernelspec, behind the bridge (in_kernel/bridge.py)
            extra = {
                "command": [
                    "/opt/venv/bin/python",
                    "/conn/bridge.py",
                    "/conn/kernel.json",
                    str(language.kernelspec),
                ]
            }
        if fork_server:
            extra = {
                "user": "0:0",
                "command": ["/opt/venv/bin/python", "/conn/zygote.py", "/conn/zygote.json"],
            }
        try:
            if disk != "rw":
                try:
                    await self.call(share, storage.root)
                except (OSError, subprocess.SubprocessError) as exc:
                    raise KernelUnavailable(f"the session's disk cannot be shared: {exc}") from exc
            host_config = self.client.api.create_host_config(
                binds=binds,
                network_mode=s.network,
                cap_drop=["ALL"],
                cap_add=FORK_SERVER_CAPABILITIES if fork_server else None,
                security_opt=["no-new-privileges:true"],
                # A fork server is init itself: it reaps every process (see zygote.py);
                # under gVisor, Docker's init beside it ended the container now and then.
                init=not fork_server,
                read_only=True,
                tmpfs=tmpfs,
                mem_limit=s.memory_limit_bytes,
                memswap_limit=s.memory_limit_bytes,
                nano_cpus=int(s.cpu_limit * 1e9),
                pids_limit=s.pids_limit,
                ulimits=[docker.types.Ulimit(name="nofile", soft=1024, hard=1024)],
                # ipykernel echoes fd-level output to the container's stdout: keep it bounded.
                log_config=docker.types.LogConfig(
                    type="json-file", config={"max-size": "1m", "max-file": "1"}
                ),
            )
            if s.runtime:
                host_config["Runtime"] = s.runtime
            await self.call(
                self._create_and_start,
                name=name,
                image=language.image or s.image,
                **({"user": self._user} | extra),
                labels={
                    LABEL_MANAGED: "1",
                    LABEL_INSTANCE: self._runtime.instance,
                    LABEL_HOST: self._runtime.hostname,
                    LABEL_LOCK: str(self._runtime.lock_path),
                    LABEL_ROLE: "fork-server" if fork_server else "kernel",
                    LABEL_LANGUAGE: language.name,
                },
                host_config=host_config,
                environment={"HOME": "/home/sandbox"},
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(kernel.cleanup())
            raise
        return kernel

    def _make_conn_dir(self, language: Language) -> tuple[str, Path, ConnectionInfo]:
        """A kernel's connection folder with its files, owned by the kernel's user."""
        kernel_id, conn_dir = self._runtime.new_kernel_dir()
        try:
            info = ipc_connection(str(conn_dir / "k"))
            write_connection_file(conn_dir / "kernel.json", ipc_connection_inside(info))
            if language.builtin:
                offline = self._settings.network == "none"
                write_startup_file(conn_dir, self._settings, offline=offline)
            else:
                write_in_kernel_program(conn_dir, "bridge")  # bridge.py and jupyter_wire.py
            if self._owner is not None:
                for path in (conn_dir, *conn_dir.iterdir()):
                    os.chown(path, *self._owner)
        except BaseException:
            shutil.rmtree(conn_dir, ignore_errors=True)
            raise
        return kernel_id, conn_dir, info

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

    @property
    def _uid(self) -> str:
        return self._user.split(":")[0]

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


def _read_connection(conn_dir: Path) -> ConnectionInfo | None:
    """A running kernel's connection as the gateway sees it, from the file the kernel reads."""
    try:
        inside = json.loads((conn_dir / "kernel.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(inside, dict) or not isinstance(inside.get("key"), str):
        return None
    info = ipc_connection(str(conn_dir / "k"), key=inside["key"])
    info["signature_scheme"] = str(inside.get("signature_scheme", info["signature_scheme"]))
    return info


def ipc_connection_inside(info: ConnectionInfo) -> ConnectionInfo:
    """The same connection as the kernel sees it: the folder is mounted at /conn."""
    inside = info.copy()
    inside["ip"] = "/conn/" + Path(info["ip"]).name
    return inside
