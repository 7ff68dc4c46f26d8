"""A file path as the API takes it: relative to a session's working directory, never out of it.

The one rule for every surface that names a file (the file routes, stateless uploads, MCP's
tools, E2B's filesystem): `split_path` checks it, and the request schemas state it
(`requests.FilePath`).
"""

from __future__ import annotations

from kernel_gateway.errors import BadRequest

MAX_PATH_LENGTH = 4096  # Linux PATH_MAX (paths are walked one name at a time, so only a cap)
MAX_NAME_BYTES = 255  # NAME_MAX of Linux filesystems


def split_path(raw: str) -> list[str]:
    """Validate a client-given relative path: 400 for anything that could escape."""
    if not raw:
        raise BadRequest("a file path is required")
    if "\x00" in raw:
        raise BadRequest("file paths may not contain NUL bytes")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("file paths must be valid Unicode (no lone surrogates)") from None
    if len(raw) > MAX_PATH_LENGTH:
        raise BadRequest(f"file paths are limited to {MAX_PATH_LENGTH} characters")
    if raw.startswith("/"):
        raise BadRequest("file paths must be relative to the session's working directory")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise BadRequest("file paths may not contain '..'")
    if not parts:
        raise BadRequest("a file path is required")
    if any(len(p.encode("utf-8")) > MAX_NAME_BYTES for p in parts):
        raise BadRequest(f"file and folder names are limited to {MAX_NAME_BYTES} bytes")
    return parts
