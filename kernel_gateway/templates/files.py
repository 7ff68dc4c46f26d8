"""The files COPY steps copy: uploaded tarballs kept by their hash, and what a step takes.

E2B's SDK hashes the files of each COPY step itself (content, modes, paths), asks
`GET /templates/{id}/files/{hash}` whether the gateway has them, and if not uploads a
tar (gzipped or not) of the matching files, with paths relative to its context folder,
to the URL it is given. They are kept under `<runtime-dir>/templates/files/<hash>`; the
hash names them, it is not checked (it covers the client's file metadata, which the tar
does not hold). `copy_archive` then makes, for one COPY step, the tar that puts the
matching files where the step says, owned and moded as it says, with Docker's COPY
rules: a directory's contents are copied, not the directory; several sources, or a
destination ending in `/`, make the destination a folder.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import posixpath
import tarfile
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kernel_gateway.errors import PayloadTooLarge
from kernel_gateway.templates.steps import FILES_HASH


class CopyError(ValueError):
    """A COPY step that cannot be made from its files (the message says why)."""


class FileStore:
    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes

    def open(self) -> None:
        """Make the folder; remove what uploads cut short left."""
        self._make_folder()
        for leftover in self.folder.glob("*.part"):
            leftover.unlink(missing_ok=True)

    def _make_folder(self) -> None:
        self.folder.parent.mkdir(mode=0o700, exist_ok=True)
        self.folder.mkdir(mode=0o700, exist_ok=True)

    def path(self, files_hash: str) -> Path:
        if not FILES_HASH.match(files_hash):
            raise ValueError(f"not a files hash: {files_hash!r}")
        return self.folder / files_hash

    def has(self, files_hash: str) -> bool:
        return self.path(files_hash).is_file()

    def remove(self, files_hash: str) -> None:
        self.path(files_hash).unlink(missing_ok=True)

    def partial(self, files_hash: str) -> Path:
        """Where an upload is written before `commit` names it (so a cut upload is never
        taken for the files)."""
        self._make_folder()  # the first upload makes it
        return self.path(files_hash).with_suffix(".part")

    async def receive(self, files_hash: str, chunks: AsyncIterator[bytes], limit: int) -> int:
        """Write an upload of `files_hash` as it comes, then `commit` it: its size.

        `PayloadTooLarge` past `limit` bytes and `CopyError` for what is not a tar, with
        nothing kept either way."""
        partial = self.partial(files_hash)
        size = 0
        handle = await asyncio.to_thread(partial.open, "wb")
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"the files are over the {limit}-byte limit (--template-upload-max)"
                    )
                await asyncio.to_thread(handle.write, chunk)
        except BaseException:
            await asyncio.to_thread(handle.close)
            partial.unlink(missing_ok=True)
            raise
        await asyncio.to_thread(handle.close)
        await asyncio.to_thread(self.commit, files_hash)
        return size

    def size(self, files_hash: str) -> int:
        try:
            return self.path(files_hash).stat().st_size
        except OSError:
            return 0

    def commit(self, files_hash: str) -> None:
        partial = self.partial(files_hash)
        try:
            with tarfile.open(partial) as tar:  # gzip or not; refuse what is not a tar
                for _ in tar:
                    pass
        except (tarfile.TarError, OSError, EOFError) as exc:
            partial.unlink(missing_ok=True)
            raise CopyError(f"the upload is not a tar archive: {exc}") from exc
        os.replace(partial, self.path(files_hash))


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int


def _matches(path: str, pattern: str) -> bool:
    """Go's filepath.Match, segment by segment (`*` never crosses `/`)."""
    parts, wanted = path.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(
        fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True)
    )


def copy_archive(
    source: Path,
    src: str,
    dest: str,
    workdir: str,
    owner: Owner,
    mode: int | None,
) -> IO[bytes]:
    """A tar to unpack at `/` that does `COPY src dest` from the uploaded files `source`.

    `dest` is relative to `workdir` unless absolute. `CopyError` when nothing matches.
    The result is a temporary file (deleted when closed), positioned at its start.
    """
    pattern = posixpath.normpath(src.strip("/") or ".")
    target = posixpath.normpath(posixpath.join(workdir, dest))
    into_folder = dest.endswith("/") or dest in (".", "./")
    out = tempfile.TemporaryFile()
    try:
        with tarfile.open(source) as tar, tarfile.open(fileobj=out, mode="w") as result:
            members = [m for m in tar.getmembers() if _safe(m)]
            files = {posixpath.normpath(m.name): m for m in members}
            folders = {m for m in files if files[m].isdir()}
            for name in files:  # folders a tar names only through their files
                parts = name.split("/")
                folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
            every = set(files) | folders
            if pattern == ".":  # the whole context: its contents, as a folder's
                roots = [""]
                folders.add("")
            else:
                roots = sorted(n for n in every if _matches(n, pattern))
            if not roots:
                raise CopyError(f"COPY {src}: no uploaded file matches")
            folder_roots = [r for r in roots if r in folders]
            file_roots = [r for r in roots if r not in folders]
            several = len(roots) > 1 or pattern == "." or bool(folder_roots)
            written: set[str] = set()
            for name, member in files.items():
                placed = _place(name, file_roots, folder_roots, target, several or into_folder)
                if placed is None or placed in written:
                    continue
                written.add(placed)
                _add(tar, result, member, placed, owner, mode)
        out.seek(0)
        return out
    except BaseException:
        out.close()
        raise


def _place(
    name: str, file_roots: list[str], folder_roots: list[str], target: str, into_folder: bool
) -> str | None:
    """Where the tar entry `name` goes, or None if the step does not copy it."""
    if name in file_roots:
        return posixpath.join(target, posixpath.basename(name)) if into_folder else target
    for root in folder_roots:
        if root == "":
            return posixpath.join(target, name)
        if name.startswith(root + "/"):  # a folder's contents, not the folder itself
            return posixpath.join(target, name[len(root) + 1 :])
    return None


def _safe(member: tarfile.TarInfo) -> bool:
    name = posixpath.normpath(member.name)
    return not (
        name.startswith(("/", "../")) or name == ".." or member.isdev() or member.islnk()
    ) and (member.isfile() or member.isdir() or member.issym())


def _add(
    tar: tarfile.TarFile,
    result: tarfile.TarFile,
    member: tarfile.TarInfo,
    placed: str,
    owner: Owner,
    mode: int | None,
) -> None:
    info = tarfile.TarInfo(placed.lstrip("/"))
    info.type = member.type
    info.size = member.size if member.isfile() else 0
    info.mode = (mode if mode is not None and member.isfile() else member.mode) & 0o7777
    info.mtime = member.mtime
    info.uid, info.gid = owner.uid, owner.gid
    info.linkname = member.linkname
    data = tar.extractfile(member) if member.isfile() else None
    result.addfile(info, data)
