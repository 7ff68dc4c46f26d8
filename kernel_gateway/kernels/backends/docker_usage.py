"""A kernel container's CPU time and memory, read from its cgroup (cheap: a few small files)
where Docker's cgroupfs driver puts it on this host (v1 or v2), else from the engine's stats
(`one-shot`: a single sample, no wait). Blocks: call it in the backend's threads."""

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
