"""What a later gateway needs to adopt this one's sessions, one small file per session.

With `--persist-sessions` the registry writes a `SessionRecord` when a session is
made, when a cell starts and ends, and when its kernel is replaced; it removes the
file when the session is deleted. Each write goes to a temporary file that is then
renamed over the old one, so a gateway killed at any moment leaves either the old
record or the new one, never half of one. Writes run in order on one thread of
their own, off the event loop.

Not kept across a restart: the events of past executions (their replay buffers).
What a cell prints while no gateway is up is lost; docs/durable-sessions.md says so.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernel_gateway.kernels.volumes import VolumeMount
from kernel_gateway.records import RecordStore
from kernel_gateway.shapes.events import LostName

logger = logging.getLogger(__name__)

FORMAT = 1


@dataclass(frozen=True)
class RunningCell:
    """The cell a session was running when its record was written."""

    execution: int
    """Its number in the session (its execution id)."""
    msg_id: str
    """Its execute_request's msg_id: output the kernel still sends carries it."""
    timeout: float
    deadline: float
    """Wall-clock time (epoch seconds) at which its timeout ends."""


@dataclass(frozen=True)
class HibernatedState:
    """A hibernated session: since when, its snapshot's size, what it could not keep (each
    `{"name", "reason"}`), and why there is no snapshot at all, if that happened."""

    since: float
    """Wall-clock time (epoch seconds) it was hibernated."""
    bytes: int = 0
    lost: list[LostName] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HibernatedState:
        return cls(
            since=float(data["since"]),
            bytes=int(data.get("bytes", 0)),
            lost=[{"name": str(x["name"]), "reason": str(x["reason"])} for x in data["lost"]],
            error=str(data["error"]) if data.get("error") else None,
        )


@dataclass(frozen=True)
class SessionRecord:
    id: str
    kernel_id: str
    storage: str
    """The session's storage folder, by name, in the instance's workspace folder."""
    created_at: str
    last_activity: float
    """Wall-clock time of the last real activity: the idle clock goes on from it."""
    submitted: int
    """Executions numbered so far: the next one is `submitted + 1`."""
    last_event_id: int
    """The last SSE event id given out when this was written."""
    execution_count: int
    restarts: int
    running: RunningCell | None = None
    language: str = "python"
    """Its kernel's language (records written before languages existed are Python's)."""
    network: list[str] = field(default_factory=list)
    """Its network allowlist (empty: no network)."""
    hibernated: HibernatedState | None = None
    """Set while it is hibernated: no kernel runs (`kernel_id` is its last one's), its
    namespace is in its snapshot."""
    carrier: str | None = None
    """The storage folder (by name) whose kernel was given this session's disk when it
    resumed (`Backend.carry`): kept until the session is hibernated again or deleted."""
    template: str | None = None
    """`template_id/build_id` of the template its kernel runs, if any."""
    mounts: list[list[str]] = field(default_factory=list)
    """Its volumes: `[volume id, name, folder on the host, mount path]` each."""
    owner: str | None = None
    """The id of the API key that made it (None: the admin, and records written before
    keys existed)."""
    secrets: list[str] = field(default_factory=list)
    """The names of the secrets its code may use (never their values)."""
    placeholder: str = "kg-secret:{name}"
    """How its kernels' environment spells a secret."""
    secret_rules: list[list[Any]] = field(default_factory=list)
    """E2B's header rules: `[host pattern, {header: value with placeholders}]` each."""

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @property
    def volume_mounts(self) -> tuple[VolumeMount, ...]:
        return tuple(
            VolumeMount(i, n, Path(source), target) for i, n, source, target in self.mounts
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionRecord:
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown record format {data.get('format')!r}")
        running = data.get("running")
        return cls(
            id=str(data["id"]),
            kernel_id=str(data["kernel_id"]),
            storage=str(data["storage"]),
            created_at=str(data["created_at"]),
            last_activity=float(data["last_activity"]),
            submitted=int(data["submitted"]),
            last_event_id=int(data["last_event_id"]),
            execution_count=int(data["execution_count"]),
            restarts=int(data["restarts"]),
            language=str(data.get("language", "python")),
            template=str(data["template"]) if data.get("template") else None,
            network=[str(p) for p in data.get("network") or []],
            hibernated=HibernatedState.from_json(data["hibernated"])
            if data.get("hibernated")
            else None,
            carrier=str(data["carrier"]) if data.get("carrier") else None,
            mounts=[[str(part) for part in m] for m in data.get("mounts") or []],
            owner=str(data["owner"]) if data.get("owner") else None,
            secrets=[str(n) for n in data.get("secrets") or []],
            placeholder=str(data.get("placeholder") or "kg-secret:{name}"),
            secret_rules=[
                [str(p), {str(k): str(v) for k, v in h.items()}]
                for p, h in data.get("secret_rules") or []
            ],
            running=None
            if running is None
            else RunningCell(
                execution=int(running["execution"]),
                msg_id=str(running["msg_id"]),
                timeout=float(running["timeout"]),
                deadline=float(running["deadline"]),
            ),
        )


# A session id: hex, or `<node>.<hex>` in a cluster (`--node-name`); never a path.
class SessionStore(RecordStore[SessionRecord]):
    """Session records in `folder`."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, SessionRecord.from_json)
