"""The `kernel-gateway` command: serve the API, build the kernel image, run code, or MCP."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernel_gateway import __version__
from kernel_gateway.settings import (
    DEFAULT_GATEWAY_IMAGE,
    DEFAULT_IMAGE,
    Settings,
    add_arguments,
    add_serve_arguments,
    describe,
    env_values,
    from_args,
)
from kernel_gateway.settings.client import McpSettings


def build_parser() -> argparse.ArgumentParser:
    """Every command's flags; those of settings are made from their declarations."""
    parser = argparse.ArgumentParser(
        prog="kernel-gateway",
        description="Run AI-written code in sandboxed IPython kernels; stream results over SSE.",
        epilog="Every flag of serve, route, run and mcp that is a setting has an environment "
        "twin: --pool-size is KG_POOL_SIZE, and so on.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="start the HTTP API")
    add_serve_arguments(serve)

    from kernel_gateway.cluster.settings import add_route_arguments

    route = commands.add_parser(
        "route",
        help="a cluster's router: place sessions on node gateways and pass requests to them",
        description="Find node gateways (serve --node-name) by DNS, place new sessions on the "
        "node with the most free capacity, and pass every request for a session to its node. "
        "Every flag has a KG_* twin.",
    )
    add_route_arguments(route)

    build = commands.add_parser("build-image", help="build the kernel container image")
    build.add_argument(
        "--tag",
        help=f"image name (default: KG_IMAGE or {DEFAULT_IMAGE}; with --gateway, "
        f"{DEFAULT_GATEWAY_IMAGE})",
    )
    build.add_argument(
        "--gateway",
        action="store_true",
        help="build the gateway's own image for cluster mode (deploy/stack.yml) on top of the "
        "kernel image (KG_IMAGE), from this source checkout",
    )
    build.add_argument("--context", type=Path, help="the kernel-image folder (default: bundled)")
    build.add_argument(
        "--requirements",
        type=Path,
        metavar="FILE",
        help="extra packages to bake in, pip's requirements format; locked versions stay",
    )
    build.add_argument(
        "--cache-dir",
        type=Path,
        help="where the build context and its wheels are kept between builds "
        "(default: $XDG_CACHE_HOME/kernel-gateway/image, else ~/.cache/kernel-gateway/image)",
    )
    build.add_argument(
        "--languages",
        help="languages to build images for, comma-separated: python (always), javascript "
        "and typescript (one Deno image), r, bash, java (default: all of them); python3.11 "
        "(the classic stack's base on Debian 12: only when named)",
    )
    build.add_argument(
        "--no-download",
        dest="download",
        action="store_false",
        help="do not fetch the wheels on this host: the image build installs them from "
        "the package index itself",
    )

    from kernel_gateway.cli.run import add_arguments as add_run_arguments

    run_parser = commands.add_parser(
        "run",
        help="send code to a running gateway and print the results",
        description="Exit status: 0 ok, 1 error, 124 timeout, 130 interrupted, 137 died, "
        "2 when the gateway could not run the code.",
    )
    add_run_arguments(run_parser)

    from kernel_gateway.cli.snapshots import add_arguments as add_snapshot_arguments

    snapshot_parser = commands.add_parser(
        "snapshot",
        help="snapshots and forks of a running gateway's sessions",
        description="Take, list, start from, fork and delete snapshots through a gateway's "
        "API; prints JSON. Exit status 2 when the gateway refuses.",
    )
    add_snapshot_arguments(snapshot_parser)

    from kernel_gateway.cli.volumes import add_arguments as add_volume_arguments

    volume_parser = commands.add_parser(
        "volume",
        help="volumes of a running gateway: create, list, files in and out, delete",
        description="Volumes through a gateway's API: disks that outlive sessions. Exit "
        "status 2 when the gateway refuses.",
    )
    add_volume_arguments(volume_parser)

    from kernel_gateway.cli.keys import add_arguments as add_key_arguments

    keys_parser = commands.add_parser(
        "keys",
        help="API keys of a running gateway: create, list, quotas, rotate, revoke",
        description="API keys through a gateway's API, with its admin token (--token or "
        "KG_TOKEN); prints JSON. Exit status 2 when the gateway refuses.",
    )
    add_key_arguments(keys_parser)

    mcp_parser = commands.add_parser(
        "mcp",
        help="an MCP server over stdio (for desktop clients), relaying to a gateway",
        description="Speak MCP on stdin/stdout and relay each call to a gateway's /mcp "
        "endpoint: --url (or KG_URL), else a gateway started in this process from KG_* "
        "variables. One sandbox per client, deleted when it disconnects.",
    )
    add_arguments(mcp_parser, McpSettings)
    return parser


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from kernel_gateway.kernels.runtime_dir import secure_runtime_root
    from kernel_gateway.logs import configure
    from kernel_gateway.server.app import create_app
    from kernel_gateway.server.uvicorn_server import GatewayServer

    try:
        settings = from_args(args, os.environ)
        settings.check_exposure()
        secure_runtime_root(settings.runtime_dir)  # RuntimeDirError, a ValueError
    except ValueError as exc:
        print(f"kernel-gateway: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_format, settings.log_level)
    logging.getLogger("kernel_gateway").debug("settings: %s", ", ".join(describe(settings)))
    if settings.persist_sessions:
        from sse_starlette.sse import AppStatus

        # sse-starlette ends every stream at the first signal; a drain lets them finish
        # (uvicorn cancels what is left at `timeout_graceful_shutdown`).
        AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # configured above; the gateway writes its own access log
        access_log=False,
        timeout_keep_alive=math.ceil(settings.keep_alive_timeout),
        # With persisted sessions, streams of running cells may take the drain's time
        # (the app ends them when it is over: this is only a backstop).
        timeout_graceful_shutdown=math.ceil(settings.drain_timeout) + 5
        if settings.persist_sessions
        else 5,
    )
    GatewayServer(config, on_stop=app.state.lifecycle.stop_requested).run()
    return 0


def route(args: argparse.Namespace) -> int:
    import uvicorn

    from kernel_gateway.cluster.app import create_router_app
    from kernel_gateway.cluster.settings import from_args as router_settings
    from kernel_gateway.logs import configure

    try:
        settings = router_settings(args, os.environ)
        settings.check_exposure()
    except ValueError as exc:
        print(f"kernel-gateway route: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_format, settings.log_level)
    logging.getLogger("kernel_gateway").info(
        "routing to node gateways at %s",
        ", ".join(f"{t.host}:{t.port}" for t in settings.node_targets),
    )
    config = uvicorn.Config(
        create_router_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        access_log=False,
        timeout_keep_alive=math.ceil(settings.keep_alive_timeout),
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()
    return 0


def build_image_command(args: argparse.Namespace) -> int:
    from kernel_gateway.cli.image import build_image

    cache_dir = args.cache_dir or default_cache_dir(os.environ)
    kernel_image = env_values(Settings, os.environ, names=("image",)).get("image") or DEFAULT_IMAGE
    if args.gateway:
        from kernel_gateway.cli.gateway_image import build_gateway_image

        build_gateway_image(args.tag or DEFAULT_GATEWAY_IMAGE, kernel_image, cache_dir=cache_dir)
        return 0
    tag = args.tag or kernel_image
    build_image(
        tag,
        args.context,
        cache_dir=cache_dir,
        requirements=args.requirements,
        download=args.download,
        languages=None
        if args.languages is None
        else [n.strip().lower() for n in args.languages.split(",") if n.strip()],
    )
    return 0


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    xdg = environ.get("XDG_CACHE_HOME", "")
    root = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return root / "kernel-gateway" / "image"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gateway.cli.extras import problem

    if (missing_extra := problem(args.command)) is not None:
        print(missing_extra, file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve(args)
    if args.command == "route":
        return route(args)
    if args.command == "build-image":
        return build_image_command(args)
    if args.command == "run":
        from kernel_gateway.cli.run import run_from_cli

        return run_from_cli(args)
    if args.command == "snapshot":
        from kernel_gateway.cli.snapshots import snapshot_from_cli

        return snapshot_from_cli(args)
    if args.command == "volume":
        from kernel_gateway.cli.volumes import volume_from_cli

        return volume_from_cli(args)
    if args.command == "keys":
        from kernel_gateway.cli.keys import keys_from_cli

        return keys_from_cli(args)
    if args.command == "mcp":
        from kernel_gateway.cli.mcp_stdio import main as mcp_main

        return mcp_main(args, os.environ)
    raise AssertionError(args.command)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
