"""The MCP service, made at its first request.

Importing the MCP SDK and its types takes about half a second, more than everything
else the gateway imports together; a gateway restarting with sessions to adopt would
wait for it before serving anyone, MCP client or not. So `/mcp` imports it when first
called (in a worker thread, the event loop serving on), and one task owns the service's
session manager from then until the app stops (its task group must start and end in
one task).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from kernel_gateway.errors import ShuttingDown
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings

if TYPE_CHECKING:
    from kernel_gateway.protocols.mcp.server import McpService


class LazyMcp:
    def __init__(self, registry: Registry, settings: Settings) -> None:
        self._registry = registry
        self._settings = settings
        self._service: McpService | None = None
        self._starting = asyncio.Lock()
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service = await self.service()
        await service(scope, receive, send)

    async def service(self) -> McpService:
        async with self._starting:
            if self._service is None:
                if self._closed:
                    raise ShuttingDown("the gateway is stopping")
                module = await asyncio.to_thread(
                    importlib.import_module, "kernel_gateway.protocols.mcp.server"
                )
                if self._closed:  # the app began stopping during the import
                    raise ShuttingDown("the gateway is stopping")
                service: McpService = module.McpService(self._registry, self._settings)
                running = asyncio.get_running_loop().create_future()
                self._stop = asyncio.Event()
                self._owner = asyncio.create_task(self._own(service, running))
                # Shielded: a caller that leaves does not leave a second manager behind.
                await asyncio.shield(running)
                self._service = service
        return self._service

    async def _own(self, service: McpService, running: asyncio.Future[None]) -> None:
        """Runs the service's session manager until `close`; if it ends before, the next
        request starts a new one."""
        try:
            async with service.run():
                running.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not running.done():
                running.set_exception(exc)
            raise
        finally:
            if self._service is service:
                self._service = None

    async def close(self) -> None:
        self._closed = True
        async with self._starting:  # a start under way finishes first, then is stopped
            self._stop.set()
            if self._owner is not None:
                with contextlib.suppress(Exception):
                    await self._owner
