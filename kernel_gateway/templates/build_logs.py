"""Builds' logs: kept in memory while a build runs and is read, on disk once it ended.

Each entry is E2B's `BuildLogEntry` (`timestamp`, `level`, `message`, `step`?). A log holds
at most `MAX_ENTRIES` (a build printing more keeps its first ones and its end: the failure
reason is logged last and is also on the build). Followers wait on one event per log,
set at each new entry: nothing is spawned per line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

Level = Literal["debug", "info", "warn", "error"]
LogEntry = dict[str, Any]
MAX_ENTRIES = 20_000
FOLLOW_BATCH = 1000


class BuildLogs:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._entries: dict[str, list[LogEntry]] = {}
        self._changed: dict[str, asyncio.Event] = {}

    def start(self, build_id: str) -> None:
        self._entries[build_id] = []

    def add(self, build_id: str, level: Level, message: str, step: int | None = None) -> None:
        entries = self._entries.setdefault(build_id, [])
        if len(entries) >= MAX_ENTRIES and level != "error":
            return
        entry: LogEntry = {"timestamp": _now(), "level": level, "message": message}
        if step is not None:
            entry["step"] = str(step)
        entries.append(entry)
        changed = self._changed.get(build_id)
        if changed is not None:
            changed.set()

    def logger(self, build_id: str) -> Callable[[Level, str, int | None], None]:
        return lambda level, message, step: self.add(build_id, level, message, step)

    def read(self, build_id: str, offset: int = 0, limit: int = 100) -> list[LogEntry]:
        entries = self._entries.get(build_id)
        if entries is None:
            entries = _read(self._path(build_id))
            self._entries[build_id] = entries
        start = max(offset, 0)
        return entries[start : start + limit]

    async def follow(
        self, build_id: str, finished: Callable[[], bool], offset: int = 0
    ) -> AsyncIterator[LogEntry]:
        """Each entry from `offset` on, as it comes, until `finished()` and all are read."""
        changed = self._changed.setdefault(build_id, asyncio.Event())
        while True:
            changed.clear()
            batch = self.read(build_id, offset, FOLLOW_BATCH)
            for entry in batch:
                yield entry
            offset += len(batch)
            if batch:
                continue
            if finished():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)

    async def persist(self, build_id: str) -> None:
        """Write the log to disk (atomically), for after a restart."""
        text = "".join(json.dumps(e) + "\n" for e in self._entries.get(build_id, []))
        await asyncio.to_thread(_write_atomically, self._path(build_id), text)

    def forget(self, build_id: str) -> None:
        self._entries.pop(build_id, None)
        self._changed.pop(build_id, None)
        self._path(build_id).unlink(missing_ok=True)

    def _path(self, build_id: str) -> Path:
        return self.folder / f"{build_id}.jsonl"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def _write_atomically(path: Path, text: str) -> None:
    if not path.parent.is_dir():
        return  # the template was deleted meanwhile, and its folders with it
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _read(path: Path) -> list[LogEntry]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    except (OSError, ValueError):
        return []
