"""`kernel-gateway snapshot`: snapshots and forks of a running gateway's sessions.

    kernel-gateway snapshot take SESSION [--name NAME]   keep a copy of the session
    kernel-gateway snapshot list [--session ID] [--name NAME]
    kernel-gateway snapshot start SNAPSHOT              a new session from it: its id
    kernel-gateway snapshot fork SESSION [--count N]    copies of the session: their ids
    kernel-gateway snapshot delete SNAPSHOT

Each prints JSON (one document; `list`, one snapshot per line) on stdout; exit status 2 with
the gateway's error on stderr when it refuses.
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
from kernel_gateway.settings.client import DEFAULT_URL, ClientSettings, client_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    take = actions.add_parser("take", help="keep a copy of a session: files and variables")
    take.add_argument("session", help="the session's id")
    take.add_argument("--name", help="keep it under this name (one of that name is replaced)")
    listed = actions.add_parser("list", help="the snapshots kept, one JSON object per line")
    listed.add_argument("--session", help="only those of this session")
    listed.add_argument("--name", help="only those of this name")
    start = actions.add_parser("start", help="a new session from a snapshot; prints it")
    start.add_argument("snapshot", help="the snapshot's id or name")
    fork = actions.add_parser("fork", help="copies of a running session; prints them")
    fork.add_argument("session", help="the session's id")
    fork.add_argument("--count", type=int, default=1, help="how many copies (1 to 100)")
    delete = actions.add_parser("delete", help="delete a snapshot")
    delete.add_argument("snapshot", help="the snapshot's id or name")
    for sub in (take, listed, start, fork, delete):
        add_settings_arguments(sub, ClientSettings)  # --url, --token


def main(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO) -> int:
    settings = client_settings(ClientSettings, args, environ)
    try:
        with Client(settings.url or DEFAULT_URL, token=settings.token) as client:
            for document in _act(client, args):
                out.write(json.dumps(document) + "\n")
    except ClientError as exc:
        print(f"kernel-gateway snapshot {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0


def _act(client: Client, args: argparse.Namespace) -> list[Any]:
    if args.action == "take":
        return [client.session(args.session).snapshot(args.name)]
    if args.action == "list":
        return list(client.snapshots(args.session, args.name))
    if args.action == "start":
        return [client.create_session(snapshot=args.snapshot).info()]
    if args.action == "fork":
        made = client.session(args.session).fork(args.count)
        return [
            {"session": m.info()} if not isinstance(m, ClientError) else {"error": str(m)}
            for m in made
        ]
    client.delete_snapshot(args.snapshot)
    return []


def snapshot_from_cli(args: argparse.Namespace) -> int:
    return main(args, os.environ, sys.stdout)
