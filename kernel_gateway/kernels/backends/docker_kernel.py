"""One kernel in its Docker container, seen as a process (`KernelProcess`).

Its signals go to the container's init, which passes them on; its end comes from the
backend's events stream (`docker_events.py`): an `oom` event, then `die` with the exit
status. Commands beside it are `docker exec`s (`docker_exec.py`); so is its egress
forwarder, whose socket is in a folder of its connection folder that only the gateway
writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import docker.errors

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import (
    Command,
    ExitInfo,
    KernelProcess,
    TerminalSize,
    Usage,
    in_kernel_source,
)
from kernel_gateway.kernels.backends.docker_container import SANDBOX_FOLDERS
from kernel_gateway.kernels.backends.docker_events import exit_info
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.types import ConnectionInfo

if TYPE_CHECKING:
    from kernel_gateway.kernels.backends.docker import DockerBackend

FORWARDER_READY_SECONDS = 10.0  # a kernel's egress forwarder: up and listening by then


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
        self.sandbox_folders = SANDBOX_FOLDERS
        self._container_id: str | None = None
        """Found on the first `usage` (its cgroup is named by it)."""

    def on_oom(self) -> None:
        """Its container ran out of memory (its `die` follows)."""
        self._oom = True

    def on_die(self, code: int) -> None:
        """Its container ended with exit status `code`."""
        if not self._exit.done():
            self._exit.set_result(exit_info(code, self._oom))

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
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        stdin: bool,
        terminal: TerminalSize | None = None,
    ) -> Command:
        """`docker exec` in this kernel's container, as its user (see docker_exec.py)."""
        from kernel_gateway.kernels.backends.docker_exec import DockerCommand

        if self._exit.done():
            raise KernelUnavailable("the kernel's container has ended")
        command = DockerCommand(
            self._backend.client, self._backend.call, self.name, self._backend.user
        )
        await command.start(argv, env, cwd, stdin, terminal)
        return command

    async def limit(self, cpus: float | None, memory_bytes: int | None) -> bool:
        """See `KernelProcess` (docker_usage.py: the engine's update, else its cgroup)."""
        from kernel_gateway.kernels.backends.docker_usage import limit_container

        if self._exit.done():
            raise KernelUnavailable("the kernel's container has ended")
        backend = self._backend
        try:
            if self._container_id is None:
                found = await backend.call(backend.client.api.inspect_container, self.name)
                self._container_id = str(found["Id"])
            await backend.call(
                limit_container, backend.client, self._container_id, cpus, memory_bytes
            )
        except (docker.errors.DockerException, OSError, KeyError, ValueError) as exc:
            raise KernelUnavailable(f"the kernel's limits could not be lowered: {exc}") from exc
        return True

    async def usage(self) -> Usage | None:
        """See `KernelProcess` (docker_usage.py: its cgroup, else the engine's stats)."""
        from kernel_gateway.kernels.backends.docker_usage import read_usage

        if self._exit.done():
            return None
        backend = self._backend
        try:
            if self._container_id is None:
                found = await backend.call(backend.client.api.inspect_container, self.name)
                self._container_id = str(found["Id"])
            limit = backend.settings.memory_limit_bytes
            return await backend.call(read_usage, backend.client, self._container_id, limit)
        except (docker.errors.DockerException, OSError, KeyError):
            return None

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
