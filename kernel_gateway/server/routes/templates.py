"""`/templates`: templates built by the gateway (see kernel_gateway/templates/).

    POST   /templates                               a template and its first build (202)
    POST   /templates/{name}/builds                 build it again (a new build, 202)
    GET    /templates, /templates/{name}            what there is
    DELETE /templates/{name}                        it, its images and logs (409 in use)
    GET    /templates/{name}/builds/{id}            one build: state, reason, failed step
    GET    /templates/{name}/builds/{id}/logs       its log, live as SSE (or JSON)
    GET|PUT /templates/files/{hash}                 files for COPY steps, by SHA-256

A build is a base and steps, or a Dockerfile; the files COPY steps copy come in the same
request (`context`, a base64 tar) or beforehand with `PUT /templates/files/{hash}` (then
named by `files_hash` in the step).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.errors import BadRequest, InvalidRequest, NotFound, TemplateNotFound
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import read_model, wants_json
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.http.sse import dumps
from kernel_gateway.server.routes.fragments import JSON_BODY, LOCATION, ref
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.requests import NewTemplate, TemplateBuildRequest
from kernel_gateway.templates.dockerfile import parse_dockerfile
from kernel_gateway.templates.files import CopyError
from kernel_gateway.templates.model import Build, BuildSpec, Template
from kernel_gateway.templates.service import Templates
from kernel_gateway.templates.steps import FILES_HASH, parse_steps
from kernel_gateway.templates.views import build_json, template_json

LOG_PAGE = 1000


def _templates(request: Request) -> Templates:
    """The gateway's templates; a 400 where the backend builds none (the local one)."""
    templates: Templates | None = request.state.templates
    if templates is None:
        raise BadRequest(
            f"this gateway's {request.state.settings.backend} backend builds no templates: "
            "they need the docker backend"
        )
    return templates


def _template(request: Request) -> Template:
    templates: Templates | None = request.state.templates
    name = request.path_params["name"]
    if templates is None:
        raise TemplateNotFound(f"no template {name!r}: this gateway has none (no docker backend)")
    return templates.get(name, principal_of(request))


def _build(request: Request) -> tuple[Template, Build]:
    template = _template(request)
    build = template.build(request.path_params["build_id"])
    if build is None:
        raise NotFound(
            f"template {template.name!r} has no build {request.path_params['build_id']!r}"
        )
    return template, build


async def _spec(templates: Templates, body: TemplateBuildRequest) -> BuildSpec:
    """The build `body` asks for, its files stored (a base it cannot have: 422)."""
    context_hash = None
    if body.context:  # an empty one is none
        context_hash = hashlib.sha256(body.context).hexdigest()
        if not templates.files.has(context_hash):
            limit = templates.settings.template_upload_max_bytes

            async def chunks() -> AsyncIterator[bytes]:
                yield body.context or b""

            try:
                await templates.files.receive(context_hash, chunks(), limit)
            except CopyError as exc:
                raise InvalidRequest(f"context: {exc}") from exc
    start_cmd = body.start_cmd
    if body.dockerfile is not None:
        if body.steps is not None or body.base is not None:
            raise InvalidRequest("send a dockerfile, or a base and steps, not both")
        dockerfile = parse_dockerfile(body.dockerfile)
        base, raw_steps = dockerfile.base, dockerfile.steps
        start_cmd = start_cmd or dockerfile.start_cmd
    else:
        base = body.base or "python"
        raw_steps = [
            {"type": s.type, "args": s.args, "filesHash": s.files_hash, "force": s.force}
            for s in body.steps or []
        ]
    for number, step in enumerate(raw_steps, start=1):
        if step["type"] == "COPY" and step.get("filesHash") is None:
            if context_hash is None:
                raise InvalidRequest(
                    f"step {number}: COPY needs files: send `context` (a tar, base64) or "
                    "upload them with PUT /templates/files/{hash} and name it in files_hash"
                )
            step["filesHash"] = context_hash
        files_hash = step.get("filesHash")
        if isinstance(files_hash, str) and not templates.files.has(files_hash):
            raise InvalidRequest(
                f"step {number}: no files {files_hash[:12]}… were uploaded "
                "(PUT /templates/files/{hash})"
            )
    steps = parse_steps(raw_steps)
    kind = "template" if base.startswith("template:") else "image"
    return BuildSpec(
        base=base if kind == "template" else f"image:{base}",
        steps=tuple(steps),
        start_cmd=start_cmd,
        ready_cmd=body.ready_cmd,
        force=body.force,
    )


async def _start(
    templates: Templates, template: Template, body: TemplateBuildRequest
) -> JSONResponse[responses.TemplateBuild]:
    spec = await _spec(templates, body)
    build = templates.new_build(template, body.tags)
    try:
        templates.start(template, build, spec)
    except BaseException:
        templates.discard(template, build)
        raise
    return JSONResponse(
        build_json(template, build),
        status_code=202,
        headers={"Location": f"/templates/{template.name}/builds/{build.id}"},
    )


async def create(request: Request) -> JSONResponse[responses.TemplateBuild]:
    templates = _templates(request)
    settings = templates.settings
    limit = settings.max_body_bytes + settings.template_upload_max_bytes * 4 // 3
    body = await read_model(request, NewTemplate, limit, settings)
    template = templates.create(body.name, exist_ok=False, owner=principal_of(request))
    try:
        return await _start(templates, template, body)
    except BaseException:
        await templates.delete(template)
        raise


async def rebuild(request: Request) -> JSONResponse[responses.TemplateBuild]:
    templates = _templates(request)
    settings = templates.settings
    limit = settings.max_body_bytes + settings.template_upload_max_bytes * 4 // 3
    template = templates.writable(_template(request), principal_of(request))
    body = await read_model(request, TemplateBuildRequest, limit, settings)
    return await _start(templates, template, body)


async def list_all(request: Request) -> JSONResponse[responses.TemplateList]:
    templates: Templates | None = request.state.templates
    if templates is None:
        return JSONResponse({"templates": []})
    found = templates.all(principal_of(request))
    return JSONResponse({"templates": [template_json(templates, t) for t in found]})


async def get(request: Request) -> JSONResponse[responses.TemplateInfo]:
    return JSONResponse(template_json(_templates(request), _template(request)))


async def delete(request: Request) -> Response:
    templates = _templates(request)
    await templates.delete(templates.writable(_template(request), principal_of(request)))
    return Response(status_code=204)


async def get_build(request: Request) -> JSONResponse[responses.TemplateBuild]:
    template, build = _build(request)
    return JSONResponse(build_json(template, build))


def _offset(request: Request) -> int:
    raw = request.query_params.get("offset", "0")
    if not raw.isdigit() or len(raw) > 9:
        raise BadRequest(f"offset must be a whole number, got {raw!r}")
    return int(raw)


async def build_logs(request: Request) -> Response:
    templates = _templates(request)
    template, build = _build(request)
    offset = _offset(request)
    if wants_json(request):
        entries = templates.logs(build, offset, LOG_PAGE)
        log: responses.BuildLog = {
            "logs": entries,  # type: ignore[typeddict-item]
            "next_offset": offset + len(entries),
            "build": build_json(template, build),
        }
        return JSONResponse(log)

    async def events() -> AsyncIterator[ServerSentEvent]:
        number = offset
        async for entry in templates.follow(build, offset):
            number += 1
            yield ServerSentEvent(dumps(entry).decode(), event="log", id=str(number))
        yield ServerSentEvent(dumps(build_json(template, build)).decode(), event="end")

    return EventSourceResponse(events(), ping=15)


async def files_status(request: Request) -> JSONResponse[responses.TemplateFiles]:
    templates = _templates(request)
    files_hash = _hash(request)
    present = templates.files.has(files_hash)
    return JSONResponse(
        {"hash": files_hash, "present": present, "size_bytes": templates.files.size(files_hash)}
    )


async def upload_files(request: Request) -> JSONResponse[responses.TemplateFiles]:
    templates = _templates(request)
    files_hash = _hash(request)
    limit = templates.settings.template_upload_max_bytes
    try:
        size = await templates.files.receive(files_hash, request.stream(), limit)
    except CopyError as exc:
        raise BadRequest(str(exc)) from exc
    return JSONResponse({"hash": files_hash, "present": True, "size_bytes": size}, status_code=201)


def _hash(request: Request) -> str:
    files_hash: str = request.path_params["hash"]
    if not FILES_HASH.match(files_hash):
        raise BadRequest("a files hash is 64 lowercase hex digits (a SHA-256)")
    return files_hash


LOG_EVENTS = {
    "description": "A `log` event per line (its id: the line's number), then one `end`.",
    "oneOf": [
        {
            "type": "object",
            "title": "log",
            "properties": {
                "event": {"const": "log"},
                "id": {"type": "string", "pattern": "^[0-9]+$"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": ref("BuildLogEntry"),
                },
            },
            "required": ["event", "data"],
        },
        {
            "type": "object",
            "title": "end",
            "properties": {
                "event": {"const": "end"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": ref(responses.TemplateBuild.__name__),
                },
            },
            "required": ["event", "data"],
        },
    ],
}
"""The log's event stream, frame by frame (as the execution stream's is documented)."""

_BUILD_STARTED = Reply(
    202,
    "The build, started: follow it at `GET /templates/{name}/builds/{id}/logs`.",
    responses.TemplateBuild,
    headers=LOCATION,
)
_TEMPLATE_ERRORS = (404,)
_NO_BACKEND: tuple[int, ...] = ()
"""Where the backend builds no templates: reads answer none, writes 400."""

OPERATIONS = (
    Operation(
        "post",
        "/templates",
        create,
        "createTemplate",
        summary="Make a template and start its first build.",
        description="A base and steps (E2B's step types), or a Dockerfile; COPY's files in "
        "`context` or uploaded beforehand. Answers at once; the build runs in the background.",
        tags=("templates",),
        body=Body(NewTemplate),
        replies=(_BUILD_STARTED,),
        errors=(*JSON_BODY, 404, 409, 429, *_NO_BACKEND),
    ),
    Operation(
        "get",
        "/templates",
        list_all,
        "listTemplates",
        summary="Every template, with its builds.",
        tags=("templates",),
        replies=(Reply(200, "The templates.", responses.TemplateList),),
        errors=_NO_BACKEND,
    ),
    Operation(
        "get",
        "/templates/{name}",
        get,
        "getTemplate",
        summary="A template (by name or id), with its builds.",
        tags=("templates",),
        replies=(Reply(200, "The template.", responses.TemplateInfo),),
        errors=(*_TEMPLATE_ERRORS, *_NO_BACKEND),
    ),
    Operation(
        "delete",
        "/templates/{name}",
        delete,
        "deleteTemplate",
        summary="Remove a template, its images and logs.",
        description="409 while it builds or while sessions run on it.",
        tags=("templates",),
        replies=(Reply(204, "Deleted."),),
        errors=(*_TEMPLATE_ERRORS, 409, *_NO_BACKEND),
    ),
    Operation(
        "post",
        "/templates/{name}/builds",
        rebuild,
        "buildTemplate",
        summary="Build a template again (its tags move once the build is ready).",
        tags=("templates",),
        body=Body(TemplateBuildRequest),
        replies=(_BUILD_STARTED,),
        errors=(*JSON_BODY, 404, 409, *_NO_BACKEND),
    ),
    Operation(
        "get",
        "/templates/{name}/builds/{build_id}",
        get_build,
        "getTemplateBuild",
        summary="One build: its state, and why it failed.",
        tags=("templates",),
        replies=(Reply(200, "The build.", responses.TemplateBuild),),
        errors=(*_TEMPLATE_ERRORS, *_NO_BACKEND),
    ),
    Operation(
        "get",
        "/templates/{name}/builds/{build_id}/logs",
        build_logs,
        "templateBuildLogs",
        summary="A build's log from `offset`: live as SSE until the build ends, or a page of "
        "it as JSON with `Accept: application/json`.",
        description="SSE: a `log` event per line (its id the line's number), then one `end` "
        "event with the build.",
        tags=("templates",),
        parameters=(
            {
                "name": "offset",
                "in": "query",
                "required": False,
                "description": "Skip this many lines (default 0).",
                "schema": {"type": "string", "pattern": "^[0-9]{1,9}$"},
            },
        ),
        replies=(
            Reply(
                200,
                "The log.",
                content={
                    "text/event-stream": {"schema": LOG_EVENTS},
                    "application/json": {"schema": ref(responses.BuildLog.__name__)},
                },
            ),
        ),
        errors=(400, *_TEMPLATE_ERRORS, *_NO_BACKEND),
    ),
    Operation(
        "get",
        "/templates/files/{hash}",
        files_status,
        "templateFiles",
        summary="Whether files for COPY steps with this SHA-256 were uploaded.",
        tags=("templates",),
        replies=(Reply(200, "Present or not.", responses.TemplateFiles),),
        errors=(400, *_NO_BACKEND),
    ),
    Operation(
        "put",
        "/templates/files/{hash}",
        upload_files,
        "uploadTemplateFiles",
        summary="Upload files for COPY steps: a tar (or tar.gz), named by a SHA-256.",
        description="The hash names the files (steps refer to it); it is not checked against "
        "the body. Up to --template-upload-max.",
        tags=("templates",),
        body=Body(
            content={"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        ),
        replies=(Reply(201, "Stored.", responses.TemplateFiles),),
        errors=(400, 413, *_NO_BACKEND),
    ),
)
