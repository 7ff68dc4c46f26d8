"""The client commands' settings (`kernel-gateway run`, `kernel-gateway mcp`): where the
gateway is and how to prove who calls. Declared like the gateway's, read the same way."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from kernel_gateway.settings import values
from kernel_gateway.settings.declare import check_fields, env_values, flag_values, setting

DEFAULT_URL = "http://127.0.0.1:8888"
C = TypeVar("C", bound="ClientSettings")


@dataclass(frozen=True)
class ClientSettings:
    """`kernel-gateway run`'s."""

    url: str | None = setting(
        None,
        "the gateway's URL",
        default_doc=f"`run`: `{DEFAULT_URL}`; `mcp`: a gateway started in this process, "
        "configured from the `KG_*` variables as `serve` is",
    )
    token: str | None = setting(None, "the gateway's bearer token")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class McpSettings(ClientSettings):
    """`kernel-gateway mcp`'s: `run`'s, and how much it logs (to stderr; stdout is MCP's)."""

    log_level: str = setting(
        "warning",
        "how much the stdio server logs to stderr",
        doc="how much the stdio server logs to stderr (stdout carries only MCP messages)",
        choices=values.LOG_LEVELS,
        check=values.log_level,
    )


def client_settings(
    settings_class: type[C], args: argparse.Namespace, environ: Mapping[str, str]
) -> C:
    """A client command's settings from its flags, over its `KG_*` variables."""
    found = env_values(settings_class, environ)
    found.update(flag_values(settings_class, args))
    return settings_class(**found)
