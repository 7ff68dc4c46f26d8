"""Jupyter Server's kernel API, as Jupyter Kernel Gateway serves it to `--gateway-url` clients.

    GET    /api                          {"version"}
    GET    /api/kernelspecs              {"default": "python3", "kernelspecs": {...}}
    GET    /api/kernelspecs/{name}       one kernelspec
    GET    /api/kernels                  [kernel model, ...]
    POST   /api/kernels                  {"name"?, "env"?} -> 201 kernel model (env: see below)
    GET    /api/kernels/{id}             kernel model
    DELETE /api/kernels/{id}             204
    POST   /api/kernels/{id}/interrupt   204
    POST   /api/kernels/{id}/restart     200 kernel model
    WS     /api/kernels/{id}/channels    Jupyter messages (JSON, or the v1 binary subprotocol)

A kernel is a gateway session with the same limits; its id is the session id's UUID
spelt with dashes, as Jupyter Server's routes require (either spelling is accepted).
Errors carry Jupyter's `message` and `reason` besides the gateway's own `error` object.
Of a new kernel's `env`, `KERNEL_NETWORK_ALLOW` (the domains it may reach) and
`KERNEL_TEMPLATE` (a template to start it on; the model then has `template`) are applied.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from kernel_gateway import __version__
from kernel_gateway.errors import GatewayError, NotFound, TooManySessions
from kernel_gateway.http.auth import principal_of, refuse
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Surface
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.kernels.languages import Language
from kernel_gateway.protocols.jupyter.kernels import (
    KERNEL_NAME,
    MAX_CONNECTIONS,
    JupyterKernels,
    kernel_name,
    language_of,
    session_id,
)
from kernel_gateway.protocols.jupyter.wire import V1_PROTOCOL
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.shapes.requests import StartKernelRequest
from kernel_gateway.types import JSON

Endpoint = Callable[[Request], Awaitable[Response]]
TEMPLATE_VARIABLE = "KERNEL_TEMPLATE"
"""The `env` variable naming a template to start a kernel on (`name`, `name:tag`, or id)."""

PYTHON_SPEC: JSON = {
    "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    "display_name": "Python 3 (sandboxed)",
    "language": "python",
    "interrupt_mode": "signal",
    "env": {},
    "metadata": {"debugger": False, "kernel_gateway": {"sandboxed": True}},
}


def kernelspec_of(language: Language) -> JSON:
    """The kernelspec model Jupyter Server reads, for one of the gateway's languages."""
    if language.builtin:
        spec = PYTHON_SPEC
    else:
        spec = {
            "argv": list(language.argv),
            "display_name": f"{language.display_name} (sandboxed)",
            "language": language.name,
            "interrupt_mode": language.interrupt_mode,
            "env": {},
            "metadata": {
                "debugger": False,
                "kernel_gateway": {"sandboxed": True, "version": language.version},
            },
        }
    return {"name": kernel_name(language.name), "spec": spec, "resources": {}}


def _hub(request: Request | WebSocket) -> JupyterKernels:
    hub: JupyterKernels = request.state.jupyter
    return hub


def _registry(request: Request | WebSocket) -> Registry:
    registry: Registry = request.state.registry
    return registry


def jupyter_errors(endpoint: Endpoint) -> Endpoint:
    """Answer a GatewayError as Jupyter clients read it: `message` and `reason`, too."""

    @functools.wraps(endpoint)
    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except GatewayError as exc:
            body = {
                "message": exc.message,
                "reason": HTTPStatus(exc.status_code).phrase,
                **exc.to_json(),
            }
            headers = {"Retry-After": str(int(exc.retry_after))} if exc.retry_after else {}
            return JSONResponse(body, status_code=exc.status_code, headers=headers)

    return wrapped


@jupyter_errors
async def api(request: Request) -> Response:
    return JSONResponse({"version": __version__})


@jupyter_errors
async def kernelspecs(request: Request) -> Response:
    specs = [kernelspec_of(lang) for lang in _registry(request).languages.values()]
    return JSONResponse({"default": KERNEL_NAME, "kernelspecs": {s["name"]: s for s in specs}})


@jupyter_errors
async def kernelspec(request: Request) -> Response:
    return JSONResponse(kernelspec_of(_language(request, request.path_params["name"])))


def _language(request: Request, name: str) -> Language:
    """The language a kernelspec name stands for, or 404 naming the kernelspecs there are."""
    languages = _registry(request).languages
    found = languages.get(language_of(name))
    if found is None:
        names = ", ".join(repr(kernel_name(n)) for n in languages)
        raise NotFound(f"no kernelspec named {name!r}; this gateway has {names}")
    return found


@jupyter_errors
async def list_kernels(request: Request) -> Response:
    hub = _hub(request)
    return JSONResponse([hub.model(s) for s in _registry(request).visible(principal_of(request))])


@jupyter_errors
async def start_kernel(request: Request) -> Response:
    """Start a kernel: a new gateway session from the warm pool.

    `env` (Jupyter Server sends its `KERNEL_*` variables) is not applied to the kernel
    (pooled kernels are started before anyone asks, with a fixed environment), except
    `KERNEL_NETWORK_ALLOW`: the domains the kernel may reach, comma-separated (`none` or
    empty: none), as `network.allow` of `POST /sessions` (docs/network.md); and
    `KERNEL_TEMPLATE`: a template (`name`, `name:tag` or its id) to start the kernel on,
    as `template` of `POST /sessions` (a kernelspec name, when sent, must be its language).
    """
    registry = _registry(request)
    settings = registry.settings
    body = await read_model(
        request, StartKernelRequest, settings.max_body_bytes, settings, optional=True
    )
    env = body.env or {}
    template = env.get(TEMPLATE_VARIABLE, "").strip() or None
    language: str | None = None
    if body.name is not None or template is None:
        language = _language(request, body.name or KERNEL_NAME).name
    allow = env.get("KERNEL_NETWORK_ALLOW")
    network = None
    if allow is not None:
        patterns = [p.strip() for p in allow.split(",") if p.strip()]
        network = patterns if patterns and patterns != ["none"] else "none"
    session = await registry.create_session(
        language, network, template, owner=principal_of(request)
    )
    model = _hub(request).model(session)
    return JSONResponse(model, status_code=201, headers={"Location": f"/api/kernels/{model['id']}"})


@jupyter_errors
async def get_kernel(request: Request) -> Response:
    session = _hub(request).session(request.path_params["kernel_id"], principal_of(request))
    return JSONResponse(_hub(request).model(session))


@jupyter_errors
async def delete_kernel(request: Request) -> Response:
    session = session_id(request.path_params["kernel_id"])
    await _registry(request).delete_session(session, principal_of(request))
    _hub(request).forget(session)
    return Response(status_code=204)


@jupyter_errors
async def interrupt_kernel(request: Request) -> Response:
    session = _hub(request).session(request.path_params["kernel_id"], principal_of(request))
    await _hub(request).interrupt(session)
    return Response(status_code=204)


@jupyter_errors
async def restart_kernel(request: Request) -> Response:
    session = _hub(request).session(request.path_params["kernel_id"], principal_of(request))
    await session.restart()
    return JSONResponse(_hub(request).model(session))


async def channels(websocket: WebSocket) -> None:
    """The kernel's channels over a WebSocket (see `jupyter_kernels.ChannelProxy`)."""
    hub = _hub(websocket)
    try:
        session = hub.session(websocket.path_params["kernel_id"], principal_of(websocket))
        if hub.state(session.id).connections >= MAX_CONNECTIONS:
            raise TooManySessions(
                f"kernel {session.id} already has {MAX_CONNECTIONS} open connections",
                retry_after=5,
            )
    except GatewayError as exc:
        await refuse(websocket.scope, websocket.receive, websocket.send, exc)
        return
    protocol = V1_PROTOCOL if V1_PROTOCOL in websocket.scope.get("subprotocols", []) else None
    await hub.serve(websocket, session, protocol)


SURFACE = Surface(
    "/api",
    "Jupyter Server's kernel API (kernelspecs, kernels, the channels WebSocket): its contract "
    "is Jupyter's REST API and messaging protocol",
    [
        Route("/api", api, methods=["GET"]),
        Route("/api/kernelspecs", kernelspecs, methods=["GET"]),
        Route("/api/kernelspecs/{name}", kernelspec, methods=["GET"]),
        Route("/api/kernels", list_kernels, methods=["GET"]),
        Route("/api/kernels", start_kernel, methods=["POST"]),
        Route("/api/kernels/{kernel_id}", get_kernel, methods=["GET"]),
        Route("/api/kernels/{kernel_id}", delete_kernel, methods=["DELETE"]),
        Route("/api/kernels/{kernel_id}/interrupt", interrupt_kernel, methods=["POST"]),
        Route("/api/kernels/{kernel_id}/restart", restart_kernel, methods=["POST"]),
        WebSocketRoute("/api/kernels/{kernel_id}/channels", channels),
    ],
)
