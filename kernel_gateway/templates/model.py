"""What a template is: a name, its builds, and the tags that point at builds.

    Template   id (E2B's `templateID`), name (unique: E2B's alias), tags → build ids
    └── Build  id (E2B's `buildID`), the spec it was asked for, one state and one stop
               reason, the image it made (once ready), when it ran

A build is `waiting` (accepted, its steps not sent yet: E2B's two-call flow), then
`building`, then `ready` or `error`, never back. `error` carries the reason and the
step that failed (numbered from 1, after the base, as the logs number them). Only a
ready build can start kernels; a name (`analytics`) means its `default` tag, or its
newest ready build when nothing is tagged `default`; `analytics:v2` means tag `v2`.

Records are JSON (`to_json`/`from_json`), kept by `store.py`; build logs are kept beside
them, apart, since they grow.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kernel_gateway.errors import InvalidRequest
from kernel_gateway.shapes.responses import SessionTemplate
from kernel_gateway.templates.steps import Step, parse_steps
from kernel_gateway.tenants.principal import Principal

NAME = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
"""A template's name: lowercase, digits, `.`, `_` and `-`, 1 to 64 characters (E2B's
aliases are lowercase too; a name is also part of an image tag)."""
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
TEMPLATE_ID = re.compile(r"^[a-z0-9]{20}$")
"""A template's id, as `new_template_id` makes them (and E2B's look)."""
DEFAULT_TAG = "default"


class BuildState(StrEnum):
    WAITING = "waiting"
    BUILDING = "building"
    READY = "ready"
    ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in (BuildState.READY, BuildState.ERROR)


@dataclass(frozen=True)
class BuildSpec:
    """What to build: a base and the steps on it (see steps.py)."""

    base: str
    """An image the gateway knows (`python`, `e2bdev/base`, a language) or `template:NAME`."""
    steps: tuple[Step, ...] = ()
    start_cmd: str | None = None
    ready_cmd: str | None = None
    force: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "steps": [s.to_json() for s in self.steps],
            "start_cmd": self.start_cmd,
            "ready_cmd": self.ready_cmd,
            "force": self.force,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildSpec:
        return cls(
            base=str(data["base"]),
            steps=tuple(parse_steps(data.get("steps", []))),
            start_cmd=data.get("start_cmd"),
            ready_cmd=data.get("ready_cmd"),
            force=bool(data.get("force", False)),
        )


@dataclass
class Build:
    id: str
    created_at: float
    state: BuildState = BuildState.WAITING
    spec: BuildSpec | None = None
    image: str | None = None
    """The image's id (sha256:...) once ready."""
    size: int = 0
    reason: str | None = None
    """Why it stopped in `error`."""
    failed_step: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    cpu_count: int | None = None
    memory_mb: int | None = None
    tags_when_ready: list[str] = field(default_factory=lambda: [DEFAULT_TAG])
    """The tags this build takes once ready (E2B's `name:tag` and `tags`)."""
    language: str | None = None
    """Its kernels' language (its base's), fixed when it starts."""
    language_version: str | None = None
    """That language's version in its image (`3.11.2` on the `python3.11` base): the base's
    when it starts, then what the built image's kernelspec says (see kernels/languages.py)."""
    seeded: bool = False
    """Whether its image has files in its working directory, which each new session of it
    gets (kept beside the records as a tar: sessions' folders hide the image's)."""

    @classmethod
    def new(
        cls,
        *,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        build_id: str | None = None,
    ) -> Build:
        """A waiting build; its id `build_id` (checked: `check_build_id`) or a new UUID."""
        return cls(
            build_id or str(uuid.uuid4()), time.time(), cpu_count=cpu_count, memory_mb=memory_mb
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created_at": self.created_at,
            "state": self.state.value,
            "spec": self.spec.to_json() if self.spec is not None else None,
            "image": self.image,
            "size": self.size,
            "reason": self.reason,
            "failed_step": self.failed_step,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "cpu_count": self.cpu_count,
            "memory_mb": self.memory_mb,
            "tags_when_ready": self.tags_when_ready,
            "language": self.language,
            "language_version": self.language_version,
            "seeded": self.seeded,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Build:
        spec = data.get("spec")
        return cls(
            id=str(data["id"]),
            created_at=float(data["created_at"]),
            state=BuildState(data["state"]),
            spec=BuildSpec.from_json(spec) if spec is not None else None,
            image=data.get("image"),
            size=int(data.get("size") or 0),
            reason=data.get("reason"),
            failed_step=data.get("failed_step"),
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            cpu_count=data.get("cpu_count"),
            memory_mb=data.get("memory_mb"),
            tags_when_ready=list(data.get("tags_when_ready", [DEFAULT_TAG])),
            language=data.get("language"),
            language_version=data.get("language_version"),
            seeded=bool(data.get("seeded", False)),
        )


@dataclass
class Template:
    id: str
    name: str
    created_at: float
    updated_at: float
    builds: list[Build] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    """Tag → build id."""
    tag_times: dict[str, float] = field(default_factory=dict)
    spawn_count: int = 0
    last_spawned_at: float | None = None
    owner: str | None = None
    """The id of the API key that made it; None: the admin's, which every key may use
    (and only the admin change)."""

    @classmethod
    def new(cls, name: str, template_id: str | None = None, owner: str | None = None) -> Template:
        """A template with no build; its id `template_id` (checked: `check_template_id`) or
        a new one."""
        now = time.time()
        return cls(template_id or new_template_id(), name, now, now, owner=owner)

    def usable_by(self, viewer: Principal) -> bool:
        """Whether `viewer` may see it and start kernels on it: its own, and the admin's."""
        return self.owner is None or viewer.sees(self.owner)

    def build(self, build_id: str) -> Build | None:
        return next((b for b in self.builds if b.id == build_id), None)

    @property
    def latest(self) -> Build | None:
        return self.builds[-1] if self.builds else None

    @property
    def ready(self) -> Build | None:
        """The build a bare name starts: tag `default`, else the newest ready one."""
        tagged = self.tags.get(DEFAULT_TAG)
        if tagged is not None:
            build = self.build(tagged)
            if build is not None and build.state is BuildState.READY:
                return build
        return next((b for b in reversed(self.builds) if b.state is BuildState.READY), None)

    @property
    def building(self) -> Build | None:
        return next((b for b in self.builds if not b.state.finished), None)

    def assign(self, tags: list[str], build_id: str) -> None:
        now = time.time()
        for tag in tags:
            self.tags[tag] = build_id
            self.tag_times[tag] = now
        self.updated_at = now

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "builds": [b.to_json() for b in self.builds],
            "tags": self.tags,
            "tag_times": self.tag_times,
            "spawn_count": self.spawn_count,
            "last_spawned_at": self.last_spawned_at,
            "owner": self.owner,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Template:
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            created_at=float(data["created_at"]),
            updated_at=float(data["updated_at"]),
            builds=[Build.from_json(b) for b in data.get("builds", [])],
            tags={str(k): str(v) for k, v in data.get("tags", {}).items()},
            tag_times={str(k): float(v) for k, v in data.get("tag_times", {}).items()},
            spawn_count=int(data.get("spawn_count", 0)),
            last_spawned_at=data.get("last_spawned_at"),
            owner=str(data["owner"]) if data.get("owner") else None,
        )


@dataclass(frozen=True)
class TemplateRef:
    """Which build of which template a session runs (shown, recorded, counted)."""

    id: str
    name: str
    build_id: str

    @classmethod
    def of(cls, template: Template, build: Build) -> TemplateRef:
        return cls(template.id, template.name, build.id)

    def to_json(self) -> SessionTemplate:
        return {"id": self.id, "name": self.name, "build_id": self.build_id}

    @property
    def key(self) -> str:
        """`template_id/build_id`, as session records keep it."""
        return f"{self.id}/{self.build_id}"


def new_template_id() -> str:
    """20 lowercase letters and digits, like E2B's template ids."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(20))


def split_reference(reference: str) -> tuple[str, str | None]:
    """`analytics:v2` → (`analytics`, `v2`); `analytics` → (`analytics`, None)."""
    name, sep, tag = reference.partition(":")
    return name, (tag if sep else None)


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise InvalidRequest(
            f"template name {name!r}: use 1 to 64 lowercase letters, digits, '.', '_' or '-',"
            " starting and ending with a letter or digit"
        )
    return name


def check_template_id(template_id: str) -> str:
    """An id asked for (a router gives a template the same id on every node)."""
    if not TEMPLATE_ID.match(template_id):
        raise InvalidRequest(f"template id {template_id!r}: 20 lowercase letters and digits")
    return template_id


def check_build_id(build_id: str) -> str:
    """A build id asked for: a UUID, as `Build.new` makes them (lowercase, with hyphens)."""
    try:
        canonical = str(uuid.UUID(build_id))
    except ValueError:
        canonical = None
    if canonical != build_id:
        raise InvalidRequest(f"build id {build_id!r}: a UUID, lowercase, with hyphens")
    return build_id


def check_tag(tag: str) -> str:
    if not TAG.match(tag):
        raise InvalidRequest(
            f"tag {tag!r}: use 1 to 64 letters, digits, '_', '.' or '-', not starting with"
            " '.' or '-'"
        )
    return tag
