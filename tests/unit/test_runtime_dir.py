"""The runtime folder: ours alone, or the gateway refuses to start.

It holds connection files (with each kernel's HMAC key) and the ipc sockets; a
folder another local user made, or can write to, would hand them kernels.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from kernel_gateway.kernels.runtime_dir import (
    RuntimeDir,
    RuntimeDirError,
    filesystem_view,
    owner_gone,
)

OTHER_UID = 12345


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_runtime(root: Path) -> RuntimeDir:
    runtime = RuntimeDir(root)
    runtime.open()
    return runtime


def test_a_new_folder_is_private(tmp_path: Path) -> None:
    runtime = open_runtime(tmp_path / "a" / "rt")
    try:
        assert mode(runtime.root) == 0o700
        for path in (runtime.path, runtime.path / "k", runtime.path / "w", runtime.lock_path):
            assert os.lstat(path).st_mode & 0o077 == 0, path
    finally:
        runtime.close()
    assert not runtime.path.exists()


def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder away")
    root = tmp_path / "rt"
    root.mkdir(mode=0o700)
    os.chown(root, OTHER_UID, OTHER_UID)
    with pytest.raises(RuntimeDirError, match=f"owned by uid {OTHER_UID}"):
        open_runtime(root)
    assert list(root.iterdir()) == []


def test_a_symlink_is_refused_and_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "rt").symlink_to(target)
    with pytest.raises(RuntimeDirError, match="symlink"):
        open_runtime(tmp_path / "rt")
    assert list(target.iterdir()) == []


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rt").write_text("")
    with pytest.raises(RuntimeDirError, match="not a directory"):
        open_runtime(tmp_path / "rt")


@pytest.mark.parametrize("perm", [0o777, 0o770, 0o702, 0o720, 0o1777], ids=oct)
def test_a_folder_others_may_write_is_refused(tmp_path: Path, perm: int) -> None:
    root = tmp_path / "rt"
    root.mkdir()
    root.chmod(perm)
    with pytest.raises(RuntimeDirError, match="writable by group or others"):
        open_runtime(root)
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("perm", [0o711, 0o755, 0o750], ids=oct)
def test_our_folder_others_may_only_enter_is_made_private(tmp_path: Path, perm: int) -> None:
    root = tmp_path / "rt"  # as earlier versions made it (0711): nobody else could write in it
    root.mkdir()
    root.chmod(perm)
    runtime = open_runtime(root)
    runtime.close()
    assert mode(root) == 0o700


def test_a_parent_another_user_controls_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder away")
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, OTHER_UID, OTHER_UID)  # they could rename our folder and put theirs there
    with pytest.raises(RuntimeDirError, match=f"parent .* owned by uid {OTHER_UID}"):
        open_runtime(parent / "rt")


def test_a_parent_anyone_may_write_needs_the_sticky_bit(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(RuntimeDirError, match="sticky"):
        open_runtime(shared / "rt")
    shared.chmod(0o1777)  # like /tmp: others cannot rename or remove our folder
    open_runtime(shared / "rt").close()


def test_a_successor_waits_for_its_predecessor_and_adopts(tmp_path: Path) -> None:
    """Start-first rolling updates: the new gateway starts while the old one still runs."""
    old = RuntimeDir(tmp_path / "rt")
    old.open()
    old.sessions_path.mkdir()
    (old.sessions_path / "n1.abc.json").write_text("{}")
    new = RuntimeDir(tmp_path / "rt")
    opened = threading.Thread(target=new.open, kwargs={"adopt": True, "wait_for_predecessor": 10})
    started = time.monotonic()
    opened.start()
    time.sleep(0.5)
    assert opened.is_alive()  # still waiting: the predecessor holds its lock
    old.close(keep=True)  # it drained and left its sessions
    opened.join(10)
    assert not opened.is_alive()
    assert new.adopted and new.instance == old.instance
    assert 0.5 <= time.monotonic() - started < 5
    new.close()


def test_without_a_wait_a_second_gateway_starts_beside_a_live_one(tmp_path: Path) -> None:
    first = RuntimeDir(tmp_path / "rt")
    first.open()
    second = RuntimeDir(tmp_path / "rt")
    second.open(adopt=True, wait_for_predecessor=0.3)  # gives up waiting: starts beside it
    assert not second.adopted and second.instance != first.instance
    assert first.live_instances() == [second.instance]
    second.close()
    first.close()


def test_an_owner_is_gone_when_its_lock_is_free_or_missing_from_the_same_view(
    tmp_path: Path,
) -> None:
    live = open_runtime(tmp_path / "rt")
    lock = live.lock_path
    assert not owner_gone(lock, live.view, live.view)  # held
    live.close()
    assert owner_gone(lock, live.view, live.view)  # released or removed: gone
    # A lock this process cannot find, of a gateway that saw other paths (a container's
    # view, the host's): maybe alive. An unknown view proves nothing either.
    assert not owner_gone(tmp_path / "nowhere" / "x.lock", "1:2", live.view)
    assert not owner_gone(tmp_path / "nowhere" / "x.lock", None, live.view)
    assert not owner_gone(tmp_path / "nowhere" / "x.lock", "", "")
    assert live.view == filesystem_view() != ""
