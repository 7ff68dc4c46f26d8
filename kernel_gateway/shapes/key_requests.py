"""The request bodies of API keys (`/keys`): a key's name and quotas, validated as every
request is (`requests.RequestModel`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from kernel_gateway.shapes.requests import RequestModel, whole

MIN_DISK = 16 * 1024 * 1024
"""The least disk a key's sessions may be given (a kernel writes a little at start)."""
MIN_MEMORY = 64 * 1024 * 1024
"""The least memory a key's kernels may be given: a Python kernel needs about this."""


class Quotas(RequestModel):
    """What one API key may hold and ask; an absent or null field has no quota of its own
    (only the gateway's limits apply)."""

    max_sessions: Annotated[
        int | None,
        Field(
            ge=0,
            description="Sessions held at once (E2B sandboxes and their contexts, Jupyter "
            "kernels and MCP sessions count); past it, 429 `quota_exceeded`.",
        ),
        BeforeValidator(whole),
    ] = None
    max_stateless: Annotated[
        int | None,
        Field(
            ge=0,
            description="Stateless requests (`POST /execute`) running or waiting at once; "
            "past it, 429 `quota_exceeded`.",
        ),
        BeforeValidator(whole),
    ] = None
    requests_per_minute: Annotated[
        int | None,
        Field(
            ge=1,
            description="Requests of any kind a minute (a burst of this many, then evenly); "
            "past it, 429 `rate_limited` with `Retry-After`.",
        ),
        BeforeValidator(whole),
    ] = None

    cpus: Annotated[
        float | None,
        Field(
            ge=0.01,
            allow_inf_nan=False,
            description="CPUs for each of its kernels (sessions, sandboxes, their contexts): "
            "at most the gateway's `--cpu-limit`, which applies without it.",
        ),
    ] = None
    memory_bytes: Annotated[
        int | None,
        Field(
            ge=MIN_MEMORY,
            description="Memory in bytes for each of its kernels, swap none: at most the "
            "gateway's `--memory-limit`, which applies without it.",
        ),
        BeforeValidator(whole),
    ] = None
    disk_bytes: Annotated[
        int | None,
        Field(
            ge=MIN_DISK,
            description="Disk in bytes for each of its sessions (working directory, /tmp and "
            "home together): at most the gateway's `--workspace-size`. Past it, `ENOSPC` in "
            "the cell and 413 on an upload.",
        ),
        BeforeValidator(whole),
    ] = None
    total_disk_bytes: Annotated[
        int | None,
        Field(
            ge=MIN_DISK,
            description="Disk all its sessions hold together (sampled every 5 s): past it, a "
            "new session is refused with 429 `quota_exceeded`.",
        ),
        BeforeValidator(whole),
    ] = None


class NewKey(RequestModel):
    """A new API key."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=64,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
            description="Its name, unique among live keys: it labels the key's metrics and "
            "log lines (`admin` is the admin token's).",
        ),
    ]
    quotas: Quotas = Quotas()


class KeyChange(RequestModel):
    """A key's new quotas (they replace the ones it had)."""

    quotas: Quotas


class MergedQuotas(Quotas):
    """A key's quotas as another gateway of the cluster holds them: its limits per kernel
    may be above this gateway's own, which then apply here."""


KEY_ID = r"^key_[0-9a-f]{16}$"
TIMESTAMP = (
    r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?Z$"
)


def _a_time(value: str) -> str:
    """`value`, refused unless it is a real UTC time (no February 30th, no year 0)."""
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise PydanticCustomError("datetime", "is not a valid UTC time") from None
    return value


Stamp = Annotated[
    str,
    Field(pattern=TIMESTAMP, max_length=40, json_schema_extra={"format": "date-time"}),
    AfterValidator(_a_time),
]
"""A time as the gateway writes them (UTC, `Z`): the pattern says the form, the format that
the date is a real one."""


class MergedKey(RequestModel):
    """A key as a cluster's gateways pass it to each other (`PUT /cluster/keys`): all but
    its secret, with the secret's SHA-256 digest and when it last changed."""

    id: Annotated[str, Field(pattern=KEY_ID)]
    name: Annotated[
        str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._~-]*$")
    ]
    prefix: Annotated[str, Field(pattern=r"^e2b_[0-9a-f]{8}$")]
    created_at: Stamp
    rotated_at: Stamp | None = None
    revoked_at: Stamp | None = None
    changed_at: Stamp
    quotas: MergedQuotas = MergedQuotas()
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of its secret.")]


class KeyMerge(RequestModel):
    """Keys to merge into this gateway's (each kept if newer than the one held)."""

    keys: Annotated[list[MergedKey], Field(max_length=100_000)]
