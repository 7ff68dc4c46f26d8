"""`kernel-gateway volume`: a running gateway's volumes (docs/volumes.md).

    kernel-gateway volume create NAME [--size 2g]     a new volume: its JSON
    kernel-gateway volume list                        one volume per line
    kernel-gateway volume put VOLUME PATH [FILE]      write a file (FILE, else stdin)
    kernel-gateway volume get VOLUME PATH             a file's bytes, on stdout
    kernel-gateway volume ls VOLUME [PATH] [--depth N]
    kernel-gateway volume delete VOLUME

Exit status 2 with the gateway's error on stderr when it refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, BinaryIO, TextIO

from kernel_gateway.client import Client, ClientError
from kernel_gateway.settings import add_arguments as add_settings_arguments
from kernel_gateway.settings.client import DEFAULT_URL, ClientSettings, client_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new volume; prints it")
    create.add_argument("name", help="its name")
    create.add_argument("--size", help="its size cap: bytes, or 512m, 2g (default the gateway's)")
    listed = actions.add_parser("list", help="the volumes, one JSON object per line")
    put = actions.add_parser("put", help="write a file into a volume")
    put.add_argument("volume", help="the volume's id or name")
    put.add_argument("path", help="where in the volume")
    put.add_argument("file", nargs="?", help="the local file to send (default: stdin)")
    get = actions.add_parser("get", help="a file of a volume, on stdout")
    get.add_argument("volume", help="the volume's id or name")
    get.add_argument("path", help="the file's path in the volume")
    ls = actions.add_parser("ls", help="what a folder of a volume holds, one entry per line")
    ls.add_argument("volume", help="the volume's id or name")
    ls.add_argument("path", nargs="?", default="", help="the folder (default: its root)")
    ls.add_argument("--depth", type=int, default=1, help="levels to list (1 to 32)")
    delete = actions.add_parser("delete", help="delete a volume and its files")
    delete.add_argument("volume", help="the volume's id or name")
    for sub in (create, listed, put, get, ls, delete):
        add_settings_arguments(sub, ClientSettings)  # --url, --token


def main(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    out: TextIO,
    binary_in: BinaryIO,
    binary_out: BinaryIO,
) -> int:
    settings = client_settings(ClientSettings, args, environ)
    try:
        with Client(settings.url or DEFAULT_URL, token=settings.token) as client:
            if args.action == "get":
                binary_out.write(client.read_volume_file(args.volume, args.path))
                binary_out.flush()
                return 0
            for document in _act(client, args, binary_in):
                out.write(json.dumps(document) + "\n")
    except (ClientError, OSError) as exc:
        print(f"kernel-gateway volume {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0


def _act(client: Client, args: argparse.Namespace, binary_in: BinaryIO) -> list[Any]:
    if args.action == "create":
        return [client.create_volume(args.name, args.size)]
    if args.action == "list":
        return list(client.volumes())
    if args.action == "put":
        if args.file:
            with open(args.file, "rb") as f:
                data = f.read()
        else:
            data = binary_in.read()
        return [client.write_volume_file(args.volume, args.path, data)]
    if args.action == "ls":
        return list(client.volume_entries(args.volume, args.path, args.depth))
    client.delete_volume(args.volume)
    return []


def volume_from_cli(args: argparse.Namespace) -> int:
    return main(args, os.environ, sys.stdout, sys.stdin.buffer, sys.stdout.buffer)
