"""The gauges that describe the present, read from the `Registry` when Prometheus scrapes.

Registered on the app's `Metrics` by its lifespan once the registry exists, and removed
when it closes, so `/metrics` never shows a stale registry's numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kernel_gateway import __version__
from kernel_gateway.sessions.registry import Registry


class RegistryGauges(Collector):
    """Gauges computed from the registry at scrape time (sessions, the pools, queues)."""

    def __init__(self, registry: Registry) -> None:
        self.source = registry

    def describe(self) -> Iterable[Metric]:
        return []  # no families up front: none is created before the first scrape

    def collect(self) -> Iterator[Metric]:
        registry = self.source
        info = GaugeMetricFamily(
            "kernel_gateway_info", "Version and backend.", labels=["version", "backend"]
        )
        info.add_metric([__version__, registry.backend.name], 1)
        yield info
        pool = registry.warm.stats()
        sessions = registry.sessions()
        stats = registry.stats()
        for name, value, text in (
            ("sessions", len(sessions), "Sessions open (stateless ones not included)."),
            (
                "hibernated_sessions",
                sum(1 for s in sessions if s.hibernated),
                "Sessions hibernated: on disk, no kernel running (counted in sessions).",
            ),
            ("sessions_limit", stats["max_sessions"], "--max-sessions."),
            ("stateless_executions", stats["stateless"], "Stateless executions under way."),
            ("stateless_limit", stats["max_stateless"], "--max-stateless."),
            ("pool_warm_kernels", pool["warm"], "Warm kernels ready to hand out."),
            ("pool_starting_kernels", pool["starting"], "Kernels starting for the warm pool."),
            ("pool_target_kernels", pool["target"], "Warm kernels the pool keeps (--pool-size)."),
            (
                "queued_executions",
                sum(s.queued for s in sessions),
                "Cells waiting for their session's kernel.",
            ),
            (
                "running_executions",
                sum(1 for s in sessions if s.current is not None),
                "Session cells running now (stateless ones are stateless_executions).",
            ),
        ):
            yield GaugeMetricFamily(f"kernel_gateway_{name}", text, value=value)
        if registry.forks is not None:
            forks = registry.forks.stats()
            servers = GaugeMetricFamily(
                "kernel_gateway_fork_servers",
                "Fork-server containers for stateless requests, by state.",
                labels=["state"],
            )
            for state in ("idle", "busy", "starting"):
                servers.add_metric([state], forks[state])
            yield servers
            yield CounterMetricFamily(
                "kernel_gateway_fork_server_requests",
                "Stateless requests forked from a fork server.",
                value=forks["requests_served"],
            )
