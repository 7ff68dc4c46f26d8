"""uvicorn's server, told to pass a stop signal to the app before it drains connections."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import FrameType

import uvicorn


class GatewayServer(uvicorn.Server):
    """Calls `on_stop` (on the event loop) at the first SIGTERM or SIGINT.

    uvicorn then stops accepting connections and waits for open ones (up to
    `timeout_graceful_shutdown`) before the app's lifespan ends; `on_stop` lets the
    app start draining at the signal itself.
    """

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self._on_stop)
        except RuntimeError:  # no loop runs in this thread: nothing to drain
            pass
        super().handle_exit(sig, frame)
