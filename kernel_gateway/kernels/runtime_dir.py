"""The gateway's runtime folder, held by an instance lock.

    <root>/<instance>.lock        held (flock) while that instance's gateway runs
    <root>/<instance>/k/          the kernels' connection folders
    <root>/<instance>/w/          the sessions' storage
    <root>/<instance>/sessions/   session records (--persist-sessions)
    <root>/<instance>/chats/      the sessions' chat conversations (--persist-sessions)
    <root>/<instance>/egress/     the egress proxy's configuration and socket

The lock tells a later gateway whether an instance (its folder, and the containers
labelled with its id) belongs to a live gateway, was left with sessions for a successor
to adopt, or is an orphan to remove.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import socket
import stat
import time
from pathlib import Path

from kernel_gateway.kernels.storage import reclaim

logger = logging.getLogger(__name__)


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
        self.view = filesystem_view()
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


def filesystem_view() -> str:
    """This process's view of the file system: its mount namespace, as `device:inode`
    ("" where unknown). Two processes with one view see the same paths; a gateway in a
    container does not see the host's (nor the host its), though both may share a
    hostname and a Docker engine."""
    try:
        info = os.stat("/proc/self/ns/mnt")
    except OSError:
        return ""
    return f"{info.st_dev}:{info.st_ino}"


def owner_gone(lock: Path, view: str | None, own_view: str) -> bool:
    """Whether the gateway whose instance lock is `lock`, seen in the file system view
    `view`, is gone and left nothing to adopt. A lock this process cannot find proves that
    only when the owner saw paths as this process does: a gateway in another view (a
    container's, the host's) may be alive with a lock this one cannot see."""
    try:
        there = os.path.lexists(lock)
    except OSError:
        return False
    if not there:
        return bool(own_view) and view == own_view
    return not lock_is_held(lock) and not persisted(lock)


def persisted(lock: Path) -> bool:
    """Whether the stopped gateway holding `lock` left sessions for a successor to adopt.

    Its kernels are not orphans: a gateway on another runtime dir must leave them be.
    """
    try:
        return any((lock.with_suffix("") / "sessions").glob("*.json"))
    except OSError:
        return False
