"""The languages a gateway runs: Python built in, any other from a Jupyter kernelspec.

A language other than Python lives in a kernel image of its own, built `FROM` the
Python image (so the base layers are shared and Python's image does not grow). Such an
image holds one folder per language it provides:

    /opt/kernel/kernelspecs/<language>/kernel.json   a standard Jupyter kernelspec
    /opt/kernel/kernelspecs/<language>/version       the language's version, one line

`kernel.json` is what Jupyter itself reads (`argv` with `{connection_file}`,
`display_name`, `language`, `interrupt_mode`, `env`), plus optional gateway options in
`metadata.kernel_gateway`: `"transport": "ipc"` for a kernel that can bind the
gateway's ipc sockets itself (ipykernel-based kernels); any other kernel is started on
loopback TCP inside its container behind `in_kernel/bridge.py`. The Python image may
hold `python/` too: only its version is read, since Python starts the gateway's own
way (kernel_startup.py, the fork servers).

Which images are looked at: the Python image's name with `-<family>` added to its
repository (`kernel-gateway-kernel:latest` -> `kernel-gateway-kernel-r:latest`), for
each family `build-image --languages` knows, and the operator's `--language-image`s.
This module only parses; the backends read the files. It also holds the one place that
writes environment variables in each language's code (`env_code`): the egress proxy's
variables (`sessions/network.py`) and E2B's `envVars` and `env_vars` go through it.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kernel_gateway.errors import UnknownLanguage
from kernel_gateway.settings import LANGUAGE_NAME

PYTHON = "python"
RESERVED = frozenset({"python3"})
"""Names no image may give a language: `python3` is Python's kernelspec name in Jupyter."""
KERNELSPECS = "/opt/kernel/kernelspecs"

FAMILIES: dict[str, tuple[str, ...]] = {
    "r": ("r",),
    "deno": ("javascript", "typescript"),
    "bash": ("bash",),
    "java": ("java",),
}
"""The language images `build-image` makes, by image suffix, and what each provides."""


def family_of(language: str) -> str | None:
    """The image family that provides `language` (`typescript` -> `deno`), if any."""
    for family, languages in FAMILIES.items():
        if language in languages:
            return family
    return None


def family_image(python_image: str, family: str) -> str:
    """`kernel-gateway-kernel:latest`, `r` -> `kernel-gateway-kernel-r:latest`.

    The tag (and a registry's port) are kept: only the repository's last part grows.
    """
    name, tag = python_image, ""
    last = python_image.rsplit("/", 1)[-1]
    if "@" in last:
        name, _, digest = python_image.partition("@")
        return f"{name}-{family}@{digest}"
    if ":" in last:
        name, _, tag = python_image.rpartition(":")
        tag = ":" + tag
    return f"{name}-{family}{tag}"


@dataclass(frozen=True)
class Language:
    """One language this gateway can start kernels for."""

    name: str
    display_name: str
    version: str = ""
    image: str | None = None
    """The image its kernels run from (docker backend); None: the backend's own."""
    kernelspec: str | None = None
    """Path of its kernel.json inside the image; None for the built-in Python kernel."""
    interrupt_mode: Literal["signal", "message"] = "signal"
    """`signal` (SIGINT reaches the kernel) or `message` (an interrupt_request on control,
    sent by the bridge when the container gets SIGINT)."""
    argv: tuple[str, ...] = field(default=(), compare=False)
    start_cmd: str | None = field(default=None, compare=False)
    ready_cmd: str | None = field(default=None, compare=False)
    """A template's commands, run beside each of its kernels before it is handed out."""
    seed: Path | None = field(default=None, compare=False)
    """A tar of files every new session of it starts with in its working directory (a
    template's `/home/user`, see `templates/`), or None."""

    @property
    def builtin(self) -> bool:
        return self.kernelspec is None

    def env_code(self, env: Mapping[str, str | None]) -> str:
        """Code that sets `env` in a kernel of this language: see `env_code`."""
        return env_code(self.name, env)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "display_name": self.display_name,
            "version": self.version,
            "image": self.image,
            "interrupt_mode": self.interrupt_mode,
        }


BUILTIN_PYTHON = Language(PYTHON, "Python 3")


class Languages(Mapping[str, Language]):
    """The languages a gateway serves, by name, Python first."""

    def __init__(self, languages: Iterable[Language]) -> None:
        self._by_name = {lang.name: lang for lang in languages}

    def __getitem__(self, name: str) -> Language:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def get_or_raise(self, name: str | None) -> Language:
        """The language called `name` (None: Python), or `UnknownLanguage` naming the rest."""
        wanted = PYTHON if name is None else name
        found = self._by_name.get(wanted)
        if found is None:
            raise UnknownLanguage(
                f"language {wanted!r} is not available on this gateway; available: "
                + ", ".join(sorted(self._by_name, key=lambda n: (n != PYTHON, n)))
            )
        return found


# -- environment variables, in each language's code ---------------------------------------------

Env = Mapping[str, str | None]
"""Variables to set (a None value: unset), by name."""


def _python_env(env: Env) -> str:
    values = {k: v for k, v in env.items() if v is not None}
    lines = ["import os as __kg_os"]
    if values:
        lines.append(f"__kg_os.environ.update({values!r})")
    lines += [f"__kg_os.environ.pop({k!r}, None)" for k, v in env.items() if v is None]
    return "\n".join([*lines, "del __kg_os"])


def _r_string(text: str) -> str:
    """An R string literal: JSON's escapes are R's, and characters past ASCII are left as
    they are (R reads `\\uD83D` as an invalid escape, not half of a pair)."""
    return json.dumps(text, ensure_ascii=False)


def _r_env(env: Env) -> str:
    return "\n".join(
        f"Sys.setenv({_r_string(k)} = {_r_string(v)})"
        if v is not None
        else f"Sys.unsetenv({_r_string(k)})"
        for k, v in env.items()
    )


def _deno_env(env: Env) -> str:
    # A JSON string is a JavaScript string literal (surrogate pairs included).
    return "\n".join(
        f"Deno.env.set({json.dumps(k)}, {json.dumps(v)});"
        if v is not None
        else f"Deno.env.delete({json.dumps(k)});"
        for k, v in env.items()
    )


def _bash_env(env: Env) -> str:
    # Single quotes keep every byte but `'` as it is (newlines too); shlex closes and
    # reopens them around a `'`.
    return "\n".join(
        f"export {shlex.quote(k)}={shlex.quote(v)}" if v is not None else f"unset {shlex.quote(k)}"
        for k, v in env.items()
    )


_ENV_CODE: dict[str, Callable[[Env], str]] = {
    PYTHON: _python_env,
    "r": _r_env,
    "javascript": _deno_env,
    "typescript": _deno_env,
    "bash": _bash_env,
}
ENV_LANGUAGES = frozenset(_ENV_CODE)
"""The languages whose kernels can be given environment variables by code (not Java: a
running JVM's environment is fixed)."""


def env_code(language: str, env: Env) -> str:
    """Silent code that sets `env` (a None value: unsets the variable) in a kernel of
    `language`, for the kernel and what it starts; "" for no variables. Names and values
    are taken as they are, quoted for the language (names must be ones a process can
    have: not empty, no `=`, no NUL, and for Bash an identifier). Raises ValueError for a
    language not in `ENV_LANGUAGES`."""
    write = _ENV_CODE.get(language)
    if write is None:
        raise ValueError(f"environment variables cannot be set by code in {language}")
    return write(env) if env else ""


def parse_kernelspecs(tar_bytes: bytes, image: str) -> list[Language]:
    """The languages in a tar of `/opt/kernel/kernelspecs` (as Docker's get_archive gives it).

    A folder whose kernel.json is unreadable or not a kernelspec is skipped: one broken
    language must not cost a gateway the others. Python's folder gives its version only.
    """
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar.getmembers():
            parts = member.name.strip("/").split("/")
            if (
                member.isfile()
                and len(parts) == 3
                and parts[0] == "kernelspecs"
                and parts[2] in ("kernel.json", "version")
            ):
                handle = tar.extractfile(member)
                if handle is not None:
                    members["/".join(parts[1:])] = handle.read(1 << 20)
    found = []
    for key in sorted(members):
        name, _, leaf = key.partition("/")
        if leaf != "kernel.json" or not LANGUAGE_NAME.fullmatch(name) or name in RESERVED:
            continue
        version = members.get(f"{name}/version", b"").decode("utf-8", "replace").strip()
        spec = _kernelspec(members[key])
        if spec is None:
            continue
        if name == PYTHON:
            found.append(Language(PYTHON, spec.get("display_name", "Python 3"), version[:64]))
            continue
        found.append(
            Language(
                name=name,
                display_name=str(spec.get("display_name") or name)[:128],
                version=version[:64],
                image=image,
                kernelspec=f"{KERNELSPECS}/{name}/kernel.json",
                interrupt_mode="message" if spec.get("interrupt_mode") == "message" else "signal",
                argv=tuple(str(a) for a in spec["argv"]),
            )
        )
    return found


def _kernelspec(data: bytes) -> dict[str, str] | None:
    try:
        spec = json.loads(data)
    except ValueError:
        return None
    if not isinstance(spec, dict):
        return None
    if not isinstance(spec.get("metadata", {}), dict | None):
        return None
    argv = spec.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return None
    return spec
