"""Snapshots and forks: a named, persistent copy of a session (its files and, for Python,
its variables), new sessions started from one, and forks (copies of a running session).

A snapshot is a folder of the gateway's, `<runtime>/snapshots/<id>/` (0700): `files.tar`
(the session's working directory, /tmp and home, `kernels/sandbox_files.py`), `namespace`
(a Python kernel's variables, written as hibernation writes them) and `snapshot.json` (what
it is). Both files are written inside the sandbox, by the kernel and by `tar` as the
kernel's user, and kept without following links: the gateway never reads a session's files
with its own rights. A session made from a snapshot gets them back the same way, from
read-only links: `tar` in the new sandbox unpacks the files, its kernel loads the variables.
The folder is read afresh on every call, so every gateway on the runtime folder (a
successor, one beside it) sees the same snapshots, and they outlive the gateway.

Saving is bounded by `--snapshot-timeout` (the variables, then the files): past it the save
stops, nothing is kept, and the session runs on as it was (`hibernation_failed`, naming the
value that would not save). A name that cannot be pickled is left out and reported, exactly
as hibernation reports it; so are the variables of a kernel that cannot save them (another
language's) and of the session's other kernels (E2B's contexts).

A fork is a snapshot taken for the moment: `count` sessions are started from it at once,
each succeeding or failing on its own, and it is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernel_gateway.errors import (
    RETRY_SAVE,
    Conflict,
    GatewayError,
    HibernationFailed,
    InvalidRequest,
    SessionBusy,
    SnapshotNotFound,
    TooManySnapshots,
)
from kernel_gateway.kernels import sandbox_files
from kernel_gateway.kernels.hibernation import SnapshotError, drop, keep, load, save
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.kernels.volumes import VolumeMount
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.events import LostName
from kernel_gateway.tenants.principal import ADMIN, Principal

logger = logging.getLogger(__name__)

FORMAT = 1
FILES, NAMESPACE, RECORD = "files.tar", "namespace", "snapshot.json"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A snapshot's name (and id): what fits in a path segment and a template reference."""
MAX_FORKS = 100
LOAD_SECONDS = 300.0


@dataclass
class Snapshot:
    """What a snapshot is (`snapshot.json`)."""

    id: str
    name: str | None
    source: str
    """The session it was taken from."""
    language: str
    template: str | None
    """The id of the template the session ran, if any: sessions made from it run it too."""
    network: list[str] | str
    """The session's allowlist, or "none": given again (within the operator's ceiling)."""
    created_at: float
    bytes: int = 0
    lost: list[LostName] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    """What a front door keeps with it (E2B: the sandbox's environment variables)."""
    has_namespace: bool = False
    owner: str | None = None
    """The id of the API key that took it (None: the admin); only it and the admin see it,
    and sessions started from it are its."""

    def to_json(self) -> responses.Snapshot:
        created = datetime.fromtimestamp(self.created_at, UTC).isoformat()
        return {
            "id": self.id,
            "name": self.name,
            "session_id": self.source,
            "language": self.language,
            "template": self.template,
            "created_at": created.replace("+00:00", "Z"),
            "bytes": self.bytes,
            "lost": list(self.lost),
            "owner": self.owner,
        }

    def record(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "id": self.id,
            "name": self.name,
            "source": self.source,
            "language": self.language,
            "template": self.template,
            "network": self.network,
            "created_at": self.created_at,
            "bytes": self.bytes,
            "lost": self.lost,
            "extra": self.extra,
            "has_namespace": self.has_namespace,
            "owner": self.owner,
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Snapshot:
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown snapshot format {data.get('format')!r}")
        network = data["network"]
        return cls(
            id=str(data["id"]),
            name=None if data.get("name") is None else str(data["name"]),
            source=str(data["source"]),
            language=str(data["language"]),
            template=None if data.get("template") is None else str(data["template"]),
            network=network if network == "none" else [str(x) for x in network],
            created_at=float(data["created_at"]),
            bytes=int(data.get("bytes", 0)),
            lost=[{"name": str(x["name"]), "reason": str(x["reason"])} for x in data["lost"]],
            extra=dict(data.get("extra") or {}),
            has_namespace=bool(data.get("has_namespace", False)),
            owner=str(data["owner"]) if data.get("owner") else None,
        )


@dataclass
class Restored:
    """A session made from a snapshot, and what the snapshot did not hold."""

    session: Session
    snapshot_id: str
    lost: list[LostName]


class SnapshotStore:
    """The snapshot folders (every method blocks: call them in a thread)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def open(self) -> None:
        """Remove what a save or swap cut short left (the folder itself is made by the
        first snapshot: a gateway that never takes one leaves nothing behind)."""
        try:
            entries = list(self.folder.iterdir())
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.endswith((".partial", ".old")):
                shutil.rmtree(entry, ignore_errors=True)

    def all(self) -> list[Snapshot]:
        found = []
        try:
            entries = sorted(self.folder.iterdir())
        except FileNotFoundError:
            return []
        for entry in entries:
            if _settled(entry.name) and (entry / RECORD).is_file():
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    found.append(Snapshot.from_record(json.loads((entry / RECORD).read_bytes())))
        return sorted(found, key=lambda s: s.created_at)

    def find(self, reference: str, viewer: Principal) -> Snapshot:
        """By id, else by name, among those `viewer` sees (names are each owner's own: its
        own name first for the admin)."""
        if _settled(reference) and (self.folder / reference / RECORD).is_file():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found = self._read(self.folder / reference)
                if viewer.sees(found.owner):
                    return found
        named = [s for s in self.all() if s.name == reference and viewer.sees(s.owner)]
        for snapshot in sorted(named, key=lambda s: s.owner != viewer.owner):
            return snapshot
        raise SnapshotNotFound(f"no snapshot {reference!r}")

    def _read(self, folder: Path) -> Snapshot:
        return Snapshot.from_record(json.loads((folder / RECORD).read_bytes()))

    def path(self, snapshot: Snapshot) -> Path:
        return self.folder / snapshot.id

    def begin(self, name: str | None = None) -> Path:
        """A new folder for a snapshot being written (`commit` or `abandon` it), called
        `<name>.partial` (a random name by default)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        partial = self.folder / f"{name or secrets.token_hex(8)}.partial"
        partial.mkdir(mode=0o700)
        return partial

    def commit(self, partial: Path, snapshot: Snapshot) -> None:
        """The snapshot written in `partial` is `snapshot` now (one of the same id is
        replaced whole)."""
        (partial / RECORD).write_text(json.dumps(snapshot.record()))
        target = self.folder / snapshot.id
        if target.exists():
            old = target.with_name(f"{snapshot.id}.{secrets.token_hex(4)}.old")
            os.rename(target, old)
            os.rename(partial, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(partial, target)

    def abandon(self, partial: Path) -> None:
        shutil.rmtree(partial, ignore_errors=True)

    def delete(self, snapshot: Snapshot) -> None:
        target = self.folder / snapshot.id
        gone = target.with_name(f"{snapshot.id}.{secrets.token_hex(4)}.old")
        with contextlib.suppress(FileNotFoundError):
            os.rename(target, gone)
            shutil.rmtree(gone, ignore_errors=True)


class SavedSessions:
    """Takes snapshots of sessions, starts sessions from them, and forks sessions."""

    def __init__(self, registry: Registry, store: SnapshotStore) -> None:
        self.registry = registry
        self.settings = registry.settings
        self.store = store
        self._writing = 0
        """Snapshots being written now (counted against `--max-snapshots`)."""

    # -- what the API asks ---------------------------------------------------------------

    async def find(
        self, viewer: Principal, session_id: str | None = None, name: str | None = None
    ) -> list[Snapshot]:
        found = await asyncio.to_thread(self.store.all)
        return [
            s
            for s in found
            if viewer.sees(s.owner)
            and (session_id is None or s.source == session_id)
            and (name is None or name in (s.name, s.id))
        ]

    async def get(self, reference: str, viewer: Principal) -> Snapshot:
        return await asyncio.to_thread(self.store.find, reference, viewer)

    async def delete(self, reference: str, viewer: Principal) -> None:
        snapshot = await self.get(reference, viewer)
        await asyncio.to_thread(self.store.delete, snapshot)
        logger.info("snapshot %s deleted", snapshot.id)

    async def take(
        self, session: Session, name: str | None = None, extra: dict[str, Any] | None = None
    ) -> Snapshot:
        """A snapshot of `session` (running as it was), kept as `name`: one of that name is
        replaced (its id stays). It belongs to the session's owner, as do names."""
        if name is not None and not NAME.fullmatch(name):
            raise InvalidRequest(
                f"'name': {name!r} is not a snapshot name (letters, digits and -_., at most "
                "128, starting with a letter or digit)"
            )
        existing = await self._named(name, session.owner)
        if existing is None:
            held = len(await asyncio.to_thread(self.store.all)) + self._writing
            if held >= self.settings.max_snapshots:
                raise TooManySnapshots(
                    f"this gateway keeps at most {self.settings.max_snapshots} snapshots "
                    "(--max-snapshots); delete one first"
                )
        snapshot_id = existing.id if existing is not None else self._new_id()
        self._writing += 1
        try:
            snapshot = await self._save(session, snapshot_id, name, extra or {}, keep=True)
        finally:
            self._writing -= 1
        logger.info(
            "session %s saved as snapshot %s (%d bytes)", session.id, snapshot.id, snapshot.bytes
        )
        return snapshot

    async def start(
        self,
        reference: str,
        network: list[str] | str | None = None,
        language: str | None = None,
        template: str | None = None,
        mounts: tuple[VolumeMount, ...] = (),
        *,
        owner: Principal,
    ) -> Restored:
        """A new session of `owner`'s from the snapshot `reference` (id or name, one it sees):
        its files, its variables, its language and template, and its network policy unless
        `network` asks another. A `language` or `template` asked as well must be the
        snapshot's (else 409). `mounts`: volumes it mounts (a snapshot holds none of a
        volume's files)."""
        snapshot = await self.get(reference, owner)
        if language is not None:
            asked = self.registry.languages.get_or_raise(language).name
            if asked != snapshot.language:
                raise Conflict(
                    f"snapshot {snapshot.id} is of a {snapshot.language} session, not {asked}"
                )
        if template is not None and template != snapshot.template:
            raise Conflict(
                f"snapshot {snapshot.id} runs "
                + (f"the template {snapshot.template}" if snapshot.template else "no template")
                + f", not {template!r} (leave 'template' out, or give its id)"
            )
        return await self._start(snapshot, self.store.path(snapshot), network, mounts, owner)

    async def fork(
        self, session: Session, count: int, *, owner: Principal
    ) -> list[Restored | GatewayError]:
        """`count` new sessions of `owner`'s, each a copy of `session` as it is now (which
        runs on); each succeeds or fails on its own."""
        if not 1 <= count <= MAX_FORKS:
            raise InvalidRequest(f"'count': from 1 to {MAX_FORKS}, not {count}")
        snapshot = await self._save(session, self._new_id(), None, {}, keep=False)
        folder = self.store.folder / f"{snapshot.id}.partial"
        try:
            results = await asyncio.gather(
                *(self._start(snapshot, folder, None, session.mounts, owner) for _ in range(count)),
                return_exceptions=True,
            )
        finally:
            await asyncio.to_thread(self.store.abandon, folder)
        out: list[Restored | GatewayError] = []
        for result in results:
            if isinstance(result, Restored | GatewayError):
                out.append(result)
            elif isinstance(result, Exception):
                logger.error("a fork of session %s failed", session.id, exc_info=result)
                out.append(GatewayError(f"the fork failed: {result}"))
            else:
                raise result
        logger.info(
            "session %s forked: %d of %d started",
            session.id,
            sum(isinstance(r, Restored) for r in out),
            count,
        )
        return out

    # -- internals -------------------------------------------------------------------------

    def _new_id(self) -> str:
        hexa = secrets.token_hex(10)
        node = self.settings.node_name
        return f"{node}.snap-{hexa}" if node else f"snap-{hexa}"

    async def _named(self, name: str | None, owner: str | None) -> Snapshot | None:
        if name is None:
            return None
        for snapshot in await asyncio.to_thread(self.store.all):
            if snapshot.name == name and snapshot.owner == owner:
                return snapshot
        return None

    async def _save(
        self,
        session: Session,
        snapshot_id: str,
        name: str | None,
        extra: dict[str, Any],
        *,
        keep: bool,
    ) -> Snapshot:
        """Write `session`'s files and variables into a new folder: committed as the
        snapshot `snapshot_id` (`keep`), or left as `<id>.partial` for a fork."""
        if session.hibernated:
            await session.resume()
        partial = await asyncio.to_thread(self.store.begin, None if keep else snapshot_id)
        try:
            snapshot = await self._write(session, partial, snapshot_id, name, extra)
            if keep:
                await asyncio.to_thread(self.store.commit, partial, snapshot)
            return snapshot
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self.store.abandon, partial))
            raise

    async def _write(
        self,
        session: Session,
        folder: Path,
        snapshot_id: str,
        name: str | None,
        extra: dict[str, Any],
    ) -> Snapshot:
        seconds = self.settings.snapshot_timeout
        lost: list[LostName] = []
        total = 0
        has_namespace = False
        _refuse_if_busy(session)  # now, rather than after the cell (it holds the lock)
        async with session.slot.lock:
            _refuse_if_busy(session)
            if not session.slot.alive:
                await session.slot.revive()
            kernel = session.slot.kernel
            assert kernel is not None
            why_not = sandbox_files.supported(kernel)
            if why_not is not None:
                raise Conflict(f"session {session.id} cannot be saved: {why_not}")
            try:
                if session.language == PYTHON:
                    saved, written = await save(kernel, seconds)
                    try:
                        total += await keep(kernel, written, folder / NAMESPACE, mode=0o444)
                    except BaseException:
                        with contextlib.suppress(OSError, SnapshotError):
                            await drop(kernel, written)
                        raise
                    lost += [x.to_json() for x in saved.lost]
                    has_namespace = True
                else:
                    lost.append(
                        {
                            "name": "*",
                            "reason": f"{session.language} kernels' variables are not saved: "
                            "only the files are kept",
                        }
                    )
                size, said = await sandbox_files.archive(kernel, folder / FILES, seconds)
                total += size
                if said:
                    lost.append({"name": "files", "reason": f"not all were kept: {said[:500]}"})
            except SnapshotError as exc:
                raise HibernationFailed(
                    f"session {session.id} could not be saved ({exc}); it runs on as it was",
                    retry_after=RETRY_SAVE,
                ) from None
        for other in self.registry.companions(session.id):
            lost.append(
                {
                    "name": f"context {other.id}",
                    "reason": f"the variables of the session's other kernels ({other.language}) "
                    "are not saved: only its own kernel's",
                }
            )
        network = session.network
        return Snapshot(
            id=snapshot_id,
            name=name,
            source=session.id,
            language=session.language,
            template=session.template.id if session.template is not None else None,
            network=list(network.allow) if network is not None else "none",
            created_at=time.time(),
            bytes=total,
            lost=lost,
            extra=dict(extra),
            has_namespace=has_namespace,
            owner=session.owner,
        )

    async def _start(
        self,
        snapshot: Snapshot,
        folder: Path,
        network: list[str] | str | None,
        mounts: tuple[VolumeMount, ...],
        owner: Principal,
    ) -> Restored:
        asked = network if network is not None else snapshot.network
        session = await self.registry.create_session(
            snapshot.language, asked, snapshot.template, mounts, owner=owner
        )
        try:
            async with session.slot.lock:
                kernel = session.slot.kernel
                assert kernel is not None
                seconds = max(self.settings.snapshot_timeout, LOAD_SECONDS)
                await sandbox_files.unpack(kernel, folder / FILES, seconds)
                if snapshot.has_namespace:
                    await load(kernel, folder / NAMESPACE)
        except SnapshotError as exc:
            await asyncio.shield(self._discard(session))
            raise Conflict(f"snapshot {snapshot.id} could not be loaded: {exc}") from None
        except BaseException:
            await asyncio.shield(self._discard(session))
            raise
        return Restored(session, snapshot.id, list(snapshot.lost))

    async def _discard(self, session: Session) -> None:
        """A session whose snapshot could not be loaded: not left behind half-made."""
        with contextlib.suppress(GatewayError):
            await self.registry.delete_session(session.id, ADMIN)


def _refuse_if_busy(session: Session) -> None:
    if session.busy:
        raise SessionBusy(f"session {session.id} is running a cell; snapshot or fork it when idle")


def _settled(name: str) -> bool:
    """A folder name that can be a snapshot's (not one being written or removed)."""
    return NAME.fullmatch(name) is not None and not name.endswith((".partial", ".old"))
