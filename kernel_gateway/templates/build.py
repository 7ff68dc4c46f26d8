"""One build: a template's steps run one by one on its base, each a new image.

    base ──RUN──▶ image ──COPY──▶ image ──ENV──▶ … ──close──▶ final image ──check──▶ ready

Each step's image is labelled with a cache key (its parent's id, the step, its files'
hash); the same step on the same parent reuses it unless the step, or one before it, is
forced. RUN runs `/bin/bash -c` in a build container (see `kernels/images.py`); COPY
puts the uploaded files in place (`files.py`); ENV, WORKDIR and USER change the image's
settings for the steps after them.

The closing step is the gateway's, not the template's: it puts back `/opt/kernel` (the
launcher and the in-kernel code) from the base and the base's user, working folder,
entrypoint and command, so no step can change how a kernel starts or whom it runs as.
Then a kernel is started from the image and must answer (`Check`), running the
template's start command and waiting for its ready command; an image that fails is
removed, never registered. Logs go to `log` as the build runs; a failure names its
step (numbered from 1 after the base, as the logs number them) and its last output.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import posixpath
import shutil
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kernel_gateway.kernels.images import ImageBuilder, ImageInfo, StepFailed
from kernel_gateway.templates.build_network import BuildEgress
from kernel_gateway.templates.files import CopyError, FileStore, Owner, copy_archive
from kernel_gateway.templates.pip import MOUNT, download, parse_pip_install
from kernel_gateway.templates.steps import Step

logger = logging.getLogger(__name__)

LABEL_STEP = "io.kernel-gateway.template-step"
LABEL_TEMPLATE = "io.kernel-gateway.template"
LABEL_BUILD = "io.kernel-gateway.template-build"
KERNEL_DIR = "/opt/kernel"
TAIL_LINES = 20
DEFAULT_USER_ALIASES = ("user",)
"""E2B's templates run as `user`; here that is the image's own unprivileged user."""

Level = Literal["debug", "info", "warn", "error"]
Log = Callable[[Level, str, "int | None"], None]
Check = Callable[[str, "Callable[[str], None]"], Awaitable[None]]
"""Start a kernel from the image (its id), run the start and ready commands: raise
`StepFailed` if it does not answer. The second argument logs a line."""


class BuildFailed(Exception):
    def __init__(self, message: str, step: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.step = step


@dataclass
class _State:
    image: ImageInfo
    user: str
    workdir: str
    cached: bool = True
    """Whether every step so far came from the cache (a forced step ends it)."""
    passwd: dict[str, tuple[int, int]] | None = None
    passwd_of: str | None = None
    """The image `passwd` was read from (a RUN step may add users)."""


@dataclass
class Plan:
    template_id: str
    build_id: str
    base: ImageInfo
    """The image the template starts from (the gateway's, a language's, a template's)."""
    kernel_base: str
    """The image whose `/opt/kernel` and settings the result takes back (the gateway's)."""
    steps: tuple[Step, ...]
    time_limit: float
    max_size: int
    force: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    pip: PipThroughHost | None = None
    """How `pip install` steps fetch their wheels (None: they run as written)."""
    egress: BuildEgress | None = None
    """RUN steps' way to `--build-egress-allow` (None: they have no network)."""


@dataclass(frozen=True)
class PipThroughHost:
    target: list[str]
    """`pip download`'s target options for the image (its Python, its architecture)."""
    folder: Callable[[], Path]
    """A new empty folder on the host that the engine can bind into a container."""


async def run_build(
    plan: Plan, images: ImageBuilder, files: FileStore, log: Log, check: Check
) -> ImageInfo:
    """Build `plan`; the final image (not yet named). `BuildFailed` names the step."""
    deadline = time.monotonic() + plan.time_limit
    state = _State(plan.base, user=plan.base.user or "root", workdir=plan.base.workdir or "/")
    state.cached = not plan.force
    total = len(plan.steps)
    log("info", f"Building from {plan.base.id[:19]} ({total} steps)", None)
    try:
        for index, step in enumerate(plan.steps, start=1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise BuildFailed(f"the build ran out of time ({plan.time_limit:.0f} s)", index)
            log("info", f"Step {index}/{total} : {step.describe()}", index)
            try:
                await _step(plan, step, index, state, images, files, log, left)
            except (StepFailed, CopyError) as exc:
                raise BuildFailed(_failure(step, exc), index) from exc
        return await _close(plan, state, images, log, check)
    except BaseException:
        # Its layers go with it: removing the last removes those before that nothing
        # else uses (a layer another image builds on stays, as the engine keeps it).
        if state.image.id != plan.base.id:
            await asyncio.shield(images.remove(state.image.id))
        raise


async def _close(
    plan: Plan, state: _State, images: ImageBuilder, log: Log, check: Check
) -> ImageInfo:
    """The gateway's closing step, the size check and the readiness check."""
    log("info", "Restoring the gateway's kernel files and settings", None)
    closing = _key(state.image.id, {"close": plan.kernel_base})
    try:
        final_id = await images.apply(
            state.image.id,
            copy_from=(plan.kernel_base, KERNEL_DIR),
            changes=_closing_changes(await _info(images, plan.kernel_base)),
            labels={**plan.labels, LABEL_STEP: closing},
        )
        final = await _info(images, final_id)
    except StepFailed as exc:
        raise BuildFailed(f"closing the image failed: {exc.message}", None) from exc
    if plan.max_size and final.size > plan.max_size:
        await images.remove(final.id)
        raise BuildFailed(
            f"the image is {final.size / 2**20:.0f} MiB, over the limit of "
            f"{plan.max_size / 2**20:.0f} MiB (--template-max-size)",
            None,
        )
    log("info", "Starting a kernel from the image (readiness check)", None)
    try:
        await check(final.id, lambda line: log("info", line, None))
    except StepFailed as exc:
        await images.remove(final.id)
        raise BuildFailed(f"the kernel did not start from the image: {exc.message}", None) from exc
    return final


async def _step(
    plan: Plan,
    step: Step,
    index: int,
    state: _State,
    images: ImageBuilder,
    files: FileStore,
    log: Log,
    time_left: float,
) -> None:
    if step.type == "USER":
        await _resolve_user(images, state, step.args[0])
        state.user = step.args[0]
        await _settings_step(plan, step, state, images, [f"USER {step.args[0]}"], log, index)
        return
    if step.type == "WORKDIR":
        path = _join(state.workdir, step.args[0])
        state.workdir = path
        await _settings_step(plan, step, state, images, [f"WORKDIR {json.dumps(path)}"], log, index)
        return
    if step.type == "ENV":
        pairs = list(zip(step.args[::2], step.args[1::2], strict=True))
        if any("\n" in value for _, value in pairs):
            raise StepFailed("an ENV value holds a newline")
        changes = [f"ENV {k}={_env_value(v)}" for k, v in pairs]
        await _settings_step(plan, step, state, images, changes, log, index)
        return
    what: dict[str, object] = {"step": step.to_json()}
    if step.type == "RUN" and plan.egress is not None:
        # What a step made with network access is not what it makes without (nor with
        # another allowlist): another gateway's cached step must not stand in for it.
        what["network"] = list(plan.egress.allow)
    key = _key(state.image.id, what)
    if not (step.force or plan.force):
        found = await _cached(images, key, state)
        if found is not None:
            log("info", "CACHED", index)
            state.image = found
            return
    state.cached = False
    labels = {**plan.labels, LABEL_STEP: key}
    if step.type == "RUN":
        user = step.args[1] if len(step.args) > 1 and step.args[1] else state.user
        await _resolve_user(images, state, user, command=step.args[0])
        tail: deque[str] = deque(maxlen=TAIL_LINES)

        def output(line: str) -> None:
            tail.append(line)
            log("info", line, index)

        ends = time.monotonic() + time_left
        pip = parse_pip_install(step.args[0]) if plan.pip is not None else None
        folder = plan.pip.folder() if plan.pip is not None and pip is not None else None
        try:
            command, mounts = step.args[0], None
            if pip is not None and folder is not None and plan.pip is not None:
                await download(pip, folder, plan.pip.target, time_left, output)
                await asyncio.to_thread(_readable, folder)
                command, mounts = pip.command(), {str(folder): MOUNT}
                output(f"$ {command}")
            if plan.egress is not None:
                command = plan.egress.wrap(command)
                mounts = {**(mounts or {}), **plan.egress.mounts}
            image_id = await images.run(
                state.image.id,
                command,
                user=_user_spec(state, user),
                workdir=state.workdir,
                time_limit=max(ends - time.monotonic(), 1.0),
                on_output=output,
                labels=labels,
                mounts=mounts,
            )
        except StepFailed as exc:
            if tail:
                exc.message += ":\n" + "\n".join(tail)
            raise
        finally:
            if folder is not None:
                await asyncio.to_thread(shutil.rmtree, folder, True)
    else:  # COPY
        assert step.files_hash is not None
        if not files.has(step.files_hash):
            raise StepFailed(f"the files {step.files_hash[:12]}… were never uploaded")
        owner_name = step.args[2] if len(step.args) > 2 and step.args[2] else state.user
        owner = await _resolve_user(images, state, owner_name)
        mode = int(step.args[3], 8) if len(step.args) > 3 and step.args[3] else None
        archive = copy_archive(
            files.path(step.files_hash), step.args[0], step.args[1], state.workdir, owner, mode
        )
        with archive:
            image_id = await images.apply(
                state.image.id, changes=[], labels=labels, archive=archive.read()
            )
    state.image = await _info(images, image_id)


async def _settings_step(
    plan: Plan,
    step: Step,
    state: _State,
    images: ImageBuilder,
    changes: list[str],
    log: Log,
    index: int,
) -> None:
    key = _key(state.image.id, {"step": step.to_json()})
    if not (step.force or plan.force):
        found = await _cached(images, key, state)
        if found is not None:
            log("info", "CACHED", index)
            state.image = found
            return
    image_id = await images.apply(
        state.image.id, changes=changes, labels={**plan.labels, LABEL_STEP: key}
    )
    state.image = await _info(images, image_id)


async def _cached(images: ImageBuilder, key: str, state: _State) -> ImageInfo | None:
    if not state.cached:
        return None
    found = await images.find({LABEL_STEP: key})
    return await images.inspect(found) if found is not None else None


async def _info(images: ImageBuilder, ref: str) -> ImageInfo:
    info = await images.inspect(ref)
    if info is None:
        raise StepFailed(f"the image {ref[:19]} vanished")
    return info


async def _resolve_user(
    images: ImageBuilder, state: _State, user: str, command: str | None = None
) -> Owner:
    """The uid and gid of `user` in the current image; `StepFailed` (in E2B's words) for
    one the image does not have."""
    if user.replace(":", "").isdigit():
        uid, _, gid = user.partition(":")
        return Owner(int(uid), int(gid or uid))
    if state.passwd is None or state.passwd_of != state.image.id:
        state.passwd = await _passwd(images, state.image.id)
        state.passwd_of = state.image.id
    found = state.passwd.get(user)
    if found is None and user in DEFAULT_USER_ALIASES:
        found = state.passwd.get(_unprivileged(state))
    if found is None:
        what = f"failed to run command '{command}'" if command else f"user {user!r}"
        raise StepFailed(f"{what}: command failed: unauthenticated: invalid username: '{user}'")
    return Owner(*found)


def _unprivileged(state: _State) -> str:
    """The name of uid 1000 in the image (`sandbox` in the gateway's)."""
    for name, (uid, _) in (state.passwd or {}).items():
        if uid == 1000:
            return name
    return "sandbox"


def _user_spec(state: _State, user: str) -> str:
    if user in DEFAULT_USER_ALIASES and state.passwd is not None and user not in state.passwd:
        return _unprivileged(state)
    return user


async def _passwd(images: ImageBuilder, image: str) -> dict[str, tuple[int, int]]:
    data = await images.read_file(image, "/etc/passwd") or b""
    users: dict[str, tuple[int, int]] = {}
    for line in data.decode(errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[2].isdigit() and fields[3].isdigit():
            users.setdefault(fields[0], (int(fields[2]), int(fields[3])))
    return users


def _readable(folder: Path) -> None:
    """The wheels, readable by whoever the step runs as (`pip install --user` as uid 1000)."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _closing_changes(kernel: ImageInfo) -> list[str]:
    return [
        f"USER {kernel.user}",
        f"WORKDIR {json.dumps(kernel.workdir)}",
        f"ENTRYPOINT {json.dumps(list(kernel.entrypoint))}",
        f"CMD {json.dumps(list(kernel.cmd))}",
    ]


def _key(parent: str, what: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps([parent, what], sort_keys=True).encode()).hexdigest()[:32]


def _join(workdir: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(workdir, path))


def _env_value(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _failure(step: Step, exc: StepFailed | CopyError) -> str:
    message = exc.message if isinstance(exc, StepFailed) else str(exc)
    return f"{step.describe()}: {message}"
