"""Records kept on disk one file each, written atomically and in order, off the event loop.

Sessions (`sessions/persistence.py`) and templates (`templates/store.py`) keep theirs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

logger = logging.getLogger(__name__)

RECORD_NAME = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_-]{0,62}\.)?[A-Za-z0-9]{1,64}")


class Record(Protocol):
    """What a `RecordStore` keeps: an id that names its file, and a JSON form."""

    @property
    def id(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Record)


class RecordStore(Generic[R]):
    """Records in `folder`, one file each, written atomically and in order; `parse` reads
    one back (ValueError, KeyError or TypeError for one it cannot read)."""

    def __init__(self, folder: Path, parse: Callable[[dict[str, Any]], R]) -> None:
        self.folder = folder
        self._parse = parse
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="record-store")
        self._last: asyncio.Future[None] | None = None

    def open(self) -> None:
        self.folder.mkdir(mode=0o700, exist_ok=True)

    def load(self) -> list[R]:
        """Every readable record; leftover temporary files and unreadable ones are removed."""
        records = []
        for path in sorted(self.folder.iterdir()):
            if path.suffix != ".json":
                path.unlink(missing_ok=True)  # a write cut short: its rename never happened
                continue
            try:
                records.append(self._parse(json.loads(path.read_bytes())))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("record %s is unreadable (%s); dropping it", path, exc)
                path.unlink(missing_ok=True)
        return records

    def save(self, record: R) -> None:
        """Write `record` (after every write asked for before it); ValueError at once for
        an id that cannot name a record file."""
        self._path(record.id)
        self._submit(self._write, record)

    def delete(self, record_id: str) -> None:
        self._path(record_id)
        self._submit(self._remove, record_id)

    async def flush(self) -> None:
        """Wait until every write asked for so far is on disk."""
        if self._last is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._last)

    async def close(self) -> None:
        await self.flush()
        self._writer.shutdown(wait=True)

    def _submit(self, fn: Any, arg: Any) -> None:
        loop = asyncio.get_running_loop()
        self._last = loop.run_in_executor(self._writer, fn, arg)

    def _path(self, record_id: str) -> Path:
        if not RECORD_NAME.fullmatch(record_id):
            raise ValueError(f"not a record id: {record_id!r}")
        return self.folder / f"{record_id}.json"

    def _write(self, record: R) -> None:
        path = self._path(record.id)
        temporary = path.with_suffix(".tmp")
        try:
            fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(record.to_json()).encode())
            os.replace(temporary, path)
        except OSError:
            logger.exception("could not write the record %s in %s", record.id, self.folder)

    def _remove(self, record_id: str) -> None:
        try:
            self._path(record_id).unlink(missing_ok=True)
        except OSError:
            logger.exception("could not remove the record %s in %s", record_id, self.folder)
