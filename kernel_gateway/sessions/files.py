"""A session's files as the API sees them: what each cell produced, uploads, downloads.

After each cell the working directory is compared with what it held before,
and every file the cell created or changed becomes a `file` event. Uploads go
through `upload()` / `write()` only, which record the file as already seen, so
a file the user sent is never reported back as something the code produced.
All file-system work runs in threads (`workspace.py` does the symlink-proof
access), except scans of tiny workspaces, which are cheaper than a thread hop.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterable, Mapping

from kernel_gateway.errors import GatewayError
from kernel_gateway.kernels.events import event
from kernel_gateway.kernels.workspace import (
    INLINE_IMAGE_TYPES,
    FileInfo,
    Snapshot,
    Workspace,
    changed_files,
    file_url,
    guess_mime,
    write_stream,
)
from kernel_gateway.settings import Settings
from kernel_gateway.shapes.events import FileData
from kernel_gateway.types import Event

INLINE_SCAN_FILES = 64  # workspaces this small are scanned on the event loop


class SessionFiles:
    def __init__(
        self, session_id: str, workspace: Workspace, settings: Settings, *, inline_all: bool
    ) -> None:
        self._session_id = session_id
        self.workspace = workspace
        self._settings = settings
        self._inline_all = inline_all
        """Stateless: every file's bytes go in its event, and there is no URL to fetch."""
        self._baseline: Snapshot = {}

    # -- what the API does -------------------------------------------------------------------

    async def listing(self) -> list[FileInfo]:
        return await asyncio.to_thread(self.workspace.list)

    async def open_read(self, path: str) -> tuple[int, os.stat_result]:
        return await asyncio.to_thread(self.workspace.open_read, path)

    async def delete(self, path: str) -> None:
        await asyncio.to_thread(self.workspace.delete, path)

    async def upload(
        self,
        path: str,
        chunks: AsyncIterable[bytes],
        limit: int,
        metadata: Mapping[str, str] | None = None,
    ) -> FileInfo:
        """Write a file from a stream of chunks, atomically; nothing is left on failure."""
        info = await write_stream(self.workspace, path, chunks, limit, metadata)
        self._seen(info.path)
        return info

    async def write(
        self, path: str, data: bytes, limit: int, metadata: Mapping[str, str] | None = None
    ) -> FileInfo:
        async def one() -> AsyncIterable[bytes]:
            yield data

        return await self.upload(path, one(), limit, metadata)

    def _seen(self, path: str) -> None:
        state = self.workspace.state_of(path)
        if state is not None:
            self._baseline[path] = state

    # -- what cells produce ------------------------------------------------------------------

    async def take_baseline(self) -> None:
        """Count every file there now as reported (a session adopted after a restart)."""
        self._baseline, _ = await asyncio.to_thread(self.workspace.scan)

    async def changed_file_events(self) -> list[Event]:
        """A `file` event for each file created or changed since the last call."""
        s = self._settings
        if len(self._baseline) < INLINE_SCAN_FILES:
            after, _ = self.workspace.scan()
        else:
            after, _ = await asyncio.to_thread(self.workspace.scan)
        changed = changed_files(self._baseline, after)
        self._baseline = after
        events = []
        for path in changed[: s.max_file_events]:
            size = after[path][0]
            data: FileData = {
                "path": path,
                "size": size,
                "mime": guess_mime(path),
                "url": None if self._inline_all else file_url(self._session_id, path),
            }
            inline = self._inline_all or data["mime"] in INLINE_IMAGE_TYPES
            if inline and size <= s.max_inline_file_bytes:
                content = await asyncio.to_thread(self._read_quietly, path)
                if content is not None:
                    data["data"] = base64.b64encode(content).decode()
            events.append(event("file", data))
        if len(changed) > s.max_file_events:
            more = len(changed) - s.max_file_events
            text = f"[{more} more changed files not reported; see GET /files]\n"
            events.append(event("stderr", {"text": text}))
        return events

    def _read_quietly(self, path: str) -> bytes | None:
        try:
            return self.workspace.read_bytes(path, self._settings.max_inline_file_bytes)
        except GatewayError:
            return None  # replaced by a symlink or removed since the scan
