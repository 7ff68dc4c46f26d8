"""What the sync and async clients share: everything but the I/O (as httpx's `BaseClient`).

Each API call is described once, as a `Call`: method, path, body and how to read the
answer. `Client` and `AsyncClient` only send calls and read event streams; request
bodies, paths, headers, error mapping, event decoding and collection all live here.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import httpx

from kernel_gateway.client._failover import Replicas
from kernel_gateway.client.errors import (
    APIError,
    ConnectFailed,
    ProtocolError,
    ShuttingDownError,
    StreamEnded,
    error_class,
    from_response,
)
from kernel_gateway.client.models import (
    Callbacks,
    ChatEnd,
    Done,
    Event,
    Execution,
    chat_event_from,
    event_from,
)
from kernel_gateway.client.sse import SSEDecoder

DEFAULT_URL = "http://127.0.0.1:8888"
STREAM_HEADERS = {"Accept": "text/event-stream"}
STREAM_READ_TIMEOUT = 35.0
CONNECT_SECONDS = 5.0

T = TypeVar("T")
ClientT = TypeVar("ClientT")


def read(response: httpx.Response) -> httpx.Response:
    """The response itself, or the `APIError` it stands for raised (its body must be read)."""
    if response.is_error:
        raise from_response(response)
    return response


def json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        document = read(response).json()
    except ValueError as exc:
        raise ProtocolError(f"the gateway answered with invalid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ProtocolError("the gateway answered with JSON that is not an object")
    return document


def _field(name: str) -> Callable[[httpx.Response], Any]:
    def parse(response: httpx.Response) -> Any:
        document = json_object(response)
        if name not in document:
            raise ProtocolError(f"the gateway's answer has no {name!r}")
        return document[name]

    return parse


def _forks(response: httpx.Response) -> list[str | APIError]:
    """A fork's answer: each copy's session id, or its error."""
    out: list[str | APIError] = []
    for fork in _field("forks")(response):
        if not isinstance(fork, dict):
            raise ProtocolError("the gateway's fork answer is not a list of objects")
        if isinstance(fork.get("session"), dict):
            out.append(str(fork["session"]["id"]))
            continue
        error = fork.get("error") or {}
        status = int(fork.get("status") or 500)
        kind, message = str(error.get("type", "http_error")), str(error.get("message", ""))
        out.append(error_class(status, kind)(status, kind, message))
    return out


def _nothing(response: httpx.Response) -> None:
    read(response)


def _content(response: httpx.Response) -> bytes:
    return read(response).content


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to turn its answer into a result (or raise its error)."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    content: bytes | None = None

    @property
    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.json is not None:
            options["json"] = self.json
        if self.content is not None:
            options["content"] = self.content
        return options


def network_policy(allow: list[str]) -> dict[str, list[str]] | str:
    """`network=[...]` as the API takes it: `{"allow": [...]}`, or "none" for `[]`."""
    return {"allow": list(allow)} if allow else "none"


def execute_body(
    code: str,
    timeout: float | None,
    files: dict[str, bytes] | None = None,
    language: str | None = None,
    network: list[str] | None = None,
    template: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code}
    if timeout is not None:
        body["timeout"] = timeout
    if language is not None:
        body["language"] = language
    if template is not None:
        body["template"] = template
    if network is not None:
        body["network"] = network_policy(network)
    if files:
        body["files"] = [
            {"path": path, "data": base64.b64encode(data).decode()} for path, data in files.items()
        ]
    return body


class EventReader:
    """One execution's event stream: bytes in, typed events out, `done` last. A chat turn's
    (`chat=True`): its own events and its cells', `end` last."""

    def __init__(self, *, chat: bool = False) -> None:
        self._decoder = SSEDecoder()
        self._chat = chat
        self.done = False
        self.last_event_id = ""
        """The id of the last whole event read: where a resumed stream starts after."""

    def reconnected(self) -> None:
        """A new connection: a partial event of the broken one is dropped."""
        self._decoder = SSEDecoder()

    def feed(self, chunk: bytes) -> list[Event]:
        events = []
        for sse in self._decoder.feed(chunk):
            if sse.id:
                self.last_event_id = sse.id
            try:
                data = sse.json()
            except ValueError as exc:
                raise ProtocolError(
                    f"the gateway sent an event that is not JSON: {sse.data[:200]!r}"
                ) from exc
            try:
                event: Any = (chat_event_from if self._chat else event_from)(sse.event, data)
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolError(f"malformed {sse.event!r} event: {exc!r}") from exc
            if event is not None:
                events.append(event)
                if isinstance(event, ChatEnd if self._chat else Done):
                    self.done = True
                    break
        return events

    def incomplete(self) -> StreamEnded:
        last = "an `end`" if self._chat else "a `done` event"
        return StreamEnded(f"the event stream ended without {last}")


class Reconnect:
    """How a call waits out a gateway restart (shared by both clients).

    A call whose connection failed sent nothing, and one answered `503
    shutting_down` was refused before the gateway did anything: both are sent
    again, after growing delays, until `seconds` have passed since the first try.
    """

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.attempt = 0

    def delay(self, error: Exception) -> float:
        """Seconds to wait before sending again, or `error` raised when out of time."""
        if not isinstance(error, ConnectFailed | ShuttingDownError):
            raise error
        delay: float = min(1.0, 0.05 * 2.0**self.attempt)
        if isinstance(error, ShuttingDownError) and error.retry_after:
            delay = min(float(error.retry_after), 1.0)
        self.attempt += 1
        if time.monotonic() + delay > self.deadline:
            raise error
        return delay


@dataclass
class Resumer:
    """When and how a broken execution stream is resumed (shared by both clients).

    Only a stream the gateway said can be resumed (its `Content-Location`) is, with
    `Last-Event-ID`; a POST is never sent again. The retry budget starts afresh
    whenever a connection brings new events.
    """

    retries: int
    location: str | None = None
    attempt: int = 0
    _progress_at: str = ""

    def seen(self, response: httpx.Response) -> None:
        self.location = response.headers.get("content-location") or self.location

    def next_request(
        self, reader: EventReader, error: Exception
    ) -> tuple[float, str, dict[str, str]]:
        """(delay, url, headers) of the resuming request, or `error` raised."""
        resumable = not isinstance(error, ProtocolError) or isinstance(error, StreamEnded)
        if not resumable or self.location is None:
            raise error
        if reader.last_event_id != self._progress_at:
            self.attempt, self._progress_at = 0, reader.last_event_id
        if self.attempt >= self.retries:
            raise error
        self.attempt += 1
        reader.reconnected()
        headers = dict(STREAM_HEADERS)
        if reader.last_event_id:
            headers["Last-Event-ID"] = reader.last_event_id
        return min(2.0, 0.1 * 2**self.attempt), self.location, headers


@dataclass
class Collector:
    """Collects events into an `Execution`, calling back as each arrives."""

    callbacks: Callbacks
    execution: Execution = field(default_factory=Execution)

    @classmethod
    def of(cls, callbacks: dict[str, Any]) -> Collector:
        return cls(Callbacks(**callbacks))

    def __call__(self, event: Event) -> None:
        self.execution.add(event)
        self.callbacks.dispatch(event)


def chat_body(message: str, files: Sequence[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"message": message}
    if files:
        body["files"] = list(files)
    return body


def _file_path(session_id: str, path: str) -> str:
    return f"/sessions/{quote(session_id, safe='')}/files/{quote(path.lstrip('/'))}"


def _volume_path(reference: str, path: str) -> str:
    return f"/volumes/{quote(reference, safe='')}/files/{quote(path.lstrip('/'))}"


class BaseClient:
    """Configuration and the calls of the gateway's top-level routes."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        token: str | None,
        timeout: float,
        resume_retries: int = 5,
        reconnect_seconds: float = 15.0,
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.base_url = urls[0] if urls else ""
        """The first base URL: requests are built against it."""
        self.replicas = Replicas(urls) if len(urls) > 1 or not urls else None
        """With several base URLs (a cluster's routers): which one answers now."""
        self._token = token
        self._timeout = timeout
        self._resume_retries = resume_retries
        """Reconnects in a row without progress before a broken stream is given up (0: never)."""
        self._reconnect_seconds = reconnect_seconds
        """How long a call is retried while the gateway cannot be reached or is restarting."""

    def _reconnect(self) -> Reconnect:
        return Reconnect(self._reconnect_seconds)

    def _resumer(self) -> Resumer:
        return Resumer(self._resume_retries)

    def _stream_timeout(self) -> httpx.Timeout:
        # The gateway pings every 10 s: silence for longer means the connection is dead.
        connect = self._timeout if self.replicas is None else CONNECT_SECONDS
        return httpx.Timeout(self._timeout, read=STREAM_READ_TIMEOUT, connect=connect)

    def _http_options(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "headers": {"Authorization": f"Bearer {self._token}"} if self._token else {},
            # Reads may wait long (a cell runs for minutes); keepalives arrive every 10 s.
            # With several base URLs, a dead one costs at most CONNECT_SECONDS per call.
            "timeout": httpx.Timeout(
                self._timeout,
                read=None,
                connect=self._timeout if self.replicas is None else CONNECT_SECONDS,
            ),
        }

    @staticmethod
    def _health() -> Call[dict[str, Any]]:
        return Call("GET", "/health", json_object)

    @staticmethod
    def _create_session(
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
        snapshot: str | None = None,
        volumes: dict[str, str] | None = None,
        secrets: list[str] | None = None,
    ) -> Call[str]:
        body: dict[str, Any] = {} if language is None else {"language": language}
        if volumes:
            body["volumes"] = volumes
        if secrets:
            body["secrets"] = list(secrets)
        if network is not None:
            body["network"] = network_policy(network)
        if template is not None:
            body["template"] = template
        if snapshot is not None:
            body["snapshot"] = snapshot
        return Call("POST", "/sessions", lambda r: str(_field("id")(r)), json=body)

    @staticmethod
    def _snapshots(
        session_id: str | None = None, name: str | None = None
    ) -> Call[list[dict[str, Any]]]:
        query = {k: v for k, v in (("session_id", session_id), ("name", name)) if v is not None}
        suffix = f"?{urlencode(query)}" if query else ""
        return Call("GET", f"/snapshots{suffix}", _field("snapshots"))

    @staticmethod
    def _snapshot(reference: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/snapshots/{quote(reference, safe='')}", json_object)

    @staticmethod
    def _delete_snapshot(reference: str) -> Call[None]:
        return Call("DELETE", f"/snapshots/{quote(reference, safe='')}", _nothing)

    @staticmethod
    def _create_volume(name: str, size: int | str | None) -> Call[dict[str, Any]]:
        body: dict[str, Any] = {"name": name} if size is None else {"name": name, "size": size}
        return Call("POST", "/volumes", json_object, json=body)

    @staticmethod
    def _create_secret(
        name: str, value: str, domains: list[str], header: str | None, format: str | None
    ) -> Call[dict[str, Any]]:
        body: dict[str, Any] = {"name": name, "value": value, "domains": list(domains)}
        if header is not None:
            body["header"] = header
        if format is not None:
            body["format"] = format
        return Call("POST", "/secrets", json_object, json=body)

    @staticmethod
    def _change_secret(name: str, changes: dict[str, Any]) -> Call[dict[str, Any]]:
        return Call("PUT", f"/secrets/{quote(name, safe='')}", json_object, json=changes)

    @staticmethod
    def _secrets() -> Call[list[dict[str, Any]]]:
        return Call("GET", "/secrets", _field("secrets"))

    @staticmethod
    def _delete_secret(name: str) -> Call[None]:
        return Call("DELETE", f"/secrets/{quote(name, safe='')}", _nothing)

    @staticmethod
    def _create_key(name: str, quotas: dict[str, float | None]) -> Call[dict[str, Any]]:
        return Call("POST", "/keys", json_object, json={"name": name, "quotas": quotas})

    @staticmethod
    def _keys(revoked: bool) -> Call[list[dict[str, Any]]]:
        return Call("GET", f"/keys?revoked={'true' if revoked else 'false'}", _field("keys"))

    @staticmethod
    def _key(key_id: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/keys/{quote(key_id, safe='')}", json_object)

    @staticmethod
    def _change_key(key_id: str, quotas: dict[str, float | None]) -> Call[dict[str, Any]]:
        path = f"/keys/{quote(key_id, safe='')}"
        return Call("PATCH", path, json_object, json={"quotas": quotas})

    @staticmethod
    def _rotate_key(key_id: str) -> Call[dict[str, Any]]:
        return Call("POST", f"/keys/{quote(key_id, safe='')}/rotate", json_object)

    @staticmethod
    def _revoke_key(key_id: str) -> Call[None]:
        return Call("DELETE", f"/keys/{quote(key_id, safe='')}", _nothing)

    @staticmethod
    def _volumes() -> Call[list[dict[str, Any]]]:
        return Call("GET", "/volumes", _field("volumes"))

    @staticmethod
    def _volume(reference: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/volumes/{quote(reference, safe='')}", json_object)

    @staticmethod
    def _delete_volume(reference: str) -> Call[None]:
        return Call("DELETE", f"/volumes/{quote(reference, safe='')}", _nothing)

    @staticmethod
    def _volume_entries(reference: str, path: str, depth: int) -> Call[list[dict[str, Any]]]:
        query = urlencode({"path": path, "depth": depth})
        return Call(
            "GET", f"/volumes/{quote(reference, safe='')}/entries?{query}", _field("entries")
        )

    @staticmethod
    def _write_volume_file(reference: str, path: str, data: bytes) -> Call[dict[str, Any]]:
        return Call("PUT", _volume_path(reference, path), json_object, content=data)

    @staticmethod
    def _read_volume_file(reference: str, path: str) -> Call[bytes]:
        return Call("GET", _volume_path(reference, path), _content)

    @staticmethod
    def _delete_volume_file(reference: str, path: str) -> Call[None]:
        return Call("DELETE", _volume_path(reference, path), _nothing)

    @staticmethod
    def _languages() -> Call[list[dict[str, Any]]]:
        return Call("GET", "/languages", _field("languages"))

    @staticmethod
    def _sessions() -> Call[list[dict[str, Any]]]:
        return Call("GET", "/sessions", _field("sessions"))

    STATELESS_PATH = "/execute"


class BaseSession(Generic[ClientT]):
    """A session's id, its client, and the calls of its routes."""

    def __init__(self, client: ClientT, session_id: str) -> None:
        self.client = client
        self.id = session_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    @property
    def _path(self) -> str:
        return f"/sessions/{quote(self.id, safe='')}"

    @property
    def _execute_path(self) -> str:
        return f"{self._path}/execute"

    @property
    def _chat_path(self) -> str:
        return f"{self._path}/chat"

    def _chat_history(self) -> Call[dict[str, Any]]:
        return Call("GET", self._chat_path, json_object)

    def _stop_chat(self) -> Call[bool]:
        return Call("POST", f"{self._chat_path}/stop", lambda r: bool(_field("stopped")(r)))

    def _forget_chat(self) -> Call[None]:
        return Call("DELETE", self._chat_path, _nothing)

    def _info(self) -> Call[dict[str, Any]]:
        return Call("GET", self._path, json_object)

    def _interrupt(self) -> Call[bool]:
        return Call("POST", f"{self._path}/interrupt", lambda r: bool(_field("interrupted")(r)))

    def _restart(self) -> Call[None]:
        return Call("POST", f"{self._path}/restart", _nothing)

    def _delete(self) -> Call[None]:
        return Call("DELETE", self._path, _nothing)

    def _hibernate(self) -> Call[dict[str, Any]]:
        return Call("POST", f"{self._path}/hibernate", json_object)

    def _resume(self) -> Call[dict[str, Any] | None]:
        return Call("POST", f"{self._path}/resume", _field("resumed"))

    def _take_snapshot(self, name: str | None) -> Call[dict[str, Any]]:
        body = {} if name is None else {"name": name}
        return Call("POST", f"{self._path}/snapshots", json_object, json=body)

    def _fork(self, count: int) -> Call[list[str | APIError]]:
        return Call("POST", f"{self._path}/fork", _forks, json={"count": count})

    def _upload(self, path: str, data: bytes) -> Call[dict[str, Any]]:
        return Call("PUT", _file_path(self.id, path), json_object, content=data)

    def _download(self, path: str) -> Call[bytes]:
        return Call("GET", _file_path(self.id, path), _content)

    def _files(self) -> Call[list[dict[str, Any]]]:
        return Call("GET", f"{self._path}/files", _field("files"))

    def _delete_file(self, path: str) -> Call[None]:
        return Call("DELETE", _file_path(self.id, path), _nothing)
