"""Secrets (docs/secrets.md): credentials sessions use through the egress proxy, never read.

    POST   /secrets           a new secret (201); its value is never shown again
    GET    /secrets           the caller's secrets (the admin's: all), without values
    GET    /secrets/{name}    one, by name or id
    PUT    /secrets/{name}    a new value (a rotation) and/or domains, header, format
    DELETE /secrets/{name}    gone; sessions that named it send its placeholder nowhere

A session names the secrets it may use: `POST /sessions {"secrets": ["NAME"]}`.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.server.routes.fragments import JSON_BODY, LOCATION
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import secrets as shapes
from kernel_gateway.tenants.secrets import Secret, SecretStore


def _store(request: Request) -> SecretStore:
    store: SecretStore = request.state.secrets
    return store


def _settings(request: Request) -> Settings:
    settings: Settings = request.state.settings
    return settings


def _json(secret: Secret) -> shapes.SecretInfo:
    return {
        "id": secret.id,
        "name": secret.name,
        "domains": list(secret.domains),
        "header": secret.header,
        "format": secret.format,
        "version": secret.version,
        "placeholder": f"kg-secret:{secret.name}",
        "created_at": secret.created_at,
        "updated_at": secret.updated_at,
        "owner": secret.owner,
    }


def _find(request: Request) -> Secret:
    viewer = principal_of(request)
    return _store(request).find(request.path_params["name"], viewer.owner, viewer.admin)


async def create(request: Request) -> JSONResponse[shapes.SecretInfo]:
    settings = _settings(request)
    body = await read_model(request, shapes.NewSecret, settings.max_body_bytes, settings)
    owner = principal_of(request).owner
    secret = await asyncio.to_thread(
        _store(request).create, body.name, body.value, body.domains, body.header, body.format, owner
    )
    headers = {"Location": f"/secrets/{secret.name}"}
    return JSONResponse(_json(secret), status_code=201, headers=headers)


async def list_all(request: Request) -> JSONResponse[shapes.SecretList]:
    viewer = principal_of(request)
    found = _store(request).visible(viewer.owner, viewer.admin)
    return JSONResponse({"secrets": [_json(s) for s in found]})


async def get(request: Request) -> JSONResponse[shapes.SecretInfo]:
    return JSONResponse(_json(_find(request)))


async def change(request: Request) -> JSONResponse[shapes.SecretInfo]:
    settings = _settings(request)
    body = await read_model(request, shapes.SecretChange, settings.max_body_bytes, settings)
    secret = _find(request)
    changed = await asyncio.to_thread(
        _store(request).change, secret, body.value, body.domains, body.header, body.format
    )
    return JSONResponse(_json(changed))


async def delete(request: Request) -> Response:
    secret = _find(request)
    await asyncio.to_thread(_store(request).delete, secret)
    return Response(status_code=204)


_WHY = (
    "501 `secrets_not_configured` on a gateway started without `--secrets-key-file`. Another "
    "key's secret is 404, as one that does not exist."
)

OPERATIONS = (
    Operation(
        "post",
        "/secrets",
        create,
        "createSecret",
        summary="Keep a secret: sessions that name it send its value only to its domains.",
        description=_WHY,
        tags=("secrets",),
        body=Body(shapes.NewSecret),
        replies=(
            Reply(201, "The secret, without its value.", shapes.SecretInfo, headers=LOCATION),
        ),
        errors=(*JSON_BODY, 409, 501),
    ),
    Operation(
        "get",
        "/secrets",
        list_all,
        "listSecrets",
        summary="The caller's secrets (the admin's: every one), never their values.",
        tags=("secrets",),
        replies=(Reply(200, "The secrets.", shapes.SecretList),),
    ),
    Operation(
        "get",
        "/secrets/{name}",
        get,
        "getSecret",
        summary="One secret, by name or id, without its value.",
        tags=("secrets",),
        replies=(Reply(200, "The secret.", shapes.SecretInfo),),
        errors=(404,),
    ),
    Operation(
        "put",
        "/secrets/{name}",
        change,
        "changeSecret",
        summary="Rotate its value and/or change its domains, header or format.",
        description="Takes effect on the next request of every session that uses it.",
        tags=("secrets",),
        body=Body(shapes.SecretChange),
        replies=(Reply(200, "The secret, its version one more.", shapes.SecretInfo),),
        errors=(*JSON_BODY, 404, 501),
    ),
    Operation(
        "delete",
        "/secrets/{name}",
        delete,
        "deleteSecret",
        summary="Forget a secret: sessions that named it send its placeholder nowhere.",
        tags=("secrets",),
        replies=(Reply(204, "Deleted."),),
        errors=(404,),
    ),
)
"""The secrets' endpoints, each routed and documented from its record."""
