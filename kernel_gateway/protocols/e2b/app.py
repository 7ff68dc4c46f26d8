"""`/e2b`: E2B's API, for E2B's own SDKs, on the gateway's sessions.

Users point the SDKs at it with `E2B_API_URL=http://HOST:8888/e2b` and
`E2B_SANDBOX_URL=http://HOST:8888/e2b` (and `E2B_API_KEY=<the gateway's token or an API
key>`).
The SDKs send control-plane calls without sandbox headers, and every data-plane call to
the same base URL with `E2b-Sandbox-Id` and `E2b-Sandbox-Port`; so requests are told
apart by those headers, not by path (see design/e2b-wire.md). This module dispatches;
each router is a module of its own:

    no E2b-Sandbox-Id, or a      the control plane (X-API-KEY)        templates_api.py,
    control path (`paths.py`)    (a template's file upload: the       sandboxes_api.py
                                 token its URL carries)
    E2b-Sandbox-Port: 49999      the code interpreter (sandbox token) interpreter.py:
                                                                      /execute, /contexts
    any other port               envd (sandbox token)                 envd_api.py: /health,
                                                                      /files, RPC

Every answer is in E2B's shapes, never the gateway's own error document.

`X-API-KEY` is the admin token or an API key (`http.auth.Authenticator`, as every other
surface): the control plane acts as its principal, which sees only its own sandboxes,
snapshots and templates. The data plane's credential is each sandbox's own token; a
sandbox whose API key was revoked is refused there too, and its open streams end.
"""

from __future__ import annotations

import re
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route, Router
from starlette.types import Receive, Scope, Send

from kernel_gateway import logs
from kernel_gateway.http.auth import Authenticator, credential, until_revoked
from kernel_gateway.kernels.volumes import Volumes
from kernel_gateway.logs import ROUTE_TEMPLATE
from kernel_gateway.protocols.e2b.api_keys_api import api_key_routes
from kernel_gateway.protocols.e2b.envd import Envd
from kernel_gateway.protocols.e2b.envd_api import envd_routes
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.interpreter import interpreter_routes
from kernel_gateway.protocols.e2b.paths import is_control
from kernel_gateway.protocols.e2b.process import Processes
from kernel_gateway.protocols.e2b.replies import e2b_error, gone
from kernel_gateway.protocols.e2b.sandbox import Sandbox
from kernel_gateway.protocols.e2b.sandboxes import Sandboxes
from kernel_gateway.protocols.e2b.sandboxes_api import control_routes
from kernel_gateway.protocols.e2b.secrets_api import secret_routes
from kernel_gateway.protocols.e2b.snapshots_api import snapshot_routes
from kernel_gateway.protocols.e2b.template_files import Uploads
from kernel_gateway.protocols.e2b.templates_api import template_routes
from kernel_gateway.protocols.e2b.volumes_api import VolumeTokens, volume_routes
from kernel_gateway.records import RecordStore
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.snapshots import SavedSessions
from kernel_gateway.sessions.usage import UsageSampler
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.principal import ADMIN, Principal
from kernel_gateway.tenants.secrets import SecretStore

INTERPRETER_PORT = "49999"
SANDBOX_IN_PATH = re.compile(r"^/+(?:v\d+/+)?sandboxes/+(?P<id>[^/]+)")
SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A sandbox id worth binding to log lines (anything else is not logged as one)."""


class E2BService:
    """The `/e2b` ASGI app, and the sandboxes it keeps (started and stopped with the app)."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        snapshots: SavedSessions,
        usage: UsageSampler,
        volumes: Volumes,
        auth: Authenticator,
        records: Path | None = None,
        secrets: SecretStore | None = None,
    ) -> None:
        """`records`: the folder that keeps sandboxes for the next gateway (with
        `--persist-sessions`), or None."""
        self.registry = registry
        self.settings = settings
        self.usage = usage
        """Sessions' metrics (the sandboxes' metrics)."""
        store = RecordStore(records, Sandbox.from_json) if records is not None else None
        self.sandboxes = Sandboxes(registry, snapshots, store, self._commands_running)
        self.auth = auth
        self.secrets = secrets if secrets is not None else SecretStore(Path("/nonexistent"), None)
        """The gateway's secrets (E2B's `/secrets`); off without --secrets-key-file."""
        self.volumes = volumes
        self.volume_tokens = VolumeTokens(settings.token)
        """Signs the tokens of the volumes' content API (volumes_api.py)."""
        self.uploads = Uploads(settings.token)
        """Signs the URLs templates' COPY files are uploaded to (template_files.py)."""
        self._control = Router(
            routes=[
                *api_key_routes(self),
                *secret_routes(self),
                *snapshot_routes(self),
                *template_routes(self),
                *volume_routes(self),
                *control_routes(self),
            ]
        )
        self._interpreter = Router(routes=interpreter_routes(self))
        self._envd = Router(routes=envd_routes(self))
        self._envds: dict[str, Envd] = {}
        self._processes: dict[str, Processes] = {}

    def envd(self, sandbox: Sandbox) -> Envd:
        """The sandbox's envd state (its watchers); dropped with the sandbox."""
        self._forget_gone(sandbox.id)
        envd = self._envds.get(sandbox.id)
        if envd is None:
            envd = self._envds[sandbox.id] = Envd(self.settings.max_upload_bytes)
        return envd

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
        owner = self.sandboxes.owner(sandbox)
        keys = self.auth.keys
        if owner is None or keys is None:
            logs.bind(key=ADMIN.name)
            await router(scope, receive, send)
            return
        logs.bind(key=keys.name_of(owner))
        await until_revoked(router, keys, owner, scope, receive, send)

    # -- authentication -----------------------------------------------------------------

    def api_principal(self, request: Request) -> Principal | None:
        """Who `X-API-KEY` (else `Authorization: Bearer`, as E2B's access tokens come) stands
        for: the admin token or an API key (on a gateway without a token, any key but one:
        the SDKs always send it, and a web page cannot without the browser asking first, so
        a page cannot create or drive sandboxes there)."""
        key = request.headers.get("x-api-key") or credential(request.headers) or None
        if key is None:
            return None
        return self.auth.principal(key)

    def _data_plane_sandbox(self, sandbox_id: str, headers: Headers) -> Sandbox | Response:
        try:
            sandbox = self.sandboxes.get(sandbox_id, ADMIN)  # its own token is checked below
        except SandboxError:
            return gone(sandbox_id)
        token = headers.get("x-access-token") or headers.get("e2b-traffic-access-token")
        if sandbox.paused and not (
            sandbox.accepts(token) and self.sandboxes.resume_on_demand(sandbox)
        ):
            return gone(sandbox_id)  # paused: as E2B's edge answers (whatever the token)
        if not sandbox.accepts(token):
            return e2b_error(401, "invalid access token for this sandbox")
        keys = self.auth.keys
        owner = self.sandboxes.owner(sandbox)
        if owner is not None and keys is not None and not keys.live(owner):
            return e2b_error(401, "the API key that made this sandbox was revoked")
        self.sandboxes.touch(sandbox)
        return sandbox


def _template(router: Router, scope: Scope) -> str:
    """The path template of the route `scope` goes to (`/sandboxes/{id}`), for the access
    log and the HTTP metrics: a fixed set of values, whatever the paths asked for."""
    for route in router.routes:
        if isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE:
            return route.path if route.path != "/{rest:path}" else "/{path}"
    return "/{path}"
