"""E2B's secrets (`/secrets`) as the gateway's secrets (`tenants/secrets.py`, docs/secrets.md).

    GET    /secrets              the caller's, as E2B's `Secret` (never a value); paged
    POST   /secrets              {name, value, metadata?} → 201
    GET    /secrets/{secretID}   one, by id (`sec_…`) or name
    POST   /secrets/{secretID}   {value, metadata?}: a new version
    DELETE /secrets/{secretID}

E2B's secrets have no domains of their own: a sandbox's `network.rules` say which hosts
get which headers, and a `${e2b.secrets.NAME}` in them may go to those hosts only
(`sandboxes_api._rules`). Names are lower-cased, as E2B stores them.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernel_gateway.http.auth import principal_of
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.replies import ControlHandler, Handler, guarded, json_body
from kernel_gateway.protocols.e2b.template_views import page
from kernel_gateway.tenants.secrets import Secret, SecretStore

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService

NAME = re.compile(r"[a-z0-9_-]{1,128}")
MAX_VALUE = 16 * 1024


def secret_routes(service: E2BService) -> list[Route]:
    def guard(handler: ControlHandler) -> Handler:
        return guarded(service, handler)

    return [
        Route("/secrets", guard(list_secrets), methods=["GET"]),
        Route("/secrets", guard(create), methods=["POST"]),
        Route("/secrets/{id}", guard(get), methods=["GET"]),
        Route("/secrets/{id}", guard(update), methods=["POST"]),
        Route("/secrets/{id}", guard(delete), methods=["DELETE"]),
    ]


def _store(service: E2BService) -> SecretStore:
    return service.secrets


def secret_json(secret: Secret) -> dict[str, Any]:
    """E2B's `Secret`."""

    def rfc3339(seconds: float) -> str:
        return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")

    return {
        "secretID": secret.id,
        "name": secret.name,
        "currentVersion": secret.version,
        "metadata": dict(secret.metadata),
        "createdAt": rfc3339(secret.created_at),
        "updatedAt": rfc3339(secret.updated_at),
    }


def _value(body: dict[str, Any]) -> str:
    value = body.get("value")
    if not isinstance(value, str) or not value:
        raise SandboxError(400, "'value' is required: the secret")
    if len(value.encode()) > MAX_VALUE or any(c in value for c in "\r\n\0"):
        raise SandboxError(400, f"'value' must be at most {MAX_VALUE} bytes, without CR, LF or NUL")
    return value


def _metadata(body: dict[str, Any]) -> dict[str, str] | None:
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or len(metadata) > 32
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 128 and len(v) <= 1024
            for k, v in metadata.items()
        )
    ):
        raise SandboxError(400, "'metadata' must be at most 32 strings (keys 128, values 1024)")
    return dict(metadata)


def _find(request: Request, service: E2BService) -> Secret:
    viewer = principal_of(request)
    reference = str(request.path_params["id"])
    name = reference if reference.startswith("sec_") else reference.lower()
    return _store(service).find(name, viewer.owner, False)


async def list_secrets(request: Request, service: E2BService) -> Response:
    viewer = principal_of(request)
    found = _store(service).visible(viewer.owner, False)
    items, following = page(found, lambda s: s.id, request.query_params)
    headers = {"X-Next-Token": following} if following else {}
    return JSONResponse([secret_json(s) for s in items], headers=headers)


async def create(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name.lower()) or name.startswith("sec_"):
        raise SandboxError(400, "'name' must be 1-128 letters, digits, '_' or '-' (not sec_…)")
    secret = await asyncio.to_thread(
        _store(service).create,
        name.lower(),
        _value(body),
        [],
        None,
        "{value}",
        principal_of(request).owner,
        _metadata(body),
    )
    return JSONResponse(secret_json(secret), status_code=201)


async def get(request: Request, service: E2BService) -> Response:
    return JSONResponse(secret_json(_find(request, service)))


async def update(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    secret = _find(request, service)
    changed = await asyncio.to_thread(
        _store(service).change, secret, _value(body), None, None, None, _metadata(body)
    )
    return JSONResponse(secret_json(changed))


async def delete(request: Request, service: E2BService) -> Response:
    secret = _find(request, service)
    await asyncio.to_thread(_store(service).delete, secret)
    return Response(status_code=204)
