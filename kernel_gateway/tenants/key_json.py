"""API keys as the API shows them (`KeyInfo`, `KeyRecord`): the JSON of `tenants/keys.py`,
typed with the API's shapes (which a router, loading no pydantic, does without)."""

from __future__ import annotations

from typing import cast

from kernel_gateway.shapes import responses
from kernel_gateway.tenants.key_records import Key, Record


def key_json(key: Key) -> responses.KeyInfo:
    return cast(responses.KeyInfo, key.to_json())


def record_json(record: Record) -> responses.KeyRecord:
    return cast(responses.KeyRecord, record.to_json())
