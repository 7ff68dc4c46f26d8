"""The gateway's endpoints: each declared once, as a record beside its handler.

`OPERATIONS` are the gateway's own API (routed and documented from their records:
`kernel_gateway.http.operations`); `SURFACES` are the routes whose contract is another
specification (the web UI's files, MCP, Jupyter's API, E2B's), routed as given and left out
of the document. The server only assembles them.
"""

from __future__ import annotations

from kernel_gateway.http.operations import Operation, Surface
from kernel_gateway.http.operations import routes as routing_table
from kernel_gateway.protocols.e2b import routes as e2b
from kernel_gateway.protocols.jupyter import routes as jupyter
from kernel_gateway.protocols.mcp import routes as mcp
from kernel_gateway.server.routes import (
    chat,
    cluster_keys,
    files,
    health,
    keys,
    metrics,
    openapi,
    secrets,
    session_metrics,
    session_network,
    sessions,
    snapshots,
    templates,
    volumes,
    web,
)

OPERATIONS: tuple[Operation, ...] = (
    *web.OPERATIONS,
    *health.OPERATIONS,
    *openapi.OPERATIONS,
    *metrics.OPERATIONS,
    *sessions.OPERATIONS,
    *chat.OPERATIONS,
    *session_metrics.OPERATIONS,
    *session_network.OPERATIONS,
    *snapshots.OPERATIONS,
    *volumes.OPERATIONS,
    *files.OPERATIONS,
    *templates.OPERATIONS,
    *keys.OPERATIONS,
    *secrets.OPERATIONS,
    *cluster_keys.OPERATIONS,
)
SURFACES: tuple[Surface, ...] = (
    web.SURFACE,
    mcp.SURFACE,
    e2b.SURFACE,
    e2b.SIGNED_FILES,
    jupyter.SURFACE,
)

routes = routing_table(OPERATIONS, SURFACES)
