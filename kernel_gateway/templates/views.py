"""Templates and builds as the gateway's API shows them (`shapes/responses.py`)."""

from __future__ import annotations

import datetime

from kernel_gateway.shapes import responses
from kernel_gateway.templates.model import Build, Template
from kernel_gateway.templates.service import Templates


def timestamp(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def optional_timestamp(seconds: float | None) -> str | None:
    return timestamp(seconds) if seconds is not None else None


def build_json(template: Template, build: Build) -> responses.TemplateBuild:
    spec = build.spec
    return {
        "id": build.id,
        "template_id": template.id,
        "template": template.name,
        "state": build.state.value,
        "reason": build.reason,
        "failed_step": build.failed_step,
        "base": spec.base.removeprefix("image:") if spec is not None else None,
        "steps": len(spec.steps) if spec is not None else 0,
        "created_at": timestamp(build.created_at),
        "started_at": optional_timestamp(build.started_at),
        "finished_at": optional_timestamp(build.finished_at),
        "image": build.image,
        "size_bytes": build.size,
        "tags": sorted(tag for tag, built in template.tags.items() if built == build.id),
    }


def template_json(templates: Templates, template: Template) -> responses.TemplateInfo:
    ready = template.ready
    latest = template.latest
    shown = ready or latest
    language = shown.language if shown is not None else None
    return {
        "id": template.id,
        "name": template.name,
        "language": language,
        "state": latest.state.value if latest is not None else "waiting",
        "ready_build": ready.id if ready is not None else None,
        "tags": dict(template.tags),
        "created_at": timestamp(template.created_at),
        "updated_at": timestamp(template.updated_at),
        "sessions": templates.in_use(template),
        "warm": templates.warm(template),
        "spawn_count": template.spawn_count,
        "last_spawned_at": optional_timestamp(template.last_spawned_at),
        "builds": [build_json(template, b) for b in template.builds],
    }
