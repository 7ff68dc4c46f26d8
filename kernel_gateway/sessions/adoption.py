"""Taking over a session's kernel that a predecessor gateway left running (`durable.py`).

The session's record says which cell, if any, was running when the predecessor stopped
(`RunningCell`: its number, its msg_id, its deadline). That cell is followed from here
on: its output still carries its msg_id, so it reaches an execution of its own, which a
client can resume. The adopted kernel is held (the session's cells wait) until it is free:
a kernel answers on shell only between cells, so its answer to a kernel_info_request says
the left-over cell has ended and its output has reached this gateway. Past the cell's
deadline it is interrupted, and if it will not stop the kernel is retired, as for any
timeout. The cell then ends as every cell does (`CellRunner.end_cell`).
"""

from __future__ import annotations

import contextlib
import logging
import time

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.sessions.cells import REPLY_WAIT, CellRunner
from kernel_gateway.sessions.execution import Execution, StopReason
from kernel_gateway.sessions.execution_log import ExecutionLog
from kernel_gateway.sessions.files import SessionFiles
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.sessions.persistence import RunningCell
from kernel_gateway.settings import Settings

logger = logging.getLogger(__name__)

ADOPTED_READY_WAIT = 5.0  # seconds an adopted, idle kernel has to answer on shell


class Adoption:
    """One adopted kernel's take-over: the left-over cell followed, the kernel held until it
    is free, the cell ended. Its work runs among the session's cells (`CellRunner.spawn`):
    a suspension cancels it, a close waits for it."""

    def __init__(
        self,
        session_id: str,
        slot: KernelSlot,
        files: SessionFiles,
        cells: CellRunner,
        log: ExecutionLog,
        settings: Settings,
    ) -> None:
        self._session_id = session_id
        self._slot = slot
        self._files = files
        self._cells = cells
        self._log = log
        self._settings = settings

    def start(self, running: RunningCell | None) -> None:
        """Follow `running` (the cell the record names, if any) and settle the kernel."""
        execution = self._follow(running) if running is not None else None
        self._cells.spawn(self._settle(execution, running))

    def _follow(self, running: RunningCell) -> Execution:
        """The cell an earlier gateway left running, followed from here on."""
        execution = self._log.adopted(running)
        execution.start()
        # It started under the earlier gateway: its duration counts from then.
        execution.started = time.monotonic() - max(
            0.0, running.timeout - (running.deadline - time.time())
        )
        self._cells.follow(execution, running)
        kernel = self._slot.kernel
        assert kernel is not None
        kernel.follow(running.msg_id, execution)
        return execution

    async def _settle(self, execution: Execution | None, running: RunningCell | None) -> None:
        """Hold the adopted kernel until it is free; stop a left-over cell at its deadline."""
        slot, cells = self._slot, self._cells
        kernel = slot.kernel
        assert kernel is not None
        try:
            async with slot.lock:
                # Files from before are not news; those a left-over cell writes from now on are.
                await self._files.take_baseline()
                if running is not None:
                    wait = max(running.deadline - time.time(), ADOPTED_READY_WAIT)
                else:  # idle, or a cell sent just before its record was written
                    wait = max(ADOPTED_READY_WAIT, self._settings.exec_timeout)
                if await _ready(kernel, wait):
                    if execution is not None and running is not None:
                        # Its reply went to the stopped gateway; the kernel kept the outcome.
                        reply = await kernel.outcome(running.msg_id, REPLY_WAIT)
                        if reply is not None:
                            execution.on_reply(reply)
                    return
                if kernel.exit_info is not None:
                    if execution is not None:
                        cells.died(execution, kernel)
                    else:
                        slot.note_death(kernel)
                    return
                if execution is not None:
                    execution.stop(StopReason.TIMEOUT)
                logger.info(
                    "session %s: an adopted cell ran past its deadline; interrupting",
                    self._session_id,
                )
                await kernel.interrupt()
                if await _ready(kernel, 2 * self._settings.interrupt_grace + 1):
                    return
                await cells.retire_stuck(execution, kernel)
        finally:
            if running is not None:
                kernel.forget(running.msg_id)
            if execution is not None:
                with contextlib.suppress(Exception):
                    await cells.report_files(execution)
                cells.end_cell(execution)


async def _ready(kernel: Kernel, seconds: float) -> bool:
    try:
        await kernel.wait_ready(seconds)
    except KernelUnavailable:
        return False
    return True
