"""An API key's CPU and memory per kernel and disk per session (its quotas `cpus`,
`memory_bytes`, `disk_bytes`, below the gateway's `--cpu-limit`, `--memory-limit` and
`--workspace-size`): the disk capped once, when the session gets it; the limits set on every
kernel the session gets, the first and each later one (a restart, a resume), before any
cell reaches it.

Where the backend cannot lower a kernel's limits (the local backend: kernels are host
processes) or the session has no disk of its own (a gateway that is not root: plain
folders), the gateway's own limits apply and a warning says so once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.storage import cap_disk
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.principal import Quotas

logger = logging.getLogger(__name__)

_warned: set[str] = set()


def _warn_once(what: str, text: str) -> None:
    if what not in _warned:
        _warned.add(what)
        logger.warning("%s", text)


@dataclass(frozen=True)
class KeyLimits:
    """What a key's quotas ask of each of its sessions."""

    cpus: float | None
    memory_bytes: int | None
    disk_bytes: int | None

    async def limit(self, kernel: Kernel) -> None:
        """Lower `kernel`'s CPU and memory to the key's."""
        if self.cpus is None and self.memory_bytes is None:
            return
        if not await kernel.process.limit(self.cpus, self.memory_bytes):
            _warn_once(
                "kernel",
                "this backend cannot lower a kernel's CPU or memory: API keys' cpus and "
                "memory_bytes quotas are not applied (the gateway's own limits are)",
            )


def limits_of(quotas: Quotas, settings: Settings) -> KeyLimits | None:
    """What `quotas` ask of each session (None: nothing), never above the gateway's own
    limits (a key made on another node of a cluster may ask for more than this one has)."""
    found = KeyLimits(
        _least(quotas.cpus, settings.cpu_limit),
        _least(quotas.memory_bytes, settings.memory_limit_bytes),
        _least(quotas.disk_bytes, settings.workspace_size_bytes),
    )
    return None if found == KeyLimits(None, None, None) else found


N = TypeVar("N", int, float)


def _least(asked: N | None, ceiling: N) -> N | None:
    return None if asked is None else min(asked, ceiling)


async def limited(
    slot: KernelSlot, limits: KeyLimits, close: Callable[[], Awaitable[None]] | None
) -> None:
    """The session's disk capped, and every kernel of `slot` limited from now on, the one it
    has first; if that cannot be done, `close` (the session is not kept) and raise
    KernelUnavailable. `close` None: a session taken over after a restart, whose kernel and
    disk were limited when it was made: a failure now is logged and the session kept (its
    files are never lost for it)."""
    slot.prepare.insert(0, limits.limit)
    try:
        if limits.disk_bytes is not None:
            try:
                capped = await asyncio.to_thread(cap_disk, slot.storage.root, limits.disk_bytes)
            except OSError as exc:
                raise KernelUnavailable(f"the session's disk could not be capped: {exc}") from exc
            if not capped:
                _warn_once(
                    "disk",
                    "sessions have no disk of their own here (plain folders): API keys' "
                    "disk_bytes quotas are not applied",
                )
        if slot.kernel is not None:
            await limits.limit(slot.kernel)
    except KernelUnavailable as exc:
        if close is None:
            logger.warning("an adopted session's limits could not be set again: %s", exc.message)
            return
        await close()
        raise
    except BaseException:
        if close is not None:
            await close()
        raise
