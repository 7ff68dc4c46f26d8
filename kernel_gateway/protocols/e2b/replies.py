"""What E2B's API answers besides success: its error documents, and bodies refused in its shape.

The control plane and envd's HTTP answer errors as `{"code": status, "message"}`; E2B's edge
answers a sandbox that is not there with a 502 the SDKs read as "not running". An error with
a gateway error type behind it (`template_not_found`...) names it in `ERROR_TYPE_HEADER`, which
the SDKs ignore and a cluster router reads (a sandbox on a template another node has).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kernel_gateway.errors import GatewayError, InvalidRequest
from kernel_gateway.http.auth import act_as
from kernel_gateway.http.bodies import read_json
from kernel_gateway.protocols.e2b.errors import SandboxError, status_for
from kernel_gateway.protocols.e2b.paths import ERROR_TYPE_HEADER

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
MAX_BODY_BYTES = 2 * 2**20
Handler = Callable[[Request], Awaitable[Response]]
ControlHandler = Callable[[Request, "E2BService"], Awaitable[Response]]


def e2b_error(status: int, message: str, kind: str | None = None) -> JSONResponse:
    """The control plane's (and envd HTTP's) error document: `code` is the status; `kind`,
    the gateway's error type behind it, goes in `ERROR_TYPE_HEADER`."""
    headers = {ERROR_TYPE_HEADER: kind} if kind else None
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def gone(sandbox_id: str) -> JSONResponse:
    """What E2B's edge answers for a sandbox that is not there (or is paused): the SDKs
    read a 502 whose message says "was not found" as "not running"."""
    return JSONResponse(
        {"code": 502, "message": "The sandbox was not found", "sandboxId": sandbox_id},
        status_code=502,
    )


async def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object (empty: `{}`), refused in E2B's error shape."""
    try:
        return await read_json(request, MAX_BODY_BYTES, optional=True)
    except GatewayError as exc:
        # E2B's API answers a body that is JSON but not an object with 400, not 422.
        status = 400 if isinstance(exc, InvalidRequest) else exc.status_code
        raise SandboxError(status, exc.message) from None


def answered(service: E2BService, handler: ControlHandler) -> Handler:
    """`handler` as an endpoint whose failures are E2B's error documents: a `SandboxError`
    as it says, a `GatewayError` from the layers below (sessions, templates) at the status
    E2B's SDKs read best (`status_for`)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request, service)
        except SandboxError as exc:
            return e2b_error(exc.status, exc.message, exc.kind)
        except GatewayError as exc:
            return e2b_error(status_for(exc), exc.message, exc.error_type)

    return endpoint


def guarded(service: E2BService, handler: ControlHandler) -> Handler:
    """`answered`, behind the control plane's `X-API-KEY` (`E2BService.api_principal`):
    the handler acts as its principal (`http.auth.principal_of`), within its rate limit."""
    inner = answered(service, handler)

    async def endpoint(request: Request) -> Response:
        principal = service.api_principal(request)
        if principal is None:
            return e2b_error(
                401, "invalid API key: it is the gateway's token or one of its API keys"
            )
        try:
            service.auth.limiter.take(principal)
        except GatewayError as exc:
            response = e2b_error(status_for(exc), exc.message, exc.error_type)
            if exc.retry_after is not None:
                response.headers["Retry-After"] = str(round(exc.retry_after))
            return response
        act_as(request.scope, principal)
        return await inner(request)

    return endpoint
