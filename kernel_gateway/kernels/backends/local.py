"""Kernels as local processes: the embedded default where no Docker engine answers.

When bubblewrap (`bwrap`) is installed, each kernel runs inside it: no network,
a read-only view of the system, only its session's storage (working directory,
/tmp and home, on one capped disk when the gateway is root) and its connection
folder writable, its own pid namespace (it cannot see the gateway or
other kernels), all capabilities dropped. Resource limits are rlimits. Without
bwrap, code runs with the gateway user's rights on the host; the startup log
says which isolation is active, and warns loudly when there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from kernel_gateway.errors import BackendUnavailable, KernelUnavailable
from kernel_gateway.kernels.backends.base import (
    Backend,
    ExitInfo,
    KernelProcess,
    ipc_connection,
    to_the_end,
    wait_for_exit,
    write_connection_file,
    write_startup_file,
)
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, PYTHON, Language
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.storage import (
    PlainStorage,
    SessionStorage,
    StorageProvider,
    choose_provider,
)
from kernel_gateway.settings import Settings
from kernel_gateway.types import ConnectionInfo

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
        kernel_pid: int | None = None,
    ) -> None:
        self.id = kernel_id
        self._conn_dir = conn_dir
        self.handover = (conn_dir, str(conn_dir))
        self._proc = proc
        self._kernel_pid = kernel_pid or proc.pid
        """The kernel itself: inside bwrap it is not the process we started."""
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
                os.kill(self._kernel_pid, signum)

    async def kill(self) -> None:
        if self._proc.returncode is not None:
            # Gone: inside bwrap its pid namespace died with it. Without bwrap its
            # children may live on in its process group (never reused while they do).
            if self._kernel_pid == self._proc.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
            return
        # The kernel leads its own process group (or pid namespace): take its children too.
        for pid in {self._kernel_pid, self._proc.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

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
        self._bwrap = shutil.which("bwrap")
        self._font_seed = runtime.root / "matplotlib"
        # Chosen in start(): a capped disk per session when it works here.
        self._storage: StorageProvider = PlainStorage(settings.workspace_size_bytes)
        # The kernel gets a small, explicit environment: never the gateway's own
        # (which may hold its token or cloud credentials).
        self._env = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.defpath]),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "MPL_FONT_CACHE_SEED": str(runtime.root / "matplotlib"),
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }

    @property
    def isolated(self) -> bool:
        return self._bwrap is not None

    @property
    def isolation(self) -> str:
        limits = (
            f"rlimits: address space {self._settings.memory_limit} x4, 1024 files, "
            f"file size {self._settings.workspace_size}"
        )
        storage = f"storage (working directory, /tmp, home): {self._storage.describe()}"
        if self._bwrap:
            return (
                "bubblewrap sandbox: no network, read-only system, only its storage writable, "
                f"own pid namespace, all capabilities dropped; {limits}; {storage}"
            )
        return (
            f"none: kernels are local processes with the gateway user's rights; {limits}; "
            + storage
        )

    async def start(self) -> None:
        others = [name for name in self._settings.language_list or () if name != PYTHON]
        if others:
            raise BackendUnavailable(
                f"--languages asks for {', '.join(others)}: the local backend runs Python "
                "only (other languages run in kernel images: the docker backend)"
            )
        for instance in await asyncio.to_thread(self._runtime.orphaned_instances):
            await asyncio.to_thread(_kill_orphans, self._runtime.root / instance)
            # Its session disks too: unmounted, loop devices detached, images deleted.
            await asyncio.to_thread(self._runtime.remove_instance, instance)
        await asyncio.to_thread(self._warm_font_cache)
        self._storage = await asyncio.to_thread(
            choose_provider, self._storage.size, self._runtime.path / "w"
        )

    async def prepare_storage(self, root: Path) -> SessionStorage:
        """Make `root` the session's storage with the provider chosen at startup."""
        return await to_the_end(asyncio.to_thread(self._storage.prepare, root, None))

    async def release_storage(self, storage: SessionStorage) -> None:
        try:
            await asyncio.shield(asyncio.to_thread(self._storage.release, storage.root))
        except Exception:
            logger.exception("releasing the storage at %s failed", storage.root)

    def _warm_font_cache(self) -> None:
        """Build matplotlib's font cache once; each kernel starts from a copy of it."""
        self._font_seed.mkdir(parents=True, exist_ok=True)
        if any(self._font_seed.glob("fontlist-*.json")):
            return
        subprocess.run(
            [sys.executable, "-c", "import matplotlib.font_manager"],
            env={**self._env, "MPLCONFIGDIR": str(self._font_seed)},
            capture_output=True,
            timeout=120,
        )

    def _sandbox(self, conn_dir: Path, storage: SessionStorage, info_fd: int) -> list[str]:
        """bwrap arguments: only what Python needs is visible, read-only.

        Not `/` as a whole: that would expose /run (the Docker socket, session
        buses), /home and, for a root gateway, root-owned secrets such as
        /etc/shadow. The session's own tmp folder serves /tmp (on its disk, not in
        memory), so the runtime dir (and every other session's files) stays
        hidden unless bound in below.
        """
        assert self._bwrap is not None
        argv = [self._bwrap]
        for path in SYSTEM_DIRS:
            argv += ["--ro-bind-try", path, path]
        argv += ["--dev", "/dev", "--proc", "/proc", "--bind", str(storage.tmp), "/tmp"]
        argv += ["--dir", "/etc"]
        for path in ETC_FILES:
            argv += ["--ro-bind-try", path, path]
        for path in python_paths():
            argv += ["--ro-bind-try", path, path]
        argv += [
            "--ro-bind", str(self._font_seed), str(self._font_seed),
            "--bind", str(conn_dir), str(conn_dir),
            "--bind", str(storage.files), str(storage.files),
            "--bind", str(storage.home), str(storage.home),
            "--chdir", str(storage.files),
            "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-pid", "--as-pid-1",
            "--cap-drop", "ALL",
            "--die-with-parent", "--new-session",
            "--info-fd", str(info_fd),
            "--",
        ]  # fmt: skip
        return argv

    def _limits(self) -> None:
        """Runs in the child before exec: rlimits the kernel inherits."""
        memory = self._settings.memory_limit_bytes * 4  # address space, not RSS
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        size = self._settings.workspace_size_bytes
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # No RLIMIT_NPROC: it counts every process of the user (the gateway and all
        # kernels), so it cannot limit one kernel; the docker backend has a real pids cap.

    async def launch(
        self, storage: SessionStorage, language: Language = BUILTIN_PYTHON
    ) -> KernelProcess:
        """Start a kernel process on `storage`; raises only `KernelUnavailable`.

        Local kernels are Python only: other languages live in kernel images.
        """
        if not language.builtin:
            raise KernelUnavailable(f"the local backend runs Python only, not {language.name}")
        try:
            return await self._launch(storage)
        except (OSError, TimeoutError) as exc:
            raise KernelUnavailable(
                f"could not start a local kernel: {exc}", retry_after=5
            ) from exc

    async def _launch(self, storage: SessionStorage) -> KernelProcess:
        workspace = storage.files
        kernel_id, conn_dir = self._runtime.new_kernel_dir()
        connection = ipc_connection(str(conn_dir / "k"))
        conn_file = conn_dir / "kernel.json"
        write_connection_file(conn_file, connection)
        home = storage.home
        env = dict(
            self._env,
            HOME=str(home),
            IPYTHONDIR=str(home / ".ipython"),
            MPLCONFIGDIR=str(home / ".matplotlib"),
        )
        if not self._bwrap:  # in the sandbox, the session's tmp folder is /tmp
            env["TMPDIR"] = str(storage.tmp)
        # ipykernel echoes all fd-level output to its own stdout: discard it, or a
        # `while True: print()` would fill the disk with a log nobody reads.
        startup = write_startup_file(conn_dir, self._settings, offline=self._bwrap is not None)
        command = [sys.executable, str(startup), "-f", str(conn_file)]
        read_fd, write_fd = os.pipe() if self._bwrap else (-1, -1)
        try:
            if self._bwrap:
                command = self._sandbox(conn_dir, storage, write_fd) + command
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=workspace,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=self._limits,
                pass_fds=(write_fd,) if self._bwrap else (),
            )
        except BaseException:
            if read_fd >= 0:
                os.close(read_fd)
            shutil.rmtree(conn_dir, ignore_errors=True)
            raise
        finally:
            if write_fd >= 0:
                os.close(write_fd)
        kernel_pid = None
        if self._bwrap:
            try:
                kernel_pid = await asyncio.wait_for(
                    asyncio.to_thread(_child_pid, read_fd), self._settings.kernel_start_timeout
                )
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                shutil.rmtree(conn_dir, ignore_errors=True)
                raise
        kernel = LocalKernel(kernel_id, conn_dir, proc, connection, kernel_pid)
        (conn_dir / "pid").write_text(str(proc.pid))
        self._kernels.add(kernel)
        kernel._exit.add_done_callback(lambda _: self._kernels.discard(kernel))
        return kernel

    async def close(self) -> None:
        await asyncio.gather(*(k.cleanup() for k in list(self._kernels)))

    @property
    def startup_warning(self) -> str:
        if self._bwrap:
            return (
                "local backend: kernels run in a bubblewrap sandbox but share this host's "
                "kernel; prefer the docker backend (with --runtime runsc) for untrusted code"
            )
        banner = "!" * 78
        return (
            f"\n{banner}\nWARNING: the local backend runs code as YOUR USER ON THIS HOST, with "
            "no isolation.\nUse it only for code you trust. Build the kernel image "
            "(kernel-gateway build-image) and run with --backend docker for untrusted "
            f"code.\n{banner}"
        )


SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
ETC_FILES = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/ssl",
    "/etc/fonts",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/mime.types",
    "/etc/matplotlibrc",
)


def python_paths() -> list[str]:
    """The interpreter's prefixes and import path, wherever they live (a venv in /tmp too)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).parent)}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted(paths)


def _child_pid(fd: int) -> int | None:
    """The kernel's pid, from bwrap's --info-fd JSON (bwrap itself is its parent)."""
    data = b""
    try:
        while b"}" not in data:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    try:
        pid = json.loads(data)["child-pid"]
    except (ValueError, KeyError):
        return None
    return int(pid)


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
