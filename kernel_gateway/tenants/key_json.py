"""API keys as the API shows them (`KeyInfo`, `KeyRecord`), typed with its shapes, so that
mypy checks each field against the document's. A router, which loads no pydantic, uses the
untyped twins `Key.to_json` and `Record.to_json`; a unit test holds the two in step."""

from __future__ import annotations

from kernel_gateway.shapes import responses
from kernel_gateway.tenants.key_records import Key, Record


def key_json(key: Key) -> responses.KeyInfo:
    quotas = key.quotas
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.shown,
        "created_at": key.created_at,
        "rotated_at": key.rotated_at,
        "revoked_at": key.revoked_at,
        "quotas": {
            "max_sessions": quotas.max_sessions,
            "max_stateless": quotas.max_stateless,
            "requests_per_minute": quotas.requests_per_minute,
            "cpus": quotas.cpus,
            "memory_bytes": quotas.memory_bytes,
            "disk_bytes": quotas.disk_bytes,
            "total_disk_bytes": quotas.total_disk_bytes,
        },
    }


def record_json(record: Record) -> responses.KeyRecord:
    key = record.key
    return {**key_json(key), "changed_at": key.changed_at, "digest": record.digest.hex()}
