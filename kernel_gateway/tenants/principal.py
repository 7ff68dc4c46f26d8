"""A request's principal: the admin, or one API key with its quotas.

Every resource a request makes is written with its owner: the key's id, or `None` when
the admin made it (the `--token`, or anyone on a gateway without one). A principal sees
a resource when it owns it; the admin sees everything. Another key's resource is
answered as missing (404), never as forbidden: a key must not learn that an id exists.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ADMIN_NAME = "admin"


@dataclass(frozen=True)
class Quotas:
    """What one key may hold at once, and how fast it may ask. `None`: only the gateway's
    own limits apply (`--max-sessions`, `--memory-limit`, ...)."""

    max_sessions: int | None = None
    """Sessions (and E2B sandboxes, Jupyter kernels, MCP sessions) held at once."""
    max_stateless: int | None = None
    """Stateless requests (`POST /execute`) running or waiting at once."""
    requests_per_minute: int | None = None
    """Requests of any kind; past it, 429 with `Retry-After`."""
    cpus: float | None = None
    """CPUs for each of its kernels, at most the gateway's `--cpu-limit`."""
    memory_bytes: int | None = None
    """Memory for each of its kernels, at most the gateway's `--memory-limit`."""
    disk_bytes: int | None = None
    """Disk for each of its sessions, at most the gateway's `--workspace-size`."""
    total_disk_bytes: int | None = None
    """Disk its sessions hold together: past it, no new session (sampled every 5 s)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Quotas:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Principal:
    """Who a request acts as. `key_id` is None for the admin."""

    key_id: str | None
    name: str
    quotas: Quotas = field(default_factory=Quotas)

    @property
    def admin(self) -> bool:
        return self.key_id is None

    @property
    def owner(self) -> str | None:
        """What a resource this principal makes is written with."""
        return self.key_id

    def sees(self, owner: str | None) -> bool:
        """Whether a resource written with `owner` exists for this principal."""
        return self.key_id is None or owner == self.key_id


ADMIN = Principal(None, ADMIN_NAME)
"""The operator: the `--token`, anyone on a gateway without one, and the gateway itself
(its reaper, its drain, adoption)."""


def acting_for(owner: str | None) -> Principal:
    """The principal the gateway acts as on behalf of a resource's owner (a template's
    build resolving its base): what it sees is what the owner sees."""
    return ADMIN if owner is None else Principal(owner, owner)
