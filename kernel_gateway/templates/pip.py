"""`pip install` steps, done through the host: containers here cannot reach the index.

A RUN step that is exactly a `pip install` (E2B's `pip_install(...)` sends
`pip install a b`, as root) is recognised (`parse_pip_install`). The gateway then runs
`pip download` on its own host for the image's Python and architecture (only wheels:
`--only-binary :all:`), with the step's index options, and the step becomes
`pip install --no-index --find-links <the wheels>` with the step's own flags, the wheels
bound read-only into the build container for that step alone (so no layer keeps them).

What is not recognised runs in the build container as written: a command with `&&`,
`;`, a pipe or a redirect, `-r requirements.txt` or `-c` (files in the image), local
paths, editable installs, an option this module does not know.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernel_gateway.kernels.images import StepFailed

PIPS = (("pip",), ("pip3",), ("python", "-m", "pip"), ("python3", "-m", "pip"))
INDEX_OPTIONS = {"-i", "--index-url", "--extra-index-url", "--trusted-host"}
"""Options taking a value that `pip download` on the host needs (where to fetch from)."""
INSTALL_FLAGS = {
    "--user", "-U", "--upgrade", "--no-deps", "--pre", "--force-reinstall",
    "--no-cache-dir", "-q", "--quiet", "-v", "--verbose", "--no-warn-script-location",
    "--break-system-packages", "--ignore-installed", "-I",
}  # fmt: skip
"""Flags of the install itself, kept on the install in the container."""
BOTH = {"--pre", "--no-deps"}
"""Flags both the download and the install need."""
SHELL = set("$`\\\n")
"""Expansions and escapes: such a line is left to the shell."""
OPERATORS = set("&|;<>()")
MOUNT = "/tmp/kg-wheels"


@dataclass(frozen=True)
class PipInstall:
    packages: tuple[str, ...]
    download_options: tuple[str, ...]
    install_flags: tuple[str, ...]

    def command(self) -> str:
        """The step's command in the container: from the wheels alone."""
        words = ["pip", "install", "--no-index", "--find-links", MOUNT]
        return shlex.join([*words, *self.install_flags, *self.packages])


def parse_pip_install(command: str) -> PipInstall | None:
    """The `pip install` `command` is, or None when it is anything else."""
    if any(c in SHELL for c in command):
        return None
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return None
    if any(word and all(c in OPERATORS for c in word) for word in words):
        return None  # `&&`, `;`, a pipe, a redirect: a shell line, not one pip install
    program = next((p for p in PIPS if tuple(words[: len(p)]) == p), None)
    if program is None:
        if words[:1] and words[0].endswith(("/pip", "/pip3")):
            program = (words[0],)
        else:
            return None
    rest = words[len(program) :]
    if rest[:1] != ["install"]:
        return None
    packages: list[str] = []
    download: list[str] = []
    install: list[str] = []
    args = iter(rest[1:])
    for word in args:
        name, has_value, _ = word.partition("=")
        if name in INDEX_OPTIONS:
            value = word if has_value else f"{word}={next(args, '')}"
            download.append(value)
        elif word in INSTALL_FLAGS:
            install.append(word)
            if word in BOTH:
                download.append(word)
        elif word.startswith("-"):
            return None
        elif word.startswith((".", "/", "~")) or "://" in word or word.startswith("file:"):
            return None  # a path or a URL: not from the index
        else:
            packages.append(word)
    if not packages:
        return None
    return PipInstall(tuple(packages), tuple(download), tuple(install))


async def download(
    pip: PipInstall,
    dest: Path,
    target: list[str],
    time_limit: float,
    log: Callable[[str], None],
) -> None:
    """Fetch the wheels of `pip` (and its dependencies) for `target` into `dest`, logging
    pip's output; `StepFailed` with its last lines when it fails."""
    argv = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
        "--no-input", "--progress-bar", "off", "--dest", str(dest),
        "--only-binary", ":all:", *target, *pip.download_options, *pip.packages,
    ]  # fmt: skip
    log(f"pip download on the gateway's host: {shlex.join(pip.packages)}")
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    tail: list[str] = []

    async def read() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            tail[:] = [*tail[-19:], line]
            log(line)

    try:
        await asyncio.wait_for(asyncio.gather(read(), process.wait()), time_limit)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise StepFailed(f"pip download ran out of time ({time_limit:.0f} s)") from None
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    if process.returncode != 0:
        raise StepFailed(
            f"pip download on the gateway's host failed (exit {process.returncode}; only "
            "wheels can be installed in a template):\n" + "\n".join(tail)
        )
