"""The asynchronous client: only I/O; everything else is in `_base`."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from kernel_gateway.client._base import (
    DEFAULT_URL,
    STREAM_HEADERS,
    BaseClient,
    BaseSession,
    Call,
    Collector,
    EventReader,
    execute_body,
    read,
)
from kernel_gateway.client._failover import AsyncFailoverTransport
from kernel_gateway.client.chat import AsyncChatCalls
from kernel_gateway.client.errors import (
    APIError,
    ConnectFailed,
    NotFoundError,
    ShuttingDownError,
    TransportError,
    from_response,
    map_exceptions,
)
from kernel_gateway.client.models import Event, Execution
from kernel_gateway.client.templates import (
    BuildLogEntry,
    BuildOptions,
    LogReader,
    TemplateBuild,
    TemplateCalls,
    TemplateInfo,
    build_body,
    outcome,
)

T = TypeVar("T")


class AsyncClient(BaseClient):
    def __init__(
        self,
        base_url: str | Sequence[str] = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        resume_retries: int = 5,
        reconnect_seconds: float = 15.0,
    ) -> None:
        super().__init__(
            base_url,
            token=token,
            timeout=timeout,
            resume_retries=resume_retries,
            reconnect_seconds=reconnect_seconds,
        )
        if self.replicas is not None:
            transport = AsyncFailoverTransport(
                self.replicas, transport or httpx.AsyncHTTPTransport()
            )
        self._http = httpx.AsyncClient(transport=transport, **self._http_options())
        self.templates = AsyncTemplates(self)
        """`/templates`: build images from a base and steps, for sessions to start on."""

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Any request; an error answer raises its `APIError` (see `_send` for retries)."""
        reconnect = self._reconnect()
        while True:
            try:
                with map_exceptions():
                    return read(await self._http.request(method, path, **kwargs))
            except (ConnectFailed, ShuttingDownError) as exc:
                await asyncio.sleep(reconnect.delay(exc))

    async def _send(self, call: Call[T]) -> T:
        """Send a call; while the gateway restarts it is sent again (`Reconnect`)."""
        reconnect = self._reconnect()
        while True:
            try:
                with map_exceptions():
                    response = await self._http.request(call.method, call.path, **call.options)
                return call.parse(response)
            except (ConnectFailed, ShuttingDownError) as exc:
                await asyncio.sleep(reconnect.delay(exc))

    async def _stream(
        self, path: str, body: dict[str, Any], *, chat: bool = False
    ) -> AsyncIterator[Any]:
        """POST the cell (or the chat's message); if the stream breaks, resume it from the
        last event id seen."""
        reader, resumer, reconnect = EventReader(chat=chat), self._resumer(), self._reconnect()
        request: dict[str, Any] = {"method": "POST", "url": path, "json": body}
        request["headers"] = STREAM_HEADERS
        while True:
            try:
                with map_exceptions("the event stream broke"):
                    async with self._http.stream(
                        **request, timeout=self._stream_timeout()
                    ) as response:
                        if response.is_error:
                            await response.aread()
                            raise from_response(response)
                        resumer.seen(response)
                        async for chunk in response.aiter_bytes():
                            for event in reader.feed(chunk):
                                yield event
                            if reader.done:
                                return
                raise reader.incomplete()
            except (ConnectFailed, ShuttingDownError) as exc:
                if resumer.location is None:  # the POST itself never reached a running gateway
                    await asyncio.sleep(reconnect.delay(exc))
                    continue
                delay, url, headers = resumer.next_request(reader, exc)
            except TransportError as exc:
                delay, url, headers = resumer.next_request(reader, exc)
            await asyncio.sleep(delay)
            request = {"method": "GET", "url": url, "headers": headers}

    async def _follow_log(self, reader: LogReader) -> AsyncGenerator[BuildLogEntry, None]:
        """A build's log as it is written, to its `end`; a broken stream is asked for again
        from the line it broke at (a GET: nothing runs twice)."""
        while True:
            try:
                with map_exceptions("the build's log broke"):
                    async with self._http.stream(
                        "GET", reader.url, headers=STREAM_HEADERS, timeout=self._stream_timeout()
                    ) as response:
                        if response.is_error:
                            await response.aread()
                            raise from_response(response)
                        async for chunk in response.aiter_bytes():
                            for entry in reader.feed(chunk):
                                yield entry
                            if reader.done:
                                return
                raise reader.incomplete()
            except (TransportError, ShuttingDownError) as exc:
                await asyncio.sleep(reader.retry(exc, self._resume_retries))

    async def health(self) -> dict[str, Any]:
        return await self._send(self._health())

    async def create_session(
        self,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
        snapshot: str | None = None,
        volumes: dict[str, str] | None = None,
        secrets: list[str] | None = None,
    ) -> AsyncSession:
        """A new session; `language` one of `languages()` (default python, or the template's);
        `network` the domains it may reach (within the gateway's `--egress-allow`; default
        none); `template` one of `templates.list()` (`name`, `name:tag` or its id);
        `snapshot` a snapshot's id or name: its files, variables, language and template;
        `volumes` volumes to mount, `{"name or id": "/mnt/data"}`; `secrets` secrets its
        code may use (`create_secret`; each within `network`)."""
        call = self._create_session(language, network, template, snapshot, volumes, secrets)
        return AsyncSession(self, await self._send(call))

    async def snapshots(
        self, session_id: str | None = None, name: str | None = None
    ) -> list[dict[str, Any]]:
        """The snapshots kept (oldest first), those of one session or name if asked."""
        return await self._send(self._snapshots(session_id, name))

    async def snapshot(self, reference: str) -> dict[str, Any]:
        """A snapshot, by id or name (`SnapshotNotFoundError` if none)."""
        return await self._send(self._snapshot(reference))

    async def delete_snapshot(self, reference: str) -> None:
        await self._send(self._delete_snapshot(reference))

    # -- API keys (the admin token's; a key sees and rotates itself) ------------------------

    async def create_key(self, name: str, **quotas: float | None) -> dict[str, Any]:
        """A new API key with its quotas (`max_sessions`, `max_stateless`,
        `requests_per_minute`, `cpus` and `memory_bytes` per kernel); its `secret` is in this
        answer only."""
        return await self._send(self._create_key(name, quotas))

    async def keys(self, revoked: bool = False) -> list[dict[str, Any]]:
        """The live keys, oldest first (and revoked ones when asked)."""
        return await self._send(self._keys(revoked))

    async def key(self, key_id: str) -> dict[str, Any]:
        return await self._send(self._key(key_id))

    async def change_key(self, key_id: str, **quotas: float | None) -> dict[str, Any]:
        """Replace a key's quotas (those not given: none of its own)."""
        return await self._send(self._change_key(key_id, quotas))

    async def rotate_key(self, key_id: str) -> dict[str, Any]:
        """A new secret for the key (in the answer); the old one stops working at once."""
        return await self._send(self._rotate_key(key_id))

    async def revoke_key(self, key_id: str) -> None:
        """Revoke a key: its requests are refused and its open streams end at once."""
        await self._send(self._revoke_key(key_id))

    async def create_secret(
        self,
        name: str,
        value: str,
        domains: list[str],
        *,
        header: str | None = None,
        format: str | None = None,
    ) -> dict[str, Any]:
        """A secret its sessions' code can use but never read: the egress proxy puts `value`
        into requests to `domains` only (for a placeholder, or as `header: format`)."""
        return await self._send(self._create_secret(name, value, domains, header, format))

    async def rotate_secret(self, name: str, value: str) -> dict[str, Any]:
        """A new value: the next request of every session that uses it carries it."""
        return await self._send(self._change_secret(name, {"value": value}))

    async def secrets(self) -> list[dict[str, Any]]:
        """The caller's secrets, never their values."""
        return await self._send(self._secrets())

    async def delete_secret(self, name: str) -> None:
        await self._send(self._delete_secret(name))

    async def create_volume(self, name: str, size: int | str | None = None) -> dict[str, Any]:
        """A new volume (a disk that outlives sessions); `size` in bytes or `2g` (default
        the gateway's `--volume-size`). Mount it with `session(volumes={name: "/mnt/x"})`."""
        return await self._send(self._create_volume(name, size))

    async def volumes(self) -> list[dict[str, Any]]:
        """Every volume (oldest first), with `used` bytes and `mounted_by`."""
        return await self._send(self._volumes())

    async def volume(self, reference: str) -> dict[str, Any]:
        """A volume, by id or name (`VolumeNotFoundError` if none)."""
        return await self._send(self._volume(reference))

    async def delete_volume(self, reference: str) -> None:
        """Delete a volume and its files (`VolumeInUseError` while a session mounts it)."""
        await self._send(self._delete_volume(reference))

    async def volume_entries(
        self, reference: str, path: str = "", depth: int = 1
    ) -> list[dict[str, Any]]:
        """What a folder of the volume holds, `depth` levels down."""
        return await self._send(self._volume_entries(reference, path, depth))

    async def write_volume_file(self, reference: str, path: str, data: bytes) -> dict[str, Any]:
        return await self._send(self._write_volume_file(reference, path, data))

    async def read_volume_file(self, reference: str, path: str) -> bytes:
        return await self._send(self._read_volume_file(reference, path))

    async def delete_volume_file(self, reference: str, path: str) -> None:
        """Delete a file, or a folder with all it holds."""
        await self._send(self._delete_volume_file(reference, path))

    async def languages(self) -> list[dict[str, Any]]:
        """The languages the gateway runs: name, display_name, version, ..."""
        return await self._send(self._languages())

    def session(
        self,
        session_id: str | None = None,
        *,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
        snapshot: str | None = None,
        volumes: dict[str, str] | None = None,
        secrets: list[str] | None = None,
    ) -> _SessionContext:
        """`async with client.session() as s:` creates (or attaches) and deletes it on exit.

        Awaited instead (`s = await client.session()`), it creates without deleting.
        """
        return _SessionContext(
            self, session_id, language, network, template, snapshot, volumes, secrets
        )

    async def sessions(self) -> list[dict[str, Any]]:
        return await self._send(self._sessions())

    def stream(
        self,
        code: str,
        *,
        timeout: float | None = None,
        files: dict[str, bytes] | None = None,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
    ) -> AsyncIterator[Event]:
        """Stateless: run `code` in a fresh kernel (of `template`, if given), yielding events
        as they arrive; `network`: the domains it may reach (within `--egress-allow`)."""
        body = execute_body(code, timeout, files, language, network, template)
        return self._stream(self.STATELESS_PATH, body)

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the cell's limit, enforced by the server
        files: dict[str, bytes] | None = None,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
        **callbacks: Any,
    ) -> Execution:
        """Stateless: run `code` in a fresh kernel and collect what it produced."""
        collect = Collector.of(callbacks)
        async for event in self.stream(
            code,
            timeout=timeout,
            files=files,
            language=language,
            network=network,
            template=template,
        ):
            collect(event)
        return collect.execution


class _SessionContext:
    def __init__(
        self,
        client: AsyncClient,
        session_id: str | None,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
        snapshot: str | None = None,
        volumes: dict[str, str] | None = None,
        secrets: list[str] | None = None,
    ) -> None:
        self._client = client
        self._volumes = volumes
        self._secrets = secrets
        self._session_id = session_id
        self._language = language
        self._network = network
        self._template = template
        self._snapshot = snapshot
        self._session: AsyncSession | None = None

    async def _open(self) -> AsyncSession:
        if self._session_id:
            return AsyncSession(self._client, self._session_id)
        return await self._client.create_session(
            self._language,
            self._network,
            self._template,
            self._snapshot,
            self._volumes,
            self._secrets,
        )

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._open()
        return self._session

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.__aexit__(kind, exc, tb)


class AsyncSession(BaseSession[AsyncClient], AsyncChatCalls):
    """A stateful session: variables persist from one `run` to the next."""

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.delete()
        except NotFoundError:
            pass

    async def info(self) -> dict[str, Any]:
        return await self.client._send(self._info())

    def stream(self, code: str, *, timeout: float | None = None) -> AsyncIterator[Event]:
        return self.client._stream(self._execute_path, execute_body(code, timeout))

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the cell's limit, enforced by the server
        **callbacks: Any,
    ) -> Execution:
        """Run `code`, calling back as events arrive (`on_stdout=print`, ...), and collect."""
        collect = Collector.of(callbacks)
        async for event in self.stream(code, timeout=timeout):
            collect(event)
        return collect.execution

    async def interrupt(self) -> bool:
        return await self.client._send(self._interrupt())

    async def restart(self) -> None:
        await self.client._send(self._restart())

    async def delete(self) -> None:
        await self.client._send(self._delete())

    async def hibernate(self) -> dict[str, Any]:
        """Save the session's variables to disk and stop its kernel (it resumes by itself on
        its next call); the session, whose `hibernation.lost` names what was not kept."""
        return await self.client._send(self._hibernate())

    async def resume(self) -> dict[str, Any] | None:
        """Bring a hibernated session back now: what resuming reported (`lost`: the names
        that did not come back, each with why), or None if it was not hibernated."""
        return await self.client._send(self._resume())

    async def snapshot(self, name: str | None = None) -> dict[str, Any]:
        """Keep a copy of the session as it is now (files, and a Python session's variables):
        the snapshot (`lost`: what it does not hold); sessions start from it with
        `client.session(snapshot=id)`. A snapshot of that `name` is replaced."""
        return await self.client._send(self._take_snapshot(name))

    async def fork(self, count: int = 1) -> list[AsyncSession | APIError]:
        """`count` copies of the session as it is now, each a new session (or the error
        that kept it from starting); this one runs on."""
        return [
            AsyncSession(self.client, made) if isinstance(made, str) else made
            for made in await self.client._send(self._fork(count))
        ]

    async def upload(self, path: str, data: bytes) -> dict[str, Any]:
        return await self.client._send(self._upload(path, data))

    async def download(self, path: str) -> bytes:
        return await self.client._send(self._download(path))

    async def files(self) -> list[dict[str, Any]]:
        return await self.client._send(self._files())

    async def delete_file(self, path: str) -> None:
        await self.client._send(self._delete_file(path))


class AsyncTemplates(TemplateCalls):
    """`client.templates`: images built from a base and steps, which sessions start on
    (`client.session(template="name")`). Docker backend only (elsewhere: 503)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(
        self,
        name: str,
        *,
        wait: bool = False,
        on_log: Callable[[BuildLogEntry], object] | None = None,
        **options: Unpack[BuildOptions],
    ) -> TemplateBuild:
        """A new template and its first build, started: the build (`building`). With
        `wait=True`, follow its log (`on_log` gets each line) to its end: the ready build,
        or `TemplateBuildError` with the reason and the step that failed."""
        body = await asyncio.to_thread(build_body, options)  # a folder context is read
        build = await self.client._send(self._create(name, body))
        return await self.wait(build, on_log=on_log) if wait else build

    async def build(
        self,
        name: str,
        *,
        wait: bool = False,
        on_log: Callable[[BuildLogEntry], object] | None = None,
        **options: Unpack[BuildOptions],
    ) -> TemplateBuild:
        """Build template `name` again (its tags move to the new build once it is ready);
        `wait` and `on_log` as for `create`."""
        body = await asyncio.to_thread(build_body, options)
        build = await self.client._send(self._rebuild(name, body))
        return await self.wait(build, on_log=on_log) if wait else build

    async def list(self) -> builtins.list[TemplateInfo]:
        return await self.client._send(self._list())

    async def get(self, name: str) -> TemplateInfo:
        """A template by name or id, with its builds."""
        return await self.client._send(self._get(name))

    async def get_build(self, name: str, build_id: str) -> TemplateBuild:
        return await self.client._send(self._get_build(name, build_id))

    async def delete(self, name: str) -> None:
        """Remove a template, its images and logs (`TemplateConflictError` while it builds
        or sessions run on it)."""
        await self.client._send(self._delete(name))

    def logs(self, name: str, build_id: str, offset: int = 0) -> AsyncBuildLogs:
        """A build's log from line `offset`, live: `async for` each line as it is written,
        until the build ends; then `.build` is the finished build."""
        return AsyncBuildLogs(self.client, LogReader(name, build_id, offset))

    async def wait(
        self,
        build: TemplateBuild | str,
        build_id: str | None = None,
        *,
        on_log: Callable[[BuildLogEntry], object] | None = None,
    ) -> TemplateBuild:
        """Follow a build's log to its end (`on_log` gets each line): the ready build, or
        `TemplateBuildError` if it failed. `build`: a build, or a template's name with the
        build's id (default: its newest build)."""
        if isinstance(build, TemplateBuild):
            name, build_id = build.template, build.id
        else:
            name = build
            if build_id is None:
                latest = (await self.get(name)).latest
                if latest is None:
                    raise ValueError(f"template {name!r} has no build to wait for")
                build_id = latest.id
        logs = self.logs(name, build_id)
        async for entry in logs:
            if on_log is not None:
                on_log(entry)
        return outcome(logs.build)


class AsyncBuildLogs:
    """A build's log, read as it is written: `async for` its `BuildLogEntry`s; once it
    ends, `build` is the build as it finished (`state` `ready` or `error`)."""

    def __init__(self, client: AsyncClient, reader: LogReader) -> None:
        self._reader = reader
        self._entries = client._follow_log(reader)

    def __aiter__(self) -> AsyncBuildLogs:
        return self

    async def __anext__(self) -> BuildLogEntry:
        return await anext(self._entries)

    @property
    def build(self) -> TemplateBuild | None:
        """The finished build, once the log was read to its end (else None)."""
        return self._reader.build

    @property
    def offset(self) -> int:
        """Lines read so far (from the offset asked for): where to read on from."""
        return self._reader.offset

    async def aclose(self) -> None:
        """Stop following (the connection is closed)."""
        await self._entries.aclose()
