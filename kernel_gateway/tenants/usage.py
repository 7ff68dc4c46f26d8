"""What each API key used: counted as it happens, kept with the keys, shown as metrics.

    sessions_created     sessions made (E2B sandboxes and their contexts, Jupyter kernels,
                         MCP sandboxes, sessions from snapshots and forks)
    stateless_requests   stateless executions let in (`POST /execute`, MCP's stateless tool)
    kernel_seconds       seconds its sessions' kernels ran (sampled every 5 s), and its
                         stateless executions' (each counted as it ends)
    cpu_seconds          CPU seconds they used (where the backend can tell: docker)
    peak_memory_bytes    the most memory one of its kernels held at a sample
    egress_bytes         bytes its sessions sent and received through the egress proxy
                         (allowlisted domains; sampled every 5 s)

Counts are added in memory and written to `keys.sqlite3` (`usage` table) every few seconds
and when the gateway stops, so a restart keeps them and a crash loses at most the last
few seconds'. Prometheus reads them at scrape time, labelled with the key's name
(`UsageCollector`); the admin token's own use is not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

USAGE_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    key_id TEXT PRIMARY KEY,
    sessions_created INTEGER NOT NULL DEFAULT 0,
    stateless_requests INTEGER NOT NULL DEFAULT 0,
    kernel_seconds REAL NOT NULL DEFAULT 0,
    cpu_seconds REAL NOT NULL DEFAULT 0,
    peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
    egress_bytes INTEGER NOT NULL DEFAULT 0
);
"""


@dataclass
class Usage:
    sessions_created: int = 0
    stateless_requests: int = 0
    kernel_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_memory_bytes: int = 0
    egress_bytes: int = 0

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)

    def row(self) -> tuple[float | int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


COLUMNS = tuple(f.name for f in fields(Usage))

HELP = {
    "sessions_created": "Sessions an API key made.",
    "stateless_requests": "Stateless executions an API key ran.",
    "kernel_seconds": "Seconds an API key's session kernels ran.",
    "cpu_seconds": "CPU seconds an API key's session kernels used.",
    "egress_bytes": "Bytes an API key's sessions sent and received through the egress proxy.",
}


class UsageCollector(Collector):
    """Each key's usage as Prometheus families, labelled `key` (its name), at scrape time."""

    def __init__(self, usage: Callable[[], Iterable[tuple[str, Usage]]]) -> None:
        self._usage = usage

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        rows = list(self._usage())
        for name, text in HELP.items():
            family = CounterMetricFamily(f"kernel_gateway_key_{name}", text, labels=["key"])
            for key, used in rows:
                family.add_metric([key], float(getattr(used, name)))
            yield family
        peak = GaugeMetricFamily(
            "kernel_gateway_key_peak_memory_bytes",
            "The most memory one of an API key's kernels held at a sample.",
            labels=["key"],
        )
        for key, used in rows:
            peak.add_metric([key], float(used.peak_memory_bytes))
        yield peak
