"""The `kernel-gateway` command: serve the API, build the kernel image, or run code."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .settings import DEFAULT_IMAGE, add_serve_arguments, describe, from_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernel-gateway",
        description="Run AI-written code in sandboxed IPython kernels; stream results over SSE.",
        epilog="Every serve flag has an environment twin: --pool-size is KG_POOL_SIZE, and so on.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="start the HTTP API")
    add_serve_arguments(serve)

    build = commands.add_parser("build-image", help="build the kernel container image")
    build.add_argument("--tag", help=f"image name (default: KG_IMAGE or {DEFAULT_IMAGE})")
    build.add_argument("--context", type=Path, help="the kernel-image folder (default: bundled)")

    from .run import add_arguments

    run_parser = commands.add_parser(
        "run",
        help="send code to a running gateway and print the results",
        description="Exit status: 0 ok, 1 error, 124 timeout, 130 interrupted, 137 died, "
        "2 when the gateway could not run the code.",
    )
    add_arguments(run_parser)
    return parser


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import create_app
    from .backends.base import secure_runtime_root
    from .logs import configure

    try:
        settings = from_args(args, os.environ)
        settings.check_exposure()
        secure_runtime_root(settings.runtime_dir)  # RuntimeDirError, a ValueError
    except ValueError as exc:
        print(f"kernel-gateway: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_format, settings.log_level)
    logging.getLogger("kernel_gateway").debug("settings: %s", ", ".join(describe(settings)))
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # configured above; the gateway writes its own access log
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


def build_image_command(args: argparse.Namespace) -> int:
    from .image import build_image

    tag = args.tag or os.environ.get("KG_IMAGE") or DEFAULT_IMAGE
    build_image(tag, args.context)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .extras import problem

    if (missing_extra := problem(args.command)) is not None:
        print(missing_extra, file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve(args)
    if args.command == "build-image":
        return build_image_command(args)
    if args.command == "run":
        from .run import run_from_cli

        return run_from_cli(args)
    raise AssertionError(args.command)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
