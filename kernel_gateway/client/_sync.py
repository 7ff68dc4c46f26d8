"""The synchronous client: only I/O; everything else is in `_base`."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Generator, Iterator, Sequence
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
from kernel_gateway.client._failover import FailoverTransport
from kernel_gateway.client.chat import ChatCalls
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


class Client(BaseClient):
    def __init__(
        self,
        base_url: str | Sequence[str] = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
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
            transport = FailoverTransport(self.replicas, transport or httpx.HTTPTransport())
        self._http = httpx.Client(transport=transport, **self._http_options())
        self.templates = Templates(self)
        """`/templates`: build images from a base and steps, for sessions to start on."""

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Any request; an error answer raises its `APIError` (see `_send` for retries)."""
        reconnect = self._reconnect()
        while True:
            try:
                with map_exceptions():
                    return read(self._http.request(method, path, **kwargs))
            except (ConnectFailed, ShuttingDownError) as exc:
                time.sleep(reconnect.delay(exc))

    def _send(self, call: Call[T]) -> T:
        """Send a call; while the gateway restarts it is sent again (`Reconnect`)."""
        reconnect = self._reconnect()
        while True:
            try:
                with map_exceptions():
                    response = self._http.request(call.method, call.path, **call.options)
                return call.parse(response)
            except (ConnectFailed, ShuttingDownError) as exc:
                time.sleep(reconnect.delay(exc))

    def _stream(self, path: str, body: dict[str, Any], *, chat: bool = False) -> Iterator[Any]:
        """POST the cell (or the chat's message); if the stream breaks, resume it from the
        last event id seen."""
        reader, resumer, reconnect = EventReader(chat=chat), self._resumer(), self._reconnect()
        request: dict[str, Any] = {"method": "POST", "url": path, "json": body}
        request["headers"] = STREAM_HEADERS
        while True:
            try:
                with map_exceptions("the event stream broke"):
                    with self._http.stream(**request, timeout=self._stream_timeout()) as response:
                        if response.is_error:
                            response.read()
                            raise from_response(response)
                        resumer.seen(response)
                        for chunk in response.iter_bytes():
                            yield from reader.feed(chunk)
                            if reader.done:
                                return
                raise reader.incomplete()
            except (ConnectFailed, ShuttingDownError) as exc:
                if resumer.location is None:  # the POST itself never reached a running gateway
                    time.sleep(reconnect.delay(exc))
                    continue
                delay, url, headers = resumer.next_request(reader, exc)
            except TransportError as exc:
                delay, url, headers = resumer.next_request(reader, exc)
            time.sleep(delay)
            request = {"method": "GET", "url": url, "headers": headers}

    def _follow_log(self, reader: LogReader) -> Generator[BuildLogEntry, None, None]:
        """A build's log as it is written, to its `end`; a broken stream is asked for again
        from the line it broke at (a GET: nothing runs twice)."""
        while True:
            try:
                with map_exceptions("the build's log broke"):
                    with self._http.stream(
                        "GET", reader.url, headers=STREAM_HEADERS, timeout=self._stream_timeout()
                    ) as response:
                        if response.is_error:
                            response.read()
                            raise from_response(response)
                        for chunk in response.iter_bytes():
                            yield from reader.feed(chunk)
                            if reader.done:
                                return
                raise reader.incomplete()
            except (TransportError, ShuttingDownError) as exc:
                time.sleep(reader.retry(exc, self._resume_retries))

    def health(self) -> dict[str, Any]:
        return self._send(self._health())

    def create_session(
        self,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
        snapshot: str | None = None,
        volumes: dict[str, str] | None = None,
        secrets: list[str] | None = None,
    ) -> Session:
        """A new session; `language` one of `languages()` (default python, or the template's);
        `network` the domains it may reach (within the gateway's `--egress-allow`; default
        none); `template` one of `templates.list()` (`name`, `name:tag` or its id);
        `snapshot` a snapshot's id or name: its files, variables, language and template;
        `volumes` volumes to mount, `{"name or id": "/mnt/data"}`; `secrets` secrets its
        code may use (`create_secret`; each within `network`)."""
        call = self._create_session(language, network, template, snapshot, volumes, secrets)
        return Session(self, self._send(call))

    def snapshots(
        self, session_id: str | None = None, name: str | None = None
    ) -> list[dict[str, Any]]:
        """The snapshots kept (oldest first), those of one session or name if asked."""
        return self._send(self._snapshots(session_id, name))

    def snapshot(self, reference: str) -> dict[str, Any]:
        """A snapshot, by id or name (`SnapshotNotFoundError` if none)."""
        return self._send(self._snapshot(reference))

    def delete_snapshot(self, reference: str) -> None:
        self._send(self._delete_snapshot(reference))

    # -- API keys (the admin token's; a key sees and rotates itself) ------------------------

    def create_key(self, name: str, **quotas: float | None) -> dict[str, Any]:
        """A new API key with its quotas (`max_sessions`, `max_stateless`,
        `requests_per_minute`, `cpus` and `memory_bytes` per kernel); its `secret` is in this
        answer only."""
        return self._send(self._create_key(name, quotas))

    def keys(self, revoked: bool = False) -> list[dict[str, Any]]:
        """The live keys, oldest first (and revoked ones when asked)."""
        return self._send(self._keys(revoked))

    def key(self, key_id: str) -> dict[str, Any]:
        return self._send(self._key(key_id))

    def change_key(self, key_id: str, **quotas: float | None) -> dict[str, Any]:
        """Replace a key's quotas (those not given: none of its own)."""
        return self._send(self._change_key(key_id, quotas))

    def rotate_key(self, key_id: str) -> dict[str, Any]:
        """A new secret for the key (in the answer); the old one stops working at once."""
        return self._send(self._rotate_key(key_id))

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key: its requests are refused and its open streams end at once."""
        self._send(self._revoke_key(key_id))

    def create_secret(
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
        return self._send(self._create_secret(name, value, domains, header, format))

    def rotate_secret(self, name: str, value: str) -> dict[str, Any]:
        """A new value: the next request of every session that uses it carries it."""
        return self._send(self._change_secret(name, {"value": value}))

    def secrets(self) -> list[dict[str, Any]]:
        """The caller's secrets, never their values."""
        return self._send(self._secrets())

    def delete_secret(self, name: str) -> None:
        self._send(self._delete_secret(name))

    def create_volume(self, name: str, size: int | str | None = None) -> dict[str, Any]:
        """A new volume (a disk that outlives sessions); `size` in bytes or `2g` (default
        the gateway's `--volume-size`). Mount it with `session(volumes={name: "/mnt/x"})`."""
        return self._send(self._create_volume(name, size))

    def volumes(self) -> list[dict[str, Any]]:
        """Every volume (oldest first), with `used` bytes and `mounted_by`."""
        return self._send(self._volumes())

    def volume(self, reference: str) -> dict[str, Any]:
        """A volume, by id or name (`VolumeNotFoundError` if none)."""
        return self._send(self._volume(reference))

    def delete_volume(self, reference: str) -> None:
        """Delete a volume and its files (`VolumeInUseError` while a session mounts it)."""
        self._send(self._delete_volume(reference))

    def volume_entries(
        self, reference: str, path: str = "", depth: int = 1
    ) -> list[dict[str, Any]]:
        """What a folder of the volume holds, `depth` levels down."""
        return self._send(self._volume_entries(reference, path, depth))

    def write_volume_file(self, reference: str, path: str, data: bytes) -> dict[str, Any]:
        return self._send(self._write_volume_file(reference, path, data))

    def read_volume_file(self, reference: str, path: str) -> bytes:
        return self._send(self._read_volume_file(reference, path))

    def delete_volume_file(self, reference: str, path: str) -> None:
        """Delete a file, or a folder with all it holds."""
        self._send(self._delete_volume_file(reference, path))

    def languages(self) -> list[dict[str, Any]]:
        """The languages the gateway runs: name, display_name, version, ..."""
        return self._send(self._languages())

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
    ) -> Session:
        """A session to use as a context manager: created now (or attached), deleted on exit."""
        if session_id:
            return Session(self, session_id)
        return self.create_session(language, network, template, snapshot, volumes, secrets)

    def sessions(self) -> list[dict[str, Any]]:
        return self._send(self._sessions())

    def stream(
        self,
        code: str,
        *,
        timeout: float | None = None,
        files: dict[str, bytes] | None = None,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
    ) -> Iterator[Event]:
        """Stateless: run `code` in a fresh kernel (of `template`, if given), yielding events
        as they arrive; `network`: the domains it may reach (within `--egress-allow`)."""
        body = execute_body(code, timeout, files, language, network, template)
        return self._stream(self.STATELESS_PATH, body)

    def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        files: dict[str, bytes] | None = None,
        language: str | None = None,
        network: list[str] | None = None,
        template: str | None = None,
        **callbacks: Any,
    ) -> Execution:
        """Stateless: run `code` in a fresh kernel and collect what it produced."""
        collect = Collector.of(callbacks)
        for event in self.stream(
            code,
            timeout=timeout,
            files=files,
            language=language,
            network=network,
            template=template,
        ):
            collect(event)
        return collect.execution


class Session(BaseSession[Client], ChatCalls):
    """A stateful session: variables persist from one `run` to the next."""

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
        return self.client._send(self._info())

    def stream(self, code: str, *, timeout: float | None = None) -> Iterator[Event]:
        return self.client._stream(self._execute_path, execute_body(code, timeout))

    def run(self, code: str, *, timeout: float | None = None, **callbacks: Any) -> Execution:
        """Run `code`, calling back as events arrive (`on_stdout=print`, ...), and collect."""
        collect = Collector.of(callbacks)
        for event in self.stream(code, timeout=timeout):
            collect(event)
        return collect.execution

    def interrupt(self) -> bool:
        return self.client._send(self._interrupt())

    def restart(self) -> None:
        self.client._send(self._restart())

    def delete(self) -> None:
        self.client._send(self._delete())

    def hibernate(self) -> dict[str, Any]:
        """Save the session's variables to disk and stop its kernel (it resumes by itself on
        its next call); the session, whose `hibernation.lost` names what was not kept."""
        return self.client._send(self._hibernate())

    def resume(self) -> dict[str, Any] | None:
        """Bring a hibernated session back now: what resuming reported (`lost`: the names
        that did not come back, each with why), or None if it was not hibernated."""
        return self.client._send(self._resume())

    def snapshot(self, name: str | None = None) -> dict[str, Any]:
        """Keep a copy of the session as it is now (files, and a Python session's variables):
        the snapshot (`lost`: what it does not hold); sessions start from it with
        `client.session(snapshot=id)`. A snapshot of that `name` is replaced."""
        return self.client._send(self._take_snapshot(name))

    def fork(self, count: int = 1) -> list[Session | APIError]:
        """`count` copies of the session as it is now, each a new session (or the error
        that kept it from starting); this one runs on."""
        return [
            Session(self.client, made) if isinstance(made, str) else made
            for made in self.client._send(self._fork(count))
        ]

    def upload(self, path: str, data: bytes) -> dict[str, Any]:
        return self.client._send(self._upload(path, data))

    def download(self, path: str) -> bytes:
        return self.client._send(self._download(path))

    def files(self) -> list[dict[str, Any]]:
        return self.client._send(self._files())

    def delete_file(self, path: str) -> None:
        self.client._send(self._delete_file(path))


class Templates(TemplateCalls):
    """`client.templates`: images built from a base and steps, which sessions start on
    (`client.session(template="name")`). Docker backend only (elsewhere: 503)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def create(
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
        build = self.client._send(self._create(name, build_body(options)))
        return self.wait(build, on_log=on_log) if wait else build

    def build(
        self,
        name: str,
        *,
        wait: bool = False,
        on_log: Callable[[BuildLogEntry], object] | None = None,
        **options: Unpack[BuildOptions],
    ) -> TemplateBuild:
        """Build template `name` again (its tags move to the new build once it is ready);
        `wait` and `on_log` as for `create`."""
        build = self.client._send(self._rebuild(name, build_body(options)))
        return self.wait(build, on_log=on_log) if wait else build

    def list(self) -> builtins.list[TemplateInfo]:
        return self.client._send(self._list())

    def get(self, name: str) -> TemplateInfo:
        """A template by name or id, with its builds."""
        return self.client._send(self._get(name))

    def get_build(self, name: str, build_id: str) -> TemplateBuild:
        return self.client._send(self._get_build(name, build_id))

    def delete(self, name: str) -> None:
        """Remove a template, its images and logs (`TemplateConflictError` while it builds
        or sessions run on it)."""
        self.client._send(self._delete(name))

    def logs(self, name: str, build_id: str, offset: int = 0) -> BuildLogs:
        """A build's log from line `offset`, live: iterate it for each line as it is written,
        until the build ends; then `.build` is the finished build."""
        return BuildLogs(self.client, LogReader(name, build_id, offset))

    def wait(
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
                latest = self.get(name).latest
                if latest is None:
                    raise ValueError(f"template {name!r} has no build to wait for")
                build_id = latest.id
        logs = self.logs(name, build_id)
        for entry in logs:
            if on_log is not None:
                on_log(entry)
        return outcome(logs.build)


class BuildLogs:
    """A build's log, read as it is written: iterate it for `BuildLogEntry`s; once it ends,
    `build` is the build as it finished (`state` `ready` or `error`)."""

    def __init__(self, client: Client, reader: LogReader) -> None:
        self._reader = reader
        self._entries = client._follow_log(reader)

    def __iter__(self) -> BuildLogs:
        return self

    def __next__(self) -> BuildLogEntry:
        return next(self._entries)

    @property
    def build(self) -> TemplateBuild | None:
        """The finished build, once the log was read to its end (else None)."""
        return self._reader.build

    @property
    def offset(self) -> int:
        """Lines read so far (from the offset asked for): where to read on from."""
        return self._reader.offset

    def close(self) -> None:
        """Stop following (the connection is closed)."""
        self._entries.close()
