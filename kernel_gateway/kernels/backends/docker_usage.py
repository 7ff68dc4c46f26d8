"""A kernel container's CPU time and memory, read from its cgroup (cheap: a few small files)
where Docker's cgroupfs driver puts it on this host (v1 or v2), else from the engine's stats
(`one-shot`: a single sample, no wait); and its limits lowered (an API key's quotas): by the
engine (`docker update`), else, where the runtime does not take updates (gVisor's runsc),
in its cgroup, which holds the whole sandbox. Blocks: call it in the backend's threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import docker.errors

from kernel_gateway.kernels.backends.base import Usage

CGROUP = Path("/sys/fs/cgroup")
NO_LIMIT = 1 << 62
"""What cgroup v1 reports as the limit of a group without one (about 2^63, page-rounded)."""


def read_usage(client: docker.DockerClient, container_id: str, limit: int) -> Usage | None:
    """`container_id`'s usage (`limit`: its memory limit, when the cgroup has none); None if
    it is gone."""
    return _from_cgroup(container_id, limit) or _from_engine(client, container_id, limit)


def _from_cgroup(container_id: str, limit: int) -> Usage | None:
    try:
        v1 = CGROUP / "memory" / "docker" / container_id
        if v1.is_dir():
            stat = _fields(v1 / "memory.stat")
            cpu = CGROUP / "cpuacct" / "docker" / container_id / "cpuacct.usage"
            ceiling = int((v1 / "memory.limit_in_bytes").read_text())
            return Usage(
                cpu_seconds=int(cpu.read_text()) / 1e9,
                memory_bytes=int((v1 / "memory.usage_in_bytes").read_text())
                - stat.get("total_inactive_file", 0),
                memory_limit=ceiling if 0 < ceiling < NO_LIMIT else limit,
                cache_bytes=stat.get("total_cache", 0),
            )
        v2 = CGROUP / "docker" / container_id
        if v2.is_dir():
            stat = _fields(v2 / "memory.stat")
            ceiling_text = (v2 / "memory.max").read_text().strip()
            return Usage(
                cpu_seconds=_fields(v2 / "cpu.stat").get("usage_usec", 0) / 1e6,
                memory_bytes=int((v2 / "memory.current").read_text())
                - stat.get("inactive_file", 0),
                memory_limit=int(ceiling_text) if ceiling_text.isdigit() else limit,
                cache_bytes=stat.get("file", 0),
            )
    except (OSError, ValueError):
        return None
    return None


CPU_PERIOD = 100_000
"""Microseconds of the CFS period a CPU quota is a share of (Docker's own)."""


def limit_container(
    client: docker.DockerClient, container_id: str, cpus: float | None, memory: int | None
) -> None:
    """Lower `container_id`'s limits to `cpus` and `memory` bytes (swap: none, as at start)."""
    update: dict[str, int] = {}
    if cpus is not None:
        update["NanoCpus"] = int(cpus * 1e9)
    if memory is not None:
        update["Memory"] = update["MemorySwap"] = memory
    if not update:
        return
    api: Any = client.api  # docker-py's update_container has no NanoCpus: its own POST
    try:
        url = api._url("/containers/{0}/update", container_id)
        api._raise_for_status(api._post_json(url, data=update))
        return
    except docker.errors.APIError:
        if not _limit_cgroup(container_id, cpus, memory):
            raise


def _groups(container_id: str) -> list[str]:
    """Where a container's cgroup may be, under each hierarchy: Docker's cgroupfs driver's
    folder, or the systemd driver's scope."""
    return [f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"]


def _limit_cgroup(container_id: str, cpus: float | None, memory: int | None) -> bool:
    """The same, written in its cgroup (v1 or v2); False if it has none here."""
    quota = int(cpus * CPU_PERIOD) if cpus is not None else None
    for group in _groups(container_id):
        v1 = CGROUP / "memory" / group
        if not v1.is_dir():
            continue
        if memory is not None:
            limit, swap = v1 / "memory.limit_in_bytes", v1 / "memory.memsw.limit_in_bytes"
            # memory+swap may never be below memory: lowering, memory first; raising (a
            # quota raised since an adopted kernel was limited), memory+swap first.
            order = [limit, swap]
            if swap.exists() and memory > int(swap.read_text()):
                order.reverse()
            for path in order:
                if path.exists():
                    path.write_text(str(memory))
        if quota is not None:
            cpu = CGROUP / "cpu" / group
            (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota))
        return True
    for group in _groups(container_id):
        v2 = CGROUP / group
        if not v2.is_dir():
            continue
        if memory is not None:
            (v2 / "memory.max").write_text(str(memory))
            if (v2 / "memory.swap.max").exists():
                (v2 / "memory.swap.max").write_text("0")
        if quota is not None:
            (v2 / "cpu.max").write_text(f"{quota} {CPU_PERIOD}")
        return True
    return False


def _fields(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def _from_engine(client: docker.DockerClient, container_id: str, limit: int) -> Usage | None:
    try:
        stats: dict[str, Any] = client.api.stats(container_id, stream=False, one_shot=True)
    except docker.errors.NotFound:
        return None
    memory = stats.get("memory_stats") or {}
    details = memory.get("stats") or {}
    cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    ceiling = int(memory.get("limit") or 0)
    return Usage(
        cpu_seconds=int(cpu.get("total_usage") or 0) / 1e9,
        memory_bytes=int(memory.get("usage") or 0)
        - int(details.get("inactive_file", details.get("total_inactive_file", 0))),
        memory_limit=ceiling if 0 < ceiling < NO_LIMIT else limit,
        cache_bytes=int(details.get("file", details.get("cache", 0))),
    )
