"""The interface every backend implements, and the runtime folder they share.

A backend launches kernels and hands back a `KernelProcess`: a small Popen-like
handle (after jupyter_client's provisioners) the layers above use without knowing
whether the kernel is a local process or a container.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Collection
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import ClassVar, TypeVar

import zmq.asyncio

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.in_kernel import PROGRAMS
from kernel_gateway.kernels.channels import Channels, ZmqChannels
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, Language, Languages
from kernel_gateway.kernels.storage import SessionStorage as SessionStorage
from kernel_gateway.kernels.storage import make_storage_dirs as make_storage_dirs
from kernel_gateway.kernels.storage import mounts_under as mounts_under
from kernel_gateway.kernels.storage import reclaim
from kernel_gateway.kernels.wire import ipc_connection as ipc_connection
from kernel_gateway.settings import Settings
from kernel_gateway.types import JSON, ConnectionInfo

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ExitInfo:
    """How a kernel ended. `reason` is one of exited, killed, signal, out_of_memory."""

    code: int | None
    reason: str

    def describe(self) -> str:
        if self.reason == "out_of_memory":
            return "the kernel ran out of memory and was killed"
        if self.reason == "killed":
            return "the kernel was killed"
        if self.reason == "signal":
            return f"the kernel died from a signal (exit status {self.code})"
        return f"the kernel exited (exit status {self.code})"


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
        self, argv: list[str], env: dict[str, str], cwd: str | None, stdin: bool
    ) -> Command:
        """Start `argv` beside the kernel, in its sandbox, as its user (E2B's commands).

        Raises only `KernelUnavailable` (also where a backend cannot do it)."""
        raise KernelUnavailable("commands beside a kernel need the docker backend")

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

    @abc.abstractmethod
    async def kill(self, signum: int = 9) -> None:
        """Send `signum` (SIGKILL by default, or SIGTERM) to the process and everything it
        started (its process group), from inside the sandbox (whatever its runtime)."""


@dataclass
class ForkServerHost:
    """A running fork-server container: its process, and its folder of sockets on the host
    (`zygote.sock`, and each request's `r<N>/` seen inside as `/conn/r<N>/`)."""

    process: KernelProcess
    conn_dir: Path
    inside: str = "/conn"


class Backend(abc.ABC):
    name: ClassVar[str]
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


class RuntimeDirError(ValueError):
    """The runtime folder cannot be made safe: another user could reach it. Fatal at startup."""


def secure_runtime_root(root: Path) -> None:
    """Create `root` with mode 0700, or check that an existing one is this user's alone.

    It will hold connection files (each with its kernel's HMAC key) and ipc
    sockets, so a folder another local user made or may write to would hand them
    the kernels. Refused: a symlink, anything not a directory, a folder not owned
    by our effective uid, one that group or others may write, and one whose parent
    lets another user rename it away (a parent not root's or ours, or writable by
    others without the sticky bit that /tmp has). A folder of ours that others may
    only read or enter (earlier versions made it 0711) is tightened to 0700: nobody
    else could have put anything in it. The checks are made on a descriptor opened
    with O_NOFOLLOW, so what is checked is what was opened, with no race between.
    """
    euid = os.geteuid()
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        parent = os.stat(root.parent)
        if parent.st_uid not in (0, euid):
            raise RuntimeDirError(
                f"runtime dir {root}: its parent {root.parent} is owned by uid "
                f"{parent.st_uid}, who could swap the folder for another; choose another "
                "--runtime-dir"
            )
        if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
            raise RuntimeDirError(
                f"runtime dir {root}: its parent {root.parent} is writable by others and not "
                "sticky, so they could swap the folder for another; choose another --runtime-dir"
            )
        with contextlib.suppress(FileExistsError):
            os.mkdir(root, 0o700)
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            kind = "a symlink" if os.path.islink(root) else "not a directory"
            raise RuntimeDirError(
                f"runtime dir {root} is {kind}; refusing to use it (remove it, or choose "
                "another --runtime-dir)"
            ) from None
        try:
            st = os.fstat(fd)
            if st.st_uid != euid:
                raise RuntimeDirError(
                    f"runtime dir {root} is owned by uid {st.st_uid}, not by this gateway's "
                    f"uid {euid}: another user may have made it to take over kernels; remove "
                    "it, or choose another --runtime-dir"
                )
            if st.st_mode & 0o022:
                raise RuntimeDirError(
                    f"runtime dir {root} is writable by group or others (mode "
                    f"{stat.S_IMODE(st.st_mode):o}); anything in it may have been planted. "
                    "Remove it, or choose another --runtime-dir"
                )
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    except OSError as exc:
        raise RuntimeDirError(f"runtime dir {root}: {exc.strerror or exc}") from exc


class RuntimeDir:
    """This gateway's folder for connection files and workspaces, held by a lock.

    The lock tells a later gateway whether the folder (and the containers that
    carry the same instance id) still belong to a live process or are orphans.
    `open` refuses a folder another user could reach (see `secure_runtime_root`).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))
        self.instance = secrets.token_hex(6)
        self.hostname = socket.gethostname()
        self.path = self.root / self.instance
        self._lock_fd: int | None = None
        self.adopted = False

    def open(self, *, adopt: bool = False, wait_for_predecessor: float = 0.0) -> None:
        """Make or check the root folder (RuntimeDirError if unsafe), then this instance's.

        With `adopt`, an instance that a stopped gateway left with persisted sessions
        (see `sessions_path`) becomes this one: same id, so its kernels' labels and
        folders are ours. `adopted` says whether that happened. With
        `wait_for_predecessor`, a gateway still running on this folder is given that
        many seconds to stop first (a start-first rolling update: the successor starts,
        then its predecessor drains and leaves its sessions to it).
        """
        secure_runtime_root(self.root)
        if adopt and wait_for_predecessor > 0:
            self._wait_for_live_instances(wait_for_predecessor)
        if adopt and self._take_over():
            return
        # 0700 throughout: containers see only the folders bind-mounted into them, and
        # local kernels run as the gateway's user, so no one else needs to enter.
        self.path.mkdir(mode=0o700)
        (self.path / "k").mkdir(mode=0o700)
        (self.path / "w").mkdir(mode=0o700)
        self._lock_fd = self._lock(self.instance)
        assert self._lock_fd is not None

    def _lock(self, instance: str) -> int | None:
        """Hold `instance`'s lock; None if a live gateway holds it."""
        flags = os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.root / f"{instance}.lock", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def live_instances(self) -> list[str]:
        """Instance ids whose gateway runs now (its lock is held), other than this one."""
        return [
            lock.name.removesuffix(".lock")
            for lock in self.root.glob("*.lock")
            if lock.name.removesuffix(".lock") != self.instance and lock_is_held(lock)
        ]

    def _wait_for_live_instances(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        live = self.live_instances()
        if live:
            logger.info(
                "waiting up to %.0f s for the gateway running on %s (instance %s) to stop, "
                "to adopt its sessions",
                seconds,
                self.root,
                ", ".join(live),
            )
        while live and time.monotonic() < deadline:
            time.sleep(0.1)
            live = self.live_instances()
        if live:
            logger.warning(
                "the gateway on %s (instance %s) still runs after %.0f s: starting beside it",
                self.root,
                ", ".join(live),
                seconds,
            )

    def _take_over(self) -> bool:
        """Become the newest stopped instance that persisted sessions, if there is one."""
        ordered = sorted(
            (i for i in self.stale_instances() if any((self.root / i / "sessions").glob("*.json"))),
            key=lambda i: (self.root / i / "sessions").stat().st_mtime_ns,
            reverse=True,
        )
        for instance in ordered:
            fd = self._lock(instance)
            if fd is None:
                continue  # another gateway starting right now took it first
            self.instance, self.path, self._lock_fd = instance, self.root / instance, fd
            (self.path / "k").mkdir(mode=0o700, exist_ok=True)
            (self.path / "w").mkdir(mode=0o700, exist_ok=True)
            self.adopted = True
            return True
        return False

    @property
    def sessions_path(self) -> Path:
        """Where session records live when sessions are persisted."""
        return self.path / "sessions"

    def close(self, *, keep: bool = False) -> None:
        """Remove this instance's folder and lock; with `keep`, leave them for a successor."""
        if not keep:
            reclaim(self.path)  # session disks left mounted, and their loop devices
            shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
            if not keep:
                (self.root / f"{self.instance}.lock").unlink(missing_ok=True)

    @property
    def lock_path(self) -> Path:
        return self.root / f"{self.instance}.lock"

    def is_live(self, instance: str) -> bool:
        """Whether the gateway with this instance id, in this runtime dir, still runs."""
        if instance == self.instance:
            return True
        return lock_is_held(self.root / f"{instance}.lock")

    def stale_instances(self) -> list[str]:
        """Instance ids with a folder here but no live gateway."""
        out = []
        for entry in self.root.iterdir():
            name = entry.name.removesuffix(".lock")
            if len(name) == 12 and name not in out and not self.is_live(name):
                out.append(name)
        return out

    def orphaned_instances(self) -> list[str]:
        """Stale instances to clean up: those that left no sessions to adopt."""
        return [i for i in self.stale_instances() if not persisted(self.root / f"{i}.lock")]

    def remove_instance(self, instance: str) -> None:
        reclaim(self.root / instance)  # its session disks: unmount, detach loop devices
        shutil.rmtree(self.root / instance, ignore_errors=True)
        (self.root / f"{instance}.lock").unlink(missing_ok=True)

    def new_kernel_dir(self) -> tuple[str, Path]:
        kernel_id = secrets.token_hex(6)
        path = self.path / "k" / kernel_id
        path.mkdir(mode=0o700)
        return kernel_id, path

    def new_workspace(self) -> Path:
        path = self.path / "w" / secrets.token_hex(8)
        path.mkdir(mode=0o700)
        return path


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds this instance lock (a dead one's lock is released)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # not ours to judge (another user's lock): assume it lives
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def persisted(lock: Path) -> bool:
    """Whether the stopped gateway holding `lock` left sessions for a successor to adopt.

    Its kernels are not orphans: a gateway on another runtime dir must leave them be.
    """
    try:
        return any((lock.with_suffix("") / "sessions").glob("*.json"))
    except OSError:
        return False


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


def write_startup_file(conn_dir: Path, settings: Settings, *, offline: bool = False) -> Path:
    """Put the in-kernel startup code and its settings next to the connection file.

    `offline`: the kernel has no network, so `pip install` is told to fail at once.
    """
    path = conn_dir / "startup.py"
    path.write_bytes(in_kernel_source("kernel_startup.py"))
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
