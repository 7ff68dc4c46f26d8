"""Hibernation: how long a session takes to hibernate and to resume, and what 200 idle sessions
cost running and hibernated; all in one run, on the docker backend.

    python -m bench.hibernation              # 30 cycles each, 200 sessions for memory
    python -m bench.hibernation --smoke      # a tiny run, to check the bench works

- **hibernate**: `POST /sessions/{id}/hibernate` until it answers (the snapshot written, the
  kernel stopped); for a small session (a few variables) and for one holding a 100 MB
  pandas DataFrame.
- **resume**: `POST /sessions/{id}/resume` until it answers (a kernel on the session's disk,
  its snapshot loaded), with a warm kernel ready (the bench waits for the pool first; without
  one, a kernel is started on the session's disk: a cold start more); and **first result**:
  `1 + 1` sent to a hibernated session until its `done` (the resume included).
- **memory**: the host's memory in use (processes' own, shared, and the kernel's for them:
  `USED`; clean caches dropped first) above what it was before the sessions, with 200 idle
  sessions running, then with the same 200 hibernated (their disks still mounted, their
  records in the gateway); beside it the kernel containers' own cgroup memory (warm kernels
  included).

Asserts nothing; prints tables and writes bench/results/hibernation.json.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx

from bench.run import ROOT, free_port, machine, report, serving, summary, wait_until, wait_warm
from kernel_gateway.settings import DEFAULT_IMAGE

POOL = 2
SMALL = "rows = [{'id': i, 'name': f'n{i}'} for i in range(1000)]\ntotal = sum(range(10**5))"
BIG = (
    "import numpy as np, pandas as pd\n"
    "df = pd.DataFrame(np.random.default_rng(0).random((1_310_720, 10)))\n"
    "print(round(df.memory_usage().sum() / 1e6))"
)


USED = ("AnonPages", "Shmem", "SUnreclaim", "PageTables", "KernelStack", "Percpu")
"""What /proc/meminfo counts as memory nobody can take back: processes' own memory, shared
memory, and the kernel's for them. Not MemFree: on a VM it swings by hundreds of MiB for
reasons of its own (seen here), which would drown the hibernated figure."""


def host_used_mib() -> float:
    """Memory in use on the host (`USED`), after clean caches are dropped (as root)."""
    subprocess.run(["sync"], check=False)
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(1)
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    return sum(fields.get(name, 0) for name in USED) / 1024


def containers_mib(instance: str) -> tuple[int, float]:
    """This gateway's kernel containers (fork servers not included): how many, and their
    cgroup memory in all (without their page cache), read from the cgroup's files when
    they are where Docker's cgroupfs driver puts them (v1 or v2), else from the engine's
    stats (a second or two each). A container removed meanwhile is skipped."""
    engine = docker.from_env()
    try:
        # The low-level listing: the high-level one inspects each container, and fails on
        # one removed between the listing and its inspection.
        ids = [c["Id"] for c in engine.api.containers(filters={"label": _labels(instance)})]
        total = 0.0
        for container_id in ids:
            memory = _cgroup_mib(container_id)
            if memory is None:
                try:
                    memory = _stats_mib(engine.api.stats(container_id, stream=False))
                except docker.errors.NotFound:
                    continue
            total += memory
        return len(ids), total
    finally:
        engine.close()


def _labels(instance: str) -> list[str]:
    return [f"io.kernel-gateway.instance={instance}", "io.kernel-gateway.role=kernel"]


def kernel_containers(instance: str) -> int:
    engine = docker.from_env()
    try:
        return len(engine.api.containers(filters={"label": _labels(instance)}))
    finally:
        engine.close()


def _cgroup_mib(container_id: str) -> float | None:
    v1 = Path("/sys/fs/cgroup/memory/docker") / container_id
    v2 = Path("/sys/fs/cgroup/docker") / container_id
    try:
        if v1.is_dir():
            usage = int((v1 / "memory.usage_in_bytes").read_text())
            stat = (v1 / "memory.stat").read_text()
            cache_key = "total_inactive_file"
        elif v2.is_dir():
            usage = int((v2 / "memory.current").read_text())
            stat = (v2 / "memory.stat").read_text()
            cache_key = "inactive_file"
        else:
            return None
    except (OSError, ValueError):
        return None
    fields = dict(line.split() for line in stat.splitlines() if len(line.split()) == 2)
    return (usage - int(fields.get(cache_key, 0))) / 2**20


def _stats_mib(stats: dict[str, Any]) -> float:
    usage = stats.get("memory_stats", {})
    cache = usage.get("stats", {}).get("inactive_file", 0)
    return float(usage.get("usage", 0) - cache) / 2**20


def settle(seconds: float = 5.0) -> None:
    time.sleep(seconds)  # containers removed, memory given back


def cycles(http: httpx.Client, url: str, code: str, n: int) -> dict[str, Any]:
    """Hibernate and resume one session `n` times (resume by the route and by a cell, in
    turn)."""
    sid = http.post("/sessions").json()["id"]
    made = http.post(f"/sessions/{sid}/execute", json={"code": code}, headers=JSON_ACCEPT)
    if made.json()["status"] != "ok":
        raise RuntimeError(f"setting up the session failed: {made.text}")
    hibernate: list[float] = []
    resume: list[float] = []
    first: list[float] = []
    size = 0
    try:
        for i in range(n):
            wait_warm(url, POOL)
            t = time.perf_counter()
            answer = http.post(f"/sessions/{sid}/hibernate")
            hibernate.append(time.perf_counter() - t)
            if answer.status_code != 200:
                raise RuntimeError(f"hibernate: {answer.text}")
            size = answer.json()["hibernation"]["bytes"]
            wait_warm(url, POOL)
            t = time.perf_counter()
            if i % 2 == 0:
                answer = http.post(f"/sessions/{sid}/resume")
                resume.append(time.perf_counter() - t)
            else:
                answer = http.post(
                    f"/sessions/{sid}/execute", json={"code": "1 + 1"}, headers=JSON_ACCEPT
                )
                first.append(time.perf_counter() - t)
            if answer.status_code != 200:
                raise RuntimeError(f"resume: {answer.text}")
    finally:
        http.delete(f"/sessions/{sid}")
    return {
        "snapshot_bytes": size,
        "hibernate": summary(hibernate),
        "resume": summary(resume),
        "first_result": summary(first),
    }


JSON_ACCEPT = {"Accept": "application/json"}


def memory(http: httpx.Client, url: str, n: int) -> dict[str, Any]:
    """`n` idle sessions running, then hibernated: memory above the baseline."""
    instance = http.get("/health").json()["instance"]
    wait_warm(url, POOL)
    wait_until(lambda: kernel_containers(instance) <= POOL, 120)  # earlier sessions gone
    settle(10)
    baseline = host_used_mib()
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda _: _session(http), range(n)))
    wait_warm(url, POOL)
    settle(10)
    running = host_used_mib() - baseline
    count, cgroups = containers_mib(instance)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda sid: _hibernate(http, sid), ids))
    wait_until(lambda: kernel_containers(instance) <= POOL, 120)
    settle(10)
    hibernated = host_used_mib() - baseline
    snapshots = sum(http.get(f"/sessions/{sid}").json()["hibernation"]["bytes"] for sid in ids)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda sid: http.delete(f"/sessions/{sid}"), ids))
    return {
        "sessions": n,
        "running_mib": round(running, 1),
        "running_containers": count,
        "running_cgroups_mib": round(cgroups, 1),
        "hibernated_mib": round(hibernated, 1),
        "ratio": round(hibernated / running, 4) if running > 0 else None,
        "snapshots_kib": round(snapshots / 1024, 1),
    }


def _session(http: httpx.Client) -> str:
    sid = str(http.post("/sessions").json()["id"])
    http.post(f"/sessions/{sid}/execute", json={"code": SMALL}, headers=JSON_ACCEPT)
    return sid


def _hibernate(http: httpx.Client, sid: str) -> None:
    answer = http.post(f"/sessions/{sid}/hibernate")
    if answer.status_code != 200:
        raise RuntimeError(f"hibernate: {answer.text}")


def tables(results: dict[str, Any]) -> list[str]:
    rows = [
        "| session | snapshot | hibernate p50 (p90) | resume p50 (p90) | first `1 + 1` p50 (p90) |",
        "|---|---|---|---|---|",
    ]
    for key, label in (("small", "small"), ("dataframe", "100 MB DataFrame")):
        r = results[key]

        def cell(name: str, r: dict[str, Any] = r) -> str:
            return f"{r[name]['p50_ms']:.0f} ms ({r[name]['p90_ms']:.0f})"

        rows.append(
            f"| {label} | {r['snapshot_bytes'] / 1e6:.2f} MB | {cell('hibernate')} | "
            f"{cell('resume')} | {cell('first_result')} |"
        )
    m = results["memory"]
    memory_rows = [
        "| sessions | running, idle | hibernated | hibernated / running |",
        "|---|---|---|---|",
        f"| {m['sessions']} | {m['running_mib']:.0f} MiB ({m['running_cgroups_mib']:.0f} MiB in "
        f"{m['running_containers']} containers' cgroups) | {m['hibernated_mib']:.0f} MiB "
        f"(+ {m['snapshots_kib']:.0f} KiB of snapshots on disk) | "
        f"{100 * (m['ratio'] or 0):.1f}% |",
    ]
    return ["\n".join(rows), "\n".join(memory_rows)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run, to check the bench")
    parser.add_argument("--cycles", type=int, default=30, help="hibernate/resume cycles each")
    parser.add_argument("--sessions", type=int, default=200, help="sessions for memory")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the kernel image")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "hibernation.json")
    args = parser.parse_args()
    n = 2 if args.smoke else args.cycles
    sessions = 2 if args.smoke else args.sessions
    results: dict[str, Any] = {"machine": machine(), "mode": "smoke" if args.smoke else "full"}
    runtime = Path(tempfile.mkdtemp(prefix="kg-bench-hibernation-"))
    port = free_port()
    cmd = [
        sys.executable, "-m", "kernel_gateway", "serve",
        "--backend", "docker", "--port", str(port), "--image", args.image,
        "--pool-size", str(POOL), "--max-sessions", str(sessions + 8),
        "--stateless-mode", "container",
        "--runtime-dir", str(runtime), "--log-level", "warning",
    ]  # fmt: skip
    try:
        with serving(cmd, port, POOL, up_within=60) as url:
            with httpx.Client(base_url=url, timeout=600) as http:
                print("small session…", flush=True)
                results["small"] = cycles(http, url, SMALL, n)
                print("100 MB DataFrame…", flush=True)
                results["dataframe"] = cycles(http, url, BIG, n)
                print(f"memory of {sessions} sessions…", flush=True)
                results["memory"] = memory(http, url, sessions)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    report(results, tables(results), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
