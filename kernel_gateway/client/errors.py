"""Everything the client raises, chosen by the API's error `type`, then by status.

    ClientError
    ├── TemplateBuildError              a template's build failed (`reason`, `failed_step`)
    ├── TransportError                  the gateway could not be reached, or the connection broke
    │   ├── ConnectFailed               no connection (refused, unreachable): nothing was sent
    │   └── ProtocolError               the answer broke the protocol (not JSON)
    │       └── StreamEnded             an event stream ended without its `done` (resumed first)
    └── APIError                        the gateway answered with an error document
        ├── BadRequestError             400 bad_request (and any other 400)
        │   ├── UnknownLanguageError    400 unknown_language (not one of the gateway's languages)
        │   ├── PayloadTooLargeError    413 payload_too_large
        │   ├── UnsupportedMediaTypeError  415 unsupported_media_type
        │   └── InvalidRequestError     422 invalid_request
        ├── AuthenticationError         401 unauthorized
        ├── PermissionDeniedError       403 forbidden
        │   └── NetworkNotAllowedError  403 network_not_allowed (beyond --egress-allow)
        ├── NotFoundError               404 not_found
        │   ├── SessionNotFoundError    404 session_not_found
        │   ├── ExecutionNotFoundError  404 execution_not_found
        │   ├── TemplateNotFoundError   404 template_not_found
        │   ├── SnapshotNotFoundError   404 snapshot_not_found
        │   ├── VolumeNotFoundError     404 volume_not_found
        │   ├── SecretNotFoundError     404 secret_not_found
        │   └── KeyNotFoundError        404 key_not_found
        ├── MethodNotAllowedError       405 method_not_allowed
        ├── GoneError                   410 gone
        │   ├── ExecutionExpiredError   410 execution_expired (past the session's retention)
        │   ├── SessionLostError        410 session_lost (did not survive a gateway restart)
        │   └── NodeLostError           410 node_lost (a cluster router: its node is gone)
        ├── ConflictError               409 conflict
        │   ├── SessionBusyError        409 session_busy     (too many queued executions)
        │   ├── SessionClosedError      409 session_closed   (deleted while the request waited)
        │   ├── SessionFailedError      409 session_failed   (its kernel kept dying: gave up)
        │   ├── TemplateConflictError   409 template_conflict (name taken, building, in use)
        │   ├── TurnRunningError        409 turn_running     (the session's chat is answering)
        │   └── VolumeInUseError        409 volume_in_use    (mounted by a session)
        ├── RateLimitError              429 too_many_sessions (retry_after)
        │   ├── TooManyTemplatesError   429 too_many_templates (--max-templates)
        │   ├── TooManySnapshotsError   429 too_many_snapshots (--max-snapshots)
        │   ├── TooManyVolumesError     429 too_many_volumes (--max-volumes)
        │   └── QuotaExceededError      429 quota_exceeded (the API key's quota)
        │       └── RateLimitedError    429 rate_limited (the key's requests a minute)
        └── ServerError                 500 internal_error (and any other 5xx)
            ├── ChatNotConfiguredError  501 chat_not_configured (the gateway has no model)
            ├── SecretsNotConfiguredError 501 secrets_not_configured (no --secrets-key-file)
            ├── BadGatewayError         502 bad_gateway (a cluster router: a node's answer broke)
            └── UnavailableError        503 (retry_after)
                ├── KernelUnavailableError   503 kernel_unavailable
                │   └── HibernationFailedError 503 hibernation_failed (not saved: runs on)
                ├── ShuttingDownError        503 shutting_down (the gateway is restarting)
                │   └── NodeUnavailableError 503 node_unavailable (a cluster node restarts)
                └── BackendUnavailableError  503 backend_unavailable

The gateway's error document is `{"error": {"type", "message"}}` (`kernel_gateway/errors.py`
lists each type). A known `type` picks its class whatever the status; an unknown one
falls back to the class of its status, then of its family (other 4xx: `APIError`, 5xx:
`ServerError`), so a type the gateway adds later is still caught by `except ConflictError`.
Every `APIError` has `retry_after` (seconds, from `Retry-After`, or None).

httpx's own exceptions never escape: `map_exceptions` turns them into `TransportError`
at the one place the client does I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from kernel_gateway.client.templates import TemplateBuild


class ClientError(Exception):
    """Base of everything this client raises."""


class TransportError(ClientError):
    """The gateway could not be reached, or the connection broke mid-stream."""


class ConnectFailed(TransportError):
    """No connection to the gateway could be made (refused, unreachable): nothing was sent."""


class ProtocolError(TransportError):
    """The gateway's answer did not follow the protocol."""


class StreamEnded(ProtocolError):
    """An event stream ended without its `done`, and could not be resumed."""


class TemplateBuildError(ClientError):
    """A template's build ended in `error`: `reason` says why, `failed_step` which step
    (numbered from 1 as its log numbers them; None when no step failed, e.g. the kernel
    did not start from the image). `build` is the build as the gateway reported it."""

    def __init__(self, build: TemplateBuild) -> None:
        self.build = build
        self.template = build.template
        self.build_id = build.id
        self.reason = build.reason or "no reason given"
        self.failed_step = build.failed_step
        where = f" at step {build.failed_step}" if build.failed_step is not None else ""
        super().__init__(
            f"template {build.template!r}: build {build.id} failed{where}: {self.reason}"
        )


class APIError(ClientError):
    """The gateway answered with an error: `status_code`, `type` and `message` say which."""

    def __init__(
        self,
        status_code: int,
        error_type: str,
        message: str,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status_code} {error_type}: {message}")
        self.status_code = status_code
        self.type = error_type
        self.message = message
        self.retry_after = retry_after


class BadRequestError(APIError):
    """400 (and 413, 415, 422): the request itself was wrong."""


class UnknownLanguageError(BadRequestError):
    """400: the `language` asked for is not one this gateway runs (the message names them)."""


class PayloadTooLargeError(BadRequestError):
    """413: the body was over the gateway's limit."""


class UnsupportedMediaTypeError(BadRequestError):
    """415: a JSON body sent without `Content-Type: application/json`."""


class InvalidRequestError(BadRequestError):
    """422: well-formed JSON with wrong or unknown fields, or a bad `timeout`."""


class AuthenticationError(APIError):
    """401: missing or wrong token."""


class PermissionDeniedError(APIError):
    """403: refused, for example a path through a symlink."""


class NetworkNotAllowedError(PermissionDeniedError):
    """403: a network policy asked for domains the gateway's operator does not allow
    (`--egress-allow`); the message names them."""


class NotFoundError(APIError):
    """404: no such session, file or route."""


class SessionNotFoundError(NotFoundError):
    """404: no session with this id (never created, deleted, or reaped when idle)."""


class ExecutionNotFoundError(NotFoundError):
    """404: the session has no execution with this id."""


class TemplateNotFoundError(NotFoundError):
    """404: no template with this name or id (or no such tag of it)."""


class SnapshotNotFoundError(NotFoundError):
    """404: no snapshot with this id or name."""


class VolumeNotFoundError(NotFoundError):
    """404: no volume with this id or name."""


class SecretNotFoundError(NotFoundError):
    """404: no secret of this name (or id) for this key."""


class KeyNotFoundError(NotFoundError):
    """404: no API key with this id (or it was revoked)."""


class GoneError(APIError):
    """410: what was asked for existed but is no longer kept."""


class ExecutionExpiredError(GoneError):
    """410: the execution's events are past the session's retention."""


class SessionLostError(GoneError):
    """410: the session did not survive a restart of the gateway; its state is gone."""


class NodeLostError(GoneError):
    """410: (through a cluster router) the machine holding the session stopped answering
    and is presumed dead; the session's state is gone."""


class MethodNotAllowedError(APIError):
    """405: the route does not take this method."""


class ConflictError(APIError):
    """409: the session cannot take this request now."""


class SessionBusyError(ConflictError):
    """409: too many executions are already queued on the session."""


class SessionClosedError(ConflictError):
    """409: the session was deleted while the request waited."""


class SessionFailedError(ConflictError):
    """409: the session's kernel kept dying and the gateway gave up on it."""


class TemplateConflictError(ConflictError):
    """409: the template's name is taken, it is building, in use, or has no ready build."""


class RateLimitError(APIError):
    """429: too many sessions or stateless executions; retry after `retry_after` seconds."""


class TooManyTemplatesError(RateLimitError):
    """429: the gateway keeps its maximum of templates (`--max-templates`)."""


class TooManySnapshotsError(RateLimitError):
    """429: the gateway keeps its maximum of snapshots (`--max-snapshots`)."""


class TooManyVolumesError(RateLimitError):
    """429: the gateway keeps its maximum of volumes (`--max-volumes`)."""


class QuotaExceededError(RateLimitError):
    """429: the API key holds what its quota allows; the message names the quota."""


class RateLimitedError(QuotaExceededError):
    """429: the API key's requests a minute are spent; `retry_after` says when to go on."""


class VolumeInUseError(ConflictError):
    """409: the volume is mounted by a session (delete that first)."""


class TurnRunningError(ConflictError):
    """409: the session's chat is answering a message; send the next when it ends."""


class ServerError(APIError):
    """5xx: the gateway failed."""


class ChatNotConfiguredError(ServerError):
    """501: the gateway has no model to ask (it was started without `--llm-url`)."""


class SecretsNotConfiguredError(ServerError):
    """501: the gateway keeps no secrets (it was started without `--secrets-key-file`)."""


class BadGatewayError(ServerError):
    """502: (through a cluster router) the node's answer broke off; a POST may or may not
    have been carried out."""


class UnavailableError(ServerError):
    """503: nothing can run the code now; retry after `retry_after` seconds."""


class KernelUnavailableError(UnavailableError):
    """503: no kernel could be started in time."""


class HibernationFailedError(KernelUnavailableError):
    """503: the session could not be saved to disk; it was not hibernated and runs on."""


class ShuttingDownError(UnavailableError):
    """503: the gateway is stopping for a restart and refused the call before doing anything."""


class NodeUnavailableError(ShuttingDownError):
    """503: (through a cluster router) the session's node does not answer for now, e.g. its
    gateway restarts; nothing was done, and calls are sent again as for `shutting_down`."""


class BackendUnavailableError(UnavailableError):
    """503: the gateway's backend cannot run kernels (no engine, no image)."""


BY_TYPE: dict[str, type[APIError]] = {
    "bad_request": BadRequestError,
    "unknown_language": UnknownLanguageError,
    "payload_too_large": PayloadTooLargeError,
    "unsupported_media_type": UnsupportedMediaTypeError,
    "invalid_request": InvalidRequestError,
    "unauthorized": AuthenticationError,
    "forbidden": PermissionDeniedError,
    "network_not_allowed": NetworkNotAllowedError,
    "not_found": NotFoundError,
    "session_not_found": SessionNotFoundError,
    "execution_not_found": ExecutionNotFoundError,
    "template_not_found": TemplateNotFoundError,
    "snapshot_not_found": SnapshotNotFoundError,
    "volume_not_found": VolumeNotFoundError,
    "volume_in_use": VolumeInUseError,
    "key_not_found": KeyNotFoundError,
    "quota_exceeded": QuotaExceededError,
    "rate_limited": RateLimitedError,
    "too_many_volumes": TooManyVolumesError,
    "gone": GoneError,
    "execution_expired": ExecutionExpiredError,
    "session_lost": SessionLostError,
    "node_lost": NodeLostError,
    "method_not_allowed": MethodNotAllowedError,
    "conflict": ConflictError,
    "session_busy": SessionBusyError,
    "session_closed": SessionClosedError,
    "session_failed": SessionFailedError,
    "template_conflict": TemplateConflictError,
    "turn_running": TurnRunningError,
    "chat_not_configured": ChatNotConfiguredError,
    "secrets_not_configured": SecretsNotConfiguredError,
    "secret_not_found": SecretNotFoundError,
    "too_many_sessions": RateLimitError,
    "too_many_templates": TooManyTemplatesError,
    "too_many_snapshots": TooManySnapshotsError,
    "internal_error": ServerError,
    "bad_gateway": BadGatewayError,
    "kernel_unavailable": KernelUnavailableError,
    "hibernation_failed": HibernationFailedError,
    "backend_unavailable": BackendUnavailableError,
    "shutting_down": ShuttingDownError,
    "node_unavailable": NodeUnavailableError,
}
BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidRequestError,
    429: RateLimitError,
    503: UnavailableError,
}


def error_class(status_code: int, error_type: str) -> type[APIError]:
    """The class for an error document: by type, else by status, else by status family."""
    found = BY_TYPE.get(error_type) or BY_STATUS.get(status_code)
    if found is not None:
        return found
    return ServerError if status_code >= 500 else APIError


def from_response(response: httpx.Response) -> APIError:
    """The error an error response stands for; its body must have been read."""
    try:
        error = response.json()["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "http_error", response.text[:500] or response.reason_phrase
    retry_after: float | None = None
    header = response.headers.get("retry-after")
    if header is not None:
        try:
            retry_after = float(header)
        except ValueError:
            pass
    return error_class(response.status_code, kind)(
        response.status_code, kind, message, retry_after=retry_after
    )


@contextmanager
def map_exceptions(what: str | None = None) -> Iterator[None]:
    """Turn httpx's request errors (connect, timeout, protocol, decoding) into ours."""
    try:
        yield
    except httpx.RequestError as exc:
        detail = str(exc) or type(exc).__name__
        kind = (
            ConnectFailed
            if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            else TransportError
        )
        raise kind(f"{what}: {detail}" if what else detail) from exc
