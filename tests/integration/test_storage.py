"""Session storage: a capped disk per session that is not memory, and nothing left behind.

The provider is tested directly (mkfs, mount, release, reclaim), then through real
gateways: the docker backend with its default limits (1g memory, 1g disk), the
local backend in its sandbox, gVisor, and a gateway SIGKILLed and restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.local import LocalBackend
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.storage import (
    LoopStorage,
    PlainStorage,
    SessionStorage,
    choose_provider,
    image_path,
    loop_devices_of,
    mounts_under,
    reclaim,
)
from tests.support.api import execute
from tests.support.backends import require_docker, require_gvisor, settings_for
from tests.support.server import ServerThread

from .test_cli import serve

MiB = 1024 * 1024
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loop disks need root")


def loops_under(folder: Path) -> list[str]:
    prefix = str(folder.resolve()) + "/"
    return loop_devices_of(lambda backing: str(backing).startswith(prefix))


def leftovers(folder: Path) -> tuple[list[str], list[str], list[Path]]:
    """Mounts, loop devices and disk images of ours still under `folder`."""
    return mounts_under(folder), loops_under(folder), sorted(folder.rglob("*.img"))


def settled_leftovers(
    folder: Path, seconds: float = 10.0
) -> tuple[list[str], list[str], list[Path]]:
    """`leftovers`, once the kernel has let go: a loop device detaches itself (autoclear)
    only after the last process holding its filesystem, in any mount namespace, is gone."""
    deadline = time.monotonic() + seconds
    while (found := leftovers(folder)) != ([], [], []) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def disk_state(root: Path) -> tuple[bool, bool]:
    return os.path.ismount(root), image_path(root).exists()


def fill_code(path: str) -> str:
    """A cell that writes 1 MiB chunks to `path` until the disk says no."""
    return f"f = open({path!r}, 'wb')\nwhile True:\n    f.write(b'\\0' * 2**20)\n"


# -- the provider ------------------------------------------------------------------------------


@needs_root
def test_files_tmp_and_home_share_one_capped_disk(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    provider = LoopStorage(32 * MiB)
    storage = provider.prepare(root, (1000, 1000))
    try:
        assert os.path.ismount(root)
        assert not image_path(root).is_relative_to(root)  # out of every kernel's sight
        for path, mode in ((storage.files, 0o700), (storage.tmp, 0o1777), (storage.home, 0o700)):
            info = path.stat()
            assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (1000, 1000, mode)
            assert info.st_dev == root.stat().st_dev
        (storage.files / "a").write_bytes(b"\0" * 20 * MiB)
        with pytest.raises(OSError) as caught, open(storage.tmp / "b", "wb") as f:
            for _ in range(32):
                f.write(b"\0" * MiB)
                f.flush()
        assert caught.value.errno == errno.ENOSPC
        assert (storage.files / "a").stat().st_size == 20 * MiB
    finally:
        provider.release(root)
    assert not os.path.ismount(root)
    assert settled_leftovers(tmp_path) == ([], [], [])  # autoclear detaches a moment later


@needs_root
def test_a_failed_setup_is_a_clear_error_that_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "s"
    root.mkdir()
    with pytest.raises(KernelUnavailable, match="could not prepare a session's disk: mkfs"):
        LoopStorage(4096).prepare(root, None)  # too small for ext4
    assert leftovers(tmp_path) == ([], [], [])
    monkeypatch.setattr("kernel_gateway.kernels.storage.MOUNT_OPTIONS", "loop,no_such_option")
    with pytest.raises(KernelUnavailable, match="could not prepare a session's disk: mount"):
        LoopStorage(16 * MiB).prepare(root, None)
    assert leftovers(tmp_path) == ([], [], [])
    assert list(tmp_path.iterdir()) == [root]


@needs_root
def test_a_hundred_disks_come_and_go_without_a_trace(tmp_path: Path) -> None:
    provider = LoopStorage(1024 * MiB)
    attached = len(loop_devices_of(lambda _: True))
    for i in range(100):
        root = tmp_path / f"s{i}"
        root.mkdir()
        storage = provider.prepare(root, (1000, 1000))
        (storage.files / "data").write_bytes(b"x" * 4096)
        provider.release(root)
        shutil.rmtree(root)
    assert leftovers(tmp_path) == ([], [], [])
    assert list(tmp_path.iterdir()) == []
    # Others may attach loop devices meanwhile; ours are all gone, so no net growth.
    assert len(loop_devices_of(lambda _: True)) <= attached + 2


@needs_root
def test_reclaim_unmounts_and_detaches_what_a_dead_gateway_left(tmp_path: Path) -> None:
    provider = LoopStorage(16 * MiB)
    for i in range(3):
        (tmp_path / f"s{i}").mkdir()
        provider.prepare(tmp_path / f"s{i}", None)
    # A loop device attached but never mounted (a crash between the two steps).
    orphan = tmp_path / "orphan.img"
    orphan.write_bytes(b"\0" * MiB)
    subprocess.run(["losetup", "-f", str(orphan)], check=True)
    assert len(mounts_under(tmp_path)) == 3 and len(loops_under(tmp_path)) == 4
    reclaim(tmp_path)
    # An unmounted disk's loop device detaches itself (autoclear) a moment later.
    deadline = time.monotonic() + 10
    while loops_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mounts_under(tmp_path) == [] and loops_under(tmp_path) == []


@needs_root
def test_images_in_memory_are_called_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A runtime dir on a tmpfs (as XDG_RUNTIME_DIR is) would make every disk memory again."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "kg-test", str(tmp_path)], check=True)
    try:
        with caplog.at_level(logging.WARNING, logger="kernel_gateway.kernels.storage"):
            provider = choose_provider(16 * MiB, tmp_path)
        assert isinstance(provider, LoopStorage)
        assert "the runtime dir is on tmpfs" in caplog.text
        assert list(tmp_path.iterdir()) == []  # no probe left behind
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)


def test_without_root_storage_is_plain_and_the_log_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with caplog.at_level(logging.WARNING, logger="kernel_gateway.kernels.storage"):
        provider = choose_provider(64 * MiB, tmp_path)
    assert isinstance(provider, PlainStorage) and not provider.capped
    assert "NOT size-capped: the gateway is not root" in caplog.text
    root = tmp_path / "s"
    root.mkdir()
    storage = provider.prepare(root, None)
    assert storage.files.is_dir() and storage.tmp.is_dir() and storage.home.is_dir()
    assert list(tmp_path.iterdir()) == [root]  # no probe left behind


# -- the docker backend, default limits --------------------------------------------------------


@pytest.fixture(scope="module")
def defaults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A docker gateway with the default memory limit and workspace size (1g and 1g)."""
    require_docker()
    if os.geteuid() != 0:
        pytest.skip("capped session disks need a root gateway")
    settings = settings_for("docker", tmp_path_factory.mktemp("defaults"), preload="")
    assert (settings.memory_limit, settings.workspace_size) == ("1g", "1g")
    with ServerThread(settings) as server:
        yield server


@pytest.fixture
def dclient(defaults: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=defaults.url, timeout=120) as c:
        yield c


@pytest.mark.parametrize("path", ["/tmp/big", "big"])
def test_a_full_disk_is_an_error_in_the_cell_and_the_kernel_lives_on(
    dclient: httpx.Client, path: str
) -> None:
    sid = dclient.post("/sessions").json()["id"]
    try:
        assert execute(dclient, sid, "x = 41").done["status"] == "ok"
        stream = execute(dclient, sid, fill_code(path), timeout=120)
        assert stream.done["status"] == "error", stream.done  # not `died` / out_of_memory
        (error,) = stream.named("error")
        assert error["ename"] == "OSError"
        assert error["evalue"].startswith(("[Errno 28]", "[Errno 122]")), error["evalue"]
        assert execute(dclient, sid, "print(x + 1)").stdout == "42\n"
    finally:
        dclient.delete(f"/sessions/{sid}")


def test_files_on_disk_do_not_count_as_memory(dclient: httpx.Client) -> None:
    """600 MB saved, then 600 MB of arrays: both fit under a 1 GB memory limit."""
    sid = dclient.post("/sessions").json()["id"]
    try:
        code = (
            "import os\n"
            "import numpy as np\n"
            "with open('data.bin', 'wb') as f:\n"
            "    for _ in range(600):\n"
            "        f.write(b'\\1' * 2**20)\n"
            "a = np.ones(600 * 2**20, dtype=np.uint8)\n"
            "print(os.path.getsize('data.bin') >> 20, int(a.sum()) >> 20)\n"
        )
        stream = execute(dclient, sid, code, timeout=120)
        assert stream.done["status"] == "ok", stream.done
        assert stream.stdout == "600 600\n"
    finally:
        dclient.delete(f"/sessions/{sid}")


def test_sessions_leave_no_disk_behind(tmp_path: Path) -> None:
    require_docker()
    if os.geteuid() != 0:
        pytest.skip("capped session disks need a root gateway")
    settings = settings_for("docker", tmp_path, pool_size=2, preload="", workspace_size="64m")
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        assert "own ext4 disk, capped at 64m" in c.get("/health").json()["isolation"]
        sid = c.post("/sessions").json()["id"]
        code = "import os; print({os.stat(p).st_dev for p in ('.', '/tmp', '/home/sandbox')})"
        assert len(execute(c, sid, code).stdout.split(",")) == 1  # one disk, one cap
        c.delete(f"/sessions/{sid}")
        for _ in range(5):
            sid = c.post("/sessions").json()["id"]
            assert execute(c, sid, "open('/tmp/t', 'w').write('x')").done["status"] == "ok"
            assert c.delete(f"/sessions/{sid}").status_code == 204
        # Only the warm pool's disks and the fork server's remain while the gateway runs.
        assert len(mounts_under(tmp_path)) <= 2 + settings.fork_servers
    assert settled_leftovers(tmp_path) == ([], [], [])


def test_a_killed_gateway_s_disks_are_reclaimed_by_the_next(tmp_path: Path) -> None:
    require_docker()
    if os.geteuid() != 0:
        pytest.skip("capped session disks need a root gateway")
    args: tuple[str, ...] = ("--backend", "docker", "--pool-size", "1", "--workspace-size", "64m")
    args += ("--fork-servers", "1")
    env = {"KG_PRELOAD": "", "KG_KERNEL_START_TIMEOUT": "120"}
    with serve(tmp_path, *args, env=env) as (proc, url):
        instance = httpx.get(url + "/health").json()["instance"]
        response = httpx.post(url + "/sessions", timeout=60)
        assert response.status_code == 201, response.text
        sid = response.json()["id"]
        httpx.post(url + f"/sessions/{sid}/execute", json={"code": "1"}, timeout=60)
        dead = tmp_path / "rt" / instance
        deadline = time.monotonic() + 30
        while len(loops_under(dead)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)  # the warm kernel's disk and the fork server's
        assert len(mounts_under(dead)) == len(loops_under(dead)) == 3
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert len(loops_under(dead)) == 3  # SIGKILL: nothing was cleaned up
    with serve(tmp_path, *args, env=env) as (_, url):
        assert httpx.get(url + "/health").json()["instance"] != instance
        assert settled_leftovers(dead) == ([], [], [])
        assert not dead.exists()


# -- other backends ----------------------------------------------------------------------------


def test_local_kernels_get_the_same_capped_disk(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("capped session disks need a root gateway")
    settings = settings_for("local", tmp_path, pool_size=0, preload="", workspace_size="64m")
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        sid = c.post("/sessions").json()["id"]
        code = (
            "import os\n"
            "x = 41\n"
            "home = os.path.expanduser('~')\n"
            "print(len({os.stat(p).st_dev for p in ('.', '/tmp', home)}))\n"
            "print(os.statvfs('/tmp').f_blocks * os.statvfs('/tmp').f_frsize <= 64 * 2**20)\n"
        )
        assert execute(c, sid, code).stdout == "1\nTrue\n"
        stream = execute(c, sid, fill_code("/tmp/big"), timeout=60)
        assert stream.done["status"] == "error"
        assert stream.named("error")[0]["evalue"].startswith("[Errno 28]")
        assert execute(c, sid, "print(x + 1)").stdout == "42\n"
    assert settled_leftovers(tmp_path) == ([], [], [])


def test_gvisor_kernels_fill_their_disk_and_live_on(tmp_path: Path) -> None:
    require_gvisor()
    if os.geteuid() != 0:
        pytest.skip("capped session disks need a root gateway")
    settings = settings_for(
        "docker", tmp_path, runtime="runsc", pool_size=0, preload="", workspace_size="64m"
    )
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        sid = c.post("/sessions").json()["id"]
        execute(c, sid, "x = 41")
        for path in ("/tmp/big", "big"):
            stream = execute(c, sid, fill_code(path), timeout=60)
            assert stream.done["status"] == "error", stream.done
            assert stream.named("error")[0]["evalue"].startswith(("[Errno 28]", "[Errno 122]"))
            execute(c, sid, f"import os; os.remove({path!r})")
        assert execute(c, sid, "print(x + 1)").stdout == "42\n"
    assert settled_leftovers(tmp_path) == ([], [], [])


@needs_root
async def test_a_cancelled_setup_stops_before_its_cleanup_runs(tmp_path: Path) -> None:
    """Cancelling `prepare_storage` returns only once mkfs/mount are over, so release sees all."""
    runtime = RuntimeDir(tmp_path / "rt")
    runtime.open()
    backend = LocalBackend(settings_for("local", tmp_path / "rt", workspace_size="64m"), runtime)
    try:
        backend._storage = LoopStorage(64 * MiB)  # what start() chooses as root, minus its work
        for delay in (0.0, 0.005, 0.02, 0.05):
            root = runtime.new_workspace()
            task = asyncio.ensure_future(backend.prepare_storage(root))
            await asyncio.sleep(delay)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            state = disk_state(root)
            await asyncio.sleep(0.3)
            assert disk_state(root) == state  # nothing ran on after the cancel
            await backend.release_storage(SessionStorage(root))
            shutil.rmtree(root)
            assert leftovers(runtime.path) == ([], [], [])
    finally:
        await backend.close()
        runtime.close()
