"""envd's file calls on paths outside `/home/user` (`/tmp`, `/etc`, `/proc`...), served by
commands in the sandbox itself.

The gateway reaches a session's workspace from the host, but the rest of the sandbox's file
system is the container's own (its image, its tmpfs, gVisor's `/proc`): a read of
`/proc/sys/kernel/random/boot_id` must be what the code inside would read. So each call
runs coreutils in the sandbox's container, as the sandbox's user (`docker exec`, the same
way as the process service's commands): the container's permissions decide, and nothing
the host has is in reach. Output is capped (`limit`), and each call has `CALL_SECONDS`.

File metadata is kept for files under `/home/user` only; a watch outside it is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
from collections.abc import AsyncIterable
from datetime import UTC, datetime
from typing import Any

from kernel_gateway.errors import GatewayError, KernelUnavailable, PayloadTooLarge
from kernel_gateway.kernels.backends.base import STDOUT
from kernel_gateway.protocols.e2b.connect import ConnectError, field
from kernel_gateway.protocols.e2b.envd_entries import HOME, REVIVAL_WAIT, permissions
from kernel_gateway.sessions.session import Session

CALL_SECONDS = 60.0
FIELDS = "%y\\0%m\\0%s\\0%T@\\0%U\\0%u\\0%g\\0%p\\0%l\\0"
"""What `find -printf` says of each entry: type, mode, size, mtime, owner's uid, owner,
group, path, link target, each ended by a NUL (a name may hold anything else)."""
COUNT = FIELDS.count("%")
SANDBOX_UID = "1000"
"""The sandbox's user, whom envd (and so the SDKs) call `user` whatever the image names it."""
TYPES = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY", "l": "FILE_TYPE_SYMLINK"}
ERRORS = (
    ("No such file or directory", "not_found"),
    ("Permission denied", "permission_denied"),
    ("Operation not permitted", "permission_denied"),
    ("Read-only file system", "permission_denied"),
    ("File exists", "already_exists"),
    ("Is a directory", "invalid_argument"),
    ("Not a directory", "invalid_argument"),
    ("No space left on device", "resource_exhausted"),
)
MAKE_DIR = (
    'if [ -e "$1" ] || [ -L "$1" ]; then echo "$1: File exists" >&2; exit 17; fi; mkdir -p -- "$1"'
)
WRITE = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
MOVE = 'mkdir -p -- "$(dirname -- "$2")" && mv -T -- "$1" "$2"'


def outside(path: object) -> str | None:
    """`path` as a normalized absolute path when it is outside `/home/user`, else None
    (relative paths and those under `/home/user` are the workspace's)."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return None
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    if normal == HOME or normal.startswith(HOME + "/"):
        return None
    return normal


class Outside:
    """The filesystem calls of one sandbox on paths outside its working directory."""

    def __init__(self, session: Session, limit: int) -> None:
        self._session = session
        self._limit = limit

    # -- envd's HTTP ------------------------------------------------------------------------

    async def read(self, path: str) -> bytes:
        """The file's bytes (at most `limit`: PayloadTooLarge past it)."""
        return await self._run(["cat", "--", path])

    async def write(self, path: str, chunks: AsyncIterable[bytes]) -> dict[str, Any]:
        """Write (or replace) the file, its folders made; its `WriteInfo`."""
        await self._run(["/bin/sh", "-c", WRITE, "kg-write", path], chunks)
        return {"name": posixpath.basename(path), "type": "file", "path": path}

    # -- filesystem.Filesystem ------------------------------------------------------------

    async def call(self, method: str, message: dict[str, Any]) -> dict[str, Any]:
        if method == "Stat":
            return {"entry": await self.stat(_path(message, "path"))}
        if method == "ListDir":
            depth = field(message, "depth") or 1
            if not isinstance(depth, int) or depth < 1:
                raise ConnectError("invalid_argument", "'depth' must be a positive integer")
            return {"entries": await self.list_dir(_path(message, "path"), min(depth, 32))}
        if method == "MakeDir":
            path = _path(message, "path")
            await self._run(["/bin/sh", "-c", MAKE_DIR, "kg-mkdir", path])
            return {"entry": await self.stat(path)}
        if method == "Move":
            source, destination = _path(message, "source"), _path(message, "destination")
            await self._run(["/bin/sh", "-c", MOVE, "kg-move", source, destination])
            return {"entry": await self.stat(destination)}
        if method == "Remove":
            path = _path(message, "path")
            if path == "/":
                raise ConnectError("invalid_argument", "cannot remove /")
            await self._run(["rm", "-rf", "--", path])
            return {}
        raise ConnectError(
            "permission_denied",
            f"{method} is served under {HOME} only (the sandbox's working directory)",
        )

    async def stat(self, path: str) -> dict[str, Any]:
        found = _entries(await self._run(["find", path, "-maxdepth", "0", "-printf", FIELDS]))
        if not found:
            raise ConnectError("not_found", f"{path} not found")
        return found[0]

    async def list_dir(self, path: str, depth: int) -> list[dict[str, Any]]:
        if (await self.stat(path))["type"] != "FILE_TYPE_DIRECTORY":
            raise ConnectError("invalid_argument", f"{path} is not a folder")
        argv = ["find", path, "-mindepth", "1", "-maxdepth", str(depth), "-printf", FIELDS]
        return sorted(_entries(await self._run(argv)), key=lambda e: str(e["path"]))

    # -- one command ------------------------------------------------------------------------

    async def _run(self, argv: list[str], stdin: AsyncIterable[bytes] | None = None) -> bytes:
        """Its stdout; a ConnectError from its stderr when it fails."""
        session = self._session
        if session.hibernated:  # the sandbox's own files are its container's: bring it back
            try:
                await session.resume()
            except GatewayError as exc:
                message = f"the sandbox could not resume: {exc.message}"
                raise ConnectError("unavailable", message) from None
        # A kernel killed from inside (a command's `pkill`) is being replaced: wait for it.
        kernel = await session.slot.live_kernel(REVIVAL_WAIT)
        if kernel is None:
            raise ConnectError("unavailable", "the sandbox's kernel is starting; retry")
        env = {"HOME": HOME, "LC_ALL": "C", "PATH": "/usr/local/bin:/usr/bin:/bin"}
        try:
            command = await kernel.process.run_command(argv, env, "/", stdin is not None)
        except KernelUnavailable as exc:
            raise ConnectError("unavailable", exc.message) from None
        out, err = bytearray(), bytearray()

        async def feed() -> None:
            assert stdin is not None
            with contextlib.suppress(KernelUnavailable):  # it ended: its stderr says why
                async for chunk in stdin:
                    await command.send_stdin(chunk)
            await command.close_stdin()

        ended = False

        async def drain() -> int:
            nonlocal ended
            async for stream, data in command.output():
                target = out if stream == STDOUT else err
                target += data
                if len(out) > self._limit:
                    raise PayloadTooLarge(
                        f"the file is over the download limit ({self._limit} bytes)"
                    )
                del err[4096:]
            status = await command.wait()
            ended = True
            return status

        feeding = asyncio.ensure_future(feed()) if stdin is not None else None
        try:
            status = await asyncio.wait_for(drain(), CALL_SECONDS)
        except TimeoutError:
            raise ConnectError(
                "deadline_exceeded", f"{argv[0]} took over {CALL_SECONDS:g} s"
            ) from None
        finally:
            if feeding is not None:
                feeding.cancel()
                with contextlib.suppress(asyncio.CancelledError, GatewayError):
                    await feeding
            if not ended:
                with contextlib.suppress(GatewayError):
                    await command.kill()
        if status != 0:
            raise _error(err.decode(errors="replace"), status)
        return bytes(out)


def _path(message: dict[str, Any], name: str) -> str:
    path = outside(field(message, name))
    if path is None:  # the other end of a move under /home/user: the same container path
        raw = field(message, name)
        if not isinstance(raw, str) or "\0" in raw:
            raise ConnectError("invalid_argument", f"{raw!r} is not a path")
        path = posixpath.normpath(posixpath.join(HOME, raw))
    return path


def _error(stderr: str, status: int) -> ConnectError:
    for text, code in ERRORS:
        if text in stderr:
            return ConnectError(code, stderr.strip().splitlines()[-1][:500])
    return ConnectError("internal", stderr.strip()[:500] or f"the command failed ({status})")


def _entries(raw: bytes) -> list[dict[str, Any]]:
    fields = raw.decode(errors="replace").split("\0")
    out = []
    for at in range(0, len(fields) - COUNT + 1, COUNT):
        kind, mode, size, modified, uid, owner, group, path, target = fields[at : at + COUNT]
        bits = int(mode, 8)
        entry: dict[str, Any] = {
            "name": posixpath.basename(path) or "/",
            "type": TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
            "path": path,
            "size": size,
            "mode": bits,
            "permissions": permissions({"d": "d", "l": "L"}.get(kind, "-"), bits),
            "owner": "user" if uid == SANDBOX_UID else owner,
            "group": "user" if uid == SANDBOX_UID and group == owner else group,
            "modifiedTime": datetime.fromtimestamp(float(modified), UTC)
            .isoformat()
            .replace("+00:00", "Z"),
        }
        if kind == "l":
            entry["symlinkTarget"] = target
            entry["isSymlink"] = True
        out.append(entry)
    return out
