"""The snapshot folders: written whole or not at all, replaced whole, found by id or name,
read afresh (so every gateway on the runtime folder sees the same), cleaned of what a crash
left half-made."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from kernel_gateway.errors import SnapshotNotFound
from kernel_gateway.sessions.snapshots import FILES, RECORD, Snapshot, SnapshotStore
from kernel_gateway.tenants.principal import ADMIN


def snapshot(snapshot_id: str, name: str | None = None, at: float = 1.0) -> Snapshot:
    return Snapshot(
        id=snapshot_id,
        name=name,
        source="s1",
        language="python",
        template=None,
        network="none",
        created_at=at,
        bytes=10,
        lost=[{"name": "gen", "reason": "TypeError: cannot pickle 'generator' object"}],
        extra={"e2b": {"env": {"A": "1"}}},
        has_namespace=True,
    )


def write(store: SnapshotStore, made: Snapshot, content: bytes = b"tar") -> None:
    partial = store.begin()
    (partial / FILES).write_bytes(content)
    store.commit(partial, made)


def test_written_found_listed_replaced_and_deleted(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots")
    store.open()
    assert store.all() == [] and not store.folder.exists()  # made by the first snapshot
    write(store, snapshot("snap-b", "daily", at=2.0))
    assert stat.S_IMODE(store.folder.stat().st_mode) == 0o700
    write(store, snapshot("snap-a", at=1.0))
    assert [s.id for s in store.all()] == ["snap-a", "snap-b"]  # oldest first
    assert (
        store.find("snap-b", ADMIN)
        == store.find("daily", ADMIN)
        == snapshot("snap-b", "daily", at=2.0)
    )
    write(store, snapshot("snap-b", "daily", at=3.0), b"newer")
    assert (store.path(store.find("daily", ADMIN)) / FILES).read_bytes() == b"newer"
    assert [s.created_at for s in store.all()] == [1.0, 3.0]
    store.delete(store.find("snap-a", ADMIN))
    assert [s.id for s in store.all()] == ["snap-b"]
    with pytest.raises(SnapshotNotFound):
        store.find("snap-a", ADMIN)
    assert sorted(p.name for p in store.folder.iterdir()) == ["snap-b"]


def test_what_a_crash_left_is_never_listed_and_is_removed_at_open(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots")
    store.open()
    write(store, snapshot("snap-a"))
    half = store.begin()  # a save cut short
    (half / RECORD).write_text(json.dumps(snapshot("snap-x").record()))
    swapped = store.folder / "snap-y.1234.old"  # a replace cut short
    swapped.mkdir()
    (swapped / RECORD).write_text(json.dumps(snapshot("snap-y").record()))
    unreadable = store.folder / "snap-z"
    unreadable.mkdir()
    (unreadable / RECORD).write_text("{not json")
    assert [s.id for s in store.all()] == ["snap-a"]
    with pytest.raises(SnapshotNotFound):
        store.find("snap-z", ADMIN)
    store.open()
    assert sorted(p.name for p in store.folder.iterdir()) == ["snap-a", "snap-z"]


def test_a_record_of_another_format_is_refused(tmp_path: Path) -> None:
    record = snapshot("snap-a").record()
    assert Snapshot.from_record(record) == snapshot("snap-a")
    with pytest.raises(ValueError):
        Snapshot.from_record({**record, "format": 99})
