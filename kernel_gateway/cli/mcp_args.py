"""`kernel-gateway mcp` flags, apart from `mcp_stdio` so `--help` imports no server library."""

from __future__ import annotations

import argparse


def add_mcp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="gateway to relay to (default: KG_URL; without either, start a gateway in this "
        "process, configured from KG_* variables)",
    )
    parser.add_argument("--token", help="the gateway's token (default: KG_TOKEN)")
