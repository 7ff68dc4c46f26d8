"""E2B's template API on the gateway's templates (`kernel_gateway/templates/`), for
`Template.build`, `build_in_background`, `get_build_status`, `exists` and the tags.

The SDK builds in calls of its own, each answered here:

    POST /v3/templates                        a build of the template `name` (made if new;
                                              `name:tag` and `tags` are its tags once ready;
                                              a router adds `templateID` and `buildID`, the
                                              ids the first node gave them)
                                              → 202 {templateID, buildID, ...}
    GET  /templates/{id}/files/{hash}         each COPY step's files: there, or where to
    PUT  .../files/{hash}/upload?token=       upload them (template_files.py)
    POST /v2/templates/{id}/builds/{buildID}  the base and steps: the build starts → 202
    GET  /templates/{id}/builds/{buildID}/status?logsOffset=
                                              its state and up to 100 log entries; the SDK
                                              polls until ready or error, then drains

and beside them `GET /templates/aliases/{name}` (`Template.exists`: E2B's built-in names
`base`, `code-interpreter-v1` and `code-interpreter` exist: they are the gateway's kernel
image), the lists (`GET /v2/templates`, `GET /templates`), one template with its builds
(`GET /templates/{id}`), its removal (`DELETE`, a 409 while it builds or runs sessions),
a build's logs by time (`.../logs?cursor=`), and the tags (template_tags.py).

A base is the gateway's: `fromImage` `e2bdev/base` (the SDK's default), `python`, a
language's name (`r`, `bash`...), or `fromTemplate` another template, where `base` and
the code-interpreter names mean `python`. A registry image (`ubuntu:22.04`) is refused
with a 400 that says what a base can be: the gateway pulls nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernel_gateway.http.auth import principal_of
from kernel_gateway.protocols.e2b import template_files, template_tags
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.replies import (
    ControlHandler,
    Handler,
    answered,
    guarded,
    json_body,
)
from kernel_gateway.protocols.e2b.sandboxes import TEMPLATES
from kernel_gateway.protocols.e2b.template_views import (
    MAX_PAGE,
    build_json,
    build_of,
    clean_tags,
    entries,
    is_builtin,
    level_of,
    milliseconds,
    page,
    plain_name,
    query_int,
    reason_json,
    template_json,
    template_named,
    templates_of,
)
from kernel_gateway.templates.files import FileStore
from kernel_gateway.templates.model import BuildSpec, BuildState, split_reference
from kernel_gateway.templates.steps import Step, parse_steps

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

PYTHON_BASE = "image:python"
DEFAULT_BASE = "image:e2bdev/base"


def template_routes(service: E2BService) -> list[Route]:
    """The template routes, before the sandboxes' (whose last route answers 501 for every
    other path). `/templates/tags` and `/templates/aliases/...` come before
    `/templates/{id}`, which would take them."""

    def key(handler: ControlHandler) -> Handler:
        return guarded(service, handler)

    return [
        Route("/v3/templates", key(create), methods=["POST"]),
        Route("/v2/templates", key(list_templates), methods=["GET"]),
        Route("/templates", key(list_templates), methods=["GET"]),
        Route("/templates/tags", key(template_tags.assign), methods=["POST"]),
        Route("/templates/tags", key(template_tags.remove), methods=["DELETE"]),
        Route("/templates/aliases/{alias}", key(alias), methods=["GET"]),
        Route("/templates/{id}", key(get_template), methods=["GET"]),
        Route("/templates/{id}", key(delete_template), methods=["DELETE"]),
        Route("/templates/{id}/tags", key(template_tags.listed), methods=["GET"]),
        Route("/templates/{id}/files/{hash}", key(template_files.files_status), methods=["GET"]),
        Route(
            "/templates/{id}/files/{hash}/upload",
            answered(service, template_files.upload),  # its signed token, not X-API-KEY
            methods=["PUT"],
        ),
        Route("/v2/templates/{id}/builds/{build}", key(start_build), methods=["POST"]),
        Route("/templates/{id}/builds/{build}/status", key(build_status), methods=["GET"]),
        Route("/templates/{id}/builds/{build}/logs", key(build_logs), methods=["GET"]),
    ]


# -- a build: requested, started, followed --------------------------------------------------


async def create(request: Request, service: E2BService) -> Response:
    """`POST /v3/templates`: a new build of `name` (E2B's `alias` before it), the template
    made on first use; a name built before gets a new build (its others stay)."""
    body = await json_body(request)
    raw = body.get("name") or body.get("alias")
    if not isinstance(raw, str) or not raw.strip():
        raise SandboxError(400, "'name' is required: the template's name, or name:tag")
    name, tag = split_reference(raw.strip().lower())
    if name in TEMPLATES:
        raise SandboxError(
            400, f"{name!r} is a built-in template of this gateway (its kernel image)"
        )
    extra = body.get("tags") or []
    if not isinstance(extra, list):
        raise SandboxError(400, "'tags' must be a list of tags")
    tags = clean_tags(([tag] if tag is not None else []) + extra)
    cpus, memory = _size(body, "cpuCount"), _size(body, "memoryMB")
    template_id, build_id = _id(body, "templateID"), _id(body, "buildID")
    templates = templates_of(service)
    template = templates.create(
        name, exist_ok=True, owner=principal_of(request), template_id=template_id
    )
    build = templates.new_build(
        template, tags or None, cpu_count=cpus, memory_mb=memory, build_id=build_id
    )
    answer = {
        "templateID": template.id,
        "buildID": build.id,
        "public": False,
        "aliases": [template.name],
        "names": [template.name],
        "tags": build.tags_when_ready,
    }
    return JSONResponse(answer, status_code=202)


def _id(body: dict[str, Any], name: str) -> str | None:
    """`templateID` or `buildID` asked for: not E2B's, a cluster router's, so that a template
    and its build have one id on every node (cluster/e2b_templates.py)."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SandboxError(400, f"'{name}' must be a string")
    return value


def _size(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SandboxError(400, f"'{name}' must be a whole number from 1")
    return value


async def start_build(request: Request, service: E2BService) -> Response:
    """`POST /v2/templates/{id}/builds/{build}`: the base and steps; the build runs on."""
    template = template_named(
        service, request.path_params["id"], principal_of(request), changing=True
    )
    build = build_of(template, request.path_params["build"])
    templates = templates_of(service)
    spec = build_spec(await json_body(request), templates.files)
    templates.start(template, build, spec)
    return Response(status_code=202)


def build_spec(body: dict[str, Any], files: FileStore) -> BuildSpec:
    """E2B's `TemplateBuildStartV2` as the gateway's `BuildSpec`, or E2B's 400 for what
    cannot be built here (see the module's docstring)."""
    if body.get("fromImageRegistry"):
        raise SandboxError(
            400,
            "images from registries ('fromImageRegistry') are not supported: this gateway "
            "pulls no images; build from e2bdev/base (Template().from_base_image()), a "
            "language's image or another template",
        )
    steps = parse_steps(body.get("steps"))
    _check_uploaded(steps, files)
    force = body.get("force")
    if force is not None and not isinstance(force, bool):
        raise SandboxError(400, "'force' must be true or false")
    return BuildSpec(
        _base(body),
        tuple(steps),
        start_cmd=_command(body, "startCmd"),
        ready_cmd=_command(body, "readyCmd"),
        force=bool(force),
    )


def _base(body: dict[str, Any]) -> str:
    image, template = body.get("fromImage"), body.get("fromTemplate")
    if image is not None and template is not None:
        raise SandboxError(400, "give 'fromImage' or 'fromTemplate', not both")
    for name, value in (("fromImage", image), ("fromTemplate", template)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise SandboxError(400, f"'{name}' must be a name")
    if isinstance(template, str):
        reference = template.strip().lower()
        return PYTHON_BASE if is_builtin(reference) else f"template:{reference}"
    if isinstance(image, str):
        return f"image:{image.strip()}"
    return DEFAULT_BASE


def _command(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SandboxError(400, f"'{name}' must be a command")
    return value


def _check_uploaded(steps: list[Step], files: FileStore) -> None:
    """A COPY whose files never came is the request's error, named now, not a build that
    fails half-way."""
    for number, step in enumerate(steps, start=1):
        if step.type == "COPY" and step.files_hash and not files.has(step.files_hash):
            raise SandboxError(
                400,
                f"step {number} ({step.describe()}): its files ({step.files_hash[:12]}…) were "
                "never uploaded (the SDK uploads what GET /templates/{id}/files/{hash} asks for)",
            )


async def build_status(request: Request, service: E2BService) -> Response:
    """E2B's `TemplateBuildInfo`: the state, and log entries from `logsOffset` (at most
    `limit`, 100), of `level` or above; a failed build's reason and step."""
    template = template_named(service, request.path_params["id"], principal_of(request))
    build = build_of(template, request.path_params["build"])
    query = request.query_params
    offset = query_int(query, "logsOffset", 0)
    limit = query_int(query, "limit", MAX_PAGE, most=MAX_PAGE)
    logged = entries(templates_of(service), build, level_of(query))
    answer: dict[str, Any] = {
        "templateID": template.id,
        "buildID": build.id,
        "status": build.state.value,
        "logs": [],
        "logEntries": logged[offset : offset + limit],
    }
    reason = reason_json(build, logged) if build.state is BuildState.ERROR else None
    if reason is not None:
        answer["reason"] = reason
    return JSONResponse(answer)


async def build_logs(request: Request, service: E2BService) -> Response:
    """`{logs}`: entries by time, from `cursor` (ms since the epoch) `forward` (oldest
    first) or `backward` (newest first, up to the cursor), at most `limit` (100)."""
    template = template_named(service, request.path_params["id"], principal_of(request))
    build = build_of(template, request.path_params["build"])
    query = request.query_params
    cursor = query_int(query, "cursor", -1)
    limit = query_int(query, "limit", MAX_PAGE, most=MAX_PAGE)
    direction = query.get("direction") or "forward"
    if direction not in ("forward", "backward"):
        raise SandboxError(400, "'direction' must be forward or backward")
    logged = entries(templates_of(service), build, level_of(query))
    if direction == "forward":
        chosen = [e for e in logged if milliseconds(e) >= cursor][:limit]
    else:
        before = [e for e in logged if cursor < 0 or milliseconds(e) <= cursor]
        chosen = before[::-1][:limit]
    return JSONResponse({"logs": chosen})


# -- templates: found, listed, removed ----------------------------------------------------


async def alias(request: Request, service: E2BService) -> Response:
    """`Template.exists(name)`: 200 `{templateID, public}` or E2B's 404."""
    name = str(request.path_params["alias"])
    if is_builtin(name):
        return JSONResponse({"templateID": plain_name(name), "public": True})
    templates = service.registry.templates
    viewer = principal_of(request)
    found = templates.find(plain_name(name), viewer) if templates is not None else None
    if found is None:
        raise SandboxError(404, f"template {name!r} not found")
    # The operator's templates are every key's: public, as E2B says of shared ones.
    return JSONResponse({"templateID": found.id, "public": found.owner != viewer.owner})


async def list_templates(request: Request, service: E2BService) -> Response:
    """E2B's `Template` for each of the gateway's templates, oldest first, paged (the
    built-in names are the kernel image, no template of the gateway's: not listed)."""
    templates = service.registry.templates
    if templates is None:
        return JSONResponse([])
    found = templates.all(principal_of(request))
    shown, following = page(found, lambda t: t.id, request.query_params)
    answer = [template_json(templates, t, service.settings) for t in shown]
    headers = {"X-Next-Token": following} if following is not None else {}
    return JSONResponse(answer, headers=headers)


async def get_template(request: Request, service: E2BService) -> Response:
    """E2B's `TemplateWithBuilds`: the template, and its builds newest first, paged."""
    template = template_named(service, request.path_params["id"], principal_of(request))
    builds = list(reversed(template.builds))
    shown, following = page(builds, lambda b: b.id, request.query_params)
    answer = {
        **template_json(templates_of(service), template, service.settings),
        "builds": [build_json(b, service.settings) for b in shown],
    }
    headers = {"X-Next-Token": following} if following is not None else {}
    return JSONResponse(answer, headers=headers)


async def delete_template(request: Request, service: E2BService) -> Response:
    """204; E2B's 404 for none (the SDK's `delete_snapshot` reads it as False), 409 while
    it builds or sessions run on it. A snapshot's id or name (`name:default`) deletes the
    snapshot: E2B's snapshots are templates (snapshots_api.py)."""
    snapshots = service.sandboxes.snapshots
    viewer = principal_of(request)
    found = await snapshots.find(viewer, None, request.path_params["id"].removesuffix(":default"))
    if found:
        await snapshots.delete(found[0].id, viewer)
        return Response(status_code=204)
    template = template_named(service, request.path_params["id"], viewer, changing=True)
    await templates_of(service).delete(template)
    return Response(status_code=204)
