"""API keys (kernel_gateway/tenants/keys.py): made and managed by the admin token.

    POST   /keys                  a new key, its secret shown once (201; admin)
    GET    /keys                  the live keys (`?revoked=true`: revoked ones too); a key
                                  sees only itself
    GET    /keys/{key_id}         one key (the admin, or the key itself)
    PATCH  /keys/{key_id}         its quotas replaced (admin)
    POST   /keys/{key_id}/rotate  a new secret; the old one stops at once (admin or itself)
    DELETE /keys/{key_id}         revoked: refused from now on, its open streams ended
                                  (admin or itself)
    GET    /keys/{key_id}/usage   what it used (tenants/usage.py; admin or itself)

Another key's id is answered 404, as a missing one: a key cannot learn which ids exist.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.errors import BadRequest, Forbidden, InvalidRequest, KeyNotFound
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.server.routes.fragments import JSON_BODY, LOCATION
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import key_requests, responses
from kernel_gateway.tenants.key_json import key_json
from kernel_gateway.tenants.key_records import Key
from kernel_gateway.tenants.keys import KeyStore
from kernel_gateway.tenants.principal import Quotas


def key_store(request: Request) -> KeyStore:
    keys: KeyStore = request.state.keys
    return keys


def _settings(request: Request) -> Settings:
    settings: Settings = request.state.settings
    return settings


def admin_only(request: Request, what: str) -> None:
    if not principal_of(request).admin:
        raise Forbidden(f"only the admin token may {what}")


def _visible(request: Request) -> Key:
    """The key in the path, if the caller may see it (the admin, or the key itself)."""
    key_id = request.path_params["key_id"]
    if not principal_of(request).sees(key_id):
        raise KeyNotFound(f"no key with id {key_id!r}")
    return key_store(request).get(key_id)


def quotas(asked: key_requests.Quotas, settings: Settings) -> Quotas:
    """The quotas asked for, within the gateway's own limits per kernel."""
    if asked.cpus is not None and asked.cpus > settings.cpu_limit:
        raise InvalidRequest(
            f"cpus {asked.cpus:g} is over the gateway's --cpu-limit ({settings.cpu_limit:g})"
        )
    ceiling = settings.memory_limit_bytes
    if asked.memory_bytes is not None and asked.memory_bytes > ceiling:
        raise InvalidRequest(
            f"memory_bytes {asked.memory_bytes} is over the gateway's --memory-limit "
            f"({settings.memory_limit}: {ceiling} bytes)"
        )
    disk = settings.workspace_size_bytes
    if asked.disk_bytes is not None and asked.disk_bytes > disk:
        raise InvalidRequest(
            f"disk_bytes {asked.disk_bytes} is over the gateway's --workspace-size "
            f"({settings.workspace_size}: {disk} bytes)"
        )
    return Quotas(
        asked.max_sessions,
        asked.max_stateless,
        asked.requests_per_minute,
        asked.cpus,
        asked.memory_bytes,
        asked.disk_bytes,
        asked.total_disk_bytes,
    )


def with_secret(key: Key, secret: str) -> responses.KeySecret:
    return {**key_json(key), "secret": secret}


async def create(request: Request) -> JSONResponse[responses.KeySecret]:
    admin_only(request, "make keys")
    settings = _settings(request)
    body = await read_model(request, key_requests.NewKey, settings.max_body_bytes, settings)
    key, secret = await key_store(request).create(body.name, quotas(body.quotas, settings))
    return JSONResponse(
        with_secret(key, secret),
        status_code=201,
        headers={"Location": f"/keys/{key.id}", "Cache-Control": "no-store"},
    )


async def list_all(request: Request) -> JSONResponse[responses.KeyList]:
    revoked = request.query_params.get("revoked", "false")
    if revoked not in ("true", "false"):
        raise BadRequest("revoked must be true or false")
    principal = principal_of(request)
    found = key_store(request).keys(revoked=revoked == "true")
    return JSONResponse({"keys": [key_json(k) for k in found if principal.sees(k.id)]})


async def get(request: Request) -> JSONResponse[responses.KeyInfo]:
    return JSONResponse(key_json(_visible(request)))


async def change(request: Request) -> JSONResponse[responses.KeyInfo]:
    key = _visible(request)
    admin_only(request, "change a key's quotas")
    settings = _settings(request)
    body = await read_model(request, key_requests.KeyChange, settings.max_body_bytes, settings)
    return JSONResponse(
        key_json(await key_store(request).set_quotas(key.id, quotas(body.quotas, settings)))
    )


async def rotate(request: Request) -> JSONResponse[responses.KeySecret]:
    key, secret = await key_store(request).rotate(_visible(request).id)
    return JSONResponse(with_secret(key, secret), headers={"Cache-Control": "no-store"})


async def usage(request: Request) -> JSONResponse[responses.KeyUsage]:
    key = _visible(request)
    used = key_store(request).usage(key.id)
    registry: Registry = request.state.registry
    return JSONResponse(
        {
            "sessions_created": used.sessions_created,
            "stateless_requests": used.stateless_requests,
            "kernel_seconds": round(used.kernel_seconds, 3),
            "cpu_seconds": round(used.cpu_seconds, 3),
            "peak_memory_bytes": used.peak_memory_bytes,
            "egress_bytes": used.egress_bytes,
            "sessions_held": registry.held_by(key.id),
        }
    )


async def revoke(request: Request) -> Response:
    await key_store(request).revoke(_visible(request).id)
    return Response(status_code=204)


KEY_PATH = "/keys/{key_id}"

OPERATIONS = (
    Operation(
        "post",
        "/keys",
        create,
        "createKey",
        summary="A new API key, with its quotas; its secret is shown only in this answer.",
        description="Admin token only (403 for a key). A key acts as itself on every "
        "surface: it sees and touches only what it made, within its quotas.",
        tags=("keys",),
        body=Body(key_requests.NewKey),
        replies=(Reply(201, "The key, with its secret.", responses.KeySecret, headers=LOCATION),),
        errors=(*JSON_BODY, 403, 409),
    ),
    Operation(
        "get",
        "/keys",
        list_all,
        "listKeys",
        summary="The live API keys, oldest first (a key sees only itself).",
        tags=("keys",),
        parameters=(
            {
                "name": "revoked",
                "in": "query",
                "required": False,
                "description": "Also list revoked keys.",
                "schema": {"type": "string", "enum": ["true", "false"], "default": "false"},
            },
        ),
        replies=(Reply(200, "The keys.", responses.KeyList),),
    ),
    Operation(
        "get",
        KEY_PATH,
        get,
        "getKey",
        summary="An API key (the admin's, or the key's own).",
        tags=("keys",),
        replies=(Reply(200, "The key.", responses.KeyInfo),),
        errors=(404,),
    ),
    Operation(
        "patch",
        KEY_PATH,
        change,
        "changeKey",
        summary="Replace a key's quotas (admin token only).",
        description="They apply to its next requests; what it holds already is kept.",
        tags=("keys",),
        body=Body(key_requests.KeyChange),
        replies=(Reply(200, "The key.", responses.KeyInfo),),
        errors=(*JSON_BODY, 403, 404),
    ),
    Operation(
        "post",
        KEY_PATH + "/rotate",
        rotate,
        "rotateKey",
        summary="A new secret for a key; the old one is refused at once, its open streams end.",
        tags=("keys",),
        replies=(Reply(200, "The key, with its new secret.", responses.KeySecret),),
        errors=(404,),
    ),
    Operation(
        "get",
        KEY_PATH + "/usage",
        usage,
        "keyUsage",
        summary="What a key used since it was made (the admin's, or the key's own).",
        description="Kept across restarts (written every few seconds); also on `/metrics` "
        "as `kernel_gateway_key_*` with a `key` label (its name).",
        tags=("keys",),
        replies=(Reply(200, "Its usage.", responses.KeyUsage),),
        errors=(404,),
    ),
    Operation(
        "delete",
        KEY_PATH,
        revoke,
        "revokeKey",
        summary="Revoke a key: refused from now on, its open streams and WebSockets end.",
        description="What it made is kept, and seen by the admin.",
        tags=("keys",),
        replies=(Reply(204, "Revoked."),),
        errors=(404,),
    ),
)
