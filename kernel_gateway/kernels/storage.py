"""Each session's storage: its working directory, /tmp and home on one disk of its own.

Why: a tmpfs workspace counts against the kernel's memory limit, so a cell that
fills its disk is killed as out of memory and the session loses its variables.
Here a session's storage is a sparse ext4 image (`--workspace-size`) attached
through a loop device and mounted at the session's root: files, /tmp and home
share one hard cap, a cell that writes past it gets `ENOSPC`, and only memory
counts as memory. The image sits beside the root (`<root>.img`), outside every
folder a kernel can see, and is deleted on release.

Mounting needs root. Without it (or when a probe at startup shows loop devices
do not work here) storage is plain folders on the host's disk, uncapped: the
backend says so in its startup log. The provider is chosen once, at startup,
by `choose_provider`; nothing here keeps state in module globals.

Every function here blocks (mkfs, mount, umount): backends run them in a thread.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from kernel_gateway.errors import KernelUnavailable

if TYPE_CHECKING:
    from kernel_gateway.kernels.volumes import VolumeMount

logger = logging.getLogger(__name__)

# Fastest safe options, measured by bench/storage.py: no journal (a session's disk
# never outlives a crash: it is discarded, never fsck'd or remounted), no reserved
# blocks, no resize inode, lazy inode tables, no discard pass over the sparse image;
# one inode per 8 KiB so many small files (a pip install, a git checkout) fit.
MKFS_OPTIONS = (
    "-q", "-F", "-t", "ext4", "-m", "0", "-i", "8192",
    "-O", "^has_journal,^resize_inode",
    "-E", "lazy_itable_init=1,nodiscard",
)  # fmt: skip
# `loop` makes mount(8) attach a free loop device with autoclear, so unmounting
# detaches it; `discard` gives deleted files' blocks back to the host's disk;
# `noinit_itable`: no background thread zeroing inode tables a fresh sparse image
# already reads as zeros.
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,discard,noinit_itable"
COMMAND_TIMEOUT = 30.0
PROBE_SIZE = 16 * 1024 * 1024
LOOP_SET_DIRECT_IO = 0x4C08  # linux/loop.h


@dataclass(frozen=True)
class SessionStorage:
    """One session's writable storage: its working directory, its /tmp and its home.

    All three live under `root`, which a provider may make a size-capped disk of its
    own (see `StorageProvider.prepare`), so they share one cap.
    """

    root: Path
    mounts: tuple[VolumeMount, ...] = ()
    """Volumes every kernel launched on this storage mounts (kernels/volumes.py): a restart,
    a resume from hibernation and an E2B context see the same ones."""

    @property
    def files(self) -> Path:
        """The working directory (/home/user in a container, also named /workspace); what
        the file API serves."""
        return self.root / "files"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def home(self) -> Path:
        return self.root / "home"


def make_storage_dirs(storage: SessionStorage, owner: tuple[int, int] | None) -> None:
    """Create the working directory, /tmp and home, owned by the kernel's user.

    The working directory and home are private (0700); /tmp is 1777 as everywhere.
    """
    for path, mode in ((storage.files, 0o700), (storage.tmp, 0o1777), (storage.home, 0o700)):
        path.mkdir(mode=0o700, exist_ok=True)
        if owner is not None:
            os.chown(path, *owner)
        os.chmod(path, mode)


def unpack_seed(seed: Path, folder: Path, owner: tuple[int, int] | None) -> None:
    """Unpack `seed` (a tar of a template image's working directory, its entries under
    `workspace/`) into a new session's `folder`, owned by the kernel's user.

    The tar is made from an image a user built, so it is read with tarfile's `data` filter:
    no absolute paths, nothing outside `folder`, no devices, no links leaving it, no setuid."""
    with tarfile.open(seed) as tar:
        members = []
        for member in tar.getmembers():
            name = member.name.split("/", 1)[1] if "/" in member.name else ""
            if not name:
                continue
            member.name = name
            members.append(member)
        tar.extractall(folder, members=members, filter="data")
    if owner is not None:
        for root, dirs, files in os.walk(folder):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), *owner)


CARRIED = ("files", "tmp", "home")
"""A storage's folders a kernel sees (its working directory, /tmp and home)."""


def carry(carrier: SessionStorage, storage: SessionStorage) -> None:
    """Mount `storage`'s folders over `carrier`'s: a kernel started on `carrier`, whose binds
    receive mounts made below its storage's root, works on `storage` from now on.

    All or nothing: on failure the mounts made are undone, and the error raised."""
    done: list[Path] = []
    try:
        for name in CARRIED:
            point = carrier.root / name
            run_command("mount", "--bind", str(storage.root / name), str(point))
            done.append(point)
    except BaseException:
        for point in reversed(done):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                unmount(point)
        raise


def share(root: Path) -> None:
    """Make the disk mounted at `root` a shared mount, if it is not one yet (disks made before
    `prepare` made them shared: a kernel's binds that receive mounts need it)."""
    point = str(root.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split(" - ", 1)[0].split()
        if len(fields) > 4 and _unescape(fields[4]) == point:
            if not any(f.startswith("shared:") for f in fields[6:]):
                run_command("mount", "--make-shared", point)
            return


def uncarry(carrier: SessionStorage) -> None:
    """Undo `carry`: unmount what was mounted over `carrier`'s folders (none: nothing)."""
    mounted = set(mounts_under(carrier.root))
    for name in CARRIED:
        point = carrier.root / name
        if str(point.resolve()) in mounted:
            unmount(point)


def mounts_under(folder: Path) -> list[str]:
    """Mount points below `folder` (such as session disks), as /proc/self/mounts lists them."""
    prefix = str(folder.resolve()) + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [
        _unescape(fields[1]) for fields in (line.split() for line in lines) if len(fields) > 1
    ]
    return [p for p in points if p.startswith(prefix)]


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def image_path(root: Path) -> Path:
    """Where a session's disk image lives: beside its root, never inside it."""
    return root.with_name(root.name + ".img")


class StorageProvider(abc.ABC):
    """Makes an empty folder a session's storage, and undoes it."""

    name: ClassVar[str]
    capped: ClassVar[bool]
    """Whether files, /tmp and home share a hard size cap on disk."""

    def __init__(self, size: int) -> None:
        self.size = size

    @abc.abstractmethod
    def describe(self) -> str:
        """A few words for the startup log."""

    @abc.abstractmethod
    def prepare(self, root: Path, owner: tuple[int, int] | None) -> SessionStorage:
        """Make `root` a session's storage; raise `KernelUnavailable` leaving nothing behind."""

    def release(self, root: Path) -> None:  # noqa: B027 - plain folders need nothing
        """Undo `prepare` (also a partial or a cancelled one) before `root` is removed."""


class PlainStorage(StorageProvider):
    """Plain folders on the host's disk: no cap (the fallback when loop disks fail)."""

    name = "plain"
    capped = False

    def describe(self) -> str:
        return "plain folders on the host's disk, uncapped"

    def prepare(self, root: Path, owner: tuple[int, int] | None) -> SessionStorage:
        storage = SessionStorage(root)
        try:
            make_storage_dirs(storage, owner)
        except OSError as exc:
            raise KernelUnavailable(f"could not create a session's folders: {exc}") from exc
        return storage


class LoopStorage(StorageProvider):
    """A sparse ext4 image per session, loop-mounted at its root: one hard cap, on disk."""

    name = "loop"
    capped = True
    direct_io = True

    def describe(self) -> str:
        return f"its own ext4 disk, capped at {_size(self.size)} in all (disk, not memory)"

    def prepare(self, root: Path, owner: tuple[int, int] | None) -> SessionStorage:
        image = image_path(root)
        try:
            make_image(image, self.size, MKFS_OPTIONS)
            run_command("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(root))
            # Shared: mounts made below it later reach the kernel's container (its binds
            # receive them), which is how a warm kernel takes up a hibernated session's disk.
            run_command("mount", "--make-shared", str(root))
            if self.direct_io:
                set_direct_io(root)
            storage = SessionStorage(root)
            make_storage_dirs(storage, owner)
        except (OSError, subprocess.SubprocessError) as exc:
            with contextlib.suppress(Exception):
                self.release(root)
            raise KernelUnavailable(f"could not prepare a session's disk: {_reason(exc)}") from exc
        return storage

    def release(self, root: Path) -> None:
        image = image_path(root)
        backing_file = image.resolve()  # as the kernel names it
        try:
            if os.path.ismount(root):
                unmount(root)
            for device in loop_devices_of(lambda backing: backing == backing_file):
                detach(device, backing_file)  # left attached only when a mount failed half-way
        finally:
            image.unlink(missing_ok=True)  # an attached loop keeps its own reference


def choose_provider(size: int, scratch: Path) -> StorageProvider:
    """`loop` when the gateway is root and a probe disk mounts in `scratch`; else `plain`.

    `scratch` is an empty folder where the images will live (beside session roots);
    the probe mounts, writes and releases one small disk there, then removes it.
    """
    reason: str | None = "the gateway is not root (mounting a disk per session needs root)"
    if os.geteuid() == 0:
        reason = _probe(scratch)
        if reason is None:
            kind = _filesystem_type(scratch)
            if kind in ("tmpfs", "ramfs"):  # XDG_RUNTIME_DIR usually is
                logger.warning(
                    "\n%s\nWARNING: the runtime dir is on %s, so each session's disk image "
                    "lives in memory: a cell that fills its disk uses host memory.\nPass "
                    "--runtime-dir (KG_RUNTIME_DIR) on a disk, such as /var/lib/kernel-gateway."
                    "\n%s",
                    "!" * 78,
                    kind,
                    "!" * 78,
                )
            return LoopStorage(size)
    logger.warning(
        "\n%s\nWARNING: session storage is NOT size-capped: %s.\nSessions get plain folders "
        "on the host's disk, so one cell can fill it. A capped disk per session needs a "
        "root gateway, loop devices and mkfs.ext4.\n%s",
        "!" * 78,
        reason,
        "!" * 78,
    )
    return PlainStorage(size)


def _probe(scratch: Path) -> str | None:
    """Why a loop disk cannot be made in `scratch`, or None when it can."""
    root = scratch / "probe"
    provider = LoopStorage(PROBE_SIZE)
    try:
        root.mkdir(mode=0o700)
        storage = provider.prepare(root, None)
        (storage.files / "probe").write_bytes(b"ok")
    except (OSError, KernelUnavailable) as exc:
        return f"a probe disk failed ({_reason(exc)})"
    finally:
        with contextlib.suppress(Exception):
            provider.release(root)
        shutil.rmtree(root, ignore_errors=True)
    return None


def reclaim(folder: Path) -> None:
    """Unmount every disk below `folder` and detach its loop devices: a dead gateway's leftovers.

    Loop devices are found by their backing file, so one whose mount is already gone
    (or never happened) is detached too.
    """
    for point in sorted(mounts_under(folder), key=len, reverse=True):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            unmount(Path(point))
    prefix = str(folder.resolve()) + "/"
    for device in loop_devices_of(lambda backing: str(backing).startswith(prefix)):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            detach(device)


def unmount(point: Path) -> None:
    """Unmount, lazily if something still holds it open (autoclear frees the loop after)."""
    result = subprocess.run(
        ["umount", str(point)], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    if result.returncode != 0:
        logger.warning("umount %s failed (%s); detaching lazily", point, result.stderr.strip())
        run_command("umount", "-l", str(point))


def set_direct_io(root: Path) -> None:
    """Let the loop device behind `root` bypass the host's page cache (best effort).

    Without it every written page is cached twice: once in the session's filesystem
    and once more as a page of the image file on the host. Direct I/O keeps one
    copy. It costs about 20 ms more setup (off the acquisition path); filling 1 GiB
    took as long either way, within noise (bench/storage.py --fill).
    """
    dev = os.stat(root).st_dev
    name = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve().name
    if not name.startswith("loop"):
        return
    try:
        fd = os.open(f"/dev/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.ioctl(fd, LOOP_SET_DIRECT_IO, 1)
    except OSError as exc:  # a backing filesystem without O_DIRECT (tmpfs): cached
        logger.debug("no direct I/O for %s: %s", name, exc)
    finally:
        os.close(fd)


def detach(device: str, backing: Path | None = None) -> None:
    """Detach a loop device; one that autoclear detached meanwhile is fine.

    Right after an unmount the kernel may still list the device as attached and
    then free it while `losetup -d` runs, which then fails with ENXIO; and a device
    freed so is at once free for another session's disk. So a failure counts only if
    the device is still attached to `backing` (to anything, when no backing is given).
    """
    try:
        run_command("losetup", "-d", device)
    except OSError:
        if attached(device, backing):
            raise


def attached(device: str, backing: Path | None = None) -> bool:
    """Whether the loop device is attached (to `backing`, when given)."""
    name = device.removeprefix("/dev/")
    try:
        found = Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
    except OSError:
        return False
    return backing is None or Path(found.removesuffix(" (deleted)")) == backing


def loop_devices_of(match: Callable[[Path], bool]) -> list[str]:
    """Attached loop devices whose backing file satisfies `match` (from /sys, no subprocess)."""
    found = []
    for entry in Path("/sys/block").glob("loop*"):
        try:
            backing = (entry / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue  # not attached
        backing = backing.removesuffix(" (deleted)")
        if match(Path(backing)):
            found.append(f"/dev/{entry.name}")
    return found


HELD_BACK = ".held-back"
"""A file on a session's disk, beside the folders its kernel sees, whose blocks keep the disk
down to an API key's smaller size (`cap_disk`)."""


def cap_disk(root: Path, size: int) -> bool:
    """Let the session's disk at `root` hold at most about `size` bytes of its files (an API
    key's smaller disk): the rest is allocated to a file of root's beside the folders the
    kernel sees (`HELD_BACK`; allocated, never written: the image stays sparse). False where
    `root` is no disk of its own (plain folders: nothing to cap). Raises OSError when it
    could not be done."""
    if not image_path(root).exists() or not os.path.ismount(root):
        return False
    found = os.statvfs(root)
    held = held_back(root)
    used = (found.f_blocks - found.f_bfree) * found.f_frsize - held
    # What it may still write (ext4 keeps a few MB of its own out of that) plus what it
    # holds comes to `size`.
    extra = found.f_bavail * found.f_frsize - max(size - used, 0)
    if extra <= 0:
        return True
    fd = os.open(root / HELD_BACK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o000)
    try:
        os.posix_fallocate(fd, 0, held + extra)
    finally:
        os.close(fd)
    return True


def held_back(root: Path) -> int:
    """The bytes `cap_disk` keeps from the session's disk at `root` (0: none)."""
    try:
        return os.stat(root / HELD_BACK).st_blocks * 512
    except OSError:
        return 0


def make_image(image: Path, size: int, mkfs_options: tuple[str, ...]) -> None:
    """A new sparse file of `size` bytes (disk is used as files are written), made ext4."""
    fd = os.open(image, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    run_command("mkfs.ext4", *mkfs_options, str(image))


def run_command(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if result.returncode != 0:
        message = result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}"
        raise OSError(errno.EIO, f"{argv[0]}: {message}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KernelUnavailable):
        return exc.message
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.strerror}: {exc.filename}"
    return str(exc) or type(exc).__name__


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} bytes"


def _filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path` (longest mount point that prefixes it)."""
    best, kind = "", ""
    target = str(path.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2:
                point = _unescape(fields[1])
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    return kind
