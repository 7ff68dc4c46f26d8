"""A cluster's keys kept in step (`tenants/keys.py`, `cluster/keys.py`): the routers read
each node gateway's keys and give it the ones it lacks. Admin token only.

    GET /cluster/keys   every key (revoked ones too) with its secret's digest, and the
                        version of the set (`/health` shows it as `keys`)
    PUT /cluster/keys   keys to merge: each is kept where it is newer than the one held
"""

from __future__ import annotations

from starlette.requests import Request

from kernel_gateway.http.bodies import read_model
from kernel_gateway.http.operations import Body, Operation, Reply
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.server.routes.fragments import JSON_BODY
from kernel_gateway.server.routes.keys import admin_only, key_store
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import key_requests, responses
from kernel_gateway.tenants.key_json import record_json
from kernel_gateway.tenants.key_records import Record
from kernel_gateway.tenants.keys import KeyStore

MERGE_BODY_BYTES = 64 * 1024 * 1024
"""The largest set of keys a router gives (about 500 bytes a key: some 130,000 keys, revoked
ones included), whatever `--max-body-bytes` says of other requests."""


def records_json(keys: KeyStore) -> responses.KeyRecords:
    return {"version": keys.version, "keys": [record_json(r) for r in keys.records()]}


async def read(request: Request) -> JSONResponse[responses.KeyRecords]:
    admin_only(request, "read a cluster's keys")
    return JSONResponse(records_json(key_store(request)), headers={"Cache-Control": "no-store"})


async def merge(request: Request) -> JSONResponse[responses.KeyRecords]:
    admin_only(request, "change a cluster's keys")
    settings: Settings = request.state.settings
    limit = max(settings.max_body_bytes, MERGE_BODY_BYTES)
    body = await read_model(request, key_requests.KeyMerge, limit, settings)
    keys = key_store(request)
    await keys.merge(Record.from_json(r.model_dump()) for r in body.keys)
    return JSONResponse(records_json(keys), headers={"Cache-Control": "no-store"})


OPERATIONS = (
    Operation(
        "get",
        "/cluster/keys",
        read,
        "readClusterKeys",
        summary="Every API key with its secret's digest, for a cluster's routers.",
        description="Admin token only (403 for a key). A router reads it from the node "
        "whose `/health` shows another `keys` version than its own.",
        tags=("cluster",),
        replies=(Reply(200, "The keys and their version.", responses.KeyRecords),),
        errors=(403,),
    ),
    Operation(
        "put",
        "/cluster/keys",
        merge,
        "mergeClusterKeys",
        summary="Merge API keys into this gateway's (each kept where it is newer).",
        description="Admin token only. A revocation is final; otherwise a key's latest "
        "change wins. A key revoked or given a new secret here stops working at once.",
        tags=("cluster",),
        body=Body(key_requests.KeyMerge),
        replies=(Reply(200, "The keys held now, and their version.", responses.KeyRecords),),
        errors=(*JSON_BODY, 403, 409),
    ),
)
