"""The gateway's side of snapshot files (kernels/hibernation.py): what a kernel wrote is taken
only as a plain file of one link, never through a symlink, kept 0600 in a 0700 folder, and
given back to that session's kernel only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kernel_gateway.kernels.hibernation import (
    SnapshotError,
    Snapshots,
    _give,
    _take,
    _take_back,
)


@pytest.fixture
def store(tmp_path: Path) -> Snapshots:
    snapshots = Snapshots(tmp_path / "snapshots")
    snapshots.open()
    return snapshots


def test_a_written_snapshot_is_taken_private(store: Snapshots, tmp_path: Path) -> None:
    handover = tmp_path / "conn"
    handover.mkdir()
    (handover / "snapshot-1").write_bytes(b"pickle")
    os.chmod(handover / "snapshot-1", 0o644)
    _take(handover, "snapshot-1", store.path("abc123"), 0o600)
    kept = store.path("abc123")
    assert kept.read_bytes() == b"pickle" and not (handover / "snapshot-1").exists()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.folder.stat().st_mode) == 0o700
    assert store.ids() == {"abc123"} and store.exists("abc123") and store.size("abc123") == 6
    store.delete("abc123")
    assert store.ids() == set()


def test_a_symlink_or_a_second_link_is_never_taken(store: Snapshots, tmp_path: Path) -> None:
    handover = tmp_path / "conn"
    handover.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("the host's")
    (handover / "snapshot-link").symlink_to(secret)
    with pytest.raises(SnapshotError):
        _take(handover, "snapshot-link", store.path("s1"), 0o600)
    assert not store.exists("s1") and secret.read_text() == "the host's"
    os.link(secret, handover / "snapshot-hard")
    with pytest.raises(SnapshotError):
        _take(handover, "snapshot-hard", store.path("s2"), 0o600)
    assert not store.exists("s2") and secret.exists()


def test_given_to_a_kernel_as_a_read_only_link_then_private_again(
    store: Snapshots, tmp_path: Path
) -> None:
    store.open()
    store.path("s3").write_bytes(b"pickle")
    handover = tmp_path / "conn"
    handover.mkdir()
    shared = _give(store.path("s3"), handover, "restore-1")
    assert not shared
    given = handover / "restore-1"
    assert given.read_bytes() == b"pickle" and store.exists("s3")  # kept until recorded
    assert stat.S_IMODE(given.stat().st_mode) == 0o444 and given.stat().st_uid == os.geteuid()
    _take_back(store.path("s3"), handover, "restore-1", shared)
    assert not given.exists() and store.path("s3").read_bytes() == b"pickle"
    assert stat.S_IMODE(store.path("s3").stat().st_mode) == 0o600


def test_a_fifo_in_place_of_the_snapshot_never_blocks(store: Snapshots, tmp_path: Path) -> None:
    handover = tmp_path / "conn"
    handover.mkdir()
    os.mkfifo(handover / "snapshot-fifo")
    with pytest.raises(SnapshotError):
        _take(handover, "snapshot-fifo", store.path("s4"), 0o600)
    assert not store.exists("s4")


def test_a_set_aside_snapshot_is_deleted_with_its_session(store: Snapshots) -> None:
    store.open()
    store.path("s5").write_bytes(b"x")
    store.set_aside("s5")
    assert not store.exists("s5") and store.ids() == {"s5"}
    store.delete("s5")
    assert store.ids() == set()


def test_session_ids_name_files_and_nothing_else(store: Snapshots) -> None:
    assert store.path("node-1.0123abcd").name == "node-1.0123abcd.snapshot"
    for bad in ("../x", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(ValueError):
            store.path(bad)


def test_a_shared_file_stays_read_only_while_many_kernels_read_it(
    store: Snapshots, tmp_path: Path
) -> None:
    """A saved snapshot (0444) is given to several kernels at once (a fork): one kernel's
    take-back leaves it readable for the others."""
    source = store.folder / "files.tar"
    handover = tmp_path / "conn"
    handover.mkdir()
    _take_setup = handover / "files-1"
    _take_setup.write_bytes(b"tar")
    assert _take(handover, "files-1", source, 0o444) == 3
    first = _give(source, handover, "give-1")
    second = _give(source, handover, "give-2")
    assert first and second
    _take_back(source, handover, "give-1", first)
    assert (handover / "give-2").read_bytes() == b"tar"
    assert stat.S_IMODE(source.stat().st_mode) == 0o444
