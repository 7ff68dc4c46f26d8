"""A template's start and ready commands, run beside each of its kernels as it starts.

E2B's templates may name a start command (a server the sandbox needs, say) and a ready
command (`curl -f localhost:8080/health`): the start command is started in the kernel's
sandbox, detached, as the kernel's user; the ready command is run every half second until
it succeeds. A kernel is handed out only after that, and one whose ready command never
succeeds within `seconds` is not handed out at all (`KernelUnavailable`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import KernelProcess

READY_EVERY = 0.5


async def run_start_commands(
    process: KernelProcess,
    start_cmd: str | None,
    ready_cmd: str | None,
    seconds: float,
    log: Callable[[str], None] = lambda line: None,
) -> None:
    if start_cmd:
        log(f"Start command: {start_cmd}")
        # setsid: its own session, so the end of `docker exec` does not end it.
        await _run(process, f"setsid nohup bash -c {_quote(start_cmd)} >/dev/null 2>&1 &")
    if not ready_cmd:
        return
    log(f"Waiting for the ready command: {ready_cmd}")
    deadline = time.monotonic() + seconds
    output = ""
    while True:
        code, output = await _run(process, ready_cmd)
        if code == 0:
            return
        if time.monotonic() > deadline:
            raise KernelUnavailable(
                f"the template's ready command {ready_cmd!r} did not succeed within "
                f"{seconds:g} s (last exit {code})" + (f": {output[-500:]}" if output else "")
            )
        await asyncio.sleep(READY_EVERY)


async def _run(process: KernelProcess, command: str) -> tuple[int, str]:
    handle = await process.run_command(["/bin/bash", "-c", command], {}, None, False)
    output = bytearray()
    async for _, chunk in handle.output():
        if len(output) < 64 * 1024:
            output += chunk
    return await handle.wait(), output.decode(errors="replace")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
