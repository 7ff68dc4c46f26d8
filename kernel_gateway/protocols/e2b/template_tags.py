"""E2B's template tags: `Template.assign_tags`, `remove_tags`, `get_tags`.

A tag names one build of a template (`analytics:v2`); a build takes the tags it was asked
for once it is ready (`Template.build(t, "analytics:v2", tags=[...])`), and these calls
move them afterwards, as E2B's API does:

    POST   /templates/tags            {target: "name[:tag]", tags}  the build `target` means
                                                                    takes `tags` → 201
                                                                    {tags, buildID}
    DELETE /templates/tags            {name, tags}                  the tags go → 204 (not
                                                                    `default`; no tag in name)
    GET    /templates/{id}/tags                                     [{tag, buildID, createdAt}]

Tags are trimmed and lowercased; one starting with ':' or naming nothing (`name:`) is a
400, as with E2B.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kernel_gateway.http.auth import principal_of
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.replies import json_body
from kernel_gateway.protocols.e2b.template_views import (
    clean_tags,
    template_named,
    templates_of,
    timestamp,
)
from kernel_gateway.templates.model import DEFAULT_TAG, Template, split_reference

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService


def _tags(body: dict[str, Any]) -> list[str]:
    raw = body.get("tags")
    if not isinstance(raw, list):
        raise SandboxError(400, "'tags' must be a list of tags")
    tags = clean_tags(raw)
    if not tags:
        raise SandboxError(400, "at least one tag is required")
    return tags


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise SandboxError(400, f"'{name}' is required: a template's name")
    return value.strip().lower()


async def assign(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    target = _text(body, "target")
    tags = _tags(body)
    _, tag = split_reference(target)
    if tag is not None:
        clean_tags([tag])  # `name:` is a 400, not the default tag
    templates = templates_of(service)
    viewer = principal_of(request)
    template, build = templates.resolve(target, viewer)
    templates.writable(template, viewer)
    template.assign(tags, build.id)
    templates.save(template)
    return JSONResponse({"tags": tags, "buildID": build.id}, status_code=201)


async def remove(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    name = _text(body, "name")
    if split_reference(name)[1] is not None:
        raise SandboxError(400, "the template's name has no tag here: list them in 'tags'")
    tags = _tags(body)
    if DEFAULT_TAG in tags:
        raise SandboxError(400, f"the '{DEFAULT_TAG}' tag cannot be deleted")
    template = template_named(service, name, principal_of(request), changing=True)
    _unassign(template, tags)
    templates_of(service).save(template)
    return Response(status_code=204)


def _unassign(template: Template, tags: list[str]) -> None:
    for tag in tags:
        template.tags.pop(tag, None)
        template.tag_times.pop(tag, None)
    template.updated_at = time.time()


async def listed(request: Request, service: E2BService) -> Response:
    template = template_named(service, request.path_params["id"], principal_of(request))
    return JSONResponse(
        [
            {
                "tag": tag,
                "buildID": build_id,
                "createdAt": timestamp(template.tag_times.get(tag, template.created_at)),
            }
            for tag, build_id in sorted(template.tags.items())
        ]
    )
