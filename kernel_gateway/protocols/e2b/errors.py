"""The E2B front door's one error: a failure answered in E2B's shapes."""

from __future__ import annotations

from kernel_gateway.errors import GatewayError


class SandboxError(Exception):
    """A control-plane failure, answered as E2B's `{"code": status, "message"}`; `kind`: the
    gateway's error type behind it, if any (sent as `ERROR_TYPE_HEADER`, for a router)."""

    def __init__(self, status: int, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def not_found(sandbox_id: str) -> SandboxError:
    return SandboxError(404, f"sandbox {sandbox_id!r} not found")


def status_for(exc: GatewayError) -> int:
    """The gateway's refusal as a status E2B's SDKs map well (429 and 503 are retried)."""
    if exc.status_code == 422:  # the gateway's invalid_request: E2B's SDKs know 400
        return 400
    return exc.status_code if exc.status_code in (400, 403, 404, 409, 413, 429, 503) else 500
