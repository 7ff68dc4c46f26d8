"""The protocols spoken besides the gateway's own API: MCP at `/mcp`, Jupyter's at `/api`.

Both run on the registry's sessions; this is where their long-lived parts start
and stop with the app (the MCP session manager's task group, made at the first MCP
request: lazy_mcp.py; the Jupyter channel proxies and their ZMQ context).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TypedDict

from kernel_gateway.http.auth import Authenticator
from kernel_gateway.kernels.volumes import Volumes
from kernel_gateway.protocols.e2b.app import E2BService
from kernel_gateway.protocols.jupyter.kernels import JupyterKernels
from kernel_gateway.protocols.mcp.lazy import LazyMcp
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.snapshots import SavedSessions
from kernel_gateway.sessions.usage import UsageSampler
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.secrets import SecretStore


class ProtocolState(TypedDict):
    jupyter: JupyterKernels
    mcp: LazyMcp | None
    e2b: E2BService


@asynccontextmanager
async def protocol_state(
    settings: Settings,
    registry: Registry,
    snapshots: SavedSessions,
    usage: UsageSampler,
    volumes: Volumes,
    auth: Authenticator,
    records: Path | None = None,
    secrets: SecretStore | None = None,
) -> AsyncIterator[ProtocolState]:
    """`records`: where front doors keep what must outlive the gateway (E2B's sandboxes),
    with `--persist-sessions`; None without."""
    jupyter = JupyterKernels(registry)
    mcp = LazyMcp(registry, settings) if settings.mcp != "off" else None
    e2b = E2BService(
        registry,
        settings,
        snapshots,
        usage,
        volumes,
        auth,
        records / "e2b" if records is not None else None,
        secrets,
    )
    async with AsyncExitStack() as stack:
        stack.push_async_callback(jupyter.close)
        e2b.start()
        stack.push_async_callback(e2b.close)
        if mcp is not None:
            stack.push_async_callback(mcp.close)
        yield {"jupyter": jupyter, "mcp": mcp, "e2b": e2b}
