"""`/e2b`: E2B's API, for E2B's own SDKs, on the gateway's sessions.

Users point the SDKs at it with `E2B_API_URL=http://HOST:8888/e2b` and
`E2B_SANDBOX_URL=http://HOST:8888/e2b` (and `E2B_API_KEY=<the gateway's token>`).
The SDKs send control-plane calls without sandbox headers, and every data-plane call to
the same base URL with `E2b-Sandbox-Id` and `E2b-Sandbox-Port`; so requests are told
apart by those headers, not by path (see design/e2b-wire.md):

    no E2b-Sandbox-Id, or a      the control plane (X-API-KEY)        control routes
    control path (`paths.py`)
    E2b-Sandbox-Port: 49999      the code interpreter (sandbox token) /execute, /contexts
    any other port               envd (sandbox token)                 /health, /files, RPC

Every answer is in E2B's shapes, never the gateway's own error document.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Match, Route, Router
from starlette.types import Receive, Scope, Send

from kernel_gateway import logs
from kernel_gateway.errors import GatewayError, InvalidRequest
from kernel_gateway.http.bodies import read_json
from kernel_gateway.logs import ROUTE_TEMPLATE
from kernel_gateway.protocols.e2b import ndjson
from kernel_gateway.protocols.e2b.connect import ConnectError
from kernel_gateway.protocols.e2b.envd import Envd
from kernel_gateway.protocols.e2b.paths import is_control
from kernel_gateway.protocols.e2b.process import Processes
from kernel_gateway.protocols.e2b.sandboxes import (
    ENVD_VERSION,
    Sandbox,
    SandboxError,
    Sandboxes,
    check_env,
)
from kernel_gateway.sessions.persistence import RecordStore
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.types import Record

INTERPRETER_PORT = "49999"
SANDBOX_USER = "user"
"""E2B's default user, and the only one here (the kernel's uid 1000)."""
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
KEEPALIVE_SECONDS = 5.0
MAX_BODY_BYTES = 2 * 2**20
SANDBOX_IN_PATH = re.compile(r"^/+(?:v\d+/+)?sandboxes/+(?P<id>[^/]+)")
SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A sandbox id worth binding to log lines (anything else is not logged as one)."""
Handler = Callable[[Request], Awaitable[Response]]


def e2b_error(status: int, message: str) -> JSONResponse:
    """The control plane's (and envd HTTP's) error document: `code` is the status."""
    return JSONResponse({"code": status, "message": message}, status_code=status)


def gone(sandbox_id: str) -> JSONResponse:
    """What E2B's edge answers for a sandbox that is not there (or is paused): the SDKs
    read a 502 whose message says "was not found" as "not running"."""
    return JSONResponse(
        {"code": 502, "message": "The sandbox was not found", "sandboxId": sandbox_id},
        status_code=502,
    )


class E2BService:
    """The `/e2b` ASGI app, and the sandboxes it keeps (started and stopped with the app)."""

    def __init__(self, registry: Registry, settings: Settings, records: Path | None = None) -> None:
        """`records`: the folder that keeps sandboxes for the next gateway (with
        `--persist-sessions`), or None."""
        self.registry = registry
        self.settings = settings
        store = RecordStore(records, Sandbox.from_json) if records is not None else None
        self.sandboxes = Sandboxes(registry, store, self._commands_running)
        self._key_digest = (
            hashlib.sha256(settings.token.encode()).digest() if settings.token else None
        )
        self._control = Router(routes=_control_routes(self))
        self._interpreter = Router(routes=_interpreter_routes(self))
        self._envd = Router(routes=_envd_routes(self))
        self._envds: dict[str, Envd] = {}
        self._processes: dict[str, Processes] = {}

    def envd(self, sandbox: Sandbox) -> Envd:
        """The sandbox's envd state (its watchers); dropped with the sandbox."""
        self._forget_gone(sandbox.id)
        return self._envds.setdefault(sandbox.id, Envd())

    def _commands_running(self, sandbox_id: str) -> bool:
        processes = self._processes.get(sandbox_id)
        return processes is not None and processes.running

    def processes(self, sandbox: Sandbox) -> Processes:
        """The sandbox's commands; dropped with the sandbox (its container goes with it)."""
        self._forget_gone(sandbox.id)
        return self._processes.setdefault(sandbox.id, Processes(sandbox.env))

    def _forget_gone(self, keep: str) -> None:
        for table in (self._envds, self._processes):
            for gone_id in [i for i in table if i != keep and not self.sandboxes.has(i)]:
                del table[gone_id]

    def start(self) -> None:
        self.sandboxes.start()

    async def close(self) -> None:
        await self.sandboxes.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        scope = dict(scope)
        # E2B_SANDBOX_URL with a trailing slash makes the SDKs ask for `/e2b//execute`.
        scope["path"] = re.sub(r"/{2,}", "/", scope["path"])
        headers = Headers(scope=scope)
        sandbox_id = headers.get("e2b-sandbox-id")
        root = scope.get("root_path", "")
        relative = scope["path"][len(root) :] if scope["path"].startswith(root) else scope["path"]
        state = scope.setdefault("state", {})
        if sandbox_id is None or is_control(relative):
            named = SANDBOX_IN_PATH.match(relative)
            logs.bind(session_id=named["id"] if named and SANE_ID.fullmatch(named["id"]) else None)
            state[ROUTE_TEMPLATE] = root + _template(self._control, scope)
            await self._control(scope, receive, send)
            return
        logs.bind(session_id=sandbox_id if SANE_ID.fullmatch(sandbox_id) else None)
        router = (
            self._interpreter if headers.get("e2b-sandbox-port") == INTERPRETER_PORT else self._envd
        )
        state[ROUTE_TEMPLATE] = root + _template(router, scope)
        sandbox = self._data_plane_sandbox(sandbox_id, headers)
        if isinstance(sandbox, Response):
            await sandbox(scope, receive, send)
            return
        state["e2b_sandbox"] = sandbox
        await router(scope, receive, send)

    # -- authentication -----------------------------------------------------------------

    def api_key_ok(self, request: Request) -> bool:
        """`X-API-KEY` is the gateway's token (any key when the gateway has none, but one:
        the SDKs always send it, and a web page cannot without the browser asking first, so
        a page cannot create or drive sandboxes on a gateway without a token)."""
        key = request.headers.get("x-api-key")
        if key is None:
            return False
        if self._key_digest is None:
            return True
        return hmac.compare_digest(hashlib.sha256(key.encode()).digest(), self._key_digest)

    def _data_plane_sandbox(self, sandbox_id: str, headers: Headers) -> Sandbox | Response:
        try:
            sandbox = self.sandboxes.get(sandbox_id)
        except SandboxError:
            return gone(sandbox_id)
        token = headers.get("x-access-token") or headers.get("e2b-traffic-access-token")
        if sandbox.paused and not (
            sandbox.accepts(token) and self.sandboxes.resume_on_demand(sandbox)
        ):
            return gone(sandbox_id)  # paused: as E2B's edge answers (whatever the token)
        if not sandbox.accepts(token):
            return e2b_error(401, "invalid access token for this sandbox")
        self.sandboxes.touch(sandbox)
        return sandbox


def _template(router: Router, scope: Scope) -> str:
    """The path template of the route `scope` goes to (`/sandboxes/{id}`), for the access
    log and the HTTP metrics: a fixed set of values, whatever the paths asked for."""
    for route in router.routes:
        if isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE:
            return route.path if route.path != "/{rest:path}" else "/{path}"
    return "/{path}"


# -- the control plane ----------------------------------------------------------------------


def _control_routes(service: E2BService) -> list[Route]:
    def guarded(handler: Callable[[Request, E2BService], Awaitable[Response]]) -> Handler:
        async def endpoint(request: Request) -> Response:
            if not service.api_key_ok(request):
                return e2b_error(401, "invalid API key: it is the gateway's token")
            try:
                return await handler(request, service)
            except SandboxError as exc:
                return e2b_error(exc.status, exc.message)

        return endpoint

    return [
        Route("/sandboxes", guarded(create), methods=["POST"]),
        Route("/v2/sandboxes", guarded(create), methods=["POST"]),
        Route("/sandboxes", guarded(list_sandboxes), methods=["GET"]),
        Route("/v2/sandboxes", guarded(list_sandboxes), methods=["GET"]),
        Route("/sandboxes/{id}", guarded(get_sandbox), methods=["GET"]),
        Route("/sandboxes/{id}", guarded(kill), methods=["DELETE"]),
        Route("/sandboxes/{id}/timeout", guarded(set_timeout), methods=["POST"]),
        Route("/sandboxes/{id}/connect", guarded(connect), methods=["POST"]),
        Route("/v2/sandboxes/{id}/connect", guarded(connect), methods=["POST"]),
        Route("/sandboxes/{id}/resume", guarded(connect), methods=["POST"]),
        Route("/sandboxes/{id}/pause", guarded(pause), methods=["POST"]),
        Route("/sandboxes/{id}/metrics", guarded(metrics), methods=["GET"]),
        Route("/{rest:path}", guarded(unsupported), methods=ALL_METHODS),
    ]


async def _json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object (empty: `{}`), refused in E2B's error shape."""
    try:
        return await read_json(request, MAX_BODY_BYTES, optional=True)
    except GatewayError as exc:
        # E2B's API answers a body that is JSON but not an object with 400, not 422.
        status = 400 if isinstance(exc, InvalidRequest) else exc.status_code
        raise SandboxError(status, exc.message) from None


def _string_map(body: dict[str, Any], name: str) -> dict[str, str]:
    value = body.get(name) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SandboxError(400, f"'{name}' must be an object of strings")
    return dict(value)


def _int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SandboxError(400, f"'{name}' must be a number of seconds")
    return int(value)


def sandbox_json(sandbox: Sandbox) -> dict[str, Any]:
    """What create and connect answer (E2B's `Sandbox`)."""
    return {
        "sandboxID": sandbox.id,
        "templateID": sandbox.template,
        "alias": sandbox.template,
        "clientID": "kernel-gateway",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.token,
        "trafficAccessToken": sandbox.token,
        "domain": None,
    }


def detail_json(sandbox: Sandbox, settings: Settings) -> dict[str, Any]:
    """What get and list answer (E2B's `SandboxDetail` / `ListedSandbox`)."""
    from datetime import UTC, datetime

    def rfc3339(moment: datetime) -> str:
        return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")

    return {
        "sandboxID": sandbox.id,
        "templateID": sandbox.template,
        "alias": sandbox.template,
        "clientID": "kernel-gateway",
        "startedAt": rfc3339(sandbox.started_at),
        "endAt": rfc3339(datetime.fromtimestamp(sandbox.end_at, UTC)),
        "envdVersion": ENVD_VERSION,
        "cpuCount": max(1, math.ceil(settings.cpu_limit)),
        "memoryMB": settings.memory_limit_bytes // 2**20,
        "diskSizeMB": settings.workspace_size_bytes // 2**20,
        "state": sandbox.state,
        "metadata": sandbox.metadata,
        "envdAccessToken": sandbox.token,
    }


async def create(request: Request, service: E2BService) -> Response:
    body = await _json_body(request)
    template = body.get("templateID") or "base"
    if not isinstance(template, str):
        raise SandboxError(400, "'templateID' must be a string")
    _refuse_what_is_not_here(body)
    auto_resume = body.get("autoResume") or {}
    lifecycle = body.get("lifecycle") or {}
    if not isinstance(auto_resume, dict) or not isinstance(lifecycle, dict):
        raise SandboxError(400, "'autoResume' and 'lifecycle' must be objects")
    sandbox = await service.sandboxes.create(
        template,
        _int(body, "timeout"),
        _string_map(body, "metadata"),
        _string_map(body, "envVars"),
        auto_pause=body.get("autoPause") is True or lifecycle.get("onTimeout") == "pause",
        auto_resume=auto_resume.get("enabled") is True or lifecycle.get("autoResume") is True,
        network=_network(body),
    )
    return JSONResponse(sandbox_json(sandbox), status_code=201)


def _network(body: dict[str, Any]) -> list[str] | str | None:
    """E2B's network options as the gateway's policy (docs/network.md):

    - `network.allowOut` (domain names): exactly those, within the gateway's ceiling;
    - `allow_internet_access: false`: none;
    - neither (or `allow_internet_access: true`, which e2b before 2.51 sends for every
      sandbox): the gateway's default (`--egress-default`; none unless the operator set one).
    """
    network = body.get("network")
    if network is not None and not isinstance(network, dict):
        raise SandboxError(400, "'network' must be an object")
    allow_out = (network or {}).get("allowOut")
    if allow_out is not None:
        if not isinstance(allow_out, list) or not all(isinstance(a, str) for a in allow_out):
            raise SandboxError(400, "'network.allowOut' must be a list of domain names")
        return allow_out or "none"
    if body.get("allow_internet_access") is False:
        return "none"
    return None


def _refuse_what_is_not_here(body: dict[str, Any]) -> None:
    """A create asking for what this gateway's sandboxes cannot have: a clear 400, never a
    sandbox that silently lacks it."""
    for name, what in (("mcp", "MCP servers in a sandbox"), ("volumeMounts", "volumes")):
        if body.get(name):
            raise SandboxError(400, f"{what} ('{name}') are not supported by this gateway")


async def get_sandbox(request: Request, service: E2BService) -> Response:
    sandbox = service.sandboxes.get(request.path_params["id"])
    return JSONResponse(detail_json(sandbox, service.settings))


async def kill(request: Request, service: E2BService) -> Response:
    await service.sandboxes.kill(request.path_params["id"])
    return Response(status_code=204)


async def set_timeout(request: Request, service: E2BService) -> Response:
    timeout = _int(await _json_body(request), "timeout")
    if timeout is None:
        raise SandboxError(400, "'timeout' is required")
    service.sandboxes.set_timeout(request.path_params["id"], timeout)
    return Response(status_code=204)


async def connect(request: Request, service: E2BService) -> Response:
    body = await _json_body(request)
    sandbox_id = request.path_params["id"]
    sandbox, resumed = await service.sandboxes.connect(sandbox_id, _int(body, "timeout"))
    return JSONResponse(sandbox_json(sandbox), status_code=201 if resumed else 200)


async def pause(request: Request, service: E2BService) -> Response:
    await service.sandboxes.pause(request.path_params["id"])
    return Response(status_code=204)


async def metrics(request: Request, service: E2BService) -> Response:
    service.sandboxes.get(request.path_params["id"])
    raise SandboxError(501, "sandbox metrics are not served by this gateway (see /metrics)")


async def list_sandboxes(request: Request, service: E2BService) -> Response:
    from urllib.parse import parse_qsl, unquote

    query = request.query_params
    states = {s for s in (query.get("state") or "").split(",") if s}
    wanted_metadata = {unquote(k): unquote(v) for k, v in parse_qsl(query.get("metadata") or "")}
    found = [
        s
        for s in service.sandboxes.all()
        if (not states or s.state in states)
        and all(s.metadata.get(k) == v for k, v in wanted_metadata.items())
    ]
    found.sort(key=lambda s: (s.started_at, s.id))
    try:
        limit = int(query.get("limit") or 100)
    except ValueError:
        raise SandboxError(400, "'limit' must be a number") from None
    if not 1 <= limit <= 100:
        raise SandboxError(400, "'limit' must be between 1 and 100")
    start = 0
    token = query.get("nextToken")
    if token:
        ids = [s.id for s in found]
        if token not in ids:
            raise SandboxError(400, "'nextToken' does not name a sandbox of this listing")
        start = ids.index(token)
    page = found[start : start + limit]
    headers = {}
    if start + limit < len(found):
        headers["X-Next-Token"] = found[start + limit].id
    return JSONResponse([detail_json(s, service.settings) for s in page], headers=headers)


async def unsupported(request: Request, service: E2BService) -> Response:
    return e2b_error(
        501, f"{request.method} {request.url.path} is not supported by this gateway's E2B API"
    )


# -- the code interpreter (port 49999) --------------------------------------------------------


def _interpreter_routes(service: E2BService) -> list[Route]:
    def handled(handler: Callable[[Request, E2BService], Awaitable[Response]]) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request, service)
            except SandboxError as exc:
                # The SDKs read this port's errors from the status and the body's text.
                return PlainTextResponse(exc.message, status_code=exc.status)

        return endpoint

    return [
        Route("/execute", handled(execute), methods=["POST"]),
        Route("/contexts", handled(create_context), methods=["POST"]),
        Route("/contexts", handled(list_contexts), methods=["GET"]),
        Route("/contexts/{id}", handled(remove_context), methods=["DELETE"]),
        Route("/contexts/{id}/restart", handled(restart_context), methods=["POST"]),
    ]


LANGUAGE_ALIASES = {"js": "javascript", "ts": "typescript"}


def _language(value: Any) -> str:
    if value is None:
        return "python"
    if not isinstance(value, str):
        raise SandboxError(400, "'language' must be a string")
    name = value.strip().lower()
    return LANGUAGE_ALIASES.get(name, name)


async def create_context(request: Request, service: E2BService) -> Response:
    sandbox: Sandbox = request.state.e2b_sandbox
    body = await _json_body(request)
    cwd = body.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise SandboxError(400, "'cwd' must be a string")
    context = await service.sandboxes.create_context(sandbox, _language(body.get("language")), cwd)
    return JSONResponse(context.to_json())


async def list_contexts(request: Request, service: E2BService) -> Response:
    sandbox: Sandbox = request.state.e2b_sandbox
    return JSONResponse([c.to_json() for c in sandbox.contexts.values()])


async def remove_context(request: Request, service: E2BService) -> Response:
    sandbox: Sandbox = request.state.e2b_sandbox
    await service.sandboxes.remove_context(sandbox, request.path_params["id"])
    return JSONResponse(None)


async def restart_context(request: Request, service: E2BService) -> Response:
    sandbox: Sandbox = request.state.e2b_sandbox
    session = service.sandboxes.context_session(sandbox, request.path_params["id"])
    try:
        await session.restart()
    except GatewayError as exc:
        raise SandboxError(exc.status_code, exc.message) from exc
    return JSONResponse(None)


async def execute(request: Request, service: E2BService) -> Response:
    sandbox: Sandbox = request.state.e2b_sandbox
    body = await _json_body(request)
    if not isinstance(body.get("code"), str):
        raise SandboxError(400, "the body must be JSON with a string 'code'")
    context_id = body.get("context_id")
    if context_id is not None and body.get("language") is not None:
        raise SandboxError(400, "give 'context_id' or 'language', not both")
    env = body.get("env_vars") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise SandboxError(400, "'env_vars' must be an object of strings")
    if context_id is not None:
        session = service.sandboxes.context_session(sandbox, str(context_id))
    else:
        language = _language(body.get("language"))
        try:
            service.registry.languages.get_or_raise(language)
        except GatewayError as exc:
            raise SandboxError(400, exc.message) from exc
        context = await service.sandboxes.default_context(sandbox, language)
        session = service.sandboxes.context_session(sandbox, context.id)
    if env and session.language != "python":
        raise SandboxError(400, "'env_vars' are applied to Python contexts only")
    check_env(env, "'env_vars'")
    try:
        owner = service.sandboxes.session(sandbox)
        owner.touch()  # a context's work keeps its sandbox from the gateway's idle reaper
        execution = session.submit(
            body["code"], service.settings.max_exec_timeout, _env_around(env) if env else None
        )
    except GatewayError as exc:
        raise SandboxError(exc.status_code, exc.message) from exc

    async def lines() -> AsyncIterator[bytes]:
        # The records are read by a task of their own, so waiting for the next one can
        # time out (a keepalive line) without cancelling the records' generator.
        queue: asyncio.Queue[Record | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for record in execution.records(None):
                    queue.put_nowait(record)
            finally:
                queue.put_nowait(None)

        session.attach(execution)
        reader = asyncio.ensure_future(pump())
        finished = False
        try:
            while True:
                try:
                    record = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield ndjson.KEEPALIVE
                    continue
                if record is None:
                    break
                for out in ndjson.lines_of(record.event.name, record.event.data):
                    yield out
                finished = finished or record.event.name == "done"
        finally:
            reader.cancel()
            session.detach(execution)
            if not finished:
                session.abandon(execution)  # the client went away: stop the cell now

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _env_around(env: dict[str, str]) -> tuple[str, str]:
    """Silent code that puts `env` in `os.environ` for one cell and then restores it."""
    setup = (
        "import os as __kg_os\n"
        f"__kg_env_saved = {{k: __kg_os.environ.get(k) for k in {list(env)!r}}}\n"
        f"__kg_os.environ.update({env!r})\n"
        "del __kg_os"
    )
    teardown = (
        "import os as __kg_os\n"
        "for __kg_k, __kg_v in __kg_env_saved.items():\n"
        "    if __kg_v is None:\n"
        "        __kg_os.environ.pop(__kg_k, None)\n"
        "    else:\n"
        "        __kg_os.environ[__kg_k] = __kg_v\n"
        "del __kg_os, __kg_env_saved, __kg_k, __kg_v"
    )
    return setup, teardown


# -- envd (any other port) ------------------------------------------------------------------


def _basic_user(authorization: str | None) -> str | None:
    """The user an SDK names (`user=`) in `Authorization: Basic base64("<user>:")`."""
    if authorization is None or not authorization.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return "?"
    return decoded.partition(":")[0]


def _envd_routes(service: E2BService) -> list[Route]:
    def with_session(
        handler: Callable[[Request, Sandbox, Session], Awaitable[Response]],
    ) -> Handler:
        async def endpoint(request: Request) -> Response:
            sandbox: Sandbox = request.state.e2b_sandbox
            user = _basic_user(request.headers.get("authorization"))
            if user not in (None, "", SANDBOX_USER):
                message = (
                    f"user {user!r} is not available here: files and commands belong to the "
                    f"sandbox's only user, {SANDBOX_USER!r} (uid 1000)"
                )
                if request.url.path.endswith("/files"):
                    return e2b_error(400, message)
                error = ConnectError("invalid_argument", message)
                return JSONResponse(error.to_json(), status_code=error.status)
            try:
                session = service.sandboxes.session(sandbox)
            except SandboxError:
                return gone(sandbox.id)
            return await handler(request, sandbox, session)

        return endpoint

    async def health(request: Request) -> Response:
        return Response(status_code=204)

    async def download(request: Request, sandbox: Sandbox, session: Session) -> Response:
        return await service.envd(sandbox).download(request, session)

    async def upload(request: Request, sandbox: Sandbox, session: Session) -> Response:
        settings = service.settings
        return await service.envd(sandbox).upload(
            request, session, settings.max_upload_bytes, settings.workspace_size_bytes
        )

    async def filesystem(request: Request, sandbox: Sandbox, session: Session) -> Response:
        method = request.path_params["method"]
        return await service.envd(sandbox).filesystem(method, request, session)

    async def process(request: Request, sandbox: Sandbox, session: Session) -> Response:
        method = request.path_params["method"]
        return await service.processes(sandbox).handle(method, request, session)

    async def rpc_unsupported(request: Request) -> Response:
        error = ConnectError("unimplemented", f"{request.url.path} is not served by this gateway")
        return JSONResponse(error.to_json(), status_code=error.status)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/files", with_session(download), methods=["GET"]),
        Route("/files", with_session(upload), methods=["POST"]),
        Route("/filesystem.Filesystem/{method}", with_session(filesystem), methods=["POST"]),
        Route("/process.Process/{method}", with_session(process), methods=["POST"]),
        Route("/{rest:path}", rpc_unsupported, methods=ALL_METHODS),
    ]
