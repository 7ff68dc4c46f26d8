"""Volumes as plain folders (no root needed): made, found by id or name, listed afresh from
disk, refused while mounted, deleted with their files; where a volume may be mounted."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_gateway.errors import (
    BadRequest,
    Conflict,
    TooManyVolumes,
    VolumeInUse,
    VolumeNotFound,
)
from kernel_gateway.kernels.volumes import MIN_SIZE, Volumes, mount_target
from kernel_gateway.tenants.principal import ADMIN


def volumes(tmp_path: Path, most: int = 3) -> Volumes:
    return Volumes(tmp_path / "volumes", capped=False, owner=None, max_volumes=most)


async def test_a_volume_is_made_found_listed_and_deleted(tmp_path: Path) -> None:
    store = volumes(tmp_path)
    await store.open()
    made = await store.create("data", 1, ADMIN)
    assert made.id.startswith("vol-") and made.size == MIN_SIZE  # rounded up
    (store.data(made) / "file.txt").write_text("kept")
    assert await store.get("data", ADMIN) == made == await store.get(made.id, ADMIN)
    again = volumes(tmp_path)  # another gateway on the same folder sees it
    assert [v.name for v in await again.all(ADMIN)] == ["data"]
    with pytest.raises(VolumeInUse, match="s1"):
        await store.delete("data", ["s1"], ADMIN)
    assert (store.data(made) / "file.txt").read_text() == "kept"
    await store.delete(made.id, [], ADMIN)
    assert await store.all(ADMIN) == []
    assert not (tmp_path / "volumes" / made.id).exists()
    with pytest.raises(VolumeNotFound):
        await store.get("data", ADMIN)


async def test_names_are_unique_checked_and_the_count_capped(tmp_path: Path) -> None:
    store = volumes(tmp_path, most=2)
    await store.create("a", MIN_SIZE, ADMIN)
    with pytest.raises(Conflict):
        await store.create("a", MIN_SIZE, ADMIN)
    for bad in ("", "has space", "../up", "-dash", "x" * 129):
        with pytest.raises(BadRequest):
            await store.create(bad, MIN_SIZE, ADMIN)
    await store.create("b", MIN_SIZE, ADMIN)
    with pytest.raises(TooManyVolumes):
        await store.create("c", MIN_SIZE, ADMIN)


async def test_a_half_made_volume_is_not_listed(tmp_path: Path) -> None:
    store = volumes(tmp_path)
    await store.open()
    assert not (tmp_path / "volumes").exists()  # made with the first volume only
    (tmp_path / "volumes" / ("vol-" + "0" * 20)).mkdir(parents=True)  # no volume.json yet
    (tmp_path / "volumes" / "stray").mkdir()
    assert await store.all(ADMIN) == []


async def test_mounts_resolve_names_and_refuse_overlaps(tmp_path: Path) -> None:
    store = volumes(tmp_path)
    one = await store.create("one", MIN_SIZE, ADMIN)
    await store.create("two", MIN_SIZE, ADMIN)
    (mount,) = await store.mounts({"one": "/mnt//data/"}, ADMIN)
    assert (mount.volume_id, mount.target, mount.source) == (one.id, "/mnt/data", store.data(one))
    with pytest.raises(BadRequest, match="overlap"):
        await store.mounts({"one": "/mnt/a", "two": "/mnt/a/b"}, ADMIN)
    with pytest.raises(BadRequest, match="overlap"):
        await store.mounts({"one": "/mnt/a", "two": "/mnt/a"}, ADMIN)
    assert len(await store.mounts({"one": "/mnt/a", "two": "/mnt/ab"}, ADMIN)) == 2
    with pytest.raises(VolumeNotFound):
        await store.mounts({"three": "/mnt/c"}, ADMIN)


@pytest.mark.parametrize(
    "path",
    ["relative", "/", "/usr/local/x", "/etc", "/proc/1", "/opt/venv/lib", "/tmp", "/workspace",
     "/home/sandbox", "/mnt", "/conn/x", "/mnt/../etc/x", "/x\0y"],
)  # fmt: skip
def test_a_volume_is_never_mounted_over_the_system(path: str) -> None:
    with pytest.raises(BadRequest):
        mount_target(path)


@pytest.mark.parametrize(
    ("path", "target"),
    [("/mnt/data", "/mnt/data"), ("/data/", "/data"), ("/workspace/shared", "/workspace/shared"),
     ("/home/sandbox/cache", "/home/sandbox/cache"), ("//srv//x", "/srv/x"),
     ("/mnt/a/../b", "/mnt/b")],
)  # fmt: skip
def test_mount_paths_are_normalized(path: str, target: str) -> None:
    assert mount_target(path) == target
