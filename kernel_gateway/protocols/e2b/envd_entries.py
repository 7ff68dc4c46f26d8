"""What envd says about a path: E2B's paths as paths in a session's workspace, and a file's
`EntryInfo` (its type, mode, times, symlink target and metadata) in proto3 JSON.

E2B users write paths as `/home/user/...` (the sandbox user's home and working directory)
or relative to it; here that directory is the session's workspace. Paths elsewhere are
refused rather than resolved on the host.
"""

from __future__ import annotations

import dataclasses
import posixpath
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request

from kernel_gateway.errors import GatewayError
from kernel_gateway.kernels.workspace import Entry, Workspace
from kernel_gateway.protocols.e2b.connect import ConnectError

HOME = "/home/user"
REVIVAL_WAIT = 30.0
"""Seconds a command or a file call outside /home/user waits for the sandbox's kernel to be
back after it died (its container is its sandbox): killed from inside, it is replaced in
about a second."""


def to_workspace(path: object) -> str:
    """An E2B path as a path in the workspace ("" for the workspace itself)."""
    if path is None or path == "":
        return ""
    if not isinstance(path, str) or "\0" in path:
        raise ConnectError("invalid_argument", f"{path!r} is not a path")
    if path == HOME or path == HOME + "/":
        return ""
    if path.startswith(HOME + "/"):
        return path[len(HOME) + 1 :]
    if path.startswith("/"):
        raise ConnectError(
            "permission_denied",
            f"{path!r} is outside the sandbox's working directory {HOME}: only paths under "
            "it (or relative to it) are served",
        )
    return path


def to_e2b(rel: str) -> str:
    return f"{HOME}/{rel}" if rel else HOME


FILE_TYPES = {
    "file": "FILE_TYPE_FILE",
    "dir": "FILE_TYPE_DIRECTORY",
    "symlink": "FILE_TYPE_SYMLINK",
}


LINK_HOPS = 8


def followed(workspace: Workspace, entry: Entry) -> Entry:
    """A symlink as envd shows one: the type of what it points to, and that target as an
    absolute path (`symlinkTarget`), when the target is in the sandbox's working directory
    (found there without following any link, hop by hop); else the link as it is."""
    if entry.kind != "symlink" or entry.link_target is None:
        return entry
    at = entry
    for _ in range(LINK_HOPS):
        assert at.link_target is not None
        base = posixpath.dirname(to_e2b(at.path))
        target = posixpath.normpath(posixpath.join(base, at.link_target))
        try:
            rel = to_workspace(target)
            at = workspace.entry(rel)
        except (ConnectError, GatewayError):
            return entry
        if at.kind != "symlink":
            return dataclasses.replace(entry, kind=at.kind, link_target=target)
    return entry


def permissions(letter: str, mode: int) -> str:
    """envd's `permissions`: `ls -l`'s letters (`-rw-r--r--`, `drwxr-xr-x`, `L...`)."""
    return letter + "".join(
        ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx")
    )


def entry_json(entry: Entry, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """An `EntryInfo` in proto3 JSON."""
    mode = entry.mode
    kind = entry.kind
    out: dict[str, Any] = {
        "name": entry.path.rsplit("/", 1)[-1] if entry.path else "user",
        "type": FILE_TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": to_e2b(entry.path),
        "size": str(entry.size),
        "mode": mode,
        "permissions": permissions({"dir": "d", "symlink": "L"}.get(kind, "-"), mode),
        "owner": "user",
        "group": "user",
        "modifiedTime": datetime.fromtimestamp(entry.modified, UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    if entry.link_target is not None:
        out["symlinkTarget"] = entry.link_target
        out["isSymlink"] = True
    if metadata:
        out["metadata"] = metadata
    return out


def described(workspace: Workspace, entry: Entry) -> dict[str, Any]:
    """`entry_json` with the entry's metadata (reads its attributes: call in a thread)."""
    return entry_json(entry, workspace.metadata(entry))


METADATA_HEADER = "x-metadata-"


def upload_metadata(request: Request) -> dict[str, str]:
    """The metadata an upload asks for: its `X-Metadata-<key>` headers (keys lowercased,
    as envd keeps them)."""
    return {
        name[len(METADATA_HEADER) :]: value
        for name, value in request.headers.items()
        if name.startswith(METADATA_HEADER)
    }
