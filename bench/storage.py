"""What a session's storage costs: setup and release per candidate, and a disk fill.

    python bench/storage.py                  # 50 runs each, 1g disks, in /var/tmp
    python bench/storage.py --runs 100 --size 1g --dir /var/tmp --fill

Needs root (mount, loop devices). Candidates:
  loop          the chosen design: kernel_gateway.kernels.storage.LoopStorage (sparse image,
                mkfs.ext4 without journal, mount -o loop, direct I/O, 3 folders)
  loop+journal  the same with mkfs's default journal (lazily initialised)
  loop+template one mkfs'd image copied per session (cp --sparse=always), then mounted
  tmpfs         what sessions had before: a size-capped tmpfs (its pages are memory)
  plain         plain folders: no cap at all (the fallback without root)
It also reports whether project quotas (the other way to cap a folder) exist here,
checks that 8 disks set up at once do not race for loop devices, and that nothing is
left behind. `--fill` writes 1 MiB chunks into a disk from a container of the kernel
image under a memory limit equal to the disk size, with and without direct I/O.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernel_gateway.kernels.storage import (
    MKFS_OPTIONS,
    MOUNT_OPTIONS,
    LoopStorage,
    PlainStorage,
    SessionStorage,
    StorageProvider,
    image_path,
    loop_devices_of,
    make_storage_dirs,
    mounts_under,
    reclaim,
    set_direct_io,
    unmount,
)
from kernel_gateway.settings import DEFAULT_IMAGE, parse_size

OWNER = (1000, 1000)


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class CachedLoop(LoopStorage):
    """LoopStorage without direct I/O: the image's pages are cached by the host too."""

    direct_io = False


class JournalLoop(LoopStorage):
    """LoopStorage with mkfs's default journal (lazy_journal_init)."""

    def prepare(self, root: Path, owner: tuple[int, int] | None) -> SessionStorage:
        image = image_path(root)
        with open(image, "wb") as f:
            f.truncate(self.size)
        options = ["-q", "-F", "-t", "ext4", "-m", "0", "-i", "8192"]
        options += ["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"]
        run("mkfs.ext4", *options, str(image))
        run("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(root))
        set_direct_io(root)
        storage = SessionStorage(root)
        make_storage_dirs(storage, owner)
        return storage


class TemplateLoop(LoopStorage):
    """One image made by mkfs once, copied sparsely for each session."""

    def __init__(self, size: int, template: Path) -> None:
        super().__init__(size)
        self.template = template
        with open(template, "wb") as f:
            f.truncate(size)
        run("mkfs.ext4", *MKFS_OPTIONS, str(template))

    def prepare(self, root: Path, owner: tuple[int, int] | None) -> SessionStorage:
        image = image_path(root)
        run("cp", "--sparse=always", str(self.template), str(image))
        run("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(root))
        set_direct_io(root)
        storage = SessionStorage(root)
        make_storage_dirs(storage, owner)
        return storage


class Tmpfs(StorageProvider):
    """The design before: a size-capped tmpfs whose pages count as memory."""

    name = "tmpfs"
    capped = True

    def describe(self) -> str:
        return "tmpfs"

    def prepare(self, root: Path, owner: tuple[int, int] | None) -> SessionStorage:
        run(
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={self.size},mode=0700,nosuid,nodev",
            "kg",
            str(root),
        )
        storage = SessionStorage(root)
        make_storage_dirs(storage, owner)
        return storage

    def release(self, root: Path) -> None:
        if os.path.ismount(root):
            unmount(root)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(provider: StorageProvider, base: Path, runs: int) -> tuple[list[float], list[float]]:
    """Setup and release times (ms) of `runs` sessions, one after another."""
    setup, release = [], []
    for i in range(runs):
        root = base / f"s{i}"
        root.mkdir()
        started = time.perf_counter()
        provider.prepare(root, OWNER)
        setup.append((time.perf_counter() - started) * 1000)
        (root / "files" / "hello.txt").write_text("hi")
        started = time.perf_counter()
        provider.release(root)
        shutil.rmtree(root)
        release.append((time.perf_counter() - started) * 1000)
    return setup, release


def concurrent_setup(provider: StorageProvider, base: Path, count: int) -> str:
    """Set up `count` disks at once (loop devices are allocated concurrently)."""
    roots = [base / f"c{i}" for i in range(count)]
    for root in roots:
        root.mkdir()
    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        results = list(pool.map(lambda r: _try(provider.prepare, r), roots))
    elapsed = (time.perf_counter() - started) * 1000
    devices = {os.stat(root).st_dev for root in roots}
    for root in roots:
        provider.release(root)
        shutil.rmtree(root)
    failed = [r for r in results if r]
    if failed:
        return f"{len(failed)} of {count} failed: {failed[0]}"
    return f"{count} disks at once in {elapsed:.0f} ms, {len(devices)} distinct devices"


def _try(fn: Callable[[Path, tuple[int, int] | None], object], root: Path) -> str:
    try:
        fn(root, OWNER)
    except Exception as exc:
        return str(exc)
    return ""


def project_quota_status(path: Path) -> str:
    """Whether the filesystem holding `path` enforces project quotas, and why not."""
    source, point, kind, options = "", "", "", ""
    target = str(path.resolve())
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        inside = target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")
        if inside and len(fields[1]) >= len(point):
            source, point, kind, options = fields[0], fields[1], fields[2], fields[3]
    detail = f"{path} is {kind} on {source} (mounted at {point}; options {options})"
    if kind == "ext4":
        ext4_options = Path(f"/proc/fs/ext4/{Path(source).name}/options")
        if ext4_options.exists():
            flags = ext4_options.read_text().split()
            if "noquota" in flags or "prjquota" not in flags:
                detail += (
                    f"; {ext4_options}: quota off ("
                    + ("noquota" if "noquota" in flags else "no prjquota")
                    + ")"
                )
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    q_getinfo, prjquota = 0x800005, 2
    buffer = ctypes.create_string_buffer(64)
    result = libc.quotactl((q_getinfo << 8) | prjquota, source.encode(), 0, buffer)
    if result == 0:
        return "available: " + detail
    code = ctypes.get_errno()
    return (
        f"unavailable: quotactl(Q_GETINFO, PRJQUOTA) -> {errno.errorcode.get(code, code)} "
        f"({os.strerror(code)}); {detail}. Enabling them needs `tune2fs -O project,quota` on "
        "the unmounted filesystem and a prjquota mount: not possible on a live root disk"
    )


def reflink_status(base: Path) -> str:
    source, copy = base / "reflink-src", base / "reflink-dst"
    source.write_bytes(b"x" * 4096)
    try:
        result = subprocess.run(
            ["cp", "--reflink=always", str(source), str(copy)], capture_output=True, text=True
        )
        return "supported" if result.returncode == 0 else result.stderr.strip()
    finally:
        source.unlink()
        copy.unlink(missing_ok=True)


def fill(base: Path, size: int, image: str, direct_io: bool) -> str:
    """Fill a disk from a kernel-image container limited to `size` of memory."""
    provider = LoopStorage(size) if direct_io else CachedLoop(size)
    root = base / f"fill-{direct_io}"
    root.mkdir()
    provider.prepare(root, OWNER)
    try:
        code = (
            "import errno, time\n"
            "n = 0; t = time.monotonic()\n"
            "try:\n"
            "    with open('/workspace/big', 'wb') as f:\n"
            "        while True: f.write(b'\\0' * 2**20); n += 1\n"
            "except OSError as e:\n"
            "    print(errno.errorcode[e.errno], n, round(time.monotonic() - t, 2))\n"
        )
        result = subprocess.run(
            ["docker", "run", "--rm", "--cpus", "1", "--memory", str(size),
             "--memory-swap", str(size), "--user", "1000:1000", "--network", "none",
             "-v", f"{root / 'files'}:/workspace", image, "python3", "-c", code],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if result.returncode != 0:
            return f"container exit {result.returncode} {result.stderr.strip()[-200:]}"
        err, chunks, seconds = result.stdout.split()
        return f"{err} after {chunks} MiB in {seconds} s ({int(chunks) / float(seconds):.0f} MiB/s)"
    finally:
        provider.release(root)
        shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--size", default="1g", help="disk size (like --workspace-size)")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where images live")
    parser.add_argument("--fill", action="store_true", help="also fill a disk from a container")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/storage.py needs root (mount and loop devices)")
    size = parse_size(args.size)
    base = Path(tempfile.mkdtemp(prefix="kg-storage-bench-", dir=args.dir))
    loops_before = len(loop_devices_of(lambda _: True))
    try:
        print(f"# {platform.node()}: {platform.platform()}, {os.cpu_count()} CPUs")
        print(f"# images in {base}; size {args.size}; {args.runs} runs each\n")
        candidates: list[tuple[str, StorageProvider]] = [
            ("loop (chosen)", LoopStorage(size)),
            ("loop, no direct I/O", CachedLoop(size)),
            ("loop+journal", JournalLoop(size)),
            ("loop+template (cp --sparse)", TemplateLoop(size, base / "template.img")),
            ("tmpfs (before; memory)", Tmpfs(size)),
            ("plain (no cap)", PlainStorage(size)),
        ]
        header = f"{'candidate':30} {'setup p50':>10} {'p99':>8} {'release p50':>12} {'p99':>8}"
        print(header)
        print("-" * len(header))
        for label, provider in candidates:
            setup, release = measure(provider, base, args.runs)
            print(
                f"{label:30} {statistics.median(setup):8.1f}ms {percentile(setup, 0.99):6.1f}ms "
                f"{statistics.median(release):10.1f}ms {percentile(release, 0.99):6.1f}ms"
            )
        (base / "template.img").unlink()
        print()
        print("concurrent:    ", concurrent_setup(LoopStorage(size), base, 8))
        print("project quota: ", project_quota_status(base))
        print("reflink copy:  ", reflink_status(base))
        if args.fill:
            for direct_io in (True, False):
                label = "on " if direct_io else "off"
                print(f"fill, direct I/O {label}:", fill(base, size, args.image, direct_io))
        left = mounts_under(base)
        loops = loop_devices_of(lambda p: str(p).startswith(str(base)))
        print(f"left behind:    {len(left)} mounts, {len(loops)} loop devices", end="")
        print(f" (attached loop devices on the host: {loops_before} before, ", end="")
        print(f"{len(loop_devices_of(lambda _: True))} after)")
    finally:
        reclaim(base)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
