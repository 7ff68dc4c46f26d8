"""Sessions' metrics: CPU, memory and disk, sampled every 5 s while a session's kernel runs,
kept for an hour (`GET /sessions/{id}/metrics`, E2B's sandbox metrics).

A sample's time is its 5-second bucket's (as E2B aligns its own). CPU is the share of the
session's CPUs (`--cpu-limit`, rounded up) used since the previous sample (the first: since
the kernel started); memory is the kernel container's, without the page cache it can give
back (the cache on its own beside it), against its limit; disk is the session's own disk
(`--workspace-size`; where sessions have plain folders, that size is the total shown). A
session with no sample yet is sampled when asked, so a new one has metrics at once. Only the
backend can tell CPU and memory (`KernelProcess.usage`; the docker backend's): elsewhere a
session has no metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from kernel_gateway import logs
from kernel_gateway.kernels.storage import held_back
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import responses

logger = logging.getLogger(__name__)

EVERY = 5.0
KEEP = 3600.0
FIRST_SPAN = 0.25
"""Seconds between a new kernel's two first readings."""


class UsageSink(Protocol):
    """Where each API key's use is added up (`tenants.keys.KeyStore`)."""

    def count(
        self,
        key_id: str | None,
        *,
        sessions: int = 0,
        stateless: int = 0,
        kernel_seconds: float = 0.0,
        cpu_seconds: float = 0.0,
        memory_bytes: int = 0,
        egress_bytes: int = 0,
    ) -> None: ...

    async def save_usage(self) -> None: ...


@dataclass(frozen=True)
class Sample:
    at: int
    """Unix time in seconds, at the start of its bucket."""
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int

    def to_json(self) -> responses.SessionMetric:
        return {
            "timestamp": datetime.fromtimestamp(self.at, UTC).isoformat().replace("+00:00", "Z"),
            "cpu_count": self.cpu_count,
            "cpu_used_pct": self.cpu_used_pct,
            "mem_used": self.mem_used,
            "mem_total": self.mem_total,
            "mem_cache": self.mem_cache,
            "disk_used": self.disk_used,
            "disk_total": self.disk_total,
        }


@dataclass
class _Series:
    samples: deque[Sample]
    kernel_id: str
    cpu_seconds: float
    taken: float
    """When `cpu_seconds` was read (monotonic)."""
    egress_bytes: int = 0
    """Its network's `transferred` when last read."""
    owner: str | None = None
    own_disk: bool = False
    """Its files are on a disk of its own (not the host's, shared by every session)."""


class UsageSampler:
    """Every running session's metrics, sampled in the background."""

    def __init__(
        self,
        settings: Settings,
        sessions: Callable[[], list[Session]],
        every: float = EVERY,
        sink: UsageSink | None = None,
    ) -> None:
        """`sink`: where each sample's kernel time, CPU and memory are added to its
        session's API key (saved there every tick)."""
        self.settings = settings
        self._sessions = sessions
        self._sink = sink
        self._every = every
        self._series: dict[str, _Series] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def disk_held(self, key_id: str) -> int:
        """The disk `key_id`'s sessions hold, at their last samples (those with a disk of
        their own: on plain folders a session's share of the host's disk is not known)."""
        return sum(
            s.samples[-1].disk_used
            for s in self._series.values()
            if s.owner == key_id and s.samples and s.own_disk
        )

    async def samples(
        self, session: Session, start: float | None = None, end: float | None = None
    ) -> list[Sample]:
        """`session`'s samples from `start` to `end` (Unix seconds, inclusive), oldest first;
        sampled now if it has none yet."""
        series = self._series.get(session.id)
        if series is None or not series.samples:
            await self._sample(session)
            series = self._series.get(session.id)
        if series is None:
            return []
        return [
            s
            for s in series.samples
            if (start is None or s.at >= start) and (end is None or s.at <= end)
        ]

    async def _run(self) -> None:
        while True:
            began = time.monotonic()
            sessions = self._sessions()
            alive = {s.id for s in sessions}
            for gone in [i for i in self._series if i not in alive]:
                del self._series[gone]
            for session in sessions:
                with logs.bound(session_id=session.id):
                    try:
                        await self._sample(session)
                    except Exception:  # noqa: BLE001 - one session's failure stops no one's
                        logger.exception("sampling session %s's usage failed", session.id)
            if self._sink is not None:
                try:
                    await self._sink.save_usage()
                except Exception:  # noqa: BLE001 - kept in memory, written next time
                    logger.exception("writing the API keys' usage failed")
            await asyncio.sleep(max(0.5, self._every - (time.monotonic() - began)))

    async def _sample(self, session: Session) -> None:
        kernel = session.slot.kernel
        if session.closed or session.hibernated or kernel is None:
            return
        series = self._series.get(session.id)
        if series is None or series.kernel_id != kernel.id:
            # A first reading, and a second a moment later: CPU is a share of a time span.
            first = await kernel.process.usage()
            if first is None:
                return
            series = _Series(
                deque(maxlen=max(1, int(KEEP / self._every))),
                kernel.id,
                first.cpu_seconds,
                time.monotonic(),
                series.egress_bytes if series is not None else 0,  # its network's, counted
                session.owner,
                await asyncio.to_thread(os.path.ismount, session.slot.storage.root),
            )
            self._series[session.id] = series
            await asyncio.sleep(FIRST_SPAN)
        usage = await kernel.process.usage()
        if usage is None:
            return
        now = time.monotonic()
        cpus = max(1, math.ceil(self.settings.cpu_limit))
        seconds = max(now - series.taken, 1e-3)
        used = max(usage.cpu_seconds - series.cpu_seconds, 0.0)
        series.cpu_seconds, series.taken = usage.cpu_seconds, now
        network = session.network
        sent = network.transferred if network is not None else series.egress_bytes
        egress = max(sent - series.egress_bytes, 0)
        series.egress_bytes = sent
        if self._sink is not None:
            self._sink.count(
                session.owner,
                kernel_seconds=seconds,
                cpu_seconds=used,
                memory_bytes=max(usage.memory_bytes, 0),
                egress_bytes=egress,
            )
        total, written = await asyncio.to_thread(_disk, session.slot.storage.files)
        disk_total = min(total, self.settings.workspace_size_bytes) or total
        at = int(time.time() // EVERY * EVERY)
        sample = Sample(
            at=at,
            cpu_count=cpus,
            cpu_used_pct=round(min(100.0, 100.0 * used / seconds / cpus), 2),
            mem_used=max(usage.memory_bytes, 0),
            mem_total=usage.memory_limit,
            mem_cache=usage.cache_bytes,
            disk_used=max(min(written, disk_total), 0),
            disk_total=disk_total,
        )
        if series.samples and series.samples[-1].at == at:
            series.samples[-1] = sample  # one per bucket: the latest
        else:
            series.samples.append(sample)


def _disk(folder: Path) -> tuple[int, int]:
    """The space the session may fill on the file system holding `folder` (what it holds and
    what it may still write: an API key's cap, not the disk's size), and what it holds (0, 0
    if gone)."""
    try:
        found = os.statvfs(folder)
    except OSError:
        return 0, 0
    used = (found.f_blocks - found.f_bfree) * found.f_frsize - held_back(folder.parent)
    return used + found.f_bavail * found.f_frsize, used
