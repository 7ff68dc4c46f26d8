"""The gateway as an MCP server: streamable HTTP at `/mcp`, on the official SDK.

Tools run on the gateway's own sessions (see `mcp_tools` for what each does):

- an MCP session (handshake-era clients: `initialize`, then `Mcp-Session-Id`) gets
  one gateway session, made on its first tool call and deleted when the client
  ends the MCP session (DELETE); an idle one ends with `--idle-timeout`, like any
  session, and the SDK forgets the MCP session after the same time;
- sessionless clients (protocol 2026-07-28) keep a sandbox by passing back the
  `session` handle each result names (the gateway session id, so its files are
  also at `/sessions/{id}/files`);
- with `--mcp stateless`, every `run_python` call runs in a fresh kernel that is
  destroyed afterwards (the gateway's `POST /execute`);
- with `--mcp-templates` (and a backend that builds templates), the tools take a
  `template`, and their schemas name the templates there are when they are listed.

A long cell reports progress (elapsed seconds and its latest output line) to
clients that ask for it. Cancelling a call (`notifications/cancelled`, or closing
the response stream) interrupts the cell, and restarts the kernel if it will not
stop, as a disconnect does for the HTTP API.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from kernel_gateway import __version__
from kernel_gateway.errors import GatewayError, SessionNotFound, Unauthorized
from kernel_gateway.http.auth import principal_of
from kernel_gateway.kernels.workspace import Workspace, file_url, guess_mime, iso_time
from kernel_gateway.protocols.mcp.tools import (
    IMAGE_TYPES,
    LIST_FILES,
    MAX_TEXT,
    READ_FILE,
    RESTART_KERNEL,
    RUN_PYTHON,
    UPLOAD_FILE,
    CellReport,
    ReadFileArguments,
    RunPythonArguments,
    SessionArguments,
    StatelessRunPythonArguments,
    ToolInputError,
    UploadFileArguments,
    as_text,
    clip,
    error_result,
    file_tools,
    parse_arguments,
    run_python_tool,
    text_block,
)
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.sessions.follow import Disconnect, follow
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.templates.model import DEFAULT_TAG
from kernel_gateway.tenants.principal import ADMIN, Principal

logger = logging.getLogger(__name__)

MCP_SESSION_HEADER = "mcp-session-id"
Handler = Callable[[ServerRequestContext[Any], Any], Awaitable[types.CallToolResult]]
"""A tool: the call's context and its validated arguments (a model of `mcp_tools`)."""
PROGRESS_SECONDS = 1.0
INSTRUCTIONS = (
    "A sandboxed Python interpreter. Use run_python to compute, analyse data and draw charts; "
    "charts come back as images. Put input files in place with upload_file, and look at what "
    "the code wrote with list_files and read_file. Keep passing back the `session` handle a "
    "result names to stay in the same sandbox."
)


class McpService:
    """The MCP server, its HTTP session manager, and which gateway session serves whom."""

    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self.stateless = settings.mcp == "stateless"
        self.server: Server[Any] = Server(
            "kernel-gateway",
            version=__version__,
            title="kernel-gateway: sandboxed Python",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            stateless=self.stateless,
            session_idle_timeout=settings.idle_timeout,
            # Uploads travel in the body as base64: leave room for them.
            max_request_body_size=settings.max_stateless_body_bytes,
            max_sessions=max(64, 8 * settings.max_sessions),
        )
        self._bound: dict[str, str] = {}
        """MCP session id (and language, for any but Python) -> the gateway session serving
        it: one sandbox per language per MCP session."""
        self._binding: dict[str, asyncio.Lock] = {}
        """Held while an MCP session's sandbox is made, so two first calls make one."""
        self.templates = settings.mcp_templates and registry.templates is not None
        """Whether the tools take a `template` (`--mcp-templates`, on a backend with them)."""
        self._tools = self._make_tools(None)

    def _make_tools(self, templates: list[str] | None) -> list[types.Tool]:
        """The tools; `templates`: those a sandbox may start on (None: not offered)."""
        tools = [
            run_python_tool(
                self.settings.max_exec_timeout,
                self.settings.exec_timeout,
                stateless=self.stateless,
                languages=list(self.registry.languages),
                egress=self.settings.egress_ceiling,
                templates=templates,
            )
        ]
        if not self.stateless:
            tools += file_tools(self.settings.max_upload_bytes, templates)
        return tools

    def _template_names(self, viewer: Principal) -> list[str]:
        """The templates a sandbox of `viewer`'s can start on now, as the tools name them."""
        templates = self.registry.templates
        if templates is None:
            return []
        names = []
        for template in templates.all(viewer):
            ready = template.ready
            if ready is not None:
                tags = sorted(t for t in template.tags if t != DEFAULT_TAG)
                tagged = f", tags {', '.join(tags)}" if tags else ""
                names.append(f"{template.name} ({ready.language or 'python'}{tagged})")
        return names

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The `/mcp` endpoint (an ASGI app); auth has been checked by the middleware."""
        await self.manager.handle_request(scope, receive, send)
        if scope["type"] == "http" and scope["method"] == "DELETE":
            mcp_session = Headers(scope=scope).get(MCP_SESSION_HEADER)
            if mcp_session is not None:
                await self.release(mcp_session, principal_of(scope))

    async def release(self, mcp_session: str, viewer: Principal) -> None:
        """The MCP session ended: delete the gateway sessions that served it (one per
        language, list of domains and template it asked for) that `viewer` owns (the
        admin: all)."""
        ours = [
            k
            for k in self._binding
            if k.split("\0", 1)[0] == mcp_session and viewer.sees(_bound_owner(k))
        ]
        for key in ours:
            del self._binding[key]
        session_ids = [self._bound.pop(key) for key in ours if key in self._bound]
        await asyncio.gather(*(self._delete(session_id) for session_id in session_ids))

    async def _delete(self, session_id: str) -> None:
        logger.info("MCP session ended; deleting its session %s", session_id)
        try:
            await self.registry.delete_session(session_id, ADMIN)  # bound for its owner
        except SessionNotFound:
            pass

    # -- MCP handlers ------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if self.templates:  # they name the templates there are now
            names = self._template_names(_principal(ctx))
            return types.ListToolsResult(tools=self._make_tools(names))
        return types.ListToolsResult(tools=list(self._tools))

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        handlers: dict[str, tuple[type[BaseModel], Handler]]
        if self.stateless:
            handlers = {RUN_PYTHON: (StatelessRunPythonArguments, self._run_python_stateless)}
        else:
            handlers = {
                RUN_PYTHON: (RunPythonArguments, self._run_python),
                UPLOAD_FILE: (UploadFileArguments, self._upload_file),
                LIST_FILES: (SessionArguments, self._list_files),
                READ_FILE: (ReadFileArguments, self._read_file),
                RESTART_KERNEL: (SessionArguments, self._restart_kernel),
            }
        if params.name not in handlers:
            raise MCPError(
                types.INVALID_PARAMS,
                f"unknown tool {params.name!r}; this server has {', '.join(handlers)}",
            )
        model, handler = handlers[params.name]
        try:
            arguments = parse_arguments(model, dict(params.arguments or {}), self.settings)
            if getattr(arguments, "template", None) is not None and not self.templates:
                raise ToolInputError(
                    "unknown argument 'template': this gateway does not let MCP clients "
                    "choose a template (its operator can allow it: --mcp-templates)"
                )
            return await handler(ctx, arguments)
        except ToolInputError as exc:
            return error_result(f"invalid arguments for {params.name}: {exc}")
        except GatewayError as exc:
            return error_result(exc.message)

    # -- the tools ---------------------------------------------------------------------------

    async def _run_python_stateless(
        self, ctx: ServerRequestContext[Any], arguments: StatelessRunPythonArguments
    ) -> types.CallToolResult:
        files = [(f.path, f.content) for f in arguments.files or ()]
        session, execution = await self.registry.run_stateless(
            arguments.code,
            arguments.timeout,
            files,
            arguments.language,
            arguments.network,
            arguments.template,
            owner=_principal(ctx),
        )
        report = CellReport(_base_url(ctx))
        await self._follow(ctx, session, execution, report)
        return self._cell_result(report, None)

    async def _run_python(
        self, ctx: ServerRequestContext[Any], arguments: RunPythonArguments
    ) -> types.CallToolResult:
        session, note = await self._session_for(
            ctx, arguments.session, arguments.language, arguments.network, arguments.template
        )
        execution = session.submit(arguments.code, arguments.timeout)
        report = CellReport(_base_url(ctx))
        await self._follow(ctx, session, execution, report)
        result = self._cell_result(report, session.id)
        if note:
            result.content.insert(0, text_block(note))
        return result

    def _cell_result(self, report: CellReport, session_id: str | None) -> types.CallToolResult:
        content: list[types.ContentBlock] = list(report.content(session_id))
        if not report.done:  # the stream was let go: the gateway is stopping
            note = (
                "[the gateway stopped before the cell ended; with --persist-sessions it keeps "
                "running in this sandbox for the next gateway: look at its files, or run "
                "the next cell, in a moment]"
            )
            content.insert(0, text_block(note))
        return types.CallToolResult(content=content, is_error=report.status != "ok")

    async def _follow(
        self,
        ctx: ServerRequestContext[Any],
        session: Session,
        execution: Execution,
        report: CellReport,
    ) -> None:
        """Collect the cell's events, reporting progress; a cancelled call stops the cell."""
        started = time.monotonic()

        async def tick() -> None:
            while True:
                await asyncio.sleep(PROGRESS_SECONDS)
                elapsed = time.monotonic() - started
                message = f"running for {elapsed:.0f} s"
                if latest:
                    message += f": {latest[-200:]}"
                try:
                    await ctx.session.report_progress(elapsed, execution.timeout, message)
                except Exception:  # the client went away; the stream will say so
                    return

        latest = ""
        ticker = asyncio.ensure_future(tick())
        # A cancelled call stops the cell; a draining gateway (--persist-sessions) leaves
        # it to run for its successor.
        following = follow(session, execution, None, Disconnect.INTERRUPT_UNLESS_DRAINING)
        try:
            async with following as records:
                async for record in records:
                    event = record.event
                    report.add(event)
                    if event.name in ("stdout", "stderr"):
                        lines = [line for line in str(event.data["text"]).splitlines() if line]
                        latest = lines[-1] if lines else latest
        finally:
            ticker.cancel()

    async def _upload_file(
        self, ctx: ServerRequestContext[Any], arguments: UploadFileArguments
    ) -> types.CallToolResult:
        session, note = await self._session_for(ctx, arguments.session, template=arguments.template)
        info = await session.files.write(
            arguments.path, arguments.content, self.settings.max_upload_bytes
        )
        url = _base_url(ctx) + file_url(session.id, info.path)
        text = (
            f"{note}Wrote {info.path} ({info.size} bytes, {info.mime}); code run with run_python "
            f"opens it as {info.path!r}.\nsession: {session.id}\n"
        )
        link = types.ResourceLink(
            type="resource_link", name=info.path, uri=url, mime_type=info.mime, size=info.size
        )
        return types.CallToolResult(content=[text_block(text), link])

    async def _list_files(
        self, ctx: ServerRequestContext[Any], arguments: SessionArguments
    ) -> types.CallToolResult:
        session, note = await self._session_for(ctx, arguments.session, template=arguments.template)
        files = await session.files.listing()
        base = _base_url(ctx)
        lines = [note] if note else []
        if not files:
            lines.append("The working directory is empty.\n")
        for info in files:
            url = base + file_url(session.id, info.path)
            lines.append(
                f"{info.path}\t{info.size} bytes\t{info.mime}\t{iso_time(info.modified)}\t{url}\n"
            )
        lines.append(f"session: {session.id}\n")
        return types.CallToolResult(content=[text_block(clip("".join(lines)))])

    async def _read_file(
        self, ctx: ServerRequestContext[Any], arguments: ReadFileArguments
    ) -> types.CallToolResult:
        path = arguments.path
        session, _ = await self._session_for(ctx, arguments.session, template=arguments.template)
        limit = self.settings.max_inline_file_bytes
        raw, size = await asyncio.to_thread(_read_capped, session.files.workspace, path, limit)
        url = _base_url(ctx) + file_url(session.id, path)
        if raw is None:
            return error_result(
                f"{path} is {size} bytes, more than the {limit} bytes a tool result may carry; "
                f"download it from {url}, or read parts of it with run_python"
            )
        mime = guess_mime(path)
        content: types.TextContent | types.ImageContent | types.EmbeddedResource
        if mime in IMAGE_TYPES:
            content = types.ImageContent(
                type="image", data=base64.b64encode(raw).decode(), mime_type=mime
            )
        elif (text := as_text(raw)) is not None:
            if len(text) > MAX_TEXT:
                text = clip(text) + f"\n[{path} is {size} bytes; read parts of it with run_python]"
            content = text_block(text)
        else:
            content = types.EmbeddedResource(
                type="resource",
                resource=types.BlobResourceContents(
                    uri=url, mime_type=mime, blob=base64.b64encode(raw).decode()
                ),
            )
        return types.CallToolResult(content=[content])

    async def _restart_kernel(
        self, ctx: ServerRequestContext[Any], arguments: SessionArguments
    ) -> types.CallToolResult:
        session, _ = await self._session_for(ctx, arguments.session, template=arguments.template)
        await session.restart()
        text = (
            f"The kernel was restarted: variables are cleared, files kept.\nsession: {session.id}\n"
        )
        return types.CallToolResult(content=[text_block(text)])

    # -- which gateway session ---------------------------------------------------------------

    async def _session_for(
        self,
        ctx: ServerRequestContext[Any],
        handle: str | None,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
    ) -> tuple[Session, str]:
        """The session a call runs in (`handle`: the one the model named, if it did), and a
        note for the model when it is a fresh one. `language` (None: the named session's,
        else the template's, else Python), `network` (None: the named session's, else none)
        and `template` (None: the named session's, else none) pick the MCP session's
        sandbox of that language, those domains and that template."""
        principal = _principal(ctx)
        if handle is not None:
            try:
                session = self.registry.get(handle, principal)
            except SessionNotFound:
                raise ToolInputError(
                    f"there is no sandbox {handle!r} (any longer): idle sandboxes are removed "
                    f"after {self.settings.idle_timeout:g} s. Call again without `session` to "
                    "start a fresh one."
                ) from None
            if language is not None and language != session.language:
                raise ToolInputError(
                    f"sandbox {handle!r} runs {session.language}, not {language}: leave out "
                    "`session` to get a sandbox of that language"
                )
            has = session.network.allow if session.network is not None else []
            if network is not None and self.registry.network_policy(network or "none") != has:
                raise ToolInputError(
                    f"sandbox {handle!r} may reach {', '.join(has) or 'nothing'}: leave out "
                    "`session` to get a sandbox with the domains you ask for"
                )
            if template is not None:
                self._check_template(handle, session, template, principal)
            return session, ""
        name = None  # a template's sandbox runs the template's language unless one is named
        if language is not None or template is None:
            name = self.registry.languages.get_or_raise(language).name
        allow = self.registry.network_policy(network or "none")  # checked before any sandbox
        mcp_session = _mcp_session(ctx)
        if mcp_session is None:
            session = await self.registry.create_session(
                name, allow or "none", template, owner=principal
            )
            return session, ""
        # NUL cannot be in a session id, a language, a domain or a template reference, and
        # "@" cannot start a language or a domain: keys cannot collide. The key's owner is
        # in it: another API key presenting this MCP session's id gets sandboxes of its own.
        parts = [*([name] if name not in (None, "python") else []), *allow]
        owner = [f"#{principal.key_id}"] if principal.key_id is not None else []
        tail = [*([f"@{template}"] if template else [])]
        key = "\0".join([mcp_session, *owner, *parts, *tail])
        lock = self._binding.setdefault(key, asyncio.Lock())
        async with lock:  # two first calls at once must not make two sessions
            bound = self._bound.get(key)
            if bound is not None:
                try:
                    return self.registry.get(bound, principal), ""
                except SessionNotFound:
                    note = (
                        "[the previous sandbox of this connection was removed after being idle; "
                        "this is a fresh one: define variables and upload files again]\n"
                    )
            else:
                note = ""
            self._forget_gone()
            session = await self.registry.create_session(
                name, allow or "none", template, owner=principal
            )
            self._bound[key] = session.id
            return session, note

    def _check_template(
        self, handle: str, session: Session, reference: str, viewer: Principal
    ) -> None:
        """A named sandbox asked for on a template must run on it (on any of its builds)."""
        templates = self.registry.templates
        assert templates is not None  # `template` is refused before, where there are none
        wanted = templates.get(reference.partition(":")[0], viewer)
        has = session.template
        if has is None or has.id != wanted.id:
            runs = f"template {has.name!r}" if has is not None else "no template"
            raise ToolInputError(
                f"sandbox {handle!r} runs on {runs}, not {wanted.name!r}: leave out `session` "
                "to get a sandbox on that template"
            )

    def _forget_gone(self) -> None:
        """Drop bindings whose gateway session was removed (idle, or deleted by hand)."""
        alive = {s.id for s in self.registry.sessions()}
        for key in [k for k, v in self._bound.items() if v not in alive]:
            del self._bound[key]
        for key in [k for k, lock in self._binding.items() if not lock.locked()]:
            if key not in self._bound:
                del self._binding[key]


def _mcp_session(ctx: ServerRequestContext[Any]) -> str | None:
    request = ctx.request
    if isinstance(request, Request):
        return request.headers.get(MCP_SESSION_HEADER)
    return None


def _principal(ctx: ServerRequestContext[Any]) -> Principal:
    """Who the tool call acts as: the principal of the HTTP request that carried it."""
    request = ctx.request
    if isinstance(request, Request):
        return principal_of(request)
    raise Unauthorized("this MCP call came without an authenticated request")


def _bound_owner(key: str) -> str | None:
    """The key id written in a binding's key (`#key_…` after the MCP session's id)."""
    parts = key.split("\0")
    return parts[1][1:] if len(parts) > 1 and parts[1].startswith("#") else None


def _base_url(ctx: ServerRequestContext[Any]) -> str:
    """The gateway's URL as the client reached it, for download links."""
    request = ctx.request
    if isinstance(request, Request):
        return str(request.base_url).rstrip("/")
    return ""


def _read_capped(workspace: Workspace, path: str, limit: int) -> tuple[bytes | None, int]:
    """The file's bytes (None when over `limit`) and its size."""
    fd, info = workspace.open_read(path)
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            return None, info.st_size
        data = f.read(limit + 1)
    return (data if len(data) <= limit else None), len(data)
