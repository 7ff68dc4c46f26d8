"""`kernel-gateway keys`: a running gateway's API keys (docs/keys.md), with its admin token.

    kernel-gateway keys create NAME [--max-sessions N] [--max-stateless N]
                                    [--requests-per-minute N] [--cpus N]
                                    [--memory SIZE] [--disk SIZE]
                                    [--total-disk SIZE]         the key, its secret once
    kernel-gateway keys list [--revoked]                        one key per line
    kernel-gateway keys show KEY_ID
    kernel-gateway keys quotas KEY_ID [--max-sessions N] ...   its quotas replaced
    kernel-gateway keys rotate KEY_ID                           a new secret, once
    kernel-gateway keys revoke KEY_ID

Prints JSON, one document per line. Exit status 2 with the gateway's error on stderr when
it refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from kernel_gateway.client import Client, ClientError
from kernel_gateway.settings import add_arguments as add_settings_arguments
from kernel_gateway.settings import values
from kernel_gateway.settings.client import DEFAULT_URL, ClientSettings, client_settings

QUOTAS = (
    "max_sessions",
    "max_stateless",
    "requests_per_minute",
    "cpus",
    "memory_bytes",
    "disk_bytes",
    "total_disk_bytes",
)


def _quota_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-sessions", type=int, help="sessions held at once")
    parser.add_argument(
        "--max-stateless", type=int, help="stateless executions running or waiting at once"
    )
    parser.add_argument("--requests-per-minute", type=int, help="requests of any kind a minute")
    parser.add_argument(
        "--cpus", type=float, help="CPUs for each of its kernels (at most the gateway's)"
    )
    parser.add_argument(
        "--memory",
        dest="memory_bytes",
        type=_size,
        metavar="SIZE",
        help="memory for each of its kernels: 512m, 1g (at most the gateway's)",
    )
    parser.add_argument(
        "--disk",
        dest="disk_bytes",
        type=_size,
        metavar="SIZE",
        help="disk for each of its sessions (at most the gateway's --workspace-size)",
    )
    parser.add_argument(
        "--total-disk",
        dest="total_disk_bytes",
        type=_size,
        metavar="SIZE",
        help="disk its sessions hold together; past it no new session",
    )


def _size(text: str) -> int:
    try:
        return values.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new key; prints it with its secret (once)")
    create.add_argument("name", help="its name: labels its metrics and log lines")
    _quota_flags(create)
    listed = actions.add_parser("list", help="the keys, one JSON object per line")
    listed.add_argument("--revoked", action="store_true", help="revoked keys too")
    show = actions.add_parser("show", help="one key")
    quotas = actions.add_parser("quotas", help="replace a key's quotas (those not given: none)")
    _quota_flags(quotas)
    rotate = actions.add_parser("rotate", help="a new secret (printed once); the old one stops")
    revoke = actions.add_parser("revoke", help="revoke a key: refused at once, streams end")
    for sub in (show, quotas, rotate, revoke):
        sub.add_argument("key_id", help="the key's id (key_…)")
    for sub in (create, listed, show, quotas, rotate, revoke):
        add_settings_arguments(sub, ClientSettings)  # --url, --token


def main(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO) -> int:
    settings = client_settings(ClientSettings, args, environ)
    try:
        with Client(settings.url or DEFAULT_URL, token=settings.token) as client:
            for document in _act(client, args):
                out.write(json.dumps(document) + "\n")
    except ClientError as exc:
        print(f"kernel-gateway keys {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0


def _act(client: Client, args: argparse.Namespace) -> list[Any]:
    if args.action == "create":
        return [client.create_key(args.name, **_quotas(args))]
    if args.action == "list":
        return client.keys(revoked=args.revoked)
    if args.action == "show":
        return [client.key(args.key_id)]
    if args.action == "quotas":
        return [client.change_key(args.key_id, **_quotas(args))]
    if args.action == "rotate":
        return [client.rotate_key(args.key_id)]
    client.revoke_key(args.key_id)
    return []


def _quotas(args: argparse.Namespace) -> dict[str, float | int | None]:
    return {name: getattr(args, name) for name in QUOTAS}


def keys_from_cli(args: argparse.Namespace) -> int:
    return main(args, os.environ, sys.stdout)
