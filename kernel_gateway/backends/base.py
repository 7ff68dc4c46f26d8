"""The interface every backend implements, and the runtime folder they share.

A backend launches kernels and hands back a `KernelProcess`: a small Popen-like
handle (after jupyter_client's provisioners) the layers above use without knowing
whether the kernel is a local process or a container.
"""

from __future__ import annotations

import abc
import asyncio
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..settings import Settings
from ..types import ConnectionInfo

logger = logging.getLogger(__name__)

# ipc "ports" are only suffixes of the socket path: <ip>-<port>.
IPC_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}


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


@dataclass(frozen=True)
class SessionStorage:
    """One session's writable storage: its working directory, its /tmp and its home.

    All three live under `root`, which a backend may make a size-capped disk of its
    own (see `Backend.prepare_storage`), so they share one cap.
    """

    root: Path

    @property
    def files(self) -> Path:
        """The working directory (/workspace in a container); what the file API serves."""
        return self.root / "files"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def home(self) -> Path:
        return self.root / "home"


class KernelProcess(abc.ABC):
    """One running kernel, seen as a process."""

    id: str
    connection: ConnectionInfo
    """Connection info as seen from the gateway's side."""

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

    @abc.abstractmethod
    async def cleanup(self) -> None:
        """Release everything the kernel held (container, sockets). Idempotent."""


class Backend(abc.ABC):
    name: ClassVar[str]

    @property
    @abc.abstractmethod
    def isolation(self) -> str:
        """One line for the startup log: what separates kernel code from the host."""

    @property
    def workspace_owner(self) -> tuple[int, int] | None:
        """uid/gid the kernel runs as, for files the gateway writes into a workspace."""
        return None

    async def prepare_storage(self, root: Path) -> SessionStorage:
        """Make the empty folder `root` a session's storage: plain folders by default."""
        storage = SessionStorage(root)
        await asyncio.to_thread(make_storage_dirs, storage, self.workspace_owner)
        return storage

    async def release_storage(self, storage: SessionStorage) -> None:  # noqa: B027 - optional
        """Undo `prepare_storage` before the folder is removed."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Get ready to launch; reclaim what a crashed earlier gateway left behind."""

    @abc.abstractmethod
    async def launch(self, storage: SessionStorage) -> KernelProcess:
        """Start a kernel working in `storage.files`.

        Raises only `KernelUnavailable`: every lower-level failure (engine errors,
        OSError, timeouts) is mapped to it here, at the backend's boundary.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop and remove every kernel this gateway started."""


class RuntimeDir:
    """This gateway's folder for connection files and workspaces, held by a lock.

    The lock tells a later gateway whether the folder (and the containers that
    carry the same instance id) still belong to a live process or are orphans.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.instance = secrets.token_hex(6)
        self.hostname = socket.gethostname()
        self.path = root / self.instance
        self._lock_fd: int | None = None

    def open(self) -> None:
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.path.mkdir(mode=0o711)
        (self.path / "k").mkdir()
        (self.path / "w").mkdir()
        fd = os.open(self.root / f"{self.instance}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._lock_fd = fd

    def close(self) -> None:
        for mount in mounts_under(self.path):  # a workspace tmpfs left behind
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
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

    def remove_instance(self, instance: str) -> None:
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


def make_storage_dirs(storage: SessionStorage, owner: tuple[int, int] | None) -> None:
    """Create the working directory, /tmp and home folders, owned by the kernel's user."""
    for path in (storage.files, storage.tmp, storage.home):
        path.mkdir(mode=0o700, exist_ok=True)
        if owner is not None:
            os.chown(path, *owner)


def mounts_under(folder: Path) -> list[str]:
    """Mount points below `folder` (such as workspace tmpfs mounts)."""
    prefix = str(folder) + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [fields[1] for fields in (line.split() for line in lines) if len(fields) > 1]
    return [p for p in points if p.startswith(prefix)]


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds this instance lock (a dead one's lock is released)."""
    try:
        fd = os.open(path, os.O_RDWR)
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


def ipc_connection(prefix: str) -> ConnectionInfo:
    """Connection info for ZMQ ipc sockets named `<prefix>-<n>`, with a fresh HMAC key."""
    return ConnectionInfo(
        transport="ipc",
        ip=prefix,
        key=secrets.token_hex(32),
        signature_scheme="hmac-sha256",
        kernel_name="python3",
        shell_port=IPC_PORTS["shell_port"],
        iopub_port=IPC_PORTS["iopub_port"],
        stdin_port=IPC_PORTS["stdin_port"],
        control_port=IPC_PORTS["control_port"],
        hb_port=IPC_PORTS["hb_port"],
    )


STARTUP_SOURCE = Path(__file__).resolve().parent.parent / "kernel_startup.py"


def write_startup_file(conn_dir: Path, settings: Settings) -> Path:
    """Put the in-kernel startup code and its settings next to the connection file."""
    path = conn_dir / "startup.py"
    shutil.copyfile(STARTUP_SOURCE, path)
    config = {"figure_formats": settings.figure_format_list, "figure_dpi": settings.figure_dpi}
    (conn_dir / "startup.json").write_text(json.dumps(config))
    return path


def write_connection_file(path: Path, info: ConnectionInfo) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)


async def wait_for_exit(process: KernelProcess, seconds: float) -> ExitInfo | None:
    try:
        return await asyncio.wait_for(asyncio.shield(process.wait()), seconds)
    except TimeoutError:
        return None
