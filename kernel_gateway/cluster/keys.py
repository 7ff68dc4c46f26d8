"""A cluster's API keys: held by every node gateway, kept in step by the routers.

Every node gateway holds every key in its own `keys.sqlite3` (its runtime folder, which
outlives its restarts), and authenticates E2B's `X-API-KEY` with it. A router holds a copy
in memory (`KeyReplica`), to know who its callers are; it passes their requests on with the
cluster's token and the key's id (`http.auth.ACTING_FOR`), after counting them against the
key's rate limit.

Keeping them in step: each node's `/health` shows the version of its keys (a digest of
every key's last change). After every poll, a router whose own version differs from a
node's reads that node's keys (`GET /cluster/keys`) and merges them into its copy; then it
gives every node that still differs the whole set (`PUT /cluster/keys`). A merge keeps each
key's latest change, a revocation over any change (`tenants/keys.py`), so the nodes and the
routers converge whatever order changes arrive in, and a node that was away catches up
within a poll of its return.

A change (`POST /keys`, a new secret, new quotas, a revocation) is made on one node, then
read back and given to every other node before it is answered: when the client hears of
it, every node that answers holds it. Another router learns of it at its next poll, or at
once when a caller presents a key it does not know (at most one such read a second).
A key's usage is each node's: `GET /keys/{id}/usage` adds them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel_gateway.cluster.directory import Node, NodeDirectory
from kernel_gateway.cluster.proxy import NodeUnreachable, Proxy
from kernel_gateway.errors import GatewayError, NodeUnavailable, QuotaExceeded
from kernel_gateway.http.bodies import read_body
from kernel_gateway.http.responses import JSONResponse
from kernel_gateway.tenants.key_records import Record
from kernel_gateway.tenants.keys import SECRET_LENGTH, SECRET_PREFIX, KeyStore
from kernel_gateway.tenants.principal import Principal

logger = logging.getLogger("kernel_gateway.cluster")

PATH = "/cluster/keys"
ANSWER_SECONDS = 10.0
REFRESH_SPACING = 1.0
"""Seconds between two reads of the nodes' keys forced by unknown keys."""
RETRY_AFTER = 2.0
NO_NODE = "no node of the cluster answers now; retry shortly"
MAX_BODY = 64 * 1024
"""A key's name and quotas: far below this."""


class KeyReplica:
    """The router's copy of the cluster's keys, and the rounds that keep it in step."""

    def __init__(self, directory: NodeDirectory, http: httpx.AsyncClient, token: str | None):
        self.store = KeyStore(None)
        self._directory = directory
        self._http = http
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._refreshed = 0.0
        self._creating: dict[str, int] = {}
        """Sessions this router is placing now, per key id."""

    async def start(self) -> None:
        await asyncio.to_thread(self.store.open)
        self._task = asyncio.create_task(self._run(), name="key-replica")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await asyncio.to_thread(self.store.close)

    async def _run(self) -> None:
        while True:
            await self._directory.next_poll(time.monotonic() + 3600)
            try:
                await self.sync()
            except Exception:  # never let one bad round stop the rounds
                logger.exception("keeping the cluster's keys in step failed")

    # -- rounds ----------------------------------------------------------------------------

    async def sync(self, changed: Node | None = None) -> None:
        """Merge the keys of every up node whose version is not this copy's (and of
        `changed`, a node just changed through this router), then give every node that
        still differs the whole set."""
        async with self._lock:
            # A node whose /health shows no keys is a gateway from before keys were shared
            # (a rolling update under way): it is left alone, not asked every poll.
            up = [n for n in self._directory.up() if "keys" in n.health]
            ahead = [n for n in up if n is changed or n.health["keys"] != self.store.version]
            if not ahead:
                return
            read = await asyncio.gather(*(self._read(n) for n in ahead))
            versions: dict[str, str] = {}
            for node, answer in zip(ahead, read, strict=True):
                if answer is not None:
                    version, records = answer
                    versions[node.name] = version
                    await self.store.merge(records)
            behind = [
                n for n in up if versions.get(n.name, n.health.get("keys")) != self.store.version
            ]
            await asyncio.gather(*(self._give(n) for n in behind))

    async def refresh(self) -> bool:
        """Read every node's keys now (a caller presented a key this copy does not know),
        at most once every REFRESH_SPACING seconds; whether a read was made."""
        now = time.monotonic()
        if now - self._refreshed < REFRESH_SPACING:
            return False
        self._refreshed = now
        async with self._lock:
            read = await asyncio.gather(*(self._read(n) for n in self._directory.up()))
            for answer in read:
                if answer is not None:
                    await self.store.merge(answer[1])
        return True

    async def _read(self, node: Node) -> tuple[str, list[Record]] | None:
        try:
            response = await self._http.get(
                node.url + PATH, headers=self._headers, timeout=ANSWER_SECONDS
            )
            document = response.json()
            if response.status_code != 200:
                raise ValueError(f"status {response.status_code}")
            records = [Record.from_json(r) for r in document["keys"]]
            return str(document["version"]), records
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            logger.warning("could not read node %s's API keys: %s", node.name, exc)
            return None

    async def _give(self, node: Node) -> bool:
        body = {"keys": [r.to_json() for r in self.store.records()]}
        try:
            response = await self._http.put(
                node.url + PATH, json=body, headers=self._headers, timeout=ANSWER_SECONDS
            )
        except httpx.HTTPError as exc:
            logger.warning("could not give node %s the API keys: %s", node.name, exc)
            return False
        if response.status_code != 200:
            logger.warning(
                "node %s refused the API keys (%d): %s",
                node.name,
                response.status_code,
                response.text[:200],
            )
            return False
        return True

    @contextlib.asynccontextmanager
    async def session_for(self, principal: Principal) -> AsyncIterator[None]:
        """Around a new session placed for `principal`: refused (QuotaExceeded) when its key
        holds its `max_sessions` across the cluster (every up node's count, and the creates
        this router has under way for it)."""
        quota, key_id = principal.quotas.max_sessions, principal.key_id
        if key_id is None or quota is None:
            yield
            return
        counts = await asyncio.gather(*(self._held(n, key_id) for n in self._directory.up()))
        held = sum(counts) + self._creating.get(key_id, 0)
        if held >= quota:
            raise QuotaExceeded(
                f"key {principal.name!r} holds its quota of {quota} sessions (max_sessions, "
                "across the cluster; E2B sandboxes and their contexts count); delete one first"
            )
        self._creating[key_id] = self._creating.get(key_id, 0) + 1
        try:
            yield
        finally:
            self._creating[key_id] -= 1
            if not self._creating[key_id]:
                del self._creating[key_id]

    async def _held(self, node: Node, key_id: str) -> int:
        try:
            response = await self._http.get(
                f"{node.url}/keys/{key_id}/usage", headers=self._headers, timeout=ANSWER_SECONDS
            )
            held = response.json()["sessions_held"] if response.status_code == 200 else 0
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return 0  # a node not heard holds what it holds: its own check still applies
        return held if isinstance(held, int) else 0

    async def resolve(self, secret: str) -> bool:
        """Called for a credential no key of this copy has: whether reading the nodes' keys
        now found it. Only what has a key's form is looked for."""
        if not (secret.startswith(SECRET_PREFIX) and len(secret) == SECRET_LENGTH):
            return False
        return await self.refresh() and self.store.resolve(secret) is not None


# -- the routes --------------------------------------------------------------------------


def _state(request: Request) -> tuple[NodeDirectory, Proxy, KeyReplica]:
    s = request.state
    return s.directory, s.proxy, s.keys


async def change(request: Request) -> Response:
    """A change to the keys (make, new quotas, new secret, revoke), made on one node and
    given to all before it is answered; reads are any node's (they all hold every key)."""
    directory, proxy, replica = _state(request)
    body = await read_body(request, MAX_BODY) if request.method in ("POST", "PATCH") else None
    path = request.url.path
    for node in sorted(directory.up(), key=lambda n: n.name):
        try:
            upstream = await proxy.send(node, request, path, body, answer_within=ANSWER_SECONDS)
        except NodeUnreachable:
            continue
        try:
            await upstream.aread()
        finally:
            await upstream.aclose()
        if request.method != "GET" and upstream.status_code < 300:
            await replica.sync(changed=node)
        headers = {
            k: v
            for k, v in upstream.headers.items()
            if k.lower() in ("content-type", "location", "cache-control", "retry-after")
        }
        return Response(upstream.content, status_code=upstream.status_code, headers=headers)
    raise NodeUnavailable(
        "no node of the cluster answers now; retry shortly", retry_after=RETRY_AFTER
    )


USAGE_SUMMED = (
    "sessions_created",
    "stateless_requests",
    "kernel_seconds",
    "cpu_seconds",
    "egress_bytes",
    "sessions_held",
)


async def usage(request: Request) -> Response:
    """A key's usage: the sum of every node's (the most memory: the largest). A node that
    does not answer is named in `unavailable_nodes`."""
    directory, proxy, _ = _state(request)
    up = directory.up()

    async def ask(node: Node) -> dict[str, Any] | Response | None:
        try:
            upstream = await proxy.send(
                node, request, request.url.path, None, answer_within=ANSWER_SECONDS
            )
        except (NodeUnreachable, GatewayError):
            return None
        try:
            await upstream.aread()
        finally:
            await upstream.aclose()
        if upstream.status_code != 200:  # 404 (no such key, or not the caller's) is for all
            kind = upstream.headers.get("content-type", "application/json")
            return Response(upstream.content, upstream.status_code, media_type=kind)
        try:
            document = upstream.json()
        except ValueError:
            return None
        return document if isinstance(document, dict) else None

    answers = await asyncio.gather(*(ask(n) for n in up))
    refused = next((a for a in answers if isinstance(a, Response)), None)
    if refused is not None:
        return refused
    found = [a for a in answers if isinstance(a, dict)]
    if not found:
        raise NodeUnavailable(
            "no node of the cluster answers now; retry shortly", retry_after=RETRY_AFTER
        )
    total: dict[str, Any] = {
        name: round(sum(float(a.get(name, 0)) for a in found), 3) for name in USAGE_SUMMED
    }
    for name in ("sessions_created", "stateless_requests", "egress_bytes", "sessions_held"):
        total[name] = int(total[name])
    total["peak_memory_bytes"] = max(int(a.get("peak_memory_bytes", 0)) for a in found)
    missing = sorted(n.name for n, a in zip(up, answers, strict=True) if a is None)
    missing += sorted(n.name for n in directory.nodes.values() if n.state != "up")
    if missing:
        total["unavailable_nodes"] = missing
    return JSONResponse(total)


routes = [
    Route("/keys", change, methods=["GET", "POST"]),
    Route("/keys/{key_id}", change, methods=["GET", "PATCH", "DELETE"]),
    Route("/keys/{key_id}/rotate", change, methods=["POST"]),
    Route("/keys/{key_id}/usage", usage, methods=["GET"]),
]
