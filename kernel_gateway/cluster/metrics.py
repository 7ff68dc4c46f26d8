"""The router's Prometheus metrics: requests, placements, and each node as last seen.

Node gauges are read from the directory at scrape time. Node names label some series:
a cluster has a bounded, operator-chosen set of nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from kernel_gateway.cluster.directory import NODE_STATES, NodeDirectory

PLACEMENT_OUTCOMES = ("placed", "refused", "unreachable")


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "kernel_gateway_router_http_requests",
            "HTTP requests the router answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.placements = Counter(
            "kernel_gateway_router_placements",
            "New sessions and stateless requests offered to a node, by kind and outcome.",
            ["kind", "node", "outcome"],
            registry=r,
        )
        self.lost_sessions = Counter(
            "kernel_gateway_router_node_lost_answers",
            "Requests answered 410 node_lost (their session's node is presumed dead).",
            registry=r,
        )
        self._directory: NodeDirectory | None = None
        r.register(_NodeCollector(self))

    def watch(self, directory: NodeDirectory | None) -> None:
        self._directory = directory

    def request(self, method: str, route: str, status: int) -> None:
        self.http_requests.labels(method, route, str(status)).inc()

    def placement(self, kind: str, node: str, outcome: str) -> None:
        self.placements.labels(kind, node, outcome).inc()

    def lost_session(self) -> None:
        self.lost_sessions.inc()

    def render(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class _NodeCollector(Collector):
    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        directory = self._metrics._directory
        nodes = list(directory.nodes.values()) if directory is not None else []
        by_state = GaugeMetricFamily(
            "kernel_gateway_router_nodes", "Node gateways known, by state.", labels=["state"]
        )
        for state in NODE_STATES:
            by_state.add_metric([state], sum(1 for n in nodes if n.state == state))
        sessions = GaugeMetricFamily(
            "kernel_gateway_router_node_sessions",
            "Sessions on each node, as it last reported (plus placements since).",
            labels=["node"],
        )
        capacity = GaugeMetricFamily(
            "kernel_gateway_router_node_max_sessions",
            "Each node's --max-sessions, as it last reported.",
            labels=["node"],
        )
        up = GaugeMetricFamily(
            "kernel_gateway_router_node_up",
            "1 when the node answered the last poll.",
            labels=["node"],
        )
        for node in nodes:
            sessions.add_metric([node.name], node.sessions)
            capacity.add_metric([node.name], node.max_sessions)
            up.add_metric([node.name], 1 if node.state == "up" else 0)
        yield from (by_state, sessions, capacity, up)
