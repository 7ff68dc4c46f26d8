"""E2B's code interpreter (`E2b-Sandbox-Port: 49999`): `/execute`, streaming a cell as
E2B's NDJSON lines, and `/contexts`, a kernel each on the sandbox's files.

Its errors are plain text with a status (the SDKs read them so). A client that goes away
before the cell's end stops the cell: E2B's streams cannot be resumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.responses import ConnectionDropped
from kernel_gateway.kernels.languages import ENV_LANGUAGES, PYTHON, env_code
from kernel_gateway.protocols.e2b import ndjson
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.replies import Handler, json_body
from kernel_gateway.protocols.e2b.sandbox import Sandbox
from kernel_gateway.protocols.e2b.sandboxes import check_env
from kernel_gateway.sessions.follow import Disconnect, Following, follow
from kernel_gateway.types import Record

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

KEEPALIVE_SECONDS = 5.0


def interpreter_routes(service: E2BService) -> list[Route]:
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
    body = await json_body(request)
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
    if session is None:  # a listed default context not started yet: nothing to restart
        return JSONResponse(None)
    try:
        await session.restart()
    except GatewayError as exc:
        raise SandboxError(exc.status_code, exc.message) from exc
    return JSONResponse(None)


async def execute(request: Request, service: E2BService) -> Response:
    sandbox: Sandbox = request.state.e2b_sandbox
    body = await json_body(request)
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
        session = await service.sandboxes.started_context(sandbox, str(context_id))
    else:
        language = _language(body.get("language"))
        try:
            service.registry.languages.get_or_raise(language)
        except GatewayError as exc:
            raise SandboxError(400, exc.message) from exc
        context = await service.sandboxes.default_context(sandbox, language)
        session = await service.sandboxes.started_context(sandbox, context.id)
    check_env(env, "'env_vars'")
    around = _env_around(session.language, env, sandbox.env) if env else None
    try:
        owner = service.sandboxes.session(sandbox)
        owner.touch()  # a context's work keeps its sandbox from the gateway's idle reaper
        execution = session.submit(body["code"], service.settings.max_exec_timeout, around)
    except GatewayError as exc:
        raise SandboxError(exc.status_code, exc.message) from exc

    following = follow(session, execution, None, Disconnect.INTERRUPT)
    return _FollowingResponse(following, _lines(following, lambda: owner.closed))


class _FollowingResponse(StreamingResponse):
    """A cell's NDJSON lines; its client follows the cell for as long as the response
    lasts, and one that leaves before the end stops it (E2B's streams cannot be resumed)."""

    def __init__(self, following: Following, lines: AsyncGenerator[bytes, None]) -> None:
        super().__init__(lines, media_type="application/x-ndjson")
        self._following = following
        self._lines = lines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self._following:
            try:
                await super().__call__(scope, receive, send)
            finally:
                await self._lines.aclose()  # its reader task goes with it, now


async def _lines(
    records: AsyncIterable[Record], killed: Callable[[], bool]
) -> AsyncGenerator[bytes, None]:
    """The records as E2B's lines, with a keepalive line after 5 s without one.

    A cell ended by its sandbox's kill (`killed()`: the sandbox's session is closed) ends
    the response unfinished, as the stream from a killed E2B sandbox breaks: the SDK then
    finds the sandbox gone and raises its "sandbox was killed" error."""
    # The records are read by a task of their own, so waiting for the next one can time
    # out (a keepalive line) without cancelling the records' generator.
    queue: asyncio.Queue[Record | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for record in records:
                queue.put_nowait(record)
        finally:
            queue.put_nowait(None)

    reader = asyncio.ensure_future(pump())
    try:
        while True:
            try:
                record = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield ndjson.KEEPALIVE
                continue
            if killed() and (record is None or _closed_error(record)):
                raise ConnectionDropped()
            if record is None:
                break
            for out in ndjson.lines_of(record.event.name, record.event.data):
                yield out
    finally:
        reader.cancel()


def _closed_error(record: Record) -> bool:
    """Whether `record` is the error a cell gets when its session is deleted under it."""
    event = record.event
    return (
        event.name == "error"
        and isinstance(event.data, dict)
        and event.data.get("ename") == "SessionClosed"
    )


def _env_around(language: str, env: dict[str, str], sandbox_env: dict[str, str]) -> tuple[str, str]:
    """Silent code that sets `env` for one cell, and the code that undoes it after.

    Python saves what `os.environ` held and puts it back. Other languages get back what
    the sandbox gave every context (`sandbox_env`; a variable it did not give is unset), as
    E2B's own server resets them. Java cannot: a running JVM's environment is fixed.
    """
    if language != PYTHON:
        if language not in ENV_LANGUAGES:
            raise SandboxError(
                400, f"'env_vars' cannot be applied in {language}: its environment is fixed"
            )
        try:
            setup = env_code(language, env)
            teardown = env_code(language, {name: sandbox_env.get(name) for name in env})
        except ValueError as exc:
            raise SandboxError(400, f"'env_vars': {exc}") from None
        return setup, teardown
    save = (
        "import os as __kg_os\n"
        f"__kg_env_saved = {{k: __kg_os.environ.get(k) for k in {list(env)!r}}}\n"
        "del __kg_os"
    )
    setup = save + "\n" + env_code(PYTHON, env)
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
