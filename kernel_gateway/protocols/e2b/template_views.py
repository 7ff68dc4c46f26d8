"""The gateway's templates as E2B's SDKs see them: found by what the SDKs send, shown in
E2B's shapes.

The SDKs name a template by its id, its name, or `name:tag` (the tag is dropped where a
template, not a build, is meant), and E2B's built-in names (`base`, `code-interpreter-v1`,
`code-interpreter`) mean the gateway's kernel image: they exist, are public, and are no
template of the gateway's. Shapes follow `e2b` 2.63's models, which require more fields
than E2B's OpenAPI file lists (`TemplateWithBuilds` requires every field of `Template`):

    Template            templateID, buildID (the build a bare name starts), cpuCount,
                        memoryMB, diskSizeMB, public, aliases, names, createdAt, updatedAt,
                        createdBy, lastSpawnedAt, spawnCount, buildCount, envdVersion,
                        buildStatus (its newest build's)
    TemplateWithBuilds  the same, and builds (newest first)
    TemplateBuild       buildID, status, createdAt, updatedAt, finishedAt?, cpuCount,
                        memoryMB, diskSizeMB, envdVersion
    BuildLogEntry       timestamp, level, message, step? (the service's entries as they are)
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.datastructures import QueryParams

from kernel_gateway.errors import InvalidRequest
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.sandboxes import ENVD_VERSION, TEMPLATES
from kernel_gateway.settings import Settings
from kernel_gateway.templates.build_logs import MAX_ENTRIES as MAX_LOG_ENTRIES
from kernel_gateway.templates.build_logs import LogEntry
from kernel_gateway.templates.model import Build, Template, check_tag, split_reference
from kernel_gateway.templates.service import Templates
from kernel_gateway.tenants.principal import Principal

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

NO_BUILD = "00000000-0000-0000-0000-000000000000"
"""`buildID` of a template none of whose builds is ready (the SDKs parse it as a UUID)."""
LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3}
MAX_PAGE = 100
"""Most items one call answers (E2B's `limit` maximum, for lists and log entries)."""
T = TypeVar("T")


# -- finding ---------------------------------------------------------------------------------


def templates_of(service: E2BService) -> Templates:
    """The gateway's templates, or E2B's 501 where the backend builds none (local)."""
    templates = service.registry.templates
    if templates is None:
        raise SandboxError(
            501,
            f"templates are not built by this gateway's {service.settings.backend} backend "
            "(they need the docker backend)",
        )
    return templates


def plain_name(reference: str) -> str:
    """`Name:Tag` → `name`: the template a reference means, as E2B reads names (trimmed,
    lowercase)."""
    return split_reference(reference.strip().lower())[0]


def template_named(
    service: E2BService, reference: str, viewer: Principal, *, changing: bool = False
) -> Template:
    """The template `reference` (an id, a name, `name:tag`) means among those `viewer` may
    use, or E2B's 404; `changing` (a build, a tag, a deletion): one `viewer` may change
    (its own; the operator's are shared but only the admin's to change: a 403)."""
    templates = templates_of(service)
    found = templates.find(plain_name(reference), viewer)
    if found is None:
        raise SandboxError(404, f"template {reference!r} not found")
    return templates.writable(found, viewer) if changing else found


def build_of(template: Template, build_id: str) -> Build:
    found = template.build(build_id)
    if found is None:
        raise SandboxError(404, f"build {build_id!r} of template {template.name!r} not found")
    return found


def clean_tags(raw: Sequence[object]) -> list[str]:
    """Tags as E2B takes them: trimmed, lowercase, each valid and not a UUID (which would
    read as a build id), duplicates dropped; E2B's 400 naming the first bad one."""
    tags: list[str] = []
    for value in raw:
        if not isinstance(value, str):
            raise SandboxError(400, "tags must be strings")
        tag = value.strip().lower()
        try:
            check_tag(tag)
        except InvalidRequest as exc:
            raise SandboxError(400, exc.message) from None
        if _is_uuid(tag):
            raise SandboxError(400, f"invalid tag {value!r}: a tag cannot be a UUID")
        if tag not in tags:
            tags.append(tag)
    return tags


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


# -- shapes ------------------------------------------------------------------------------------


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC, as E2B writes times."""
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _sizes(settings: Settings, build: Build | None) -> dict[str, int]:
    cpus = build.cpu_count if build is not None else None
    memory = build.memory_mb if build is not None else None
    return {
        "cpuCount": cpus or max(1, math.ceil(settings.cpu_limit)),
        "memoryMB": memory or settings.memory_limit_bytes // 2**20,
        "diskSizeMB": settings.workspace_size_bytes // 2**20,
    }


def template_json(templates: Templates, template: Template, settings: Settings) -> dict[str, Any]:
    """E2B's `Template` (a superset of `TemplateLegacy`)."""
    ready, latest = template.ready, template.latest
    shown = ready or latest
    return {
        "templateID": template.id,
        "buildID": ready.id if ready is not None else NO_BUILD,
        **_sizes(settings, shown),
        "public": False,
        "aliases": [template.name],
        "names": [template.name],
        "createdAt": timestamp(template.created_at),
        "updatedAt": timestamp(template.updated_at),
        "createdBy": None,
        "lastSpawnedAt": (
            timestamp(template.last_spawned_at) if template.last_spawned_at is not None else None
        ),
        "spawnCount": template.spawn_count,
        "buildCount": len(template.builds),
        "envdVersion": ENVD_VERSION,
        "buildStatus": latest.state.value if latest is not None else "waiting",
    }


def build_json(build: Build, settings: Settings) -> dict[str, Any]:
    """E2B's `TemplateBuild`."""
    updated = build.finished_at or build.started_at or build.created_at
    shown: dict[str, Any] = {
        "buildID": build.id,
        "status": build.state.value,
        "createdAt": timestamp(build.created_at),
        "updatedAt": timestamp(updated),
        **_sizes(settings, build),
        "envdVersion": ENVD_VERSION,
    }
    if build.finished_at is not None:
        shown["finishedAt"] = timestamp(build.finished_at)
    return shown


# -- logs --------------------------------------------------------------------------------------


def level_of(query: QueryParams) -> int:
    """The least level `?level=` asks for (none: every entry)."""
    level = query.get("level")
    if level is None:
        return 0
    if level not in LEVELS:
        raise SandboxError(400, f"'level' must be one of {', '.join(LEVELS)}")
    return LEVELS[level]


def entries(templates: Templates, build: Build, least: int) -> list[LogEntry]:
    """Every log entry of `build` at `least` level or above, oldest first."""
    return [
        entry
        for entry in templates.logs(build, 0, MAX_LOG_ENTRIES)
        if LEVELS.get(str(entry.get("level")), 1) >= least
    ]


def reason_json(build: Build, logged: list[LogEntry]) -> dict[str, Any] | None:
    """E2B's `BuildStatusReason` of a failed build: its message, its step, and the step's
    warnings and errors (as E2B picks them)."""
    if build.reason is None:
        return None
    reason: dict[str, Any] = {"message": build.reason, "logEntries": []}
    if build.failed_step is not None:
        step = str(build.failed_step)
        reason["step"] = step
        reason["logEntries"] = [
            e
            for e in logged
            if e.get("step") == step and LEVELS.get(str(e.get("level")), 1) >= LEVELS["warn"]
        ]
    return reason


def milliseconds(entry: LogEntry) -> int:
    """An entry's time as E2B's log cursor counts it (ms since the epoch)."""
    moment = datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00"))
    return int(moment.timestamp() * 1000)


# -- query parameters and pages ------------------------------------------------------------------


def query_int(query: QueryParams, name: str, default: int, *, most: int | None = None) -> int:
    """A whole-number query parameter from 0 (to `most`), or E2B's 400."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SandboxError(400, f"{name!r} must be a whole number") from None
    if value < 0 or (most is not None and value > most):
        bounds = f"between 0 and {most}" if most is not None else "0 or more"
        raise SandboxError(400, f"{name!r} must be {bounds}")
    return value


def page(items: list[T], key: Callable[[T], str], query: QueryParams) -> tuple[list[T], str | None]:
    """One page of `items` as E2B pages lists: `limit` (1 to 100) from the item `nextToken`
    names; the second value is the next page's token (E2B's `X-Next-Token`), if any."""
    limit = query_int(query, "limit", MAX_PAGE, most=MAX_PAGE) or MAX_PAGE
    start = 0
    token = query.get("nextToken")
    if token:
        keys = [key(item) for item in items]
        if token not in keys:
            raise SandboxError(400, "'nextToken' does not name an item of this listing")
        start = keys.index(token)
    following = items[start + limit] if start + limit < len(items) else None
    return items[start : start + limit], key(following) if following is not None else None


def is_builtin(reference: str) -> bool:
    """Whether `reference` names one of E2B's templates the kernel image stands for."""
    return plain_name(reference) in TEMPLATES
