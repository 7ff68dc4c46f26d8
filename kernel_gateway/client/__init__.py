"""Python clients for the gateway: `Client` (synchronous) and `AsyncClient`.

    from kernel_gateway.client import Client

    with Client("http://127.0.0.1:8888", token=None) as client:
        with client.session() as session:          # deleted on exit
            session.run("x = 41")
            result = session.run("print(x + 1)")
            print(result.stdout)                     # "42\\n"
        print(client.run("1 + 1").text)             # stateless: a fresh kernel, "2"

Templates: `client.templates.create("name", steps=[Step.run(...)], wait=True)` builds an
image (a failed build raises `TemplateBuildError`), and `client.session(template="name")`
starts a session on it (see `kernel_gateway.client.templates`).

Streaming: `session.stream(code)` yields typed events as they arrive, and
`session.run(code, on_stdout=print)` calls back while still collecting.

The chat (a gateway with `--llm-url`): `reply = session.chat("plot sales.csv by region",
files=["sales.csv"], on_text=print)`: the model's words (`reply.text`), each cell it ran
(`reply.cells`: code and `Execution`), how the turn ended (`reply.status`).
Errors from the API raise `APIError` subclasses chosen by the API's error type
(the tree is in `kernel_gateway.client.errors`); a broken connection raises
`TransportError`.

Layout (as httpx's): `_base` holds everything the two clients share (calls, bodies,
error mapping, event decoding, collection); `_sync` and `_async` only do I/O;
`models` the typed events and `Execution`; `templates` the typed templates, their steps and
the calls of `/templates`; `sse` the one server-sent-events decoder.
This package needs only httpx: it installs without the server's libraries.
"""

from __future__ import annotations

from kernel_gateway.client._async import AsyncBuildLogs, AsyncClient, AsyncSession, AsyncTemplates
from kernel_gateway.client._base import DEFAULT_URL
from kernel_gateway.client._sync import BuildLogs, Client, Session, Templates
from kernel_gateway.client.errors import (
    APIError,
    AuthenticationError,
    BackendUnavailableError,
    BadGatewayError,
    BadRequestError,
    ChatNotConfiguredError,
    ClientError,
    ConflictError,
    ConnectFailed,
    ExecutionExpiredError,
    ExecutionNotFoundError,
    GoneError,
    HibernationFailedError,
    InvalidRequestError,
    KernelUnavailableError,
    KeyNotFoundError,
    MethodNotAllowedError,
    NetworkNotAllowedError,
    NodeLostError,
    NodeUnavailableError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    QuotaExceededError,
    RateLimitedError,
    RateLimitError,
    SecretNotFoundError,
    SecretsNotConfiguredError,
    ServerError,
    SessionBusyError,
    SessionClosedError,
    SessionFailedError,
    SessionLostError,
    SessionNotFoundError,
    ShuttingDownError,
    SnapshotNotFoundError,
    StreamEnded,
    TemplateBuildError,
    TemplateConflictError,
    TemplateNotFoundError,
    TooManySnapshotsError,
    TooManyTemplatesError,
    TooManyVolumesError,
    TransportError,
    TurnRunningError,
    UnavailableError,
    UnknownLanguageError,
    UnsupportedMediaTypeError,
    VolumeInUseError,
    VolumeNotFoundError,
)
from kernel_gateway.client.models import (
    Callbacks,
    ChatCell,
    ChatEnd,
    ChatEvent,
    ChatReply,
    ChatText,
    Clear,
    Display,
    Done,
    Error,
    Event,
    Execution,
    File,
    Lost,
    Result,
    Resumed,
    Stderr,
    Stdout,
    event_from,
)
from kernel_gateway.client.sse import ServerSentEvent, SSEDecoder
from kernel_gateway.client.templates import (
    BuildLogEntry,
    BuildOptions,
    Step,
    TemplateBuild,
    TemplateInfo,
)

__all__ = [
    "DEFAULT_URL",
    "APIError",
    "AsyncBuildLogs",
    "AsyncClient",
    "AsyncSession",
    "AsyncTemplates",
    "AuthenticationError",
    "BackendUnavailableError",
    "BadGatewayError",
    "BadRequestError",
    "BuildLogEntry",
    "BuildLogs",
    "BuildOptions",
    "Callbacks",
    "ChatCell",
    "ChatEnd",
    "ChatEvent",
    "ChatNotConfiguredError",
    "SecretNotFoundError",
    "SecretsNotConfiguredError",
    "ChatReply",
    "ChatText",
    "TurnRunningError",
    "Clear",
    "Client",
    "ClientError",
    "ConflictError",
    "ConnectFailed",
    "NodeLostError",
    "NodeUnavailableError",
    "SessionLostError",
    "ShuttingDownError",
    "StreamEnded",
    "GoneError",
    "ExecutionNotFoundError",
    "ExecutionExpiredError",
    "Display",
    "Done",
    "Lost",
    "Resumed",
    "Error",
    "Event",
    "Execution",
    "File",
    "InvalidRequestError",
    "HibernationFailedError",
    "KernelUnavailableError",
    "MethodNotAllowedError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProtocolError",
    "RateLimitError",
    "Result",
    "SSEDecoder",
    "ServerError",
    "ServerSentEvent",
    "Session",
    "SessionBusyError",
    "SessionClosedError",
    "SessionFailedError",
    "Step",
    "TemplateBuild",
    "TemplateBuildError",
    "TemplateInfo",
    "Templates",
    "TemplateConflictError",
    "SnapshotNotFoundError",
    "TemplateNotFoundError",
    "TooManySnapshotsError",
    "TooManyVolumesError",
    "VolumeInUseError",
    "VolumeNotFoundError",
    "KeyNotFoundError",
    "QuotaExceededError",
    "RateLimitedError",
    "TooManyTemplatesError",
    "SessionNotFoundError",
    "UnknownLanguageError",
    "NetworkNotAllowedError",
    "Stderr",
    "Stdout",
    "TransportError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
    "event_from",
]
