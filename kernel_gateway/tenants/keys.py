"""API keys: made, listed, rotated, revoked; kept in SQLite, by hash only.

A key's secret is `e2b_` and 48 hex digits (192 random bits), the form E2B's SDKs accept
as an API key, so any key works as `E2B_API_KEY`. It is shown once, when it is made or
rotated; the file keeps its SHA-256 digest (a random secret of that size needs no slow
hash) and its first characters, to tell keys apart in a list.

The file (`keys.sqlite3` in the runtime folder, made with the first key: a gateway that
never made one leaves nothing behind) is written by one thread in transactions,
so a crash keeps each change whole or not at all; every live key is also held in memory,
so a request's key is found without touching the disk. A revoked key's row stays (its
usage is still asked for), its secret no longer resolves, and whoever is waiting on it
(an open stream) is told at once.

In a cluster every node gateway holds every key, and the routers keep them in step
(`cluster/keys.py`): a node's `records()` (each key with its secret's digest and when it
last changed) are read and `merge`d into the others. Merging keeps, for each key, its
latest change, and a revocation over any change (it is final); two keys made at once
under one name keep it for the older and give the newer `<name>~<6 of its id>`, the same
on every node. A router holds a copy in memory (`KeyStore(None)`), to know its callers.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import secrets
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from kernel_gateway.errors import Conflict, InvalidRequest, KeyNotFound
from kernel_gateway.tenants.key_records import Key, Record
from kernel_gateway.tenants.principal import ADMIN_NAME, Principal, Quotas
from kernel_gateway.tenants.usage import COLUMNS, USAGE_SCHEMA, Usage

SECRET_PREFIX = "e2b_"
SECRET_LENGTH = len(SECRET_PREFIX) + 48
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHOWN = 12
"""Characters of a secret kept to tell keys apart (`e2b_` and 8 hex digits)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    digest BLOB NOT NULL UNIQUE,
    shown TEXT NOT NULL,
    created_at TEXT NOT NULL,
    rotated_at TEXT,
    revoked_at TEXT,
    quotas TEXT NOT NULL,
    changed_at TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS live_names ON keys (name) WHERE revoked_at IS NULL;
"""

T = TypeVar("T")


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def check_name(name: str) -> str:
    if not KEY_NAME.fullmatch(name):
        raise InvalidRequest(
            f"a key's name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
            f"digit; got {name!r}"
        )
    if name == ADMIN_NAME:
        raise InvalidRequest(f"{ADMIN_NAME!r} names the admin token; choose another name")
    return name


P = ParamSpec("P")
R = TypeVar("R")


def _one_at_a_time(
    change: Callable[Concatenate[KeyStore, P], Awaitable[R]],
) -> Callable[Concatenate[KeyStore, P], Awaitable[R]]:
    """A change of the store made alone: its check, its write and its hold in memory."""

    @functools.wraps(change)
    async def alone(store: KeyStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        async with store._changing:
            return await change(store, *args, **kwargs)

    return alone


class KeyStore:
    """The keys in `path`, opened by `open()` (blocking: call it in a thread)."""

    def __init__(self, path: Path | None, busy_timeout: float = 5.0) -> None:
        """`path` None: kept in memory only (a router's copy of its cluster's keys).
        `busy_timeout`: how long a change waits for another process holding the file
        (`kernel-gateway keys` beside a running gateway) before it fails."""
        self.path = path
        self._busy_timeout = busy_timeout
        self._db: sqlite3.Connection | None = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="key-store")
        self._by_digest: dict[bytes, Key] = {}
        self._by_id: dict[str, Key] = {}
        self._digests: dict[str, bytes] = {}  # every key's, revoked ones' too
        self._version: str | None = None
        self._changing = asyncio.Lock()
        """Held by each change from its check to its hold (a merge must not undo a
        revocation under way)."""
        self._watchers: dict[str, list[Callable[[], None]]] = {}
        self._usage: dict[str, Usage] = {}
        self._unsaved: set[str] = set()

    # -- opening and closing -------------------------------------------------------------

    def open(self) -> None:
        self._writer.submit(self._open).result()

    def _open(self) -> None:
        if self.path is None or self.path.exists():
            self._connect()
            self._load()

    def _connect(self) -> None:
        if self.path is None:
            db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        else:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout,
            )
            self.path.chmod(0o600)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA + USAGE_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(keys)")}
        if "changed_at" not in columns:  # a file from before clusters shared keys
            db.execute("ALTER TABLE keys ADD COLUMN changed_at TEXT")
        counted = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
        for missing in [c for c in COLUMNS if c not in counted]:  # counted since it was made
            db.execute(f"ALTER TABLE usage ADD COLUMN {missing} INTEGER NOT NULL DEFAULT 0")
        self._db = db

    def reload(self) -> None:
        """Read the file again (another process may have changed it: `kernel-gateway keys`
        with the gateway stopped, or a router beside this one). Blocking."""
        self._writer.submit(self._load).result()

    def _load(self) -> None:
        if self._db is None:
            if self.path is not None and not self.path.exists():
                return
            self._connect()
        assert self._db is not None
        rows = self._db.execute(
            "SELECT id, name, shown, created_at, rotated_at, revoked_at, quotas, changed_at, "
            "digest FROM keys"
        ).fetchall()
        by_id: dict[str, Key] = {}
        by_digest: dict[bytes, Key] = {}
        digests: dict[str, bytes] = {}
        for row in rows:
            key = Key.from_row(row[:8])
            by_id[key.id] = key
            digests[key.id] = bytes(row[8])
            if key.revoked_at is None:
                by_digest[bytes(row[8])] = key
        gone = [
            k
            for k in self._by_id.values()
            if k.revoked_at is None and (k.id not in by_id or by_id[k.id].revoked_at is not None)
        ]
        self._by_id, self._by_digest, self._digests = by_id, by_digest, digests
        self._version = None
        columns = ", ".join(COLUMNS)
        for key_id, *values in self._db.execute(f"SELECT key_id, {columns} FROM usage"):
            if key_id not in self._unsaved:
                self._usage[key_id] = Usage(*values)
        for key in gone:
            self._tell(key.id)

    def close(self) -> None:
        """Close the file (blocking); `open()` may open it again."""
        if self._db is not None:
            self._writer.submit(self._db.close).result()
            self._db = None

    # -- reading (in memory, never the disk) ---------------------------------------------

    def resolve(self, secret: str) -> Principal | None:
        """The principal a secret stands for, if it is a live key's."""
        key = self._by_digest.get(digest(secret))
        return None if key is None else key.principal

    def get(self, key_id: str) -> Key:
        key = self._by_id.get(key_id)
        if key is None:
            raise KeyNotFound(f"no key with id {key_id!r}")
        return key

    def principal(self, key_id: str) -> Principal:
        """The principal of key `key_id` as it is now (a revoked key's as it was; one never
        known: no quotas)."""
        key = self._by_id.get(key_id)
        return key.principal if key is not None else Principal(key_id, key_id)

    # -- usage (tenants/usage.py) ----------------------------------------------------------

    def count(
        self,
        key_id: str | None,
        *,
        sessions: int = 0,
        stateless: int = 0,
        kernel_seconds: float = 0.0,
        cpu_seconds: float = 0.0,
        memory_bytes: int = 0,
        egress_bytes: int = 0,
    ) -> None:
        """Add to a key's usage (in memory; `save_usage` writes it). The admin's (None) and
        unknown keys' are not counted."""
        if key_id is None or key_id not in self._by_id:
            return
        used = self._usage.setdefault(key_id, Usage())
        used.sessions_created += sessions
        used.stateless_requests += stateless
        used.kernel_seconds += kernel_seconds
        used.cpu_seconds += cpu_seconds
        used.peak_memory_bytes = max(used.peak_memory_bytes, memory_bytes)
        used.egress_bytes += egress_bytes
        self._unsaved.add(key_id)

    def usage(self, key_id: str) -> Usage:
        self.get(key_id)
        return self._usage.get(key_id) or Usage()

    def usage_by_name(self) -> list[tuple[str, Usage]]:
        """Every key's usage, by its name (a revoked key's too), for the metrics."""
        return [(self._by_id[k].name, u) for k, u in self._usage.items() if k in self._by_id]

    async def save_usage(self) -> None:
        """Write what was counted since the last save, in one transaction."""
        if not self._unsaved:
            return
        saving, self._unsaved = self._unsaved, set()
        rows = [(k, *self._usage[k].row()) for k in saving]
        marks = ", ".join("?" for _ in range(len(COLUMNS) + 1))

        def upsert(db: sqlite3.Connection) -> None:
            columns = ", ".join(COLUMNS)
            db.executemany(
                f"INSERT OR REPLACE INTO usage (key_id, {columns}) VALUES ({marks})", rows
            )

        try:
            await self._write(upsert)
        except sqlite3.Error:
            self._unsaved |= saving  # written with the next save
            raise

    def name_of(self, key_id: str) -> str:
        """A key's name (its id, for one never known): what logs and metrics call it."""
        return self.principal(key_id).name

    def keys(self, revoked: bool = False) -> list[Key]:
        """Live keys (and revoked ones when asked), oldest first."""
        found = [k for k in self._by_id.values() if revoked or k.revoked_at is None]
        return sorted(found, key=lambda k: (k.created_at, k.id))

    def by_name(self, name: str) -> Key | None:
        return next(
            (k for k in self._by_id.values() if k.name == name and k.revoked_at is None), None
        )

    def known(self, key_id: str) -> bool:
        """Whether `key_id` is a key held here (live or revoked)."""
        return key_id in self._by_id

    def live(self, key_id: str | None) -> bool:
        """Whether `key_id` is still a live key (the admin always is)."""
        if key_id is None:
            return True
        key = self._by_id.get(key_id)
        return key is not None and key.revoked_at is None

    def watch(self, key_id: str, revoked: Callable[[], None]) -> Callable[[], None]:
        """Call `revoked` when the key is revoked or rotated; returns the call that stops it."""
        self._watchers.setdefault(key_id, []).append(revoked)

        def stop() -> None:
            watchers = self._watchers.get(key_id, [])
            if revoked in watchers:
                watchers.remove(revoked)
            if not watchers:
                self._watchers.pop(key_id, None)

        return stop

    # -- changes (one thread, one transaction each) --------------------------------------

    @_one_at_a_time
    async def create(self, name: str, quotas: Quotas) -> tuple[Key, str]:
        check_name(name)
        secret = SECRET_PREFIX + secrets.token_hex(24)
        made = now()
        key_id = f"key_{uuid.uuid4().hex[:16]}"
        key = Key(key_id, name, secret[:SHOWN], made, None, None, quotas, made)
        record = Record(key, digest(secret))

        def insert(db: sqlite3.Connection) -> None:
            _insert(db, record)

        try:
            await self._write(insert)
        except sqlite3.IntegrityError:
            raise Conflict(f"a live key is already named {name!r}") from None
        self._hold(record)
        return key, secret

    @_one_at_a_time
    async def rotate(self, key_id: str) -> tuple[Key, str]:
        """A new secret for the key; the old one stops working at once (open streams end)."""
        old = self._live(key_id)
        secret = SECRET_PREFIX + secrets.token_hex(24)
        at = now()
        key = replace(old, shown=secret[:SHOWN], rotated_at=at, changed_at=at)

        def update(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE keys SET digest = ?, shown = ?, rotated_at = ?, changed_at = ? "
                "WHERE id = ?",
                (digest(secret), key.shown, at, at, key_id),
            )

        await self._write(update)
        self._hold(Record(key, digest(secret)))
        self._tell(key_id)
        return key, secret

    @_one_at_a_time
    async def rename(self, key_id: str, name: str) -> Key:
        """A new name for a live key (unique among live keys): its metrics and log lines
        use it from now on."""
        check_name(name)
        key = replace(self._live(key_id), name=name, changed_at=now())

        def update(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE keys SET name = ?, changed_at = ? WHERE id = ?",
                (name, key.changed_at, key_id),
            )

        try:
            await self._write(update)
        except sqlite3.IntegrityError:
            raise Conflict(f"a live key is already named {name!r}") from None
        self._replace(key)
        return key

    def _replace(self, key: Key) -> None:
        self._hold(Record(key, self._digests[key.id]))

    @_one_at_a_time
    async def set_quotas(self, key_id: str, quotas: Quotas) -> Key:
        key = replace(self._live(key_id), quotas=quotas, changed_at=now())

        def update(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE keys SET quotas = ?, changed_at = ? WHERE id = ?",
                (json.dumps(quotas.to_json()), key.changed_at, key_id),
            )

        await self._write(update)
        self._replace(key)
        return key

    @_one_at_a_time
    async def revoke(self, key_id: str) -> Key:
        at = now()
        key = replace(self._live(key_id), revoked_at=at, changed_at=at)

        def update(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE keys SET revoked_at = ?, changed_at = ? WHERE id = ?", (at, at, key_id)
            )

        await self._write(update)
        self._hold(Record(key, self._digests[key_id]))
        self._tell(key_id)
        return key

    # -- a cluster's copies ----------------------------------------------------------------

    def records(self) -> list[Record]:
        """Every key (revoked ones too) with its secret's digest, for another replica."""
        return [Record(k, self._digests[k.id]) for k in self.keys(revoked=True)]

    @property
    def version(self) -> str:
        """A short digest of every key's last change: two replicas with the same version
        hold the same keys (a router compares them to know which node needs what)."""
        if self._version is None:
            lines = sorted(
                f"{k.id} {k.name} {k.changed_at} {k.revoked_at}" for k in self._by_id.values()
            )
            self._version = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
        return self._version

    @_one_at_a_time
    async def merge(self, records: Iterable[Record]) -> int:
        """Take each record newer than what is held (`Record.newer_than`); returns how many
        were taken. A key revoked or given a new secret by it stops working here at once."""
        taken: dict[str, Record] = {}
        holders = {found: key_id for key_id, found in self._digests.items()}
        for record in records:
            held = self._record(record.key.id)
            if holders.setdefault(record.digest, record.key.id) != record.key.id:
                continue  # another key's digest: never (a 192-bit secret), but never merge it
            if held is None or record.newer_than(held):
                taken[record.key.id] = record
        if not taken:
            return 0
        taken.update(self._renamed(taken))

        def upsert(db: sqlite3.Connection) -> None:
            marks = ", ".join("?" for _ in taken)
            db.execute(f"DELETE FROM keys WHERE id IN ({marks})", list(taken))
            for record in taken.values():
                _insert(db, record)

        try:
            await self._write(upsert)
        except sqlite3.IntegrityError as exc:  # a name made unique clashes again: none taken
            raise Conflict(f"the keys could not be merged: {exc}") from None
        for record in taken.values():
            before = self._by_id.get(record.key.id)
            was_live = before is not None and before.revoked_at is None
            changed = self._digests.get(record.key.id) != record.digest
            ended = record.key.revoked_at is not None or changed
            self._hold(record)
            if was_live and ended:
                self._tell(record.key.id)
        return len(taken)

    def _record(self, key_id: str) -> Record | None:
        key = self._by_id.get(key_id)
        return None if key is None else Record(key, self._digests[key_id])

    def _renamed(self, taken: dict[str, Record]) -> dict[str, Record]:
        """The live keys that must change name for live names to stay unique once `taken`
        is held: of two with one name, the later made (then the greater id)."""
        after = {k.id: k for k in self._by_id.values()} | {i: r.key for i, r in taken.items()}
        named: dict[str, list[Key]] = {}
        for key in after.values():
            if key.revoked_at is None:
                named.setdefault(key.name, []).append(key)
        renamed: dict[str, Record] = {}
        for name, keys in named.items():
            for key in sorted(keys, key=lambda k: (k.created_at, k.id))[1:]:
                new = replace(key, name=f"{name[:57]}~{key.id[-6:]}")
                found = taken.get(key.id) or self._record(key.id)
                assert found is not None
                renamed[key.id] = Record(new, found.digest)
        return renamed

    def _hold(self, record: Record) -> None:
        """Hold `record` in memory (once written): its key by id, its digest if it is live."""
        key = record.key
        self._forget_secret(key.id)
        self._by_id[key.id] = key
        self._digests[key.id] = record.digest
        if key.revoked_at is None:
            self._by_digest[record.digest] = key
        self._version = None

    def _live(self, key_id: str) -> Key:
        key = self.get(key_id)
        if key.revoked_at is not None:
            raise KeyNotFound(f"key {key_id!r} was revoked at {key.revoked_at}")
        return key

    def _forget_secret(self, key_id: str) -> None:
        for found in [d for d, k in self._by_digest.items() if k.id == key_id]:
            del self._by_digest[found]

    def _tell(self, key_id: str) -> None:
        for revoked in list(self._watchers.get(key_id, [])):
            revoked()

    async def _write(self, change: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            if self._db is None:
                self._connect()  # the first key: the file is made now
            assert self._db is not None
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = change(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, run)


def _insert(db: sqlite3.Connection, record: Record) -> None:
    key = record.key
    db.execute(
        "INSERT INTO keys (id, name, digest, shown, created_at, rotated_at, revoked_at, "
        "quotas, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            key.id,
            key.name,
            record.digest,
            key.shown,
            key.created_at,
            key.rotated_at,
            key.revoked_at,
            json.dumps(key.quotas.to_json()),
            key.changed_at,
        ),
    )
