"""envd's routes (any sandbox port but the interpreter's): `/health`, `/files`, and the
filesystem and process services over Connect, each for the sandbox's only user."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernel_gateway.protocols.e2b.connect import ConnectError
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.replies import ALL_METHODS, Handler, e2b_error, gone
from kernel_gateway.protocols.e2b.sandbox import Sandbox
from kernel_gateway.sessions.session import Session

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

SANDBOX_USER = "user"
"""E2B's default user, and the only one here (the kernel's uid 1000)."""


def _basic_user(authorization: str | None) -> str | None:
    """The user an SDK names (`user=`) in `Authorization: Basic base64("<user>:")`."""
    if authorization is None or not authorization.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return "?"
    return decoded.partition(":")[0]


def envd_routes(service: E2BService) -> list[Route]:
    def with_session(
        handler: Callable[[Request, Sandbox, Session], Awaitable[Response]],
    ) -> Handler:
        async def endpoint(request: Request) -> Response:
            sandbox: Sandbox = request.state.e2b_sandbox
            users = {_basic_user(request.headers.get("authorization"))}
            if request.url.path.endswith("/files"):  # `/files` may name it in the query
                users.add(request.query_params.get("username"))
            user = next((u for u in users if u not in (None, "", SANDBOX_USER)), None)
            if user is not None:
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
