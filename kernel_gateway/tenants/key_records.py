"""An API key as it is held and passed around: everything but its secret (`Key`), and,
between a cluster's gateways, with its secret's digest (`Record`). Their JSON forms are
the API's `KeyInfo` and `KeyRecord` (`tenants/key_json.py` types them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernel_gateway.tenants.principal import Principal, Quotas


@dataclass(frozen=True)
class Key:
    """A key as listed: everything but its secret."""

    id: str
    name: str
    shown: str
    created_at: str
    rotated_at: str | None
    revoked_at: str | None
    quotas: Quotas
    changed_at: str = ""
    """Its last change (made, renamed, new quotas or secret, revoked): a replica keeps the
    latest."""

    @property
    def principal(self) -> Principal:
        return Principal(self.id, self.name, self.quotas)

    def to_json(self) -> dict[str, Any]:
        """As the API shows it (`KeyInfo`): `prefix` is its secret's first characters."""
        return {
            "id": self.id,
            "name": self.name,
            "prefix": self.shown,
            "created_at": self.created_at,
            "rotated_at": self.rotated_at,
            "revoked_at": self.revoked_at,
            "quotas": {
                "max_sessions": self.quotas.max_sessions,
                "max_stateless": self.quotas.max_stateless,
                "requests_per_minute": self.quotas.requests_per_minute,
                "cpus": self.quotas.cpus,
                "memory_bytes": self.quotas.memory_bytes,
                "disk_bytes": self.quotas.disk_bytes,
                "total_disk_bytes": self.quotas.total_disk_bytes,
            },
        }

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Key:
        key_id, name, shown, created, rotated, revoked, quotas, changed = row
        quota = Quotas.from_json(json.loads(quotas))
        last = changed or revoked or max(created, rotated or "")
        return cls(key_id, name, shown, created, rotated, revoked, quota, last)


@dataclass(frozen=True)
class Record:
    """A key as gateways of a cluster pass it to each other: with its secret's digest."""

    key: Key
    digest: bytes

    def newer_than(self, other: Record) -> bool:
        """Whether this word on the key replaces `other`, in an order every replica agrees
        on: a revocation is final, and of two the first stands; else the latest change
        wins; a tie (one change seen apart, a name made unique on one replica) goes to the
        greater record, whole, so that replicas never keep two words on one key."""
        mine, theirs = self.key, other.key
        if (mine.revoked_at is None) != (theirs.revoked_at is None):
            return mine.revoked_at is not None
        if mine.revoked_at is not None and theirs.revoked_at is not None:
            if mine.revoked_at != theirs.revoked_at:
                return mine.revoked_at < theirs.revoked_at
        elif mine.changed_at != theirs.changed_at:
            return mine.changed_at > theirs.changed_at
        return self._whole() > other._whole()

    def _whole(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    def to_json(self) -> dict[str, Any]:
        """As gateways pass it (`KeyRecord`)."""
        return {
            **self.key.to_json(),
            "changed_at": self.key.changed_at,
            "digest": self.digest.hex(),
        }

    @classmethod
    def from_json(cls, data: Any) -> Record:
        """A record as `to_json` wrote it (checked by the API's model on a node; a router
        reads a node's answer through this alone). ValueError if it is not one."""
        if not isinstance(data, dict):
            raise ValueError("a key record is an object")
        try:
            quotas = data["quotas"]
            texts = [data[f] for f in ("id", "name", "prefix", "created_at", "changed_at")]
            rotated, revoked = data.get("rotated_at"), data.get("revoked_at")
            found = bytes.fromhex(data["digest"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a key record lacks {exc}") from None
        if not all(isinstance(t, str) for t in texts) or not all(
            t is None or isinstance(t, str) for t in (rotated, revoked)
        ):
            raise ValueError("a key record's fields are strings")
        if not isinstance(quotas, dict) or len(found) != 32:
            raise ValueError("a key record has quotas and a 32-byte digest")
        key_id, name, shown, created, changed = texts
        quota = Quotas.from_json(quotas)
        return cls(Key(key_id, name, shown, created, rotated, revoked, quota, changed), found)
