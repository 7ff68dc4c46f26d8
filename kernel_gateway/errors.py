"""Every error the gateway reports, and the HTTP status each maps to.

    GatewayError                      500 internal_error
    ├── BadRequest                    400 bad_request         (body is not JSON, bad path)
    │   └── UnknownLanguage           400 unknown_language    (not among this gateway's languages)
    ├── Unauthorized                  401 unauthorized        (missing or wrong token)
    ├── Forbidden                     403 forbidden
    │   └── NetworkNotAllowed         403 network_not_allowed (a domain beyond --egress-allow)
    ├── NotFound                      404 not_found
    │   ├── SessionNotFound           404 session_not_found
    │   ├── ExecutionNotFound         404 execution_not_found
    │   ├── TemplateNotFound          404 template_not_found
    │   ├── SnapshotNotFound          404 snapshot_not_found
    │   ├── VolumeNotFound            404 volume_not_found
    │   ├── SecretNotFound            404 secret_not_found    (or another key's)
    │   └── KeyNotFound               404 key_not_found       (or another key's: never 403)
    ├── Conflict                      409 conflict
    │   ├── SessionBusy               409 session_busy        (too many queued executions)
    │   ├── SessionClosed             409 session_closed      (deleted while the request waited)
    │   ├── SessionFailed             409 session_failed      (its kernel kept dying: gave up)
    │   ├── TemplateConflict          409 template_conflict   (name taken, build running, in use)
    │   ├── TurnRunning               409 turn_running        (the session's chat is answering)
    │   └── VolumeInUse               409 volume_in_use       (mounted by a session)
    ├── Gone                          410 gone
    │   ├── ExecutionExpired          410 execution_expired   (its events aged out of retention)
    │   ├── SessionLost               410 session_lost        (its kernel did not survive a restart)
    │   └── NodeLost                  410 node_lost           (router: its node stopped answering)
    ├── PayloadTooLarge               413 payload_too_large
    ├── UnsupportedMediaType          415 unsupported_media_type (JSON body without its type)
    ├── InvalidRequest                422 invalid_request     (well-formed JSON, wrong fields)
    ├── TooManySessions               429 too_many_sessions   (+ Retry-After)
    ├── TooManyTemplates              429 too_many_templates  (--max-templates)
    ├── TooManySnapshots              429 too_many_snapshots  (--max-snapshots)
    ├── TooManyVolumes                429 too_many_volumes    (--max-volumes)
    ├── QuotaExceeded                 429 quota_exceeded      (+ Retry-After: the key's quota)
    │   └── RateLimited               429 rate_limited        (+ Retry-After: its requests a minute)
    ├── KernelUnavailable             503 kernel_unavailable  (+ Retry-After: no kernel could start)
    │   └── HibernationFailed         503 hibernation_failed  (not saved: the session runs on;
    │                                                          also a snapshot or fork's save)
    ├── ChatNotConfigured             501 chat_not_configured (no --llm-url: no model to ask)
    ├── SecretsNotConfigured          501 secrets_not_configured (no --secrets-key-file)
    ├── BadGateway                    502 bad_gateway         (router: a node's answer was broken)
    ├── ShuttingDown                  503 shutting_down       (+ Retry-After: the gateway drains)
    │   └── NodeUnavailable           503 node_unavailable    (router: a node restarts; Retry-After)
    └── BackendUnavailable            503 backend_unavailable (no engine, no image: at startup)

`Backend.launch` raises only `KernelUnavailable`: each backend maps its own low-level
failures (Docker API errors, OSError, timeouts) to it at its boundary, so callers that
replace kernels handle exactly one exception.

Domain code raises these; only `app.py` turns them into responses, as
`{"error": {"type": ..., "message": ...}}`.
"""

from __future__ import annotations


class GatewayError(Exception):
    status_code = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"error": {"type": self.error_type, "message": self.message}}


class BadRequest(GatewayError):
    status_code = 400
    error_type = "bad_request"


class UnknownLanguage(BadRequest):
    error_type = "unknown_language"


class Unauthorized(GatewayError):
    status_code = 401
    error_type = "unauthorized"


class Forbidden(GatewayError):
    status_code = 403
    error_type = "forbidden"


class NetworkNotAllowed(Forbidden):
    """A network policy asks for domains the operator has not allowed (`--egress-allow`)."""

    error_type = "network_not_allowed"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found"


class SessionNotFound(NotFound):
    error_type = "session_not_found"


class ExecutionNotFound(NotFound):
    error_type = "execution_not_found"


class TemplateNotFound(NotFound):
    error_type = "template_not_found"


class SnapshotNotFound(NotFound):
    error_type = "snapshot_not_found"


class VolumeNotFound(NotFound):
    error_type = "volume_not_found"


class KeyNotFound(NotFound):
    error_type = "key_not_found"


class SecretNotFound(NotFound):
    error_type = "secret_not_found"


class Gone(GatewayError):
    status_code = 410
    error_type = "gone"


class ExecutionExpired(Gone):
    error_type = "execution_expired"


class SessionLost(Gone):
    """The session existed before the gateway restarted, but its kernel could not be adopted."""

    error_type = "session_lost"


class NodeLost(Gone):
    """Router: the session's node has not answered for `--node-lost-after`; presumed dead."""

    error_type = "node_lost"


class Conflict(GatewayError):
    status_code = 409
    error_type = "conflict"


class SessionBusy(Conflict):
    error_type = "session_busy"


class SessionClosed(Conflict):
    error_type = "session_closed"


class SessionFailed(Conflict):
    error_type = "session_failed"


class TemplateConflict(Conflict):
    error_type = "template_conflict"


class TurnRunning(Conflict):
    """A session's chat answers one message at a time."""

    error_type = "turn_running"


class VolumeInUse(Conflict):
    """A volume mounted by a session cannot be deleted."""

    error_type = "volume_in_use"


class PayloadTooLarge(GatewayError):
    status_code = 413
    error_type = "payload_too_large"


class UnsupportedMediaType(GatewayError):
    status_code = 415
    error_type = "unsupported_media_type"


class InvalidRequest(GatewayError):
    status_code = 422
    error_type = "invalid_request"


class TooManySessions(GatewayError):
    status_code = 429
    error_type = "too_many_sessions"


class TooManyTemplates(GatewayError):
    status_code = 429
    error_type = "too_many_templates"


class TooManySnapshots(GatewayError):
    status_code = 429
    error_type = "too_many_snapshots"


class TooManyVolumes(GatewayError):
    status_code = 429
    error_type = "too_many_volumes"


class QuotaExceeded(GatewayError):
    """The request's API key holds what its quota allows (sessions, stateless requests,
    disk): the message names the quota; nothing of anyone else's is reclaimed for it."""

    status_code = 429
    error_type = "quota_exceeded"


class RateLimited(QuotaExceeded):
    error_type = "rate_limited"


class KernelUnavailable(GatewayError):
    status_code = 503
    error_type = "kernel_unavailable"


class HibernationFailed(KernelUnavailable):
    """A session could not be saved to disk (to hibernate, snapshot or fork it): nothing was
    made of it, and it runs on as it was. Answered with `Retry-After` (`RETRY_SAVE`): the
    session may save once it has changed (a value deleted, files made smaller)."""

    error_type = "hibernation_failed"


RETRY_SAVE = 5.0
"""Seconds a client is told to wait before asking again for a save that failed."""


class ShuttingDown(GatewayError):
    """The gateway is draining for a restart: new work goes to its successor."""

    status_code = 503
    error_type = "shutting_down"


class NodeUnavailable(ShuttingDown):
    """Router: the session's node does not answer now (its gateway restarts); nothing was
    done, retry after `Retry-After` (clients retry it as they retry `shutting_down`)."""

    error_type = "node_unavailable"


class ChatNotConfigured(GatewayError):
    """The gateway has no model to ask (`--llm-url`, `--llm-model`)."""

    status_code = 501
    error_type = "chat_not_configured"


class SecretsNotConfigured(GatewayError):
    """The gateway keeps no secrets (`--secrets-key-file`)."""

    status_code = 501
    error_type = "secrets_not_configured"


class BadGateway(GatewayError):
    """Router: a node's answer broke off or was not HTTP."""

    status_code = 502
    error_type = "bad_gateway"


class BackendUnavailable(GatewayError):
    """The backend cannot run kernels here at all (no engine, no image)."""

    status_code = 503
    error_type = "backend_unavailable"
