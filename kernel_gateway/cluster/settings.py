"""The router's settings: read once from `KG_*` variables and `route` flags, then frozen."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_args

from kernel_gateway.logs import LogFormat
from kernel_gateway.settings import check_exposure, env_values, resolve_token

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


@dataclass(frozen=True)
class RouterSettings:
    nodes: str = ""
    host: str = "127.0.0.1"
    port: int = 8888
    token: str | None = None
    token_file: Path | None = None
    no_auth: bool = False
    poll_interval: float = 1.0
    node_lost_after: float = 20.0
    node_wait: float = 10.0
    connect_timeout: float = 3.0
    max_body_bytes: int = 32 * 1024 * 1024
    log_level: str = "info"
    log_format: LogFormat = "text"

    def __post_init__(self) -> None:
        if not self.node_targets:
            raise ValueError(
                "--nodes (KG_NODES): where the node gateways are, e.g. tasks.kg_node:8888 "
                "(a name with an address per node) or host1:8888,host2:8888"
            )
        for name in ("poll_interval", "node_lost_after", "node_wait", "connect_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{_flag(name)}: must be a finite number > 0 (got {value})")
        if self.node_lost_after < 3 * self.poll_interval:
            raise ValueError(
                f"{_flag('node_lost_after')}: must be at least three --poll-interval "
                f"({3 * self.poll_interval} s), or one slow answer would lose a node"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"{_flag('port')}: must be between 0 and 65535")
        if self.max_body_bytes < 1:
            raise ValueError(f"{_flag('max_body_bytes')}: must be >= 1")
        if self.log_format not in get_args(LogFormat):
            raise ValueError(f"{_flag('log_format')}: must be text or json")

    @property
    def node_targets(self) -> list[NodeTarget]:
        """`nodes` parsed (validated at startup, so this never raises afterwards)."""
        return [NodeTarget.parse(part) for part in self.nodes.split(",") if part.strip()]

    def check_exposure(self) -> None:
        check_exposure(self.host, self.token, self.no_auth)


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')} (KG_{name.upper()})"


def from_env(environ: Mapping[str, str], **overrides: Any) -> RouterSettings:
    values = env_values(RouterSettings, environ)
    values.update({k: v for k, v in overrides.items() if v is not None})
    resolve_token(values)
    return RouterSettings(**values)


def add_route_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--nodes",
        help="where the node gateways are: host[:port], comma-separated; a name resolving to "
        "several addresses means one node each (Docker Swarm: tasks.<service>:8888)",
    )
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port to listen on (default 8888)")
    add("--token", help="the token clients send, also sent to the nodes (the same one)")
    add("--token-file", type=Path, help="read the token from this file (a Docker secret)")
    add(
        "--no-auth",
        action="store_const",
        const=True,
        help="allow a non-loopback host without a token",
    )
    add("--poll-interval", type=float, help="seconds between /health polls of each node (1)")
    add(
        "--node-lost-after",
        type=float,
        help="seconds without an answer before a node is presumed dead and its sessions "
        "answer 410 node_lost (20); keep it above a node gateway's restart time",
    )
    add(
        "--node-wait",
        type=float,
        help="seconds a request for a node that does not answer waits for it before "
        "503 node_unavailable (10)",
    )
    add("--connect-timeout", type=float, help="seconds to connect to a node (3)")
    add(
        "--max-body-bytes",
        type=int,
        help="largest body of POST /sessions and POST /execute, which the router keeps to "
        "retry on another node (32 MiB)",
    )
    add("--log-level", choices=["debug", "info", "warning", "error"], help="(default info)")
    add("--log-format", choices=get_args(LogFormat), help="text or json (default text)")


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RouterSettings:
    names = {f.name for f in fields(RouterSettings)}
    return from_env(environ, **{k: v for k, v in vars(args).items() if k in names})
