"""Images made step by step: the primitives a template build needs from a backend.

A template (see `templates/`) is built one step at a time, each step a new image on the
one before: a command run in a container of the parent image, then committed (RUN);
files put into a container, then committed (COPY); or only the image's settings changed
(ENV, WORKDIR, USER, and the gateway's own closing settings). Each container runs as a
kernel does (the same runtime, memory, CPU and process limits; no network) and is
removed whatever happens. The orchestration (which step, the cache, the logs, the
readiness check) is `templates/build.py`'s; this is only the engine's side.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ImageInfo:
    """An image as a build step needs it."""

    id: str
    user: str
    workdir: str
    env: Mapping[str, str] = field(default_factory=dict)
    cmd: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    size: int = 0
    arch: str = "amd64"


@dataclass(frozen=True)
class ListedImage:
    """An image as a listing shows it (see `ImageBuilder.listed`); `tags` empty when it
    has no name (a cached step)."""

    id: str
    tags: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)


class StepFailed(Exception):
    """A step's command failed (its exit code) or could not run at all (None)."""

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class ImageBuilder(abc.ABC):
    """A backend's image primitives. Every method raises only `StepFailed` (engine errors
    included, mapped at the backend's boundary) unless it says otherwise."""

    @abc.abstractmethod
    async def inspect(self, ref: str) -> ImageInfo | None:
        """The image `ref` (a name or an id), or None if the engine has none."""

    @abc.abstractmethod
    async def run(
        self,
        parent: str,
        command: str,
        *,
        user: str,
        workdir: str,
        time_limit: float,
        on_output: Callable[[str], None],
        labels: Mapping[str, str],
        mounts: Mapping[str, str] | None = None,
    ) -> str:
        """Run `/bin/bash -c command` in a container of `parent` as `user` in `workdir`,
        passing each line of its output to `on_output`; commit it: the new image's id.
        `mounts`: host folders bound read-only (host path → path inside), not committed.
        `StepFailed` with the exit code when the command fails, or when `time_limit` passed
        (the container is killed)."""

    @abc.abstractmethod
    async def apply(
        self,
        parent: str,
        *,
        changes: list[str],
        labels: Mapping[str, str],
        archive: bytes | None = None,
        copy_from: tuple[str, str] | None = None,
    ) -> str:
        """A new image on `parent`: `archive` (a tar) unpacked at `/`, the folder
        `copy_from=(image, path)` copied from another image to the same place, then the
        Dockerfile-style `changes` (`ENV A=1`, `WORKDIR /x`, `USER 0`, `CMD [...]`)."""

    @abc.abstractmethod
    async def read_file(self, image: str, path: str, limit: int = 1 << 20) -> bytes | None:
        """The file `path` of `image` (at most `limit` bytes), or None if it has none."""

    @abc.abstractmethod
    async def archive(self, image: str, path: str, dest: Path, limit: int) -> int:
        """Write the folder `path` of `image` to `dest` as a tar (its entries under the
        folder's name); how many entries it holds (0: no such folder). `StepFailed` past
        `limit` bytes (`dest` is removed)."""

    @abc.abstractmethod
    async def find(self, labels: Mapping[str, str]) -> str | None:
        """The id of an image carrying all of `labels` (a cached step), if any."""

    @abc.abstractmethod
    async def listed(self, label: str) -> list[ListedImage]:
        """The images that carry the label `label` (any value), but those under another
        image (a build's earlier steps)."""

    @abc.abstractmethod
    async def tag(self, image: str, ref: str) -> None:
        """Name the image `image` as `ref` (`repository:tag`)."""

    @abc.abstractmethod
    async def remove(self, ref: str) -> bool:
        """Remove the image `ref` and the untagged layers only it used; False if it is in
        use (a container runs from it) or gone already. Never raises."""

    @abc.abstractmethod
    async def cleanup(self) -> int:
        """Remove what builds cut short left behind (their containers): how many."""
