"""A sandbox's files as one archive: written and unpacked inside the sandbox, by `tar` run
beside the kernel as the kernel's user (`KernelProcess.run_command`).

The gateway never reads or writes a session's files with its own rights here: the archive
is made in the kernel's handover folder by a process that can read only what the session
could, and is kept by the gateway without following links (`hibernation.keep`); it is given
back to a new sandbox as a read-only link, unpacked there by that sandbox's user. What the
archive holds are the folders the backend names (`KernelProcess.sandbox_folders`: the
working directory, /tmp and home), but for the kernel's own history database.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import STDERR, Command
from kernel_gateway.kernels.hibernation import SnapshotError, give, keep, take_back
from kernel_gateway.kernels.kernel import Kernel

EXCLUDED = ("home/sandbox/.ipython",)
"""Left out of an archive: the running kernel's own files (IPython's history database is
open, and a restored kernel has its own; hibernation restores `In`/`Out` itself)."""
ARCHIVE = (
    'target="$1"; shift; cd / && find -H "$@" -xdev -mindepth 1 '
    + " ".join(f"-path {pattern} -prune -o" for pattern in EXCLUDED)
    + ' -print0 | tar --create --file="$target" --null --no-recursion --files-from=- '
    "--ignore-failed-read --warning=no-file-changed --warning=no-file-ignored"
)
"""What is in each folder (not the folders themselves: a new sandbox's are its own, with
their owners and modes, and `tar` as its user must not try to change them), on its own file
system, listed by `find` and archived by `tar` one entry each."""
TAR_WARNINGS = 1
"""GNU tar's exit status when a file changed as it was read, or was not a file (a socket):
the archive is made, without it."""
STDERR_KEPT = 2000


def supported(kernel: Kernel) -> str | None:
    """Why this kernel's files cannot be archived, or None when they can."""
    if not kernel.process.sandbox_folders or kernel.process.handover is None:
        return "snapshots and forks need the docker backend (commands beside the kernel)"
    return None


async def archive(kernel: Kernel, target: Path, seconds: float) -> tuple[int, str]:
    """Write the sandbox's folders to `target` (a new file of the gateway's, 0444): its size,
    and what `find` and `tar` said of files they could not keep (a name too long, a file
    the user cannot read: left out, the rest kept). SnapshotError says why not at all (past
    `seconds`, the archiver is killed)."""
    _, inside = _handover(kernel)
    name = f"files-{secrets.token_hex(8)}.tar"
    folders = [folder.lstrip("/") for folder in kernel.process.sandbox_folders]
    argv = ["sh", "-c", ARCHIVE, "sh", f"{inside}/{name}", *folders]
    try:
        said = await _run(kernel, argv, seconds, "writing the session's files")
        return await keep(kernel, name, target, mode=0o444), said
    finally:
        with contextlib.suppress(OSError, SnapshotError):
            host, _ = _handover(kernel)
            await asyncio.shield(asyncio.to_thread(_unlink_quietly, host / name))


async def unpack(kernel: Kernel, source: Path, seconds: float) -> None:
    """Make the sandbox's working directory what `source` (an `archive`) holds, and add its
    /tmp and home files: the working directory is emptied first, so a file removed before
    the archive was made stays removed. SnapshotError says why not."""
    name, inside = await give(kernel, source)
    working = kernel.process.sandbox_folders[0]
    # Volumes mounted below it are left alone (-xdev); their mount points cannot be removed,
    # nor the folders holding them, so find's complaints about those are expected.
    script = 'find -H "$1" -xdev -mindepth 1 -delete 2>/dev/null; '
    script += 'exec tar --extract --file="$2" --directory=/ '
    script += "--preserve-permissions --no-same-owner --no-overwrite-dir"
    try:
        said = await _run(kernel, ["sh", "-c", script, "sh", working, inside], seconds, "unpacking")
        if said:  # tar ended with warnings only: something was not put back
            raise SnapshotError(f"unpacking: {said[:STDERR_KEPT]}")
    finally:
        await take_back(kernel, name)


async def _run(kernel: Kernel, argv: list[str], seconds: float, doing: str) -> str:
    """Run `argv` beside the kernel within `seconds`: what it said on stderr (it succeeded,
    or ended with GNU tar's warnings status), else SnapshotError."""
    try:
        command = await kernel.process.run_command(argv, {}, "/", stdin=False)
    except KernelUnavailable as exc:
        raise SnapshotError(f"{doing}: {exc.message}") from None
    errors = bytearray()
    try:
        async with asyncio.timeout(seconds):
            async for stream, data in command.output():
                if stream == STDERR and len(errors) < STDERR_KEPT:
                    errors += data[: STDERR_KEPT - len(errors)]
            status = await command.wait()
    except TimeoutError:
        await _kill(command)
        raise SnapshotError(f"{doing} did not finish within {seconds:g} s") from None
    except BaseException:
        await _kill(command)
        raise
    said = errors.decode(errors="replace").strip()
    if status > TAR_WARNINGS:
        raise SnapshotError(f"{doing} failed: {said or f'exit status {status}'}")
    return said


async def _kill(command: Command) -> None:
    with contextlib.suppress(Exception):
        await asyncio.shield(command.kill())


def _handover(kernel: Kernel) -> tuple[Path, str]:
    handover = kernel.process.handover
    if handover is None:
        raise SnapshotError("this backend's kernels have no folder for files")
    return handover


def _unlink_quietly(path: Path) -> None:
    path.unlink(missing_ok=True)  # a name in the kernel's folder: unlink never follows it
