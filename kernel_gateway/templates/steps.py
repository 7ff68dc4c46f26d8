"""A template's build steps: E2B's five step types, checked once on the way in.

E2B's SDKs send a template as a base (`fromImage` or `fromTemplate`) and a list of steps,
each `{"type", "args", "filesHash"?, "force"?}`; our own API takes the same list (or a
Dockerfile, see `dockerfile.py`). Their meaning, as E2B's build service gives it:

    RUN      [command, user?]             `/bin/bash -c command` as `user` (default: the
                                          current USER), in the current WORKDIR
    COPY     [src, dest, user?, mode?]    the files of the uploaded context `filesHash`
                                          matching `src` (a glob) into `dest`, owned by
                                          `user`, with `mode` (octal) if given
    ENV      [key, value, key, value...]  variables for the later steps and the kernels
    WORKDIR  [path]                       the folder later steps run in
    USER     [name]                       the user later steps run as

Everything else is refused here, with the step's number, so a typo never becomes a build
that half-ran. `parse_steps` is pure: no engine, no files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from kernel_gateway.errors import InvalidRequest

StepType = Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"]
STEP_TYPES: tuple[StepType, ...] = ("RUN", "COPY", "ENV", "WORKDIR", "USER")
MAX_STEPS = 100
"""Each step is a layer of the image: overlayfs stops at 128 layers, the base has ~20."""
MAX_ARG_BYTES = 64 * 1024
FILES_HASH = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ID = r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})"
USER_NAME = re.compile(rf"^{_ID}(?::{_ID})?$")
"""A user, or `user:group` (COPY's `--chown=app:app`, `USER 1000:1000`), by name or id."""
MODE = re.compile(r"^[0-7]{3,4}$")


@dataclass(frozen=True)
class Step:
    type: StepType
    args: tuple[str, ...]
    files_hash: str | None = None
    force: bool = False

    def describe(self) -> str:
        """`RUN pip install x`, as build logs and errors name a step."""
        shown = " ".join(self.args[:2] if self.type in ("RUN", "COPY") else self.args)
        return f"{self.type} {shown}"[:200]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"type": self.type, "args": list(self.args)}
        if self.files_hash is not None:
            out["filesHash"] = self.files_hash
        if self.force:
            out["force"] = True
        return out


def step_error(index: int, message: str) -> InvalidRequest:
    # Steps are numbered from 1 as build logs number them (`Step 2/5`), after the base.
    return InvalidRequest(f"step {index + 1}: {message}")


def parse_steps(raw: object) -> list[Step]:
    """The steps of a build request, checked; `InvalidRequest` names the first bad one."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidRequest("steps must be a list of {type, args} objects")
    if len(raw) > MAX_STEPS:
        raise InvalidRequest(f"a template has at most {MAX_STEPS} steps, got {len(raw)}")
    return [parse_step(i, item) for i, item in enumerate(raw)]


def parse_step(index: int, raw: object) -> Step:
    if not isinstance(raw, Mapping):
        raise step_error(index, "must be an object with a type and args")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind.upper() not in STEP_TYPES:
        raise step_error(
            index, f"unknown step type {kind!r}; the types are {', '.join(STEP_TYPES)}"
        )
    step_type = cast(StepType, kind.upper())
    args = raw.get("args", [])
    if not isinstance(args, Sequence) or isinstance(args, str):
        raise step_error(index, "args must be a list of strings")
    if not all(isinstance(a, str) for a in args):
        raise step_error(index, "args must be a list of strings")
    if any(len(a.encode()) > MAX_ARG_BYTES or "\x00" in a for a in args):
        raise step_error(index, f"an argument is over {MAX_ARG_BYTES} bytes or holds a NUL")
    force = raw.get("force", False)
    if force is not None and not isinstance(force, bool):
        raise step_error(index, "force must be true or false")
    files_hash = raw.get("filesHash")
    if files_hash is not None and (
        not isinstance(files_hash, str) or not FILES_HASH.match(files_hash)
    ):
        raise step_error(index, "filesHash must be 64 lowercase hex digits (a SHA-256)")
    step = Step(step_type, tuple(args), files_hash, bool(force))
    _check_args(index, step)
    return step


def _check_args(index: int, step: Step) -> None:
    args = step.args
    if step.type == "RUN":
        if not 1 <= len(args) <= 2 or not args[0].strip():
            raise step_error(index, "RUN takes [command] or [command, user]")
        if len(args) == 2 and args[1]:
            _check_user(index, args[1])
    elif step.type == "COPY":
        if not 2 <= len(args) <= 4 or not args[0] or not args[1]:
            raise step_error(index, "COPY takes [src, dest, user?, mode?]")
        if step.files_hash is None:
            raise step_error(index, "COPY needs the filesHash of its uploaded files")
        _check_source(index, args[0])
        if len(args) > 2 and args[2]:
            _check_user(index, args[2])
        if len(args) > 3 and args[3] and not MODE.match(args[3]):
            raise step_error(index, f"COPY mode must be octal like 0755, got {args[3]!r}")
    elif step.type == "ENV":
        if not args or len(args) % 2:
            raise step_error(index, "ENV takes [key, value, key, value, ...]")
        for key in args[::2]:
            if not ENV_NAME.match(key):
                raise step_error(index, f"ENV name {key!r} is not a valid variable name")
    elif step.type == "WORKDIR":
        if len(args) != 1 or not args[0]:
            raise step_error(index, "WORKDIR takes [path]")
    elif step.type == "USER":
        if len(args) != 1:
            raise step_error(index, "USER takes [name]")
        _check_user(index, args[0])


def _check_user(index: int, user: str) -> None:
    if not USER_NAME.match(user):
        raise step_error(index, f"{user!r} is not a user name")


def _check_source(index: int, src: str) -> None:
    """A COPY source stays inside the uploaded context: relative, no `..`."""
    parts = src.replace("\\", "/").split("/")
    if src.startswith("/") or ".." in parts:
        raise step_error(index, f"COPY source {src!r} is outside the build context")
