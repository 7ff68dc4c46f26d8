"""Python clients for the gateway: `Client` (synchronous) and `AsyncClient`.

    from kernel_gateway.client import Client

    with Client("http://127.0.0.1:8888", token=None) as client:
        with client.session() as session:          # deleted on exit
            session.run("x = 41")
            result = session.run("print(x + 1)")
            print(result.stdout)                     # "42\\n"
        print(client.run("1 + 1").text)             # stateless: a fresh kernel, "2"

Streaming: `session.stream(code)` yields typed events as they arrive, and
`session.run(code, on_stdout=print)` calls back while still collecting.
Errors from the API raise `APIError` subclasses carrying its type and message.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8888"

# -- errors ------------------------------------------------------------------------------------


class ClientError(Exception):
    """Base of everything this client raises."""


class TransportError(ClientError):
    """The gateway could not be reached, or the connection broke mid-stream."""


class APIError(ClientError):
    """The gateway answered with an error: `status_code`, `type` and `message` say which."""

    def __init__(self, status_code: int, error_type: str, message: str) -> None:
        super().__init__(f"{status_code} {error_type}: {message}")
        self.status_code = status_code
        self.type = error_type
        self.message = message


class BadRequestError(APIError):
    """400, 413, 415 or 422: the request itself was wrong."""


class AuthenticationError(APIError):
    """401: missing or wrong token."""


class NotFoundError(APIError):
    """404: no such session, file or route."""


class ConflictError(APIError):
    """409: the session is busy or was deleted."""


class RateLimitError(APIError):
    """429: too many sessions or stateless executions; retry after `retry_after` seconds."""

    retry_after: float | None = None


class UnavailableError(APIError):
    """503: no kernel could be started in time."""

    retry_after: float | None = None


_ERRORS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: BadRequestError,
    415: BadRequestError,
    422: BadRequestError,
    429: RateLimitError,
    503: UnavailableError,
}


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "http_error", response.text[:500] or response.reason_phrase
    exc = _ERRORS.get(response.status_code, APIError)(response.status_code, kind, message)
    retry_after = response.headers.get("retry-after")
    if retry_after is not None and isinstance(exc, RateLimitError | UnavailableError):
        try:
            exc.retry_after = float(retry_after)
        except ValueError:
            pass
    raise exc


# -- events ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stdout:
    text: str


@dataclass(frozen=True)
class Stderr:
    text: str


@dataclass(frozen=True)
class Display:
    data: dict[str, Any]
    metadata: dict[str, Any]
    display_id: str | None
    update: bool

    @property
    def png(self) -> bytes | None:
        value = self.data.get("image/png")
        return base64.b64decode(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class Result:
    data: dict[str, Any]
    metadata: dict[str, Any]
    execution_count: int | None

    @property
    def text(self) -> str:
        return str(self.data.get("text/plain", ""))


@dataclass(frozen=True)
class Clear:
    wait: bool


@dataclass(frozen=True)
class Error:
    ename: str
    evalue: str
    traceback: list[str]


@dataclass(frozen=True)
class File:
    path: str
    size: int
    mime: str
    url: str | None
    data: bytes | None = None


@dataclass(frozen=True)
class Done:
    status: str
    execution_count: int | None
    duration_ms: float
    restarted: bool
    reason: str | None = None
    truncated: bool = False


Event = Stdout | Stderr | Display | Result | Clear | Error | File | Done


def event_from(name: str, data: dict[str, Any]) -> Event | None:
    """One SSE event as a typed object; None for event names this client does not know."""
    if name == "stdout":
        return Stdout(data["text"])
    if name == "stderr":
        return Stderr(data["text"])
    if name == "display":
        return Display(data["data"], data["metadata"], data.get("display_id"), data["update"])
    if name == "result":
        return Result(data["data"], data["metadata"], data.get("execution_count"))
    if name == "clear":
        return Clear(bool(data["wait"]))
    if name == "error":
        return Error(data["ename"], data["evalue"], list(data["traceback"]))
    if name == "file":
        raw = data.get("data")
        return File(
            data["path"],
            data["size"],
            data["mime"],
            data.get("url"),
            base64.b64decode(raw) if raw else None,
        )
    if name == "done":
        return Done(
            data["status"],
            data.get("execution_count"),
            data["duration_ms"],
            data["restarted"],
            data.get("reason"),
            bool(data.get("truncated", False)),
        )
    return None


class SSEDecoder:
    """Incremental server-sent-events parser (WHATWG rules, minus reconnection).

    Feed it lines without their line terminator; it returns a (name, data)
    pair when a blank line ends an event. Comments (`:`) are skipped and
    several `data:` lines are joined with newlines.
    """

    def __init__(self) -> None:
        self._name = ""
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        if line == "":
            if not self._data:
                self._name = ""
                return None
            event = (self._name or "message", "\n".join(self._data))
            self._name, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        field_name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field_name == "event":
            self._name = value
        elif field_name == "data":
            self._data.append(value)
        return None


# -- executions --------------------------------------------------------------------------------


@dataclass
class Callbacks:
    on_stdout: Callable[[str], object] | None = None
    on_stderr: Callable[[str], object] | None = None
    on_display: Callable[[Display], object] | None = None
    on_result: Callable[[Result], object] | None = None
    on_error: Callable[[Error], object] | None = None
    on_file: Callable[[File], object] | None = None
    on_event: Callable[[Event], object] | None = None

    def dispatch(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
        if isinstance(event, Stdout) and self.on_stdout is not None:
            self.on_stdout(event.text)
        elif isinstance(event, Stderr) and self.on_stderr is not None:
            self.on_stderr(event.text)
        elif isinstance(event, Display) and self.on_display is not None:
            self.on_display(event)
        elif isinstance(event, Result) and self.on_result is not None:
            self.on_result(event)
        elif isinstance(event, Error) and self.on_error is not None:
            self.on_error(event)
        elif isinstance(event, File) and self.on_file is not None:
            self.on_file(event)


@dataclass
class Execution:
    """Everything one cell produced, collected."""

    events: list[Event] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    results: list[Result] = field(default_factory=list)
    displays: list[Display] = field(default_factory=list)
    files: list[File] = field(default_factory=list)
    error: Error | None = None
    done: Done | None = None

    @property
    def status(self) -> str:
        return self.done.status if self.done else "incomplete"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def text(self) -> str:
        """The cell's value as text (its last result), or "" if it had none."""
        return self.results[-1].text if self.results else ""

    def add(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, Stdout):
            self.stdout += event.text
        elif isinstance(event, Stderr):
            self.stderr += event.text
        elif isinstance(event, Result):
            self.results.append(event)
        elif isinstance(event, Display):
            self.displays.append(event)
        elif isinstance(event, File):
            self.files.append(event)
        elif isinstance(event, Error):
            self.error = event
        elif isinstance(event, Done):
            self.done = event


def _execute_body(
    code: str, timeout: float | None, files: dict[str, bytes] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code}
    if timeout is not None:
        body["timeout"] = timeout
    if files:
        body["files"] = [
            {"path": path, "data": base64.b64encode(data).decode()} for path, data in files.items()
        ]
    return body


def _event_of_line(decoder: SSEDecoder, line: str) -> Event | None:
    """Feed one line; the typed event it completes, if any."""
    parsed = decoder.feed(line)
    if parsed is None:
        return None
    name, data = parsed
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise TransportError(f"the gateway sent an event that is not JSON: {data[:200]!r}") from exc
    return event_from(name, payload)


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _file_path(session_id: str, path: str) -> str:
    return f"/sessions/{session_id}/files/{quote(path.lstrip('/'))}"


def _timeout(seconds: float) -> httpx.Timeout:
    # Reads may wait long (a cell runs for minutes); keepalives arrive every 10 s.
    return httpx.Timeout(seconds, read=None)


# -- synchronous -------------------------------------------------------------------------------


class Client:
    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url,
            headers=_headers(token),
            timeout=_timeout(timeout),
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise TransportError(str(exc)) from exc
        _raise_for(response)
        return response

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/health").json()
        return result

    def create_session(self) -> Session:
        return Session(self, self.request("POST", "/sessions").json()["id"])

    def session(self, session_id: str | None = None) -> Session:
        """A session to use as a context manager: created now (or attached), deleted on exit."""
        return Session(self, session_id) if session_id else self.create_session()

    def sessions(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/sessions").json()["sessions"]
        return result

    def stream(
        self, code: str, *, timeout: float | None = None, files: dict[str, bytes] | None = None
    ) -> Iterator[Event]:
        """Stateless: run `code` in a fresh kernel, yielding events as they arrive."""
        return self._stream("/execute", _execute_body(code, timeout, files))

    def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        files: dict[str, bytes] | None = None,
        **callbacks: Any,
    ) -> Execution:
        """Stateless: run `code` in a fresh kernel and collect what it produced."""
        return _collect(self.stream(code, timeout=timeout, files=files), Callbacks(**callbacks))

    def _stream(self, path: str, body: dict[str, Any]) -> Iterator[Event]:
        decoder = SSEDecoder()
        try:
            with self._http.stream(
                "POST", path, json=body, headers={"Accept": "text/event-stream"}
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                for line in response.iter_lines():
                    event = _event_of_line(decoder, line)
                    if event is not None:
                        yield event
                        if isinstance(event, Done):
                            return
        except httpx.TransportError as exc:
            raise TransportError(f"the event stream broke: {exc}") from exc
        raise TransportError("the event stream ended without a `done` event")


def _collect(events: Iterable[Event], callbacks: Callbacks) -> Execution:
    execution = Execution()
    for event in events:
        execution.add(event)
        callbacks.dispatch(event)
    return execution


class Session:
    """A stateful session: variables persist from one `run` to the next."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.id = session_id

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.delete()
        except NotFoundError:
            pass

    def info(self) -> dict[str, Any]:
        result: dict[str, Any] = self.client.request("GET", f"/sessions/{self.id}").json()
        return result

    def stream(self, code: str, *, timeout: float | None = None) -> Iterator[Event]:
        return self.client._stream(f"/sessions/{self.id}/execute", _execute_body(code, timeout))

    def run(self, code: str, *, timeout: float | None = None, **callbacks: Any) -> Execution:
        """Run `code`, calling back as events arrive (`on_stdout=print`, ...), and collect."""
        return _collect(self.stream(code, timeout=timeout), Callbacks(**callbacks))

    def interrupt(self) -> bool:
        return bool(
            self.client.request("POST", f"/sessions/{self.id}/interrupt").json()["interrupted"]
        )

    def restart(self) -> None:
        self.client.request("POST", f"/sessions/{self.id}/restart")

    def delete(self) -> None:
        self.client.request("DELETE", f"/sessions/{self.id}")

    def upload(self, path: str, data: bytes) -> dict[str, Any]:
        result: dict[str, Any] = self.client.request(
            "PUT", _file_path(self.id, path), content=data
        ).json()
        return result

    def download(self, path: str) -> bytes:
        return self.client.request("GET", _file_path(self.id, path)).content

    def files(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.client.request(
            "GET", f"/sessions/{self.id}/files"
        ).json()["files"]
        return result

    def delete_file(self, path: str) -> None:
        self.client.request("DELETE", _file_path(self.id, path))


# -- asynchronous ------------------------------------------------------------------------------


class AsyncClient:
    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=_headers(token),
            timeout=_timeout(timeout),
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise TransportError(str(exc)) from exc
        _raise_for(response)
        return response

    async def health(self) -> dict[str, Any]:
        result: dict[str, Any] = (await self.request("GET", "/health")).json()
        return result

    async def create_session(self) -> AsyncSession:
        return AsyncSession(self, (await self.request("POST", "/sessions")).json()["id"])

    def session(self) -> _AsyncSessionContext:
        """`async with client.session() as s:` creates a session and deletes it on exit."""
        return _AsyncSessionContext(self)

    def stream(
        self, code: str, *, timeout: float | None = None, files: dict[str, bytes] | None = None
    ) -> AsyncIterator[Event]:
        return self._stream("/execute", _execute_body(code, timeout, files))

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the cell's limit, enforced by the server
        files: dict[str, bytes] | None = None,
        **callbacks: Any,
    ) -> Execution:
        return await _acollect(
            self.stream(code, timeout=timeout, files=files), Callbacks(**callbacks)
        )

    async def _stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[Event]:
        decoder = SSEDecoder()
        try:
            async with self._http.stream(
                "POST", path, json=body, headers={"Accept": "text/event-stream"}
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response)
                async for line in response.aiter_lines():
                    event = _event_of_line(decoder, line)
                    if event is not None:
                        yield event
                        if isinstance(event, Done):
                            return
        except httpx.TransportError as exc:
            raise TransportError(f"the event stream broke: {exc}") from exc
        raise TransportError("the event stream ended without a `done` event")


async def _acollect(events: AsyncIterator[Event], callbacks: Callbacks) -> Execution:
    execution = Execution()
    async for event in events:
        execution.add(event)
        callbacks.dispatch(event)
    return execution


class _AsyncSessionContext:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._session: AsyncSession | None = None

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._client.create_session()
        return self._session

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            try:
                await self._session.delete()
            except NotFoundError:
                pass


class AsyncSession:
    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self.client = client
        self.id = session_id

    async def info(self) -> dict[str, Any]:
        result: dict[str, Any] = (await self.client.request("GET", f"/sessions/{self.id}")).json()
        return result

    def stream(self, code: str, *, timeout: float | None = None) -> AsyncIterator[Event]:
        return self.client._stream(f"/sessions/{self.id}/execute", _execute_body(code, timeout))

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the cell's limit, enforced by the server
        **callbacks: Any,
    ) -> Execution:
        return await _acollect(self.stream(code, timeout=timeout), Callbacks(**callbacks))

    async def interrupt(self) -> bool:
        response = await self.client.request("POST", f"/sessions/{self.id}/interrupt")
        return bool(response.json()["interrupted"])

    async def restart(self) -> None:
        await self.client.request("POST", f"/sessions/{self.id}/restart")

    async def delete(self) -> None:
        await self.client.request("DELETE", f"/sessions/{self.id}")

    async def upload(self, path: str, data: bytes) -> dict[str, Any]:
        response = await self.client.request("PUT", _file_path(self.id, path), content=data)
        result: dict[str, Any] = response.json()
        return result

    async def download(self, path: str) -> bytes:
        return (await self.client.request("GET", _file_path(self.id, path))).content

    async def files(self) -> list[dict[str, Any]]:
        response = await self.client.request("GET", f"/sessions/{self.id}/files")
        result: list[dict[str, Any]] = response.json()["files"]
        return result

    async def delete_file(self, path: str) -> None:
        await self.client.request("DELETE", _file_path(self.id, path))
