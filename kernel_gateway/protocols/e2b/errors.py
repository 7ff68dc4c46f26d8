"""The E2B front door's one error: a failure answered in E2B's shapes."""

from __future__ import annotations


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
