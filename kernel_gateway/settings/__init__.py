"""All configuration, read once from `KG_*` variables and CLI flags into frozen objects.

Every setting is declared once (`declare.setting`): its flag, its `KG_*` variable, its help,
its bounds and its default; argparse, the environment, validation and the table of
docs/configuration.md are made from that. A flag wins over its variable. Nothing else in
the package reads `KG_*` variables: the gateway's settings are `gateway.Settings`, the
client commands' (`run`, `mcp`) `client.ClientSettings`, the router's
`kernel_gateway.cluster.settings`.
"""

from __future__ import annotations

from kernel_gateway.settings.declare import (
    add_arguments,
    check_fields,
    convert,
    describe,
    env_values,
    flag_values,
    markdown_table,
    origin,
    setting,
)
from kernel_gateway.settings.gateway import (
    CONTAINER_STATELESS_LIMIT,
    DEFAULT_GATEWAY_IMAGE,
    DEFAULT_IMAGE,
    FORKED_STATELESS_LIMIT,
    BackendName,
    McpMode,
    Settings,
    StatelessMode,
    add_serve_arguments,
    from_args,
    from_env,
)
from kernel_gateway.settings.runtime_dir import ROOT_RUNTIME_DIR, default_runtime_dir
from kernel_gateway.settings.values import (
    FIGURE_FORMATS,
    LANGUAGE_NAME,
    LOG_LEVELS,
    MIN_MEMORY_LIMIT,
    NODE_NAME,
    check_exposure,
    is_loopback,
    parse_size,
    read_token_file,
    resolve_token,
)

__all__ = [
    "add_arguments",
    "CONTAINER_STATELESS_LIMIT",
    "DEFAULT_GATEWAY_IMAGE",
    "DEFAULT_IMAGE",
    "FIGURE_FORMATS",
    "FORKED_STATELESS_LIMIT",
    "LANGUAGE_NAME",
    "LOG_LEVELS",
    "MIN_MEMORY_LIMIT",
    "NODE_NAME",
    "ROOT_RUNTIME_DIR",
    "BackendName",
    "McpMode",
    "Settings",
    "StatelessMode",
    "add_serve_arguments",
    "check_exposure",
    "check_fields",
    "convert",
    "default_runtime_dir",
    "describe",
    "env_values",
    "flag_values",
    "from_args",
    "from_env",
    "is_loopback",
    "markdown_table",
    "origin",
    "parse_size",
    "read_token_file",
    "resolve_token",
    "setting",
]
