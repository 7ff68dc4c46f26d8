"""`kernel-gateway run`: send code to a running gateway and print the stream as it arrives.

Images (displays and image files) are saved into `--out`; the exit status says
how the cell ended: 0 ok, 1 error, 124 timeout, 130 interrupted, 137 died,
2 when the gateway could not run it at all.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from kernel_gateway.client import (
    Client,
    ClientError,
    Display,
    Done,
    Error,
    Event,
    File,
    Result,
    Resumed,
    Stderr,
    Stdout,
)
from kernel_gateway.render import resumed_note
from kernel_gateway.settings import add_arguments as add_settings_arguments
from kernel_gateway.settings.client import DEFAULT_URL, ClientSettings, client_settings

EXIT_STATUS = {"ok": 0, "error": 1, "timeout": 124, "interrupted": 130, "died": 137}
IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("code", nargs="?", help="code to run (default: read -f FILE or stdin)")
    parser.add_argument("-f", "--file", type=Path, help="run the code in this file")
    add_settings_arguments(parser, ClientSettings)  # --url, --token
    parser.add_argument("--session", help="run in this session (default: stateless)")
    parser.add_argument("--timeout", type=float, help="seconds the cell may run")
    parser.add_argument(
        "--language",
        help="the code's language: python, javascript, typescript, r, bash, java, ... "
        "(default: from the -f file's extension, else python; a --session keeps its own)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("kg-output"), help="folder for images (kg-output)"
    )


class Printer:
    def __init__(self, out_dir: Path, stdout: TextIO, stderr: TextIO) -> None:
        self.out_dir = out_dir
        self.stdout = stdout
        self.stderr = stderr
        self.color = stderr.isatty()
        self.saved = 0

    def __call__(self, event: Event) -> None:
        if isinstance(event, Stdout):
            self.stdout.write(event.text)
            self.stdout.flush()
        elif isinstance(event, Stderr):
            self.stderr.write(event.text)
            self.stderr.flush()
        elif isinstance(event, Result):
            self.stdout.write(event.text + "\n")
        elif isinstance(event, Display):
            self._display(event)
        elif isinstance(event, File):
            self._file(event)
        elif isinstance(event, Error):
            tb = "\n".join(event.traceback) or f"{event.ename}: {event.evalue}"
            self.stderr.write((tb if self.color else ANSI.sub("", tb)) + "\n")
        elif isinstance(event, Resumed):
            lost = [{"name": x.name, "reason": x.reason} for x in event.lost]
            note = resumed_note({"lost": lost})
            if note:
                self.stderr.write(note)
        elif isinstance(event, Done) and event.status != "ok":
            note = f"[{event.status}"
            note += f": {event.reason}" if event.reason else ""
            note += ", kernel restarted]" if event.restarted else "]"
            self.stderr.write(note + "\n")

    def _save(self, name: str, data: bytes) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / name
        path.write_bytes(data)
        return path

    def _display(self, event: Display) -> None:
        for mime, ext in IMAGE_EXTENSIONS.items():
            value = event.data.get(mime)
            if isinstance(value, str):
                self.saved += 1
                data = value.encode() if mime == "image/svg+xml" else base64.b64decode(value)
                path = self._save(f"display-{self.saved}.{ext}", data)
                self.stdout.write(f"[image saved to {path}]\n")
                return
        if "text/plain" in event.data:
            self.stdout.write(str(event.data["text/plain"]) + "\n")

    def _file(self, event: File) -> None:
        if event.data is not None and event.mime.startswith("image/"):
            path = self._save(Path(event.path).name, event.data)
            self.stdout.write(f"[file {event.path} saved to {path}]\n")
        else:
            self.stdout.write(f"[file {event.path}: {event.size} bytes, {event.mime}]\n")


EXTENSIONS = {
    ".py": "python",
    ".r": "r",
    ".js": "javascript",
    ".mjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".sh": "bash",
    ".bash": "bash",
    ".java": "java",
    ".jsh": "java",
}
"""The language a file's extension names, for `run -f FILE` without `--language`."""


def language_for(language: str | None, file: Path | None) -> str | None:
    if language is not None:
        return language.strip().lower()
    if file is not None:
        return EXTENSIONS.get(file.suffix.lower())
    return None


def main(args: argparse.Namespace, environ: Mapping[str, str], stdin: TextIO) -> int:
    if args.session and args.language:
        print(
            "kernel-gateway run: --language is for stateless runs; a --session keeps the "
            "language it was created with",
            file=sys.stderr,
        )
        return 2
    if args.code is not None:
        code = args.code
    elif args.file is not None:
        code = args.file.read_text()
    else:
        code = stdin.read()
    settings = client_settings(ClientSettings, args, environ)
    printer = Printer(args.out, sys.stdout, sys.stderr)
    try:
        with Client(settings.url or DEFAULT_URL, token=settings.token) as client:
            if args.session:
                events = client.session(args.session).stream(code, timeout=args.timeout)
            else:
                language = language_for(args.language, args.file)
                events = client.stream(code, timeout=args.timeout, language=language)
            status = "died"
            for event in events:
                printer(event)
                if isinstance(event, Done):
                    status = event.status
    except ClientError as exc:
        print(f"kernel-gateway run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    sys.stdout.flush()
    return EXIT_STATUS.get(status, 1)


def run_from_cli(args: argparse.Namespace) -> int:
    return main(args, os.environ, sys.stdin)
