"""A session's working directory: safe file access and change detection.

The kernel's code controls this folder and may race us: swap a directory for a
symlink between a check and an open. So no path string is ever resolved here.
Every access walks from the workspace's own directory fd, one component at a
time, with O_NOFOLLOW, so a symlink anywhere on the way is refused, never
followed, and nothing outside the workspace is read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mimetypes
import os
import secrets
import stat
from collections.abc import AsyncIterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from kernel_gateway.errors import BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge
from kernel_gateway.shapes.paths import split_path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_SCAN_ENTRIES = 10_000
IGNORED_DIRS = frozenset({"__pycache__", ".ipynb_checkpoints"})
INLINE_IMAGE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"}
)

mimetypes.add_type("image/webp", ".webp")
mimetypes.add_type("text/markdown", ".md")
mimetypes.add_type("application/vnd.apache.parquet", ".parquet")

METADATA_PREFIX = "user.e2b."
"""A file's metadata (E2B's): each key an extended attribute `user.e2b.<key>`, so what
the code in the sandbox sets with `setxattr` is metadata too."""
MAX_METADATA_BYTES = 3072
"""Keys and values of one file together (ext4 keeps a file's attributes in one block)."""

# What a file looked like at a scan: (size, mtime_ns, ctime_ns, inode).
FileState = tuple[int, int, int, int]
Snapshot = dict[str, FileState]


@dataclass(frozen=True)
class Entry:
    """A file, folder or symlink in the workspace, as `stat` saw it (links not followed)."""

    path: str
    """Relative to the workspace; "" for the workspace itself."""
    kind: str
    """`file`, `dir`, `symlink`, or `other`."""
    size: int
    mode: int
    modified: float
    link_target: str | None = None
    uid: int = 0
    gid: int = 0
    accessed: float = 0.0
    changed: float = 0.0
    """Its inode's last change (ctime)."""
    inode: int = 0


def _entry(rel: str, info: os.stat_result, target: str | None = None) -> Entry:
    return Entry(
        rel,
        _kind(info.st_mode),
        info.st_size,
        stat.S_IMODE(info.st_mode),
        info.st_mtime,
        target,
        info.st_uid,
        info.st_gid,
        info.st_atime,
        info.st_ctime,
        info.st_ino,
    )


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int
    modified: float

    @property
    def mime(self) -> str:
        return guess_mime(self.path)


def guess_mime(path: str) -> str:
    return mimetypes.guess_type(path, strict=False)[0] or "application/octet-stream"


def file_url(session_id: str, path: str) -> str:
    return f"/sessions/{session_id}/files/{quote(path)}"


def _translate_oserror(exc: OSError, path: str) -> Exception:
    if exc.errno == errno.ENOENT:
        return NotFound(f"no file {path!r} in the session's workspace")
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return Forbidden(f"{path!r} is or passes through a symlink; symlinks are not followed")
    if exc.errno == errno.ENOTDIR:
        return NotFound(f"no file {path!r}: a folder on its way is a file")
    if exc.errno == errno.EISDIR:
        return Conflict(f"{path!r} is a folder, not a file")
    if exc.errno == errno.ENAMETOOLONG:
        return BadRequest("file name too long")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return PayloadTooLarge("the workspace is full")
    return Forbidden(f"cannot access {path!r}: {exc.strerror}")


class Workspace:
    def __init__(self, root: Path, owner: tuple[int, int] | None = None) -> None:
        self.root = root
        self.owner = owner
        """uid/gid that kernels run as, given to what the gateway writes (None: keep ours)."""

    # -- safe access -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _parent_dir(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """An fd of the directory holding the last part, reached without following links."""
        fd = os.open(self.root, DIR_FLAGS)
        try:
            for name in parts[:-1]:
                try:
                    next_fd = os.open(name, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if self.owner is not None:
                        os.chown(name, *self.owner, dir_fd=fd, follow_symlinks=False)
                    next_fd = os.open(name, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    def open_read(self, raw_path: str) -> tuple[int, os.stat_result]:
        """An fd open for reading on a regular file, and its stat. The caller closes it."""
        parts = split_path(raw_path)
        try:
            with self._parent_dir(parts) as dir_fd:
                # O_NONBLOCK: a FIFO the user made must not hold a thread until a writer
                # comes (it is refused below); on a regular file it changes nothing.
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                fd = os.open(parts[-1], flags, dir_fd=dir_fd)
        except OSError as exc:
            raise _translate_oserror(exc, raw_path) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise NotFound(f"{raw_path!r} is not a regular file")
        return fd, info

    def read_bytes(self, raw_path: str, limit: int) -> bytes | None:
        """The file's bytes, or None if it is larger than `limit`."""
        fd, info = self.open_read(raw_path)
        with os.fdopen(fd, "rb") as f:
            if info.st_size > limit:
                return None
            data = f.read(limit + 1)
        return data if len(data) <= limit else None

    def begin_upload(
        self, raw_path: str, limit: int, metadata: Mapping[str, str] | None = None
    ) -> Upload:
        """Start writing a file; bytes go to a temporary name until `commit()`. The new
        file has `metadata` and no other (what an overwritten file had is gone)."""
        if metadata:
            check_metadata(metadata)
        parts = split_path(raw_path)
        try:
            with self._parent_dir(parts, create=True) as parent_fd:
                dir_fd = os.dup(parent_fd)
        except OSError as exc:
            raise _translate_oserror(exc, raw_path) from None
        try:
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    raise Conflict(f"{raw_path!r} is a folder, not a file")
                if stat.S_ISLNK(info.st_mode):
                    raise Forbidden(f"{raw_path!r} is a symlink; symlinks are not followed")
            tmp = f".upload-{secrets.token_hex(8)}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
        except BaseException as exc:
            os.close(dir_fd)
            if isinstance(exc, OSError):
                raise _translate_oserror(exc, raw_path) from None
            raise
        return Upload(self, "/".join(parts), dir_fd, tmp, fd, limit, dict(metadata or {}))

    def delete(self, raw_path: str) -> None:
        parts = split_path(raw_path)
        try:
            with self._parent_dir(parts) as dir_fd:
                info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    raise Conflict(f"{raw_path!r} is a folder, not a file")
                os.unlink(parts[-1], dir_fd=dir_fd)
        except OSError as exc:
            raise _translate_oserror(exc, raw_path) from None

    # -- folders (E2B's filesystem service) ---------------------------------------------------

    def entry(self, raw_path: str) -> Entry:
        """What is at `raw_path` ("" for the workspace itself); NotFound if nothing."""
        if raw_path.strip("/") in ("", "."):
            try:
                return _entry("", os.stat(self.root, follow_symlinks=False))
            except OSError as exc:  # the workspace itself is gone (its session ended)
                raise _translate_oserror(exc, raw_path or ".") from None
        parts = split_path(raw_path)
        try:
            with self._parent_dir(parts) as dir_fd:
                return self._entry_at(dir_fd, parts[-1], "/".join(parts))
        except OSError as exc:
            raise _translate_oserror(exc, raw_path) from None

    def metadata(self, entry: Entry) -> dict[str, str] | None:
        """The metadata of a file or folder (its `user.e2b.*` attributes), None if it has
        none or is neither (a symlink is not followed; what cannot be read is none)."""
        if entry.kind not in ("file", "dir") or not entry.path:
            return None
        parts = split_path(entry.path)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            with self._parent_dir(parts) as dir_fd:
                fd = os.open(parts[-1], flags, dir_fd=dir_fd)
            try:
                if os.fstat(fd).st_ino != entry.inode and entry.inode:
                    return None  # replaced since it was listed
                found = {
                    name[len(METADATA_PREFIX) :]: os.getxattr(fd, name).decode(errors="replace")
                    for name in os.listxattr(fd)
                    if name.startswith(METADATA_PREFIX) and len(name) > len(METADATA_PREFIX)
                }
            finally:
                os.close(fd)
        except OSError:
            return None
        return found or None

    @staticmethod
    def _entry_at(dir_fd: int, name: str, rel: str) -> Entry:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(info.st_mode) else None
        return _entry(rel, info, target)

    def list_dir(self, raw_path: str, depth: int = 1) -> list[Entry]:
        """The entries under a folder, `depth` levels down (links listed, not followed)."""
        top = self.entry(raw_path)
        if top.kind != "dir":
            raise BadRequest(f"{raw_path!r} is not a folder")
        out: list[Entry] = []
        stack = [(top.path, split_path(top.path) if top.path else [], 1)]
        while stack and len(out) < MAX_SCAN_ENTRIES:
            rel, parts, level = stack.pop()
            try:
                with self._dir(parts) as fd:
                    names = sorted(os.listdir(fd))
                    for name in names:
                        child = f"{rel}/{name}" if rel else name
                        try:
                            found = self._entry_at(fd, name, child)
                        except OSError:
                            continue
                        out.append(found)
                        if found.kind == "dir" and level < depth:
                            stack.append((child, [*parts, name], level + 1))
            except OSError as exc:
                raise _translate_oserror(exc, rel or ".") from None
        return out

    @contextlib.contextmanager
    def _dir(self, parts: list[str]) -> Iterator[int]:
        """An fd of the folder `parts` itself (the workspace for []), links refused."""
        if not parts:
            fd = os.open(self.root, DIR_FLAGS)
            try:
                yield fd
            finally:
                os.close(fd)
            return
        with self._parent_dir(parts) as parent:
            fd = os.open(parts[-1], DIR_FLAGS, dir_fd=parent)
        try:
            yield fd
        finally:
            os.close(fd)

    def make_dir(self, raw_path: str) -> bool:
        """Make a folder and its parents; False if it was already there."""
        parts = split_path(raw_path)
        try:
            with self._parent_dir(parts, create=True) as dir_fd:
                try:
                    os.mkdir(parts[-1], 0o755, dir_fd=dir_fd)
                except FileExistsError:
                    info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
                    if not stat.S_ISDIR(info.st_mode):
                        raise Conflict(f"{raw_path!r} exists and is not a folder") from None
                    return False
                if self.owner is not None:
                    os.chown(parts[-1], *self.owner, dir_fd=dir_fd, follow_symlinks=False)
                return True
        except OSError as exc:
            raise _translate_oserror(exc, raw_path) from None

    def move(self, source: str, destination: str) -> None:
        """Rename a file or folder (to a new parent too, made if missing)."""
        src, dst = split_path(source), split_path(destination)
        if dst[: len(src)] == src:
            raise BadRequest(f"cannot move {source!r} into itself")
        try:
            with self._parent_dir(src) as src_fd, self._parent_dir(dst, create=True) as dst_fd:
                os.stat(src[-1], dir_fd=src_fd, follow_symlinks=False)
                os.rename(src[-1], dst[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        except OSError as exc:
            raise _translate_oserror(exc, source) from None

    def remove(self, raw_path: str) -> None:
        """Remove a file, a symlink (not what it points to) or a folder with all it holds."""
        parts = split_path(raw_path)
        try:
            with self._parent_dir(parts) as dir_fd:
                info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    _remove_tree(dir_fd, parts[-1])
                else:
                    os.unlink(parts[-1], dir_fd=dir_fd)
        except OSError as exc:
            raise _translate_oserror(exc, raw_path) from None

    # -- listing and change detection --------------------------------------------------------

    def scan(self) -> tuple[Snapshot, dict[str, float]]:
        """Every regular file (not following links), with its state and mtime."""
        snapshot: Snapshot = {}
        mtimes: dict[str, float] = {}
        stack = [("", self.root)]
        seen = 0
        while stack and seen < MAX_SCAN_ENTRIES:
            prefix, path = stack.pop()
            try:
                with os.scandir(path) as iterator:
                    entries = list(iterator)
            except OSError:
                continue
            for entry in entries:
                seen += 1
                rel = prefix + entry.name
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    if entry.name not in IGNORED_DIRS:
                        stack.append((rel + "/", Path(entry.path)))
                elif stat.S_ISREG(info.st_mode) and not entry.name.startswith(".upload-"):
                    snapshot[rel] = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
                    mtimes[rel] = info.st_mtime
        return snapshot, mtimes

    def list(self) -> list[FileInfo]:
        snapshot, mtimes = self.scan()
        return [FileInfo(p, s[0], mtimes[p]) for p, s in sorted(snapshot.items())]

    def state_of(self, raw_path: str) -> FileState | None:
        parts = split_path(raw_path)
        try:
            with self._parent_dir(parts) as dir_fd:
                info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


class Upload:
    """A file being written: `write()` chunks, then `commit()` or `abort()`.

    The parent directory stays pinned by its fd, so the final rename lands in
    the directory that was checked even if the kernel moves things meanwhile.
    Past the limit the temporary file is removed and nothing is left behind.
    """

    def __init__(
        self,
        workspace: Workspace,
        path: str,
        dir_fd: int,
        tmp: str,
        fd: int,
        limit: int,
        metadata: dict[str, str],
    ) -> None:
        self.path = path
        self.metadata = metadata
        self._workspace = workspace
        self._dir_fd = dir_fd
        self._tmp = tmp
        self._fd = fd
        self._limit = limit
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self._limit:
            self.abort()
            raise PayloadTooLarge(f"uploads are limited to {self._limit} bytes")
        try:
            room = os.fstatvfs(self._fd)
        except OSError:
            room = None
        # What the kernel's user could write (the gateway writes as root, which may use
        # blocks a file system keeps for root): an upload fills the disk no further.
        if room is not None and len(chunk) > room.f_bavail * room.f_frsize:
            self.abort()
            raise PayloadTooLarge("the workspace is full")
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self.abort()
            raise _translate_oserror(exc, self.path) from None

    def commit(self) -> FileInfo:
        name = self.path.rsplit("/", 1)[-1]
        try:
            for key, value in self.metadata.items():
                os.setxattr(self._fd, METADATA_PREFIX + key, value.encode())
            os.close(self._fd)
            self._fd = -1
            owner = self._workspace.owner
            if owner is not None:
                os.chown(self._tmp, *owner, dir_fd=self._dir_fd, follow_symlinks=False)
            os.rename(self._tmp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            info = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except OSError as exc:
            self.abort()
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP) and self.metadata:
                raise BadRequest(
                    "this sandbox's file system keeps no extended attributes: the file's "
                    "metadata cannot be stored"
                ) from None
            if exc.errno == errno.ENOSPC and self.metadata:
                raise BadRequest("the file's metadata is too large to store") from None
            raise _translate_oserror(exc, self.path) from None
        os.close(self._dir_fd)
        self._dir_fd = -1
        return FileInfo(self.path, info.st_size, info.st_mtime)

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp, dir_fd=self._dir_fd)
            os.close(self._dir_fd)
            self._dir_fd = -1


def check_metadata(metadata: Mapping[str, str]) -> None:
    """BadRequest unless each key is a non-empty HTTP token and each value printable ASCII,
    all of it within MAX_METADATA_BYTES."""
    size = 0
    for key, value in metadata.items():
        if (
            not key
            or not all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in key)
            or not (key.isascii())
        ):
            raise BadRequest(
                f"metadata key {key!r} is not a token (letters, digits, !#$%&'*+-.^_`|~)"
            )
        if not value.isascii() or not value.isprintable():
            raise BadRequest(f"metadata value of {key!r} is not printable ASCII")
        size += len(METADATA_PREFIX) + len(key) + len(value)
    if size > MAX_METADATA_BYTES:
        raise BadRequest(f"a file's metadata is limited to {MAX_METADATA_BYTES} bytes")


def _remove_tree(parent_fd: int, name: str) -> None:
    """Remove the folder `name` under `parent_fd` and everything in it, by fds: a symlink
    in the tree is unlinked, never followed."""
    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        for child in os.listdir(fd):
            info = os.stat(child, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                _remove_tree(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def changed_files(before: Snapshot, after: Snapshot) -> list[str]:
    """Paths created or modified between two scans, in a stable order."""
    return sorted(p for p, state in after.items() if before.get(p) != state)


def iso_time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


async def write_stream(
    workspace: Workspace,
    path: str,
    chunks: AsyncIterable[bytes],
    limit: int,
    metadata: Mapping[str, str] | None = None,
) -> FileInfo:
    """Write a file from a stream of chunks, atomically (each step in a thread); nothing is
    left on failure. A session's uploads and a volume's (ours and E2B's) alike."""
    pending = await asyncio.to_thread(workspace.begin_upload, path, limit, metadata)
    try:
        async for chunk in chunks:
            if chunk:
                await asyncio.to_thread(pending.write, chunk)
        return await asyncio.to_thread(pending.commit)
    except BaseException:
        await asyncio.to_thread(pending.abort)
        raise
