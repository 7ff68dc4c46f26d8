"""API keys: the store (hashes only, survives reopening), the rate limiter, who a
credential stands for, and requests ended when their key is revoked."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from starlette.types import Message, Receive, Scope, Send

from kernel_gateway.errors import Conflict, InvalidRequest, KeyNotFound, RateLimited
from kernel_gateway.http.auth import Authenticator, BearerAuth, principal_of
from kernel_gateway.tenants.key_records import Record
from kernel_gateway.tenants.keys import KeyStore
from kernel_gateway.tenants.principal import ADMIN, Principal, Quotas
from kernel_gateway.tenants.rate import RateLimiter


def written(path: Path) -> bytes:
    """What the store's files hold: the database and its write-ahead log."""
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def file_of(store: KeyStore) -> Path:
    assert store.path is not None
    return store.path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KeyStore]:
    keys = KeyStore(tmp_path / "keys.sqlite3")
    keys.open()
    yield keys
    keys.close()


async def test_a_key_is_kept_as_a_hash_and_resolves_to_its_principal(store: KeyStore) -> None:
    key, secret = await store.create("ci-agent", Quotas(max_sessions=3))
    assert secret.startswith("e2b_") and len(secret) == 4 + 48
    assert int(secret[4:], 16) >= 0  # hex: the form E2B's SDKs accept
    assert key.shown == secret[:12] and key.id.startswith("key_")
    found = store.resolve(secret)
    assert found == Principal(key.id, "ci-agent", Quotas(max_sessions=3))
    assert store.resolve(secret + "x") is None and store.resolve("") is None
    raw = await asyncio.to_thread(written, file_of(store))
    assert secret.encode() not in raw and key.shown.encode() in raw  # its digest, not it
    assert (file_of(store).stat().st_mode & 0o777) == 0o600


async def test_no_file_is_made_until_the_first_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "rt" / "keys.sqlite3")
    store.open()
    assert store.keys() == [] and not (tmp_path / "rt").exists()
    await store.create("first", Quotas())
    assert file_of(store).exists()
    store.close()
    assert sorted(p.name for p in file_of(store).parent.iterdir()) == ["keys.sqlite3"]


async def test_keys_survive_reopening_and_revocation_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    first = KeyStore(path)
    first.open()
    kept, kept_secret = await first.create("kept", Quotas(requests_per_minute=60))
    gone, gone_secret = await first.create("gone", Quotas())
    await first.revoke(gone.id)
    first.close()
    again = KeyStore(path)
    again.open()
    try:
        assert again.resolve(kept_secret) == kept.principal
        assert again.resolve(gone_secret) is None
        assert [k.name for k in again.keys()] == ["kept"]
        assert [k.name for k in again.keys(revoked=True)] == ["kept", "gone"]
        assert again.get(gone.id).revoked_at is not None
        assert again.principal(gone.id).name == "gone"  # its usage still has a name
    finally:
        again.close()


async def test_names_are_unique_among_live_keys_and_checked(store: KeyStore) -> None:
    first, _ = await store.create("agent", Quotas())
    with pytest.raises(Conflict, match="already named 'agent'"):
        await store.create("agent", Quotas())
    await store.revoke(first.id)
    await store.create("agent", Quotas())  # a revoked key's name is free again
    for bad in ("", "-x", "a b", "x" * 65, "admin"):
        with pytest.raises(InvalidRequest):
            await store.create(bad, Quotas())


async def test_rotation_replaces_the_secret_at_once(store: KeyStore) -> None:
    key, old = await store.create("rotating", Quotas())
    told: list[str] = []
    stop = store.watch(key.id, lambda: told.append("rotated"))
    rotated, new = await store.rotate(key.id)
    assert new != old and store.resolve(old) is None
    assert store.resolve(new) == rotated.principal and rotated.rotated_at is not None
    assert told == ["rotated"]
    stop()
    await store.revoke(key.id)
    assert told == ["rotated"]  # no longer watched
    with pytest.raises(KeyNotFound, match="was revoked"):
        await store.rotate(key.id)
    with pytest.raises(KeyNotFound):
        store.get("key_nope")


async def test_quotas_change_for_the_next_requests(store: KeyStore) -> None:
    key, secret = await store.create("q", Quotas(max_sessions=1))
    await store.set_quotas(key.id, Quotas(max_sessions=5, max_stateless=2))
    found = store.resolve(secret)
    assert found is not None and found.quotas == Quotas(max_sessions=5, max_stateless=2)


async def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.sqlite3", busy_timeout=0.1)
    store.open()
    try:
        key, secret = await store.create("whole", Quotas())
        other = sqlite3.connect(file_of(store), isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # another process holds the file
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await store.revoke(key.id)
        other.execute("ROLLBACK")
        other.close()
        assert store.resolve(secret) == key.principal and store.get(key.id).revoked_at is None
    finally:
        store.close()


def test_a_key_may_burst_its_rate_then_waits() -> None:
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    key = Principal("key_a", "a", Quotas(requests_per_minute=3))
    other = Principal("key_b", "b", Quotas(requests_per_minute=3))
    for _ in range(3):
        limiter.take(key)
    with pytest.raises(RateLimited) as limited:
        limiter.take(key)
    assert limited.value.retry_after == 20 and "3 requests a minute" in limited.value.message
    limiter.take(other)  # another key's bucket is its own
    now[0] += 20
    limiter.take(key)
    with pytest.raises(RateLimited):
        limiter.take(key)
    for _ in range(100):
        limiter.take(ADMIN)  # the admin is not counted
        limiter.take(Principal("key_c", "c"))  # nor a key without a rate quota


async def test_the_token_and_keys_stand_for_their_principals(store: KeyStore) -> None:
    key, secret = await store.create("k", Quotas())
    closed = Authenticator("admin-token", store)
    assert closed.principal("admin-token") is ADMIN
    assert closed.principal(secret) == key.principal
    assert closed.principal("wrong") is None and closed.principal("") is None
    opened = Authenticator(None, store)
    assert opened.principal("") is ADMIN and opened.principal("anything") is ADMIN
    assert opened.principal(secret) == key.principal  # a key acts as itself, even here


async def test_a_revoked_keys_open_request_hears_its_client_leave(store: KeyStore) -> None:
    key, secret = await store.create("streaming", Quotas())
    heard: list[Message] = []
    started = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert principal_of(scope) == key.principal
        started.set()
        heard.append(await receive())  # a stream waits on this for the client to leave

    never = asyncio.Event()

    async def client_stays() -> Message:
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    scope: Scope = {
        "type": "http",
        "path": "/sessions/x/executions/1/events",
        "headers": [(b"authorization", f"Bearer {secret}".encode())],
    }
    auth = BearerAuth(app, Authenticator("admin-token", store))
    request = asyncio.create_task(auth(scope, client_stays, send))
    await asyncio.wait_for(started.wait(), 5)
    await store.revoke(key.id)
    await asyncio.wait_for(request, 5)
    assert heard == [{"type": "http.disconnect"}]


async def test_usage_is_counted_per_key_kept_and_shown_as_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kernel_gateway.tenants.usage import UsageCollector

    path = tmp_path / "keys.sqlite3"
    store = KeyStore(path)
    store.open()
    key, _ = await store.create("busy", Quotas())
    store.count(key.id, sessions=1)
    store.count(key.id, stateless=2, kernel_seconds=5.0, cpu_seconds=1.5, memory_bytes=100)
    store.count(key.id, kernel_seconds=5.0, memory_bytes=40)  # the peak stays
    store.count(None, sessions=7)  # the admin's: not counted
    store.count("key_unknown", sessions=7)
    used = store.usage(key.id)
    assert (used.sessions_created, used.stateless_requests) == (1, 2)
    assert (used.kernel_seconds, used.cpu_seconds, used.peak_memory_bytes) == (10.0, 1.5, 100)
    registry = CollectorRegistry()
    registry.register(UsageCollector(store.usage_by_name))
    exposition = generate_latest(registry).decode()
    assert 'kernel_gateway_key_sessions_created_total{key="busy"} 1.0' in exposition
    assert 'kernel_gateway_key_peak_memory_bytes{key="busy"} 100.0' in exposition
    await store.save_usage()
    store.count(key.id, sessions=1)  # not saved: lost with a crash, as the docs say
    store.close()
    again = KeyStore(path)
    again.open()
    try:
        kept = again.usage(key.id)
        assert (kept.sessions_created, kept.kernel_seconds) == (1, 10.0)
        with pytest.raises(KeyNotFound):
            again.usage("key_nope")
    finally:
        again.close()


# -- a cluster's copies (merged as its routers do: cluster/keys.py) ---------------------------


async def exchange(*stores: KeyStore) -> None:
    """Every store's records merged into every other, as a router's rounds do."""
    everything = [r for s in stores for r in s.records()]
    for store in stores:
        await store.merge(everything)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[KeyStore, KeyStore]]:
    node, router = KeyStore(tmp_path / "keys.sqlite3"), KeyStore(None)
    node.open()
    router.open()
    yield node, router
    node.close()
    router.close()


async def test_a_key_made_on_one_copy_works_on_another_and_survives_there(
    tmp_path: Path, pair: tuple[KeyStore, KeyStore]
) -> None:
    node, router = pair
    key, secret = await router.create("agent", Quotas(max_sessions=2))
    assert node.resolve(secret) is None and node.version != router.version
    assert await node.merge(router.records()) == 1
    assert node.resolve(secret) == router.resolve(secret) == key.principal
    assert node.version == router.version
    assert await node.merge(router.records()) == 0  # nothing newer: nothing written
    node.close()
    again = KeyStore(tmp_path / "keys.sqlite3")
    again.open()
    assert again.resolve(secret) == key.principal and again.version == router.version
    again.close()


async def test_a_revocation_is_final_and_ends_what_waits_on_the_key(
    pair: tuple[KeyStore, KeyStore],
) -> None:
    node, router = pair
    key, secret = await router.create("agent", Quotas())
    await exchange(node, router)
    told: list[str] = []
    node.watch(key.id, lambda: told.append("revoked"))
    await router.revoke(key.id)
    later = await node.set_quotas(key.id, Quotas(max_sessions=9))  # after the revocation
    assert later.changed_at >= str(router.get(key.id).revoked_at)
    await exchange(node, router)
    assert told == ["revoked"]
    assert node.resolve(secret) is None and router.resolve(secret) is None
    assert node.get(key.id).revoked_at == router.get(key.id).revoked_at is not None
    assert node.version == router.version


async def test_the_latest_change_wins_everywhere(pair: tuple[KeyStore, KeyStore]) -> None:
    node, router = pair
    key, _ = await node.create("agent", Quotas())
    await exchange(node, router)
    _, old_secret = await router.rotate(key.id)
    await asyncio.sleep(0.002)  # changes are stamped to the millisecond
    _, new_secret = await node.rotate(key.id)
    await exchange(node, router)
    for store in (node, router):
        assert store.resolve(new_secret) is not None and store.resolve(old_secret) is None
    assert node.version == router.version


async def test_two_keys_made_at_once_under_one_name_are_told_apart_alike(
    pair: tuple[KeyStore, KeyStore],
) -> None:
    node, router = pair
    first, _ = await node.create("agent", Quotas())
    await asyncio.sleep(0.002)
    second, second_secret = await router.create("agent", Quotas())
    await exchange(node, router)
    for store in (node, router):
        assert store.get(first.id).name == "agent"
        assert store.get(second.id).name == f"agent~{second.id[-6:]}"
        assert store.resolve(second_secret) is not None
    assert node.version == router.version


async def test_a_file_from_before_clusters_is_read_and_merged(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    store = KeyStore(path)
    store.open()
    key, secret = await store.create("old", Quotas())
    store.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("ALTER TABLE keys DROP COLUMN changed_at")  # as the last release wrote it
    db.close()
    again = KeyStore(path)
    again.open()
    assert again.resolve(secret) == key.principal
    assert again.get(key.id).changed_at == key.created_at
    copy = KeyStore(None)
    copy.open()
    await copy.merge(again.records())
    assert copy.resolve(secret) == key.principal and copy.version == again.version
    again.close()
    copy.close()


async def test_the_admin_token_acts_for_a_key_a_router_names_and_nobody_else_can(
    store: KeyStore,
) -> None:
    key, secret = await store.create("agent", Quotas(requests_per_minute=1))
    seen: list[Principal] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(principal_of(scope))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def ask(credential: str, acting: str | None) -> int:
        headers = [(b"authorization", f"Bearer {credential}".encode())]
        if acting is not None:
            headers.append((b"kernel-gateway-key", acting.encode()))
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        async def receive() -> Message:
            return {"type": "http.request", "body": b""}

        scope: Scope = {"type": "http", "path": "/sessions", "headers": headers}
        await BearerAuth(app, Authenticator("admin-token", store))(scope, receive, send)
        return int(sent[0]["status"])

    # The router counted the key's rate: the node does not count it again.
    assert [await ask("admin-token", key.id) for _ in range(3)] == [204, 204, 204]
    assert seen == [key.principal] * 3
    assert await ask(secret, "key_0000000000000000") == 204  # a key cannot act for another
    assert seen[-1] == key.principal
    assert await ask("admin-token", "key_0000000000000000") == 503  # not here yet: retry
    await store.revoke(key.id)
    assert await ask("admin-token", key.id) == 401


async def test_a_merge_never_takes_one_digest_for_two_keys(
    pair: tuple[KeyStore, KeyStore],
) -> None:
    node, router = pair
    key, secret = await router.create("agent", Quotas())
    (record,) = router.records()
    twin = Record(replace(record.key, id="key_" + "1" * 16, name="twin"), record.digest)
    assert await node.merge([record, twin]) == 1
    assert node.resolve(secret) == key.principal and not node.known(twin.key.id)
    assert await node.merge([twin]) == 0


async def test_replicas_agree_on_every_pair_of_words_on_a_key(
    pair: tuple[KeyStore, KeyStore],
) -> None:
    """Two revocations made apart: the first stands everywhere; a merge racing a revocation
    never brings the key back."""
    node, router = pair
    key, secret = await router.create("agent", Quotas())
    await exchange(node, router)
    await router.revoke(key.id)
    await asyncio.sleep(0.002)
    await node.revoke(key.id)
    await exchange(node, router)
    assert node.get(key.id).revoked_at == router.get(key.id).revoked_at
    assert node.version == router.version
    other, other_secret = await router.create("other", Quotas())
    await exchange(node, router)
    live = router.records()
    await asyncio.sleep(0.002)
    await asyncio.gather(node.revoke(other.id), node.merge(live))  # the older word, at once
    assert node.resolve(other_secret) is None and node.get(other.id).revoked_at is not None


async def test_the_typed_json_of_a_key_is_the_routers_untyped_one(store: KeyStore) -> None:
    from kernel_gateway.tenants.key_json import key_json, record_json

    key, _ = await store.create("both", Quotas(max_sessions=1, cpus=0.5, disk_bytes=2**26))
    await store.revoke(key.id)
    (record,) = store.records()
    assert dict(key_json(record.key)) == record.key.to_json()
    assert dict(record_json(record)) == record.to_json()
    assert Record.from_json(record.to_json()) == record
