"""The router's settings: read once from `KG_*` variables and `route` flags, then frozen.

Each is declared once, as the gateway's are (`kernel_gateway.settings.declare`): the flags,
the variables and the checks are made from the declarations below.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from kernel_gateway.logs import LogFormat
from kernel_gateway.settings import (
    LOG_LEVELS,
    add_arguments,
    check_exposure,
    check_fields,
    env_values,
    flag_values,
    origin,
    resolve_token,
    setting,
    values,
)

DEFAULT_NODE_PORT = 8888


@dataclass(frozen=True)
class NodeTarget:
    """Where node gateways are found: a name (resolved to every address it has) and a port."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> NodeTarget:
        raw = text
        text = text.strip().removeprefix("http://").rstrip("/")
        if not text or "/" in text:
            raise ValueError(f"{raw!r} is not host[:port] (e.g. tasks.kg_node:8888)")
        host, port = text, DEFAULT_NODE_PORT
        if text.startswith("["):  # [v6]:port
            host, _, rest = text[1:].partition("]")
            if rest:
                port = _port(rest.removeprefix(":"), raw)
        elif text.count(":") == 1:
            host, _, given = text.partition(":")
            port = _port(given, raw)
        if not host:
            raise ValueError(f"{raw!r} has no host")
        return cls(host, port)


def _port(text: str, raw: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{raw!r}: the port must be 1-65535")
    return int(text)


def _nodes(text: str) -> list[NodeTarget]:
    return [NodeTarget.parse(part) for part in text.split(",") if part.strip()]


@dataclass(frozen=True)
class RouterSettings:
    nodes: str = setting(
        "",
        "where the node gateways are: host[:port], comma-separated; a name resolving to "
        "several addresses means one node each (Docker Swarm: tasks.<service>:8888)",
        doc="node gateways, `host[:port]`, comma-separated; a name with several addresses is "
        "one node per address (`tasks.node:8888`)",
        default_doc="none, required",
        check=_nodes,
    )
    host: str = setting(
        "127.0.0.1",
        "address to listen on",
        doc="where the router listens; a non-loopback host needs a token or `--no-auth`",
    )
    port: int = setting(8888, "port to listen on", minimum=0, maximum=65535)
    token: str | None = setting(
        None,
        "the token clients send, also sent to the nodes (the same one)",
        doc="the token clients must send, also sent to the nodes",
    )
    token_file: Path | None = setting(
        None, "read the token from this file (a Docker secret); instead of --token"
    )
    no_auth: bool = setting(False, "allow a non-loopback host without a token")
    poll_interval: float = setting(
        1.0,
        "seconds between /health polls of each node",
        doc="seconds between `/health` polls of every node",
        positive=True,
    )
    node_lost_after: float = setting(
        20.0,
        "seconds without an answer before a node is presumed dead and its sessions answer "
        "410 node_lost; keep it above a node gateway's restart time",
        doc="seconds without an answer before a node is presumed dead (its sessions answer "
        "`410 node_lost`); at least 3 polls; keep it above a node gateway's restart time "
        "(drain + start)",
        positive=True,
    )
    node_wait: float = setting(
        10.0,
        "seconds a request for a node that does not answer waits for it before 503 "
        "node_unavailable",
        doc="seconds a request for a node that stopped answering waits for it before "
        "`503 node_unavailable`",
        positive=True,
    )
    keep_alive_timeout: float = setting(
        120.0,
        "seconds an idle HTTP connection stays open for the client's next request",
        doc="seconds an idle keep-alive connection stays open: longer than clients keep one in "
        "their pools (reqwest and hyper, as in E2B's Python SDK: 90 s), so that no request is "
        "sent on a connection the router is closing that very moment",
        positive=True,
    )
    connect_timeout: float = setting(3.0, "seconds to connect to a node", positive=True)
    max_body_bytes: int = setting(
        32 * 1024 * 1024,
        "largest body of POST /sessions and POST /execute, which the router keeps to retry "
        "on another node",
        doc="largest `POST /sessions` / `POST /execute` body (kept to retry on another node)",
        minimum=1,
    )
    log_level: str = setting(
        "info", "how much is logged", choices=LOG_LEVELS, check=values.log_level
    )
    log_format: LogFormat = setting(
        "text", "text, or json: one JSON object per line", choices=get_args(LogFormat)
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.node_targets:
            raise ValueError(
                f"{origin('nodes')}: where the node gateways are, e.g. tasks.kg_node:8888 "
                "(a name with an address per node) or host1:8888,host2:8888"
            )
        if self.node_lost_after < 3 * self.poll_interval:
            raise ValueError(
                f"{origin('node_lost_after')}: must be at least three --poll-interval "
                f"({3 * self.poll_interval} s), or one slow answer would lose a node"
            )

    @property
    def node_targets(self) -> list[NodeTarget]:
        """`nodes` parsed (validated at startup, so this never raises afterwards)."""
        return _nodes(self.nodes)

    def check_exposure(self) -> None:
        check_exposure(self.host, self.token, self.no_auth)


def from_env(environ: Mapping[str, str], **overrides: Any) -> RouterSettings:
    values = env_values(RouterSettings, environ)
    values.update({k: v for k, v in overrides.items() if v is not None})
    resolve_token(values)
    return RouterSettings(**values)


def add_route_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags for `route`; each defaults to None so the KG_* twin can fill it."""
    add_arguments(parser, RouterSettings)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RouterSettings:
    return from_env(environ, **flag_values(RouterSettings, args))
