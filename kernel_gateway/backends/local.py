"""Kernels as local processes: the embedded default where no Docker engine answers.

Code runs with the gateway user's rights on the host. That is fine for a laptop
and for tests, and never for untrusted code; the startup log says so loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from ..settings import Settings
from ..types import ConnectionInfo
from .base import (
    Backend,
    ExitInfo,
    KernelProcess,
    RuntimeDir,
    ipc_connection,
    wait_for_exit,
    write_connection_file,
    write_startup_file,
)

logger = logging.getLogger(__name__)


def _exit_info(returncode: int) -> ExitInfo:
    if returncode == -signal.SIGKILL:
        return ExitInfo(returncode, "killed")
    if returncode < 0:
        return ExitInfo(returncode, "signal")
    return ExitInfo(returncode, "exited")


class LocalKernel(KernelProcess):
    def __init__(
        self,
        kernel_id: str,
        conn_dir: Path,
        proc: asyncio.subprocess.Process,
        connection: ConnectionInfo,
    ) -> None:
        self.id = kernel_id
        self._conn_dir = conn_dir
        self._proc = proc
        self.connection = connection
        self._exit: asyncio.Task[ExitInfo] = asyncio.create_task(self._wait())

    async def _wait(self) -> ExitInfo:
        return _exit_info(await self._proc.wait())

    def poll(self) -> ExitInfo | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> ExitInfo:
        return await asyncio.shield(self._exit)

    async def send_signal(self, signum: int) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signum)

    async def kill(self) -> None:
        # The kernel leads its own process group: take its children with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    async def cleanup(self) -> None:
        await self.kill()  # also when the kernel is gone: its children may live on
        if await wait_for_exit(self, 5.0) is None:
            logger.warning("local kernel %s did not exit after SIGKILL", self.id)
        await asyncio.to_thread(shutil.rmtree, self._conn_dir, True)


class LocalBackend(Backend):
    name = "local"

    def __init__(self, settings: Settings, runtime: RuntimeDir) -> None:
        self._settings = settings
        self._runtime = runtime
        self._kernels: set[LocalKernel] = set()
        # The kernel gets a small, explicit environment: never the gateway's own
        # (which may hold its token or cloud credentials).
        self._env = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.defpath]),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "MPLCONFIGDIR": str(runtime.root / "matplotlib"),
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }

    @property
    def isolation(self) -> str:
        return "none: kernels are local processes with the gateway user's rights"

    async def start(self) -> None:
        for instance in self._runtime.stale_instances():
            await asyncio.to_thread(_kill_orphans, self._runtime.root / instance)
            self._runtime.remove_instance(instance)

    async def launch(self, workspace: Path) -> KernelProcess:
        kernel_id, conn_dir = self._runtime.new_kernel_dir()
        connection = ipc_connection(str(conn_dir / "k"))
        conn_file = conn_dir / "kernel.json"
        write_connection_file(conn_file, connection)
        home = conn_dir / "home"
        home.mkdir()
        env = dict(self._env, HOME=str(home), IPYTHONDIR=str(home / ".ipython"))
        # ipykernel echoes all fd-level output to its own stdout: discard it, or a
        # `while True: print()` would fill the disk with a log nobody reads.
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(write_startup_file(conn_dir, self._settings)),
            "-f",
            str(conn_file),
            cwd=workspace,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        kernel = LocalKernel(kernel_id, conn_dir, proc, connection)
        (conn_dir / "pid").write_text(str(proc.pid))
        self._kernels.add(kernel)
        kernel._exit.add_done_callback(lambda _: self._kernels.discard(kernel))
        return kernel

    async def close(self) -> None:
        await asyncio.gather(*(k.cleanup() for k in list(self._kernels)))


def _kill_orphans(instance_dir: Path) -> None:
    """Kill kernels of a gateway that died without cleaning up.

    A pid is only trusted if its command line still names the connection file,
    so a recycled pid is never killed by mistake.
    """
    for pid_file in instance_dir.glob("k/*/pid"):
        try:
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if str(pid_file.parent / "kernel.json").encode() in cmdline:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            logger.info("killed orphaned local kernel pid %d", pid)
