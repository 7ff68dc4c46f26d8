"""The interface every backend implements, and the helpers backends share.

A backend launches kernels and hands back a `KernelProcess`: a small Popen-like
handle (after jupyter_client's provisioners) the layers above use without knowing
whether the kernel is a local process or a container.
"""

from __future__ import annotations

import abc
import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Collection
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import ClassVar, Literal, TypeVar

import zmq.asyncio

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.in_kernel import PROGRAMS
from kernel_gateway.kernels.channels import Channels, ZmqChannels
from kernel_gateway.kernels.images import ImageBuilder
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, Language, Languages
from kernel_gateway.kernels.storage import SessionStorage as SessionStorage
from kernel_gateway.kernels.storage import make_storage_dirs as make_storage_dirs
from kernel_gateway.kernels.storage import mounts_under as mounts_under
from kernel_gateway.kernels.wire import ipc_connection as ipc_connection
from kernel_gateway.settings import Settings
from kernel_gateway.types import JSON, ConnectionInfo, DiedReason

T = TypeVar("T")


@dataclass(frozen=True)
class ExitInfo:
    """How a kernel ended. `reason` is one of exited, killed, signal, out_of_memory."""

    code: int | None
    reason: DiedReason

    def describe(self) -> str:
        if self.reason == "out_of_memory":
            return "the kernel ran out of memory and was killed"
        if self.reason == "killed":
            return "the kernel was killed"
        if self.reason == "signal":
            return f"the kernel died from a signal (exit status {self.code})"
        return f"the kernel exited (exit status {self.code})"


@dataclass(frozen=True)
class TerminalSize:
    rows: int
    cols: int


@dataclass(frozen=True)
class Usage:
    """What a kernel's sandbox uses now: its CPU time so far, its memory (without the page
    cache it can give back), its memory limit, and that cache."""

    cpu_seconds: float
    memory_bytes: int
    memory_limit: int
    cache_bytes: int


class KernelProcess(abc.ABC):
    """One running kernel, seen as a process."""

    id: str
    connection: ConnectionInfo
    """Connection info as seen from the gateway's side."""
    language: str = "python"
    """The language it runs (`Language.name`): only Python's kernel has the gateway's
    in-kernel code (its outcome log, its preloads)."""
    handover: tuple[Path, str] | None = None
    """A folder for files between the gateway and the kernel (its connection folder): its
    path on the gateway's side and its path as the kernel sees it. None: the backend has
    none."""
    sandbox_folders: tuple[str, ...] = ()
    """The session's writable folders as the kernel sees them, its working directory first
    (then /tmp and home): what a snapshot archives (`kernels/sandbox_files.py`, with
    `run_command`). Empty: the backend cannot."""

    def channels(self, context: zmq.asyncio.Context) -> Channels:
        """How the gateway exchanges messages with it: its ZMQ sockets (a forked stateless
        kernel has a Unix stream instead)."""
        return ZmqChannels(self.connection, context)

    @abc.abstractmethod
    def poll(self) -> ExitInfo | None:
        """How the kernel ended, or None while it runs."""

    @abc.abstractmethod
    async def wait(self) -> ExitInfo:
        """Resolve when the kernel ends, however that happens."""

    @abc.abstractmethod
    async def send_signal(self, signum: int) -> None:
        """Deliver a signal to the kernel process (SIGINT interrupts the running cell)."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """End the kernel at once; `wait()` resolves soon after."""

    async def last_output(self) -> str:
        """What the kernel last wrote to its own stdout/stderr, if anything keeps it."""
        return ""

    @abc.abstractmethod
    async def cleanup(self) -> None:
        """Release everything the kernel held (container, sockets). Idempotent."""

    async def run_command(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        stdin: bool,
        terminal: TerminalSize | None = None,
    ) -> Command:
        """Start `argv` beside the kernel, in its sandbox, as its user (E2B's commands);
        with `terminal`, on a pseudo-terminal of that size (its output all on STDOUT, its
        input the terminal's keys).

        Raises only `KernelUnavailable` (also where a backend cannot do it)."""
        raise KernelUnavailable("commands beside a kernel need the docker backend")

    async def limit(self, cpus: float | None, memory_bytes: int | None) -> bool:
        """Lower its sandbox's CPU and memory limits to these (None: as they are), below the
        operator's (an API key's quotas); False where the backend cannot (the local one).
        Raises KernelUnavailable when it could not be done."""
        return False

    async def usage(self) -> Usage | None:
        """Its sandbox's CPU time and memory now (sandbox metrics); None where the backend
        cannot tell, or once it has ended."""
        return None

    async def start_egress_forwarder(self, port: int) -> Path:
        """Start, beside the kernel and as its user, a forwarder from the sandbox's
        `127.0.0.1:port` to a Unix socket; return that socket's path on the gateway's side,
        where the session's egress relay listens (docs/network.md)."""
        raise KernelUnavailable("network policies need the docker backend")


STDOUT, STDERR = 1, 2


class Command(abc.ABC):
    """A process started beside a kernel, in the kernel's sandbox (same user, same files,
    same limits), with its output read as it comes."""

    pid: int
    """Its pid inside the sandbox."""
    signalled: int | None = None
    """The signal `kill` sent, if any: an exit status of 128 + it means the signal ended it."""

    @abc.abstractmethod
    def output(self) -> AsyncIterator[tuple[int, bytes]]:
        """(STDOUT or STDERR, bytes) as the process writes them, until both are closed."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """Its exit status (128 + N when a signal N ended it), once it has ended."""

    @abc.abstractmethod
    async def send_stdin(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def close_stdin(self) -> None: ...

    async def resize(self, size: TerminalSize) -> None:
        """A command on a pseudo-terminal: give the terminal this size (SIGWINCH)."""
        raise KernelUnavailable("the command has no terminal")

    @abc.abstractmethod
    async def kill(self, signum: int = 9) -> None:
        """Send `signum` (SIGKILL by default, or SIGTERM) to the process and everything it
        started (its process group), from inside the sandbox (whatever its runtime).
        SIGKILL returns once the process is gone (reaped, not a zombie), as envd's does."""


@dataclass
class ForkServerHost:
    """A running fork-server container: its process, and its folder of sockets on the host
    (`zygote.sock`, and each request's `r<N>/` seen inside as `/conn/r<N>/`)."""

    process: KernelProcess
    conn_dir: Path
    inside: str = "/conn"


class Backend(abc.ABC):
    name: ClassVar[Literal["docker", "local"]]
    languages: Languages = Languages([BUILTIN_PYTHON])
    """What this backend can start, known once `start()` returned."""

    @property
    @abc.abstractmethod
    def isolation(self) -> str:
        """One line for the startup log: what separates kernel code from the host."""

    @property
    def startup_warning(self) -> str | None:
        """A warning for the startup log when the isolation is weak, or None."""
        return None

    @property
    def workspace_owner(self) -> tuple[int, int] | None:
        """uid/gid the kernel runs as, for files the gateway writes into a workspace."""
        return None

    @property
    def volumes(self) -> str | None:
        """Why this backend's kernels cannot mount volumes (`SessionStorage.mounts`), or None
        if they can."""
        return f"the {self.name} backend cannot mount volumes into kernels"

    @property
    def disks_capped(self) -> bool:
        """Whether this backend makes size-capped disks (root, loop devices): volumes are
        such disks where it does."""
        return False

    @property
    def images(self) -> ImageBuilder | None:
        """How this backend builds template images (see `kernels/images.py`), or None."""
        return None

    async def prepare_storage(self, root: Path) -> SessionStorage:
        """Make the empty folder `root` a session's storage: plain folders by default.

        Raises only `KernelUnavailable`, leaving nothing behind. If cancelled, it
        returns only once its work has stopped, so `release_storage` undoes all of it.
        """
        storage = SessionStorage(root)
        try:
            await to_the_end(asyncio.to_thread(make_storage_dirs, storage, self.workspace_owner))
        except OSError as exc:
            raise KernelUnavailable(f"could not create a session's folders: {exc}") from exc
        return storage

    async def release_storage(self, storage: SessionStorage) -> None:  # noqa: B027 - optional
        """Undo `prepare_storage` (also a failed or cancelled one) before the folder is removed.

        Never raises: a failure is logged, and the folder is removed anyway.
        """

    @property
    def can_carry(self) -> bool:
        """Whether `carry` works here: a running kernel can be given another storage."""
        return False

    async def carry(self, carrier: SessionStorage, storage: SessionStorage) -> dict[str, int]:
        """Make a kernel launched on `carrier` work on `storage` from now on (its files, /tmp
        and home): how a warm kernel takes up a hibernated session's disk, with no copy.
        Returns each folder as the kernel sees it → the device it must now be on (for the
        kernel to check before it trusts the folder). Undone by `uncarry` once that kernel is
        gone. Raises only `KernelUnavailable`."""
        raise KernelUnavailable(f"the {self.name} backend cannot move a kernel's storage")

    async def uncarry(self, carrier: SessionStorage) -> None:  # noqa: B027 - optional
        """Undo `carry` on `carrier` (nothing if it was not carrying). Never raises."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Get ready to launch; reclaim what a crashed earlier gateway left behind."""

    @abc.abstractmethod
    async def launch(
        self, storage: SessionStorage, language: Language = BUILTIN_PYTHON
    ) -> KernelProcess:
        """Start a kernel of `language` (one of `languages`) working in `storage.files`.

        Raises only `KernelUnavailable`: every lower-level failure (engine errors,
        OSError, timeouts) is mapped to it here, at the backend's boundary.
        """

    @property
    def fork_servers(self) -> str | None:
        """Why this backend cannot run stateless fork servers, or None if it can."""
        return f"the {self.name} backend has no fork servers"

    @property
    def fork_servers_by_default(self) -> str | None:
        """Why `--stateless-mode auto` does not use fork servers here, or None if it does."""
        return self.fork_servers

    async def launch_fork_server(self, storage: SessionStorage, config: JSON) -> ForkServerHost:
        """Start a fork-server container on `storage` (see `zygote.py`).

        Raises only `KernelUnavailable`.
        """
        raise KernelUnavailable(self.fork_servers or "no fork servers here")

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop and remove every kernel this gateway started."""

    persists: ClassVar[bool] = False
    """Whether kernels can outlive the gateway, for a successor to `adopt` them."""

    async def adopt(self, kernel_ids: Collection[str]) -> dict[str, KernelProcess]:
        """Take over the kernels an earlier gateway of this instance left running.

        Returns the live ones among `kernel_ids`, by id; every other kernel of this
        instance (warm ones, stateless ones, any not asked for) is removed.
        """
        return {}

    async def detach(self) -> None:
        """Stop watching kernels but leave them running, for a successor to adopt."""
        await self.close()


def in_kernel_source(name: str) -> bytes:
    """A file of `kernel_gateway/in_kernel/` (code that runs inside a kernel's container and
    imports nothing of the gateway), read as a package resource so installed wheels work."""
    return files("kernel_gateway.in_kernel").joinpath(name).read_bytes()


def write_in_kernel_program(folder: Path, program: str) -> Path:
    """Write `in_kernel/<program>.py` into `folder` with the modules of `in_kernel/` it
    imports (`in_kernel.PROGRAMS`, the one list of them); return its path. Run as
    `python <folder>/<program>.py`, it finds them there (its folder is first on `sys.path`)."""
    for name in PROGRAMS[program]:
        (folder / name).write_bytes(in_kernel_source(name))
    return folder / f"{program}.py"


CHART_DATA_EXTENSION = "kg_chart_data"
"""The IPython extension every Python kernel loads (`in_kernel/kg_chart_data.py`)."""


def write_startup_file(conn_dir: Path, settings: Settings, *, offline: bool = False) -> Path:
    """Put the in-kernel startup code and its settings next to the connection file.

    `offline`: the kernel has no network, so `pip install` is told to fail at once.
    """
    path = conn_dir / "startup.py"
    path.write_bytes(in_kernel_source("kernel_startup.py"))
    extension = CHART_DATA_EXTENSION + ".py"  # the IPython extension it loads, beside it
    (conn_dir / extension).write_bytes(in_kernel_source(extension))
    config = {
        "figure_formats": settings.figure_format_list,
        "figure_dpi": settings.figure_dpi,
        "offline": offline,
    }
    (conn_dir / "startup.json").write_text(json.dumps(config))
    return path


def write_connection_file(path: Path, info: ConnectionInfo) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)


async def to_the_end(work: Awaitable[T]) -> T:
    """Await work running on a thread; if cancelled, wait for the thread to stop first.

    A cancelled `await` on a thread stops the waiting, not the thread: a mount could
    finish after the caller cleaned up, and leak. This lets the caller's cleanup
    see everything the work did.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


async def wait_for_exit(process: KernelProcess, seconds: float) -> ExitInfo | None:
    try:
        return await asyncio.wait_for(asyncio.shield(process.wait()), seconds)
    except TimeoutError:
        return None
