"""The API's responses: what each operation answers, as the TypedDict its producer returns.

Producers are annotated with these (`Session.to_json() -> shapes.Session`), so `mypy --strict`
refuses a missing, misspelled or extra field where the dict is built; the OpenAPI document's
`components.schemas` are generated from the same classes (`schema.py`), and tests validate
live answers against them. They are plain TypedDicts: importing them loads no pydantic (the
markers of `meta.py` become pydantic's only when a schema is made).

The classes are named as the OpenAPI document's components (`Session` is the session's JSON,
not `kernel_gateway.sessions.session.Session`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from typing_extensions import TypedDict

from kernel_gateway.errors import GatewayError
from kernel_gateway.shapes.events import DoneData, ErrorData, Event, LostName, ResumedData
from kernel_gateway.shapes.meta import (
    Count,
    Milliseconds,
    Timestamp,
    after,
    closed,
    field,
)
from kernel_gateway.types import DoneStatus, ExecutionStatus, SessionStatus


def error_types() -> list[str]:
    """Every error `type` the gateway answers with: one per `GatewayError` class."""
    found: set[str] = set()
    pending: list[type[GatewayError]] = [GatewayError]
    while pending:
        cls = pending.pop()
        found.add(cls.error_type)
        pending.extend(cls.__subclasses__())
    # Raised by the router itself, mapped in error_handlers.py.
    found.update({"method_not_allowed", "http_error"})
    return sorted(found)


def _known_error_type(value: str) -> str:
    if value not in error_types():
        raise ValueError("is not an error type of the gateway")
    return value


def _error_type_enum(schema: dict[str, Any]) -> None:
    schema["enum"] = error_types()


@closed
class ErrorDetail(TypedDict):
    type: Annotated[str, after(_known_error_type), field(json_schema_extra=_error_type_enum)]
    message: str


@closed
class Error(TypedDict):
    """Every error answer's body."""

    error: ErrorDetail


@closed
class NetworkGranted(TypedDict):
    allow: list[str]
    """The domain patterns the session may reach (normalized: lower case, no final dot)."""


@closed
class SessionTemplate(TypedDict):
    """The template (and its build) a session's kernel runs."""

    id: Annotated[str, field(description="The template's id.")]
    name: Annotated[str, field(description="The template's name.")]
    build_id: Annotated[str, field(description="The build whose image the kernel runs.")]


class Hibernation(TypedDict):
    """A hibernated session's snapshot: its variables are on disk, its kernel stopped."""

    since: Timestamp
    bytes: Count
    """The snapshot's size on disk."""
    lost: list[LostName]
    """Names the snapshot could not keep: they will be missing when the session resumes."""


@closed
class Session(TypedDict):
    """A session: a kernel kept for one client, with its working directory."""

    # Descriptions in Field, not docstrings: InterruptedSession's schema repeats them.
    id: Annotated[
        str,
        field(description="The session id: 32 hex digits (after `node.` with `--node-name`)."),
    ]
    language: Annotated[str, field(description="The language its kernel runs.")]
    status: SessionStatus
    created_at: Timestamp
    idle_seconds: Annotated[float, field(ge=0)]
    execution_count: Count
    queued: Count
    restarts: Count
    failed: Annotated[
        str | None, field(description="Why the session failed (its kernel kept dying), else null.")
    ]
    network: Annotated[
        Literal["none"] | NetworkGranted,
        field(description='Its network policy: "none", or the domains it may reach.'),
    ]
    hibernation: Annotated[
        Hibernation | None,
        field(
            description="While `status` is `hibernated`: its snapshot; else null. Any call "
            "that needs the kernel resumes it."
        ),
    ]
    template: Annotated[
        SessionTemplate | None,
        field(description="The template its kernel was started from, else null."),
    ]
    volumes: Annotated[
        dict[str, str],
        field(description="The volumes it mounts: mount path → volume name."),
    ]
    owner: Annotated[
        str | None,
        field(description="The id of the API key that made it; null: the admin token."),
    ]
    secrets: Annotated[
        list[str],
        field(description="The secrets its code may use, by name (never their values)."),
    ]


@closed
class InterruptedSession(Session):
    interrupted: bool
    """false when nothing was running"""


@closed
class ResumedSession(Session):
    resumed: Annotated[
        ResumedData | None,
        field(
            description="What resuming it reported (the names that did not come back); null "
            "when it was not hibernated."
        ),
    ]


@closed
class SessionList(TypedDict):
    sessions: list[Session]


@closed
class SessionMetric(TypedDict):
    """What a session's kernel used in one 5-second bucket."""

    timestamp: Annotated[Timestamp, field(description="The start of its bucket.")]
    cpu_count: Annotated[Count, field(description="The session's CPUs (--cpu-limit, up).")]
    cpu_used_pct: Annotated[
        float, field(ge=0, le=100, description="Their share used since the last sample.")
    ]
    mem_used: Annotated[Count, field(description="Bytes, without the page cache.")]
    mem_total: Annotated[Count, field(description="The memory limit, bytes.")]
    mem_cache: Annotated[Count, field(description="Page cache, bytes.")]
    disk_used: Annotated[Count, field(description="Bytes used on the session's disk.")]
    disk_total: Annotated[Count, field(description="The session's disk, bytes.")]


@closed
class SessionMetrics(TypedDict):
    metrics: Annotated[list[SessionMetric], field(description="Oldest first, at most an hour.")]


@closed
class Snapshot(TypedDict):
    """A snapshot: a session's files and (Python) variables as they were, kept to start new
    sessions from."""

    id: Annotated[str, field(description="`snap-` and 20 hex digits (after `node.` in a cluster).")]
    name: Annotated[str | None, field(description="The name it is kept under, if any.")]
    session_id: Annotated[str, field(description="The session it was taken from.")]
    language: str
    template: Annotated[str | None, field(description="The id of the template it runs, if any.")]
    created_at: Timestamp
    bytes: Annotated[Count, field(description="Its size on disk: files and variables.")]
    lost: Annotated[
        list[LostName],
        field(
            description="What it does not hold (names that could not be saved), as "
            "hibernation reports them."
        ),
    ]
    owner: Annotated[
        str | None,
        field(description="The id of the API key that took it; null: the admin token."),
    ]


@closed
class SnapshotList(TypedDict):
    snapshots: list[Snapshot]


@closed
class VolumeInfo(TypedDict):
    """A volume: a disk of its own that outlives sessions, mounted by any number of them."""

    id: Annotated[str, field(description="`vol-` and 20 hex digits (after `node.` in a cluster).")]
    name: Annotated[str, field(description="Its name, unique on the gateway.")]
    size: Annotated[Count, field(description="Its size cap in bytes.")]
    used: Annotated[Count, field(description="Bytes its files use now.")]
    capped: Annotated[
        bool,
        field(
            description="Whether the cap is enforced (a disk of its own: writes past it fail "
            "with ENOSPC); false where the gateway cannot make disks (not root, no loop "
            "devices)."
        ),
    ]
    created_at: Timestamp
    mounted_by: Annotated[
        dict[str, str],
        field(description="The sessions that mount it now: session id → mount path."),
    ]


@closed
class VolumeList(TypedDict):
    volumes: list[VolumeInfo]


@closed
class KeyQuotas(TypedDict):
    """A key's quotas; null: none of its own (the gateway's limits apply)."""

    max_sessions: Annotated[Count | None, field(description="Sessions held at once.")]
    max_stateless: Annotated[
        Count | None, field(description="Stateless requests running or waiting at once.")
    ]
    requests_per_minute: Annotated[Count | None, field(description="Requests a minute.")]
    cpus: Annotated[float | None, field(description="CPUs for each of its kernels.")]
    memory_bytes: Annotated[Count | None, field(description="Memory for each of its kernels.")]
    disk_bytes: Annotated[Count | None, field(description="Disk for each of its sessions.")]
    total_disk_bytes: Annotated[Count | None, field(description="Disk its sessions hold together.")]


@closed
class KeyInfo(TypedDict):
    """An API key, without its secret (shown once, when it is made or rotated)."""

    id: Annotated[str, field(description="`key_` and 16 hex digits.")]
    name: Annotated[str, field(description="Unique among live keys; labels its metrics.")]
    prefix: Annotated[
        str, field(description="The secret's first 12 characters, to tell keys apart.")
    ]
    created_at: Timestamp
    rotated_at: Annotated[Timestamp | None, field(description="Its last new secret, if any.")]
    revoked_at: Annotated[
        Timestamp | None, field(description="When it stopped working, if it has.")
    ]
    quotas: KeyQuotas


@closed
class KeySecret(KeyInfo):
    secret: Annotated[
        str,
        field(
            description="The key itself: `e2b_` and 48 hex digits, sent as `Authorization: "
            "Bearer <secret>` (or E2B's `X-API-KEY`). Shown only here: the gateway keeps its "
            "hash."
        ),
    ]


@closed
class KeyUsage(TypedDict):
    """What a key used since it was made (the admin token's own use is not counted)."""

    sessions_created: Annotated[
        Count, field(description="Sessions it made: sandboxes, contexts, kernels count.")
    ]
    stateless_requests: Annotated[Count, field(description="Stateless executions it ran.")]
    kernel_seconds: Annotated[
        float, field(ge=0, description="Seconds its sessions' kernels ran (5 s samples).")
    ]
    cpu_seconds: Annotated[
        float,
        field(ge=0, description="CPU seconds they used (0 where the backend cannot tell)."),
    ]
    peak_memory_bytes: Annotated[
        Count, field(description="The most memory one of its kernels held at a sample.")
    ]
    egress_bytes: Annotated[
        Count,
        field(description="Bytes its sessions sent and received through the egress proxy."),
    ]
    sessions_held: Annotated[
        Count,
        field(description="Sessions (and their contexts) it holds now, against `max_sessions`."),
    ]
    unavailable_nodes: NotRequired[
        Annotated[list[str], field(description="Through a router: nodes not counted now.")]
    ]


@closed
class KeyList(TypedDict):
    keys: list[KeyInfo]


@closed
class KeyRecord(KeyInfo):
    """A key as a cluster's gateways pass it to each other."""

    changed_at: Annotated[Timestamp, field(description="Its last change: the latest wins.")]
    digest: Annotated[str, field(description="The SHA-256 of its secret, in hex.")]


@closed
class KeyRecords(TypedDict):
    version: Annotated[
        str, field(description="A digest of every key's last change (`/health`'s `keys`).")
    ]
    keys: list[KeyRecord]


@closed
class VolumeEntry(TypedDict):
    """A file, folder or symlink in a volume (links listed, never followed)."""

    path: Annotated[str, field(description="Relative to the volume's root.")]
    type: Literal["file", "dir", "symlink", "other"]
    size: Count
    mode: Annotated[int, field(description="Its permission bits (`0o644` is 420).")]
    modified: Timestamp
    target: Annotated[str | None, field(description="A symlink's target, else null.")]


@closed
class VolumeListing(TypedDict):
    entries: list[VolumeEntry]


@closed
class Restored(TypedDict):
    snapshot: Annotated[str, field(description="The snapshot's id.")]
    lost: Annotated[list[LostName], field(description="What the snapshot did not hold.")]


@closed
class RestoredSession(Session):
    restored: Annotated[
        Restored | None,
        field(description="The snapshot it was started from, and what that did not hold."),
    ]


@closed
class ForkOutcome(TypedDict):
    """One copy: its session, or why it could not be started."""

    session: NotRequired[RestoredSession]
    error: NotRequired[ErrorDetail]
    status: NotRequired[
        Annotated[int, field(description="With `error`: the status it would have answered.")]
    ]


@closed
class ForkList(TypedDict):
    forks: list[ForkOutcome]


BuildState = Literal["waiting", "building", "ready", "error"]


class TemplateBuild(TypedDict):
    """One build of a template: its steps run into an image, or stopped with a reason."""

    id: str
    template_id: str
    template: Annotated[str, field(description="The template's name.")]
    state: Annotated[
        BuildState,
        field(description="`waiting` (not started), `building`, then `ready` or `error`."),
    ]
    reason: Annotated[str | None, field(description="Why it failed (state `error`), else null.")]
    failed_step: Annotated[
        int | None,
        field(ge=1, description="The step that failed, numbered from 1 as the logs number them."),
    ]
    base: Annotated[str | None, field(description="What it builds on.")]
    steps: Count
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    image: Annotated[str | None, field(description="The image it made, once ready.")]
    size_bytes: Count
    tags: Annotated[list[str], field(description="The template's tags that point at it.")]


class TemplateInfo(TypedDict):
    """A template: kernels started from its ready build run its image."""

    id: str
    name: str
    language: Annotated[str | None, field(description="Its kernels' language (its base's).")]
    state: Annotated[BuildState, field(description="Its newest build's state.")]
    ready_build: Annotated[
        str | None, field(description="The build its name starts (tag `default`, else newest).")
    ]
    tags: Annotated[dict[str, str], field(description="Tag → build id.")]
    created_at: Timestamp
    updated_at: Timestamp
    sessions: Annotated[Count, field(description="Sessions running on it now.")]
    warm: Annotated[Count, field(description="Its kernels started and ready for the next session.")]
    spawn_count: Count
    last_spawned_at: Timestamp | None
    builds: list[TemplateBuild]


class TemplateList(TypedDict):
    templates: list[TemplateInfo]


class BuildLogEntry(TypedDict):
    """One line of a build's log."""

    timestamp: Timestamp
    level: Literal["debug", "info", "warn", "error"]
    message: str
    step: NotRequired[Annotated[str, field(description="The step it belongs to (from 1).")]]


class BuildLog(TypedDict):
    """A build's log from `offset` (`Accept: application/json`)."""

    logs: list[BuildLogEntry]
    next_offset: Count
    build: TemplateBuild


class TemplateFiles(TypedDict):
    """Uploaded files for COPY steps, by their SHA-256."""

    hash: str
    present: bool
    size_bytes: Count


@closed
class ExecutionSummary(TypedDict):
    id: str
    status: ExecutionStatus
    submitted_at: Timestamp
    duration_ms: Milliseconds
    execution_count: int | None
    last_event_id: int | None


@closed
class ExecutionList(TypedDict):
    executions: list[ExecutionSummary]


@closed
class FileInfo(TypedDict):
    path: str
    size: Count
    modified: Timestamp
    mime: str
    url: str


@closed
class FileList(TypedDict):
    files: list[FileInfo]


@closed
class WarmPoolStats(TypedDict):
    """A warm pool's own numbers (`WarmPool.stats`): the first fields of `PoolStats`, and
    `LanguagePool`'s source. Not a component of the API by itself."""

    warm: Count
    starting: Count
    target: Count
    kernels_started: Count


@closed
class PoolStats(TypedDict):
    warm: Count
    starting: Count
    target: Count
    kernels_started: Count
    sessions: Count
    max_sessions: Count
    stateless: Count
    max_stateless: Count


@closed
class ForkServerStats(TypedDict):
    idle: Count
    busy: Count
    starting: Count
    target: Count
    servers_started: Count
    requests_served: Count
    light_requests: Count
    """Of `requests_served`, those forked from the light template (`--fork-light-preload`)."""


@closed
class Health(TypedDict):
    status: Literal["ok"]
    backend: Literal["docker", "local"]
    instance: str
    isolation: str
    languages: list[str]
    """The languages served (details: `GET /languages`)."""
    node: NotRequired[str]
    """This gateway's node (`--node-name`): session ids made here start with it and a dot."""
    pool: PoolStats
    stateless_mode: Literal["fork", "container"]
    """How stateless requests get a kernel (`--stateless-mode`)."""
    fork_servers: NotRequired[ForkServerStats]
    """Fork-server containers (only with `stateless_mode` fork)."""
    keys: str
    """The version of the API keys held (`GET /cluster/keys`): a cluster's routers compare
    it between nodes to keep their keys in step."""


@closed
class StatelessMode(TypedDict):
    """How stateless requests get kernels (`Registry.stateless_stats`): the fields of `Health`
    from `stateless_mode` on. Not a component of the API by itself."""

    stateless_mode: Literal["fork", "container"]
    fork_servers: NotRequired[ForkServerStats]


@closed
class LanguagePool(TypedDict):
    warm: Count
    starting: Count
    target: Count
    """Warm kernels kept (`--pool-size` for python, `--language-pool` for the others)."""


@closed
class LanguageInfo(TypedDict):
    name: str
    """What `language` takes: python, javascript, typescript, r, bash, java, ..."""
    display_name: str
    version: str
    """The language's version in its image (empty when the image does not say)."""
    image: str | None
    """The kernel image it runs from (null: the gateway's own, `--image`)."""
    interrupt_mode: Literal["signal", "message"]
    """How a cell is interrupted: SIGINT, or Jupyter's interrupt_request (Deno)."""
    pool: LanguagePool


@closed
class LanguageList(TypedDict):
    default: str
    languages: list[LanguageInfo]


@closed
class CollectedExecution(TypedDict):
    """An execution's events as one JSON document (`Accept: application/json`)."""

    execution_id: str
    status: DoneStatus
    stdout: str
    stderr: str
    error: ErrorData | None
    done: DoneData
    events: list[Event]
