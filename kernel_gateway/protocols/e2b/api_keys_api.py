"""E2B's team API keys (`/api-keys`) as the gateway's API keys (`tenants/keys.py`).

    GET    /api-keys              the live keys (a key: itself), as E2B's `TeamAPIKey`
    POST   /api-keys {name}       a new key, its secret once (`CreatedTeamAPIKey`; admin)
    PATCH  /api-keys/{id} {name}  renamed (admin)
    DELETE /api-keys/{id}         revoked (admin, or the key itself)

The same keys as `/keys`: a key made here works as `E2B_API_KEY` and as a bearer token on
every other surface. E2B authenticates these calls with a user's access token; here the
credential is the admin token or a key, as `X-API-KEY` or `Authorization: Bearer`. Keys
made here have no quotas (`PATCH /keys/{id}` gives them some).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernel_gateway.errors import Forbidden, KeyNotFound
from kernel_gateway.http.auth import principal_of
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.replies import ControlHandler, Handler, guarded, json_body
from kernel_gateway.tenants.key_records import Key
from kernel_gateway.tenants.keys import SECRET_LENGTH, SECRET_PREFIX, KeyStore
from kernel_gateway.tenants.principal import Quotas

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService


def api_key_routes(service: E2BService) -> list[Route]:
    def guard(handler: ControlHandler) -> Handler:
        return guarded(service, handler)

    return [
        Route("/api-keys", guard(list_keys), methods=["GET"]),
        Route("/api-keys", guard(create), methods=["POST"]),
        Route("/api-keys/{id}", guard(rename), methods=["PATCH"]),
        Route("/api-keys/{id}", guard(revoke), methods=["DELETE"]),
    ]


def _keys(service: E2BService) -> KeyStore:
    keys = service.auth.keys
    if not isinstance(keys, KeyStore):
        raise SandboxError(501, "this gateway keeps no API keys")
    return keys


def team_key(key: Key) -> dict[str, Any]:
    """E2B's `TeamAPIKey`."""
    return {
        "id": key.id,
        "name": key.name,
        "mask": {
            "prefix": SECRET_PREFIX,
            "valueLength": SECRET_LENGTH - len(SECRET_PREFIX),
            "maskedValuePrefix": key.shown.removeprefix(SECRET_PREFIX),
            "maskedValueSuffix": "",
        },
        "createdAt": key.created_at,
        "createdBy": None,
        "lastUsed": None,
    }


def _name(body: dict[str, Any]) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise SandboxError(400, "'name' is required: the key's name")
    return name


def _visible(request: Request, service: E2BService) -> Key:
    key_id = str(request.path_params["id"])
    if not principal_of(request).sees(key_id):
        raise KeyNotFound(f"no API key with id {key_id!r}")
    key = _keys(service).get(key_id)
    if key.revoked_at is not None:
        raise KeyNotFound(f"API key {key_id!r} was revoked")
    return key


def _admin(request: Request, what: str) -> None:
    if not principal_of(request).admin:
        raise Forbidden(f"only the gateway's admin token may {what}")


async def list_keys(request: Request, service: E2BService) -> Response:
    viewer = principal_of(request)
    return JSONResponse([team_key(k) for k in _keys(service).keys() if viewer.sees(k.id)])


async def create(request: Request, service: E2BService) -> Response:
    _admin(request, "make API keys")
    key, secret = await _keys(service).create(_name(await json_body(request)), Quotas())
    return JSONResponse({**team_key(key), "key": secret}, status_code=201)


async def rename(request: Request, service: E2BService) -> Response:
    key = _visible(request, service)
    _admin(request, "rename API keys")
    await _keys(service).rename(key.id, _name(await json_body(request)))
    return Response(status_code=200)


async def revoke(request: Request, service: E2BService) -> Response:
    await _keys(service).revoke(_visible(request, service).id)
    return Response(status_code=204)
