"""An API key's CPU and memory per kernel (its quotas `cpus` and `memory_bytes`, below the
gateway's `--cpu-limit` and `--memory-limit`): set on every kernel its sessions get, the
first and each later one (a restart, a resume), before any cell reaches it.

Where the backend cannot lower a kernel's limits (the local backend: kernels are host
processes), the key's kernels run under the gateway's limits and a warning says so once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.tenants.principal import Quotas

logger = logging.getLogger(__name__)

Limit = Callable[[Kernel], Awaitable[None]]
_warned: list[bool] = []


def limiter(quotas: Quotas) -> Limit | None:
    """What lowers a kernel's limits to `quotas`' (None: they ask for none)."""
    cpus, memory = quotas.cpus, quotas.memory_bytes
    if cpus is None and memory is None:
        return None

    async def limit(kernel: Kernel) -> None:
        if not await kernel.process.limit(cpus, memory) and not _warned:
            _warned.append(True)
            logger.warning(
                "this backend cannot lower a kernel's CPU or memory: API keys' cpus and "
                "memory_bytes quotas are not applied (the gateway's own limits are)"
            )

    return limit


async def limited(slot: KernelSlot, limit: Limit, close: Callable[[], Awaitable[None]]) -> None:
    """Every kernel of `slot` limited from now on, the one it has first; if that one cannot
    be, `close` (the session is not kept) and raise KernelUnavailable."""
    slot.prepare.insert(0, limit)
    if slot.kernel is None:
        return
    try:
        await limit(slot.kernel)
    except BaseException:
        await close()
        raise
