"""Prometheus metrics: what the gateway counts, and the gauges read at scrape time.

Each gateway has its own `CollectorRegistry` (never prometheus_client's global
one), created with the app and handed explicitly to whoever counts: the warm
pool (kernel starts), each session's kernel slot (deaths, restarts), each
session (executions), the streaming routes (events and bytes sent) and the
HTTP middleware (requests by route template). Gauges that describe the present
(sessions open, the warm pool, queued cells) are computed when Prometheus scrapes
by a collector their owner registers (`sessions/gauges.py`, in the app's lifespan),
so they can never drift from the truth and this module knows nothing above it.

Every label has a bounded set of values: route templates, never raw paths;
event names, statuses and reasons from fixed lists. Label values known in
advance are created at zero, so a series exists before its first event.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from kernel_gateway.types import DONE_STATUSES, EVENT_NAMES

DEATH_REASONS = ("exited", "signal", "killed", "out_of_memory")
EGRESS_DECISIONS = ("allowed", "refused", "failed")
KINDS = ("session", "stateless")

# Kernel starts take 0.5-3 s (runc to gVisor); cells from milliseconds to an hour.
START_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
EXECUTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)


class EndedCell(Protocol):
    """What `Metrics.execution_ended` reads of a cell (`sessions.execution.Execution`)."""

    @property
    def status(self) -> str: ...
    @property
    def started(self) -> float | None: ...
    @property
    def duration_ms(self) -> float: ...
    @property
    def first_output(self) -> float | None: ...


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.kernel_starts = Counter(
            "kernel_gateway_kernel_starts",
            "Kernels started and ready (warm pool refills and replacements).",
            registry=r,
        )
        self.kernel_start_failures = Counter(
            "kernel_gateway_kernel_start_failures",
            "Kernel starts that failed or did not become ready in time.",
            registry=r,
        )
        self.kernel_start_seconds = Histogram(
            "kernel_gateway_kernel_start_duration_seconds",
            "Time from asking the backend for a kernel to the kernel answering (and preloading).",
            buckets=START_BUCKETS,
            registry=r,
        )
        self.kernel_deaths = Counter(
            "kernel_gateway_kernel_deaths",
            "Kernels that ended without the gateway asking, by reason.",
            ["reason"],
            registry=r,
        )
        self.kernel_restarts = Counter(
            "kernel_gateway_kernel_restarts",
            "Session kernels replaced by a fresh one (after a death, a timeout, exit() or a "
            "restart request).",
            registry=r,
        )
        self.executions = Counter(
            "kernel_gateway_executions",
            "Executions that ended, by the status of their `done` event.",
            ["kind", "status"],
            registry=r,
        )
        self.execution_seconds = Histogram(
            "kernel_gateway_execution_duration_seconds",
            "Time from a cell being sent to its kernel to its end (queueing not included).",
            ["kind"],
            buckets=EXECUTION_BUCKETS,
            registry=r,
        )
        self.first_output_seconds = Histogram(
            "kernel_gateway_execution_first_output_seconds",
            "Time from a cell being sent to its kernel to its first output event.",
            ["kind"],
            buckets=EXECUTION_BUCKETS,
            registry=r,
        )
        self.events_sent = Counter(
            "kernel_gateway_events_sent",
            "Execution events sent to clients, by event and format (sse or json).",
            ["event", "format"],
            registry=r,
        )
        self.bytes_sent = Counter(
            "kernel_gateway_event_bytes_sent",
            "Bytes of execution events sent to clients (SSE frames, collected JSON documents).",
            ["format"],
            registry=r,
        )
        self.stateless_requests = Counter(
            "kernel_gateway_stateless_requests",
            "Stateless executions asked for (POST /execute with a valid body).",
            registry=r,
        )
        self.stateless_rejections = Counter(
            "kernel_gateway_stateless_rejections",
            "Stateless executions refused: capacity (429) or kernel_unavailable (503).",
            ["reason"],
            registry=r,
        )
        self.session_rejections = Counter(
            "kernel_gateway_session_rejections",
            "Sessions refused: capacity (429) or kernel_unavailable (503).",
            ["reason"],
            registry=r,
        )
        self.egress_requests = Counter(
            "kernel_gateway_egress_requests",
            "Connections a kernel made through the egress proxy, by decision: allowed, "
            "refused (the session's policy or the proxy's rules) or failed (an allowed host "
            "that could not be reached).",
            ["decision"],
            registry=r,
        )
        self.chat_turns = Counter(
            "kernel_gateway_chat_turns",
            "Chat turns ended, by their end status and the API key's name.",
            ["status", "key"],
            registry=r,
        )
        self.chat_model_calls = Counter(
            "kernel_gateway_chat_model_calls",
            "Calls to the chat's model, by outcome (ok, or the error type) and API key name.",
            ["outcome", "key"],
            registry=r,
        )
        self.chat_tokens = Counter(
            "kernel_gateway_chat_tokens",
            "Tokens the chat's model calls used, as the model reported them (else estimated).",
            ["key"],
            registry=r,
        )
        self.hibernations = Counter(
            "kernel_gateway_hibernations",
            "Sessions hibernated (saved to disk, kernel stopped).",
            registry=r,
        )
        self.hibernation_failures = Counter(
            "kernel_gateway_hibernation_failures",
            "Hibernations that failed to save the session (it ran on).",
            registry=r,
        )
        self.hibernate_seconds = Histogram(
            "kernel_gateway_hibernate_duration_seconds",
            "Time to hibernate a session: its snapshot written, its kernel stopped.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.resume_seconds = Histogram(
            "kernel_gateway_resume_duration_seconds",
            "Time to resume a hibernated session: a kernel on its disk, its snapshot loaded.",
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.http_requests = Counter(
            "kernel_gateway_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        for kind in KINDS:
            self.execution_seconds.labels(kind)
            self.first_output_seconds.labels(kind)
            for status in DONE_STATUSES:
                self.executions.labels(kind, status)
        for reason in DEATH_REASONS:
            self.kernel_deaths.labels(reason)
        for name in EVENT_NAMES:
            for fmt in ("sse", "json"):
                self.events_sent.labels(name, fmt)
        for fmt in ("sse", "json"):
            self.bytes_sent.labels(fmt)
        for decision in EGRESS_DECISIONS:
            self.egress_requests.labels(decision)
        for reason in ("capacity", "kernel_unavailable"):
            self.stateless_rejections.labels(reason)
            self.session_rejections.labels(reason)

    def register(self, collector: Collector) -> None:
        """Add gauges computed at scrape time (the owner of what they describe calls this)."""
        self.registry.register(collector)

    def unregister(self, collector: Collector) -> None:
        self.registry.unregister(collector)

    # -- what the domain reports -------------------------------------------------------------

    def kernel_started(self, seconds: float) -> None:
        self.kernel_starts.inc()
        self.kernel_start_seconds.observe(seconds)

    def kernel_start_failed(self) -> None:
        self.kernel_start_failures.inc()

    def kernel_died(self, reason: str) -> None:
        self.kernel_deaths.labels(reason if reason in DEATH_REASONS else "killed").inc()

    def kernel_restarted(self) -> None:
        self.kernel_restarts.inc()

    def execution_ended(self, execution: EndedCell, *, stateless: bool) -> None:
        kind = "stateless" if stateless else "session"
        self.executions.labels(kind, execution.status).inc()
        started = execution.started
        if started is None:  # never reached a kernel: refused, or stopped while queued
            return
        self.execution_seconds.labels(kind).observe(execution.duration_ms / 1000)
        if execution.first_output is not None:
            self.first_output_seconds.labels(kind).observe(execution.first_output - started)

    def sent(self, event: str, size: int, fmt: str) -> None:
        self.events_sent.labels(event if event in EVENT_NAMES else "other", fmt).inc()
        self.bytes_sent.labels(fmt).inc(size)

    def sent_document(self, events: Iterable[str], size: int) -> None:
        for event in events:
            self.events_sent.labels(event if event in EVENT_NAMES else "other", "json").inc()
        self.bytes_sent.labels("json").inc(size)

    def hibernated(self, seconds: float) -> None:
        self.hibernations.inc()
        self.hibernate_seconds.observe(seconds)

    def hibernation_failed(self) -> None:
        self.hibernation_failures.inc()

    def resumed(self, seconds: float) -> None:
        self.resume_seconds.observe(seconds)

    def egress_request(self, decision: str) -> None:
        self.egress_requests.labels(decision if decision in EGRESS_DECISIONS else "failed").inc()

    def request(self, method: str, route: str, status: int) -> None:
        self.http_requests.labels(method, route, str(status)).inc()

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition in the format `accept` asks for (text, or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
