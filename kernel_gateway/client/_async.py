"""The asynchronous client: only I/O; everything else is in `_base`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Sequence
from types import TracebackType
from typing import Any, TypeVar

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
from kernel_gateway.client.errors import (
    ConnectFailed,
    NotFoundError,
    ShuttingDownError,
    TransportError,
    from_response,
    map_exceptions,
)
from kernel_gateway.client.models import Event, Execution

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

    async def _stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[Event]:
        """POST the cell; if the stream breaks, resume it from the last event id seen."""
        reader, resumer, reconnect = EventReader(), self._resumer(), self._reconnect()
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

    async def health(self) -> dict[str, Any]:
        return await self._send(self._health())

    async def create_session(
        self, language: str | None = None, network: list[str] | None = None
    ) -> AsyncSession:
        """A new session; `language` one of `languages()` (default python); `network` the
        domains it may reach (within the gateway's `--egress-allow`; default none)."""
        return AsyncSession(self, await self._send(self._create_session(language, network)))

    async def languages(self) -> list[dict[str, Any]]:
        """The languages the gateway runs: name, display_name, version, ..."""
        return await self._send(self._languages())

    def session(
        self,
        session_id: str | None = None,
        *,
        language: str | None = None,
        network: list[str] | None = None,
    ) -> _SessionContext:
        """`async with client.session() as s:` creates (or attaches) and deletes it on exit.

        Awaited instead (`s = await client.session()`), it creates without deleting.
        """
        return _SessionContext(self, session_id, language, network)

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
    ) -> AsyncIterator[Event]:
        """Stateless: run `code` in a fresh kernel, yielding events as they arrive;
        `network`: the domains it may reach (within the gateway's `--egress-allow`)."""
        body = execute_body(code, timeout, files, language, network)
        return self._stream(self.STATELESS_PATH, body)

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the cell's limit, enforced by the server
        files: dict[str, bytes] | None = None,
        language: str | None = None,
        network: list[str] | None = None,
        **callbacks: Any,
    ) -> Execution:
        """Stateless: run `code` in a fresh kernel and collect what it produced."""
        collect = Collector.of(callbacks)
        async for event in self.stream(
            code, timeout=timeout, files=files, language=language, network=network
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
    ) -> None:
        self._client = client
        self._session_id = session_id
        self._language = language
        self._network = network
        self._session: AsyncSession | None = None

    async def _open(self) -> AsyncSession:
        if self._session_id:
            return AsyncSession(self._client, self._session_id)
        return await self._client.create_session(self._language, self._network)

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


class AsyncSession(BaseSession[AsyncClient]):
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

    async def upload(self, path: str, data: bytes) -> dict[str, Any]:
        return await self.client._send(self._upload(path, data))

    async def download(self, path: str) -> bytes:
        return await self.client._send(self._download(path))

    async def files(self) -> list[dict[str, Any]]:
        return await self.client._send(self._files())

    async def delete_file(self, path: str) -> None:
        await self.client._send(self._delete_file(path))
