"""Session records and the runtime-dir take-over: the pieces of durable sessions without Docker."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from kernel_gateway.kernels.runtime_dir import RuntimeDir, persisted
from kernel_gateway.sessions.persistence import RunningCell, SessionRecord, SessionStore


def record(sid: str = "abc123", running: RunningCell | None = None, n: int = 1) -> SessionRecord:
    return SessionRecord(
        id=sid,
        kernel_id="k1",
        storage="w1",
        created_at="2026-11-23T10:00:00+00:00",
        last_activity=time.time(),
        submitted=n,
        last_event_id=n * 3,
        execution_count=n,
        restarts=0,
        running=running,
    )


async def test_records_round_trip_in_the_order_they_were_written(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    store.open()
    cell = RunningCell(execution=2, msg_id="m-1", timeout=60.0, deadline=time.time() + 60)
    for n in range(1, 50):  # many writes of one record: the last one wins
        store.save(record(n=n, running=cell if n == 49 else None))
    store.save(record("gone"))
    store.delete("gone")
    await store.flush()
    (loaded,) = store.load()
    assert loaded.submitted == 49 and loaded.last_event_id == 147 and loaded.running == cell
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["abc123.json"]
    await store.close()


async def test_leftovers_of_a_write_cut_short_and_unreadable_records_are_dropped(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "sessions"
    store = SessionStore(folder)
    store.open()
    store.save(record("good"))
    await store.flush()
    (folder / "half.tmp").write_text('{"format": 1, "id": "ha')  # killed before its rename
    (folder / "bad.json").write_text("{not json")
    (folder / "old.json").write_text(json.dumps({"format": 99, "id": "old"}))
    assert [r.id for r in store.load()] == ["good"]
    assert sorted(p.name for p in folder.iterdir()) == ["good.json"]
    await store.close()


async def test_a_record_never_names_a_path_outside_its_folder(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    store.open()
    with pytest.raises(ValueError):
        store._path("../escape")
    await store.close()


def stopped_instance(root: Path, sessions: int, age: float = 0.0) -> str:
    """What a gateway that persisted `sessions` sessions and stopped leaves behind."""
    runtime = RuntimeDir(root)
    runtime.open()
    folder = runtime.sessions_path
    folder.mkdir()
    for n in range(sessions):
        (folder / f"s{n}.json").write_text("{}")
    if age:
        then = time.time() - age
        os.utime(folder, (then, then))
    runtime.close(keep=True)
    return runtime.instance


def test_a_new_gateway_takes_over_the_newest_stopped_instance_with_sessions(
    tmp_path: Path,
) -> None:
    older = stopped_instance(tmp_path, 2, age=60)
    newer = stopped_instance(tmp_path, 1)
    empty = stopped_instance(tmp_path, 0)
    assert persisted(tmp_path / f"{newer}.lock") and not persisted(tmp_path / f"{empty}.lock")
    first = RuntimeDir(tmp_path)
    first.open(adopt=True)
    assert first.adopted and first.instance == newer
    second = RuntimeDir(tmp_path)  # the first still runs: its instance is not stale
    second.open(adopt=True)
    assert second.adopted and second.instance == older
    third = RuntimeDir(tmp_path)
    third.open(adopt=True)
    assert not third.adopted and third.instance not in (older, newer)
    assert third.orphaned_instances() == [empty]
    for runtime in (first, second, third):
        runtime.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([empty, f"{empty}.lock"])


def test_without_adopt_a_gateway_starts_afresh(tmp_path: Path) -> None:
    kept = stopped_instance(tmp_path, 1)
    runtime = RuntimeDir(tmp_path)
    runtime.open()
    assert not runtime.adopted and runtime.instance != kept
    assert runtime.orphaned_instances() == []  # a persisted instance is not an orphan
    runtime.close()


def test_record_writes_do_not_block_the_event_loop(tmp_path: Path) -> None:
    async def main() -> None:
        store = SessionStore(tmp_path / "sessions")
        store.open()
        for n in range(200):
            store.save(record(f"s{n}"))
        await store.flush()
        assert len(store.load()) == 200
        await store.close()

    asyncio.run(main())


async def test_cluster_session_ids_are_records_and_paths_are_not(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    store.open()
    node_id = "rol2uva8nqfrmnvz5392k3aqo.b68b9d5242a946f5bb1e523b117e2ed2"
    store.save(record(node_id))
    await store.flush()
    assert [r.id for r in store.load()] == [node_id]
    for bad in ("../x", "a/b", ".hidden", "a..b", "a.b.c", ""):
        with pytest.raises(ValueError):
            store.save(record(bad))
    await store.close()
