"""Snapshots of Python kernels' namespaces: written by a kernel, kept by the gateway, loaded
into a new kernel (hibernation; docs/hibernation.md).

The kernel writes its snapshot into its handover folder (`KernelProcess.handover`, its
connection folder), with the code of `in_kernel/hibernation.py`. The gateway keeps it in its
own folder (`<runtime>/<instance>/snapshots/`, 0700, each file 0600): opened without
following a link or blocking, checked to be a regular file of one link, and linked in from
that descriptor, so the kernel cannot swap something else in (`take`). To resume, it links
the file into the new kernel's handover folder, readable (not writable) by that kernel,
removes that link after the load, and deletes the snapshot once the resume is recorded. A
snapshot is named by its session's id and only ever given to that session's next kernel.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_gateway.kernels.backends.base import in_kernel_source
from kernel_gateway.kernels.kernel import Kernel, KernelCallFailed, KernelCallTimedOut
from kernel_gateway.shapes.events import LostName

SAVE_GRACE = 10.0
"""Seconds past twice the save limit (the whole save, then the names one by one) before the
gateway stops waiting and interrupts the kernel (a C call the kernel's timer cannot stop)."""
LOAD_SECONDS = 300.0
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SnapshotError(Exception):
    """A snapshot could not be written, taken or loaded: the words say why."""


@dataclass
class Lost:
    """A name the snapshot could not keep, and why."""

    name: str
    reason: str

    def to_json(self) -> LostName:
        return {"name": self.name, "reason": self.reason}


@dataclass
class Saved:
    """What a kernel wrote: how many names, which were left out, the file's size."""

    names: int
    lost: list[Lost] = field(default_factory=list)
    bytes: int = 0


class Snapshots:
    """The gateway's folder of snapshots, one file per hibernated session."""

    def __init__(self, folder: Path, save_seconds: float = 60.0) -> None:
        self.folder = folder
        self.save_seconds = save_seconds
        """How long a kernel may take to write its namespace (`--snapshot-timeout`)."""

    def open(self) -> None:
        """Create the folder, 0700 (blocks)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)

    def path(self, session_id: str) -> Path:
        if not _SAFE_ID.fullmatch(session_id):
            raise ValueError(f"not a session id: {session_id!r}")
        return self.folder / f"{session_id}.snapshot"

    def exists(self, session_id: str) -> bool:
        return self.path(session_id).is_file()

    def size(self, session_id: str) -> int:
        with contextlib.suppress(OSError):
            return self.path(session_id).stat().st_size
        return 0

    def delete(self, session_id: str) -> None:
        """Delete a session's snapshot, and one set aside, if it has them (blocks)."""
        self.path(session_id).unlink(missing_ok=True)
        self.path(session_id).with_suffix(".failed").unlink(missing_ok=True)

    def set_aside(self, session_id: str) -> None:
        """A snapshot no kernel could load: kept beside (`<id>.failed`), for the operator,
        until the session is deleted (blocks)."""
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path(session_id), self.path(session_id).with_suffix(".failed"))

    def ids(self) -> set[str]:
        """The sessions that have a snapshot here, loadable or set aside (blocks)."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return set()
        return {n.rsplit(".", 1)[0] for n in names if n.endswith((".snapshot", ".failed"))}

    # -- a kernel writes one ---------------------------------------------------------------

    async def save(self, kernel: Kernel) -> tuple[Saved, str]:
        """Have `kernel` write its namespace into its handover folder: what it saved, and
        the file's name there (keep it with `take`, or `drop` it)."""
        return await save(kernel, self.save_seconds)

    async def drop(self, kernel: Kernel, name: str) -> None:
        """Delete what `save` wrote (as `name`), unused."""
        await drop(kernel, name)

    async def take(self, kernel: Kernel, name: str, session_id: str) -> None:
        """Keep what `save` wrote (as `name`) as `session_id`'s snapshot, out of the
        kernel's reach (see `keep`)."""
        self.open()
        await keep(kernel, name, self.path(session_id))

    # -- a new kernel loads it -------------------------------------------------------------

    async def load(
        self, kernel: Kernel, session_id: str, devices: dict[str, int] | None = None
    ) -> None:
        """Load `session_id`'s snapshot into `kernel` (a fresh one of that session).

        `devices`: folder in the kernel → the device it must be on, checked before loading.
        The kernel reads a second link of the gateway's file (readable, not writable, by
        it), removed after; the snapshot itself stays until the caller has recorded the
        resume (`delete`). SnapshotError says why it could not be loaded."""
        await load(kernel, self.path(session_id), devices)


async def save(kernel: Kernel, seconds: float) -> tuple[Saved, str]:
    """Have `kernel` write its namespace into its handover folder, in at most about
    `seconds`: what it saved, and the file's name there (`keep` it, or `drop` it)."""
    host, inside = _handover(kernel)
    name = f"snapshot-{secrets.token_hex(8)}"
    call = f"save({str(Path(inside) / name)!r}, {seconds!r})"
    try:
        report = await _run(kernel, call, 2 * seconds + SAVE_GRACE)
    except BaseException as exc:
        if isinstance(exc.__cause__, KernelCallTimedOut):
            await kernel.interrupt()  # stuck where its own timer cannot reach
        with contextlib.suppress(OSError):
            await asyncio.shield(asyncio.to_thread(_unlink_in, host, name))
        raise
    lost = [Lost(str(x["name"]), str(x["reason"])) for x in report.get("lost", [])]
    return Saved(int(report.get("saved", 0)), lost, int(report.get("bytes", 0))), name


async def drop(kernel: Kernel, name: str) -> None:
    """Delete what the kernel wrote as `name` in its handover folder, unused."""
    host, _ = _handover(kernel)
    await asyncio.to_thread(_unlink_in, host, name)


async def keep(kernel: Kernel, name: str, target: Path, mode: int = 0o600) -> int:
    """Keep the file the kernel wrote as `name` in its handover folder as `target` (the
    gateway's, `mode`), out of the kernel's reach: its size. The kernel may still run: the
    file is opened without following a link or blocking on a FIFO, checked to be a plain
    file of one link, made the gateway's through that descriptor, and linked to `target`
    from it (`/proc/self/fd`), so what is kept is the inode checked, whatever the kernel
    does with the name meanwhile."""
    host, _ = _handover(kernel)
    try:
        return await asyncio.to_thread(_take, host, name, target, mode)
    except OSError as exc:
        raise SnapshotError(f"the kernel's file could not be kept: {exc}") from None


async def load(kernel: Kernel, source: Path, devices: dict[str, int] | None = None) -> None:
    """Load the namespace snapshot `source` into `kernel`: see `Snapshots.load`. A file
    already 0444 (a saved snapshot, given to many kernels) stays so."""
    host, inside = _handover(kernel)
    name = f"restore-{secrets.token_hex(8)}"
    try:
        shared = await asyncio.to_thread(_give, source, host, name)
    except OSError as exc:
        raise SnapshotError(f"the snapshot is not there: {exc}") from None
    call = f"restore({str(Path(inside) / name)!r}, {devices or {}!r})"
    try:
        await _run(kernel, call, LOAD_SECONDS)
    finally:
        await asyncio.shield(asyncio.to_thread(_take_back, source, host, name, shared))


async def give(kernel: Kernel, source: Path) -> tuple[str, str]:
    """A read-only link of the gateway's 0444 file `source` in the kernel's handover folder:
    its name there and its path as the kernel sees it (`take_back` it after use)."""
    host, inside = _handover(kernel)
    name = f"give-{secrets.token_hex(8)}"
    try:
        await asyncio.to_thread(_give, source, host, name)
    except OSError as exc:
        raise SnapshotError(f"the file is not there: {exc}") from None
    return name, str(Path(inside) / name)


async def take_back(kernel: Kernel, name: str) -> None:
    """Remove what `give` linked into the kernel's handover folder."""
    host, _ = _handover(kernel)
    with contextlib.suppress(OSError):
        await asyncio.shield(asyncio.to_thread(_unlink_in, host, name))


def _take(host: Path, name: str, target: Path, mode: int) -> int:
    dir_fd = os.open(host, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            raise SnapshotError(f"the kernel's file is not there: {exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                raise SnapshotError("the kernel's file is not a plain file")
            os.fchown(fd, os.geteuid(), os.getegid())
            os.fchmod(fd, mode)
            partial = target.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            _link_open_file(fd, partial)
            os.replace(partial, target)
            return info.st_size
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        os.close(dir_fd)


def _handover(kernel: Kernel) -> tuple[Path, str]:
    handover = kernel.process.handover
    if handover is None:
        raise SnapshotError("this backend's kernels have no folder for snapshots")
    return handover


async def _run(kernel: Kernel, call: str, seconds: float) -> dict[str, Any]:
    """Run `in_kernel/hibernation.py` with `call` in `kernel`, leaving no name behind; its
    JSON report."""
    source = in_kernel_source("hibernation.py").decode()
    code = (
        "(lambda ns: (exec(compile(ns.pop('__source__'), '<kernel-gateway: hibernation>', "
        "'exec'), ns), setattr(__import__('sys'), '_kg_hibernation', "
        f"eval({call!r}, ns))))({{'__name__': 'kg_hibernation', '__source__': {source!r}}})"
    )
    expression = "__import__('sys').__dict__.pop('_kg_hibernation', '')"
    try:
        text = await kernel.evaluate(code, expression, seconds)
        report = json.loads(ast.literal_eval(text))
    except KernelCallFailed as exc:
        raise SnapshotError(str(exc)) from exc
    except (ValueError, SyntaxError) as exc:
        raise SnapshotError(f"the kernel's report is unreadable: {exc}") from None
    if not isinstance(report, dict):
        raise SnapshotError("the kernel's report is unreadable")
    return report


def _give(source: Path, host: Path, name: str) -> bool:
    """A second link of the gateway's snapshot in a kernel's folder, readable by anyone who
    reaches it (the runtime folder is the gateway's alone), writable by no one but the
    gateway. True when it was 0444 already (shared by many kernels: it stays so)."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        shared = stat.S_IMODE(os.fstat(fd).st_mode) == 0o444
        os.fchmod(fd, 0o444)
    finally:
        os.close(fd)
    dir_fd = os.open(host, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(source, name, dst_dir_fd=dir_fd, follow_symlinks=False)
    finally:
        os.close(dir_fd)
    return shared


def _take_back(source: Path, host: Path, name: str, shared: bool) -> None:
    """Undo `_give`: the kernel's link removed, the snapshot private again (unless shared)."""
    with contextlib.suppress(OSError):
        _unlink_in(host, name)
    if shared:
        return
    with contextlib.suppress(OSError):
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def _link_open_file(fd: int, target: Path) -> None:
    """A new name for the file open as `fd` (linkat through `/proc/self/fd`, following the
    magic link: the inode opened, whatever its old name is now)."""
    fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), target, src_dir_fd=fds, follow_symlinks=True)
    finally:
        os.close(fds)


def _unlink_in(host: Path, name: str) -> None:
    dir_fd = os.open(host, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
