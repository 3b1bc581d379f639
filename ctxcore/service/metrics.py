"""Prometheus metrics of `ctxcore serve`, served on their own port.

One `ServiceMetrics` per server, each with its own registry, so two servers in one
process (tests, benchmarks) never share counters. What is recorded: calls by RPC and
status code and their latency, branch outcomes, degraded and constrained assemblies,
which packer path ran, which wall applied, per-stage latency, the usable budget, and the
calls in flight, and the process's count cache of memories without stored counts (entries,
hits, misses: read when scraped). Labels are closed sets (RPC names, status codes, enum values), never
organization ids or anything a caller controls, so the series count stays bounded.
"""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..pricing import memory_count_cache_stats
from ..result import STAGES

__all__ = ["LATENCY_BUCKETS_S", "TIME_LEFT_BUCKETS_S", "ServiceMetrics"]

#: Latency buckets from 0.25 ms to 1 s, dense around the 40-45 ms wall of the defaults.
LATENCY_BUCKETS_S = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.045,
    0.050,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
)
#: Buckets of the time a call has left when it reaches admission: fine around the 45 ms
#: client timeout, coarse up to the deadlines of batch callers.
TIME_LEFT_BUCKETS_S = (
    0.001,
    0.002,
    0.005,
    0.0075,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.045,
    0.050,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: Usable-budget buckets in tokens, from the constrained line (256) to 1M-token windows.
USABLE_BUCKETS = (0, 256, 1024, 4096, 16384, 65536, 131072, 262144, 1048576)

_STAGES = (*STAGES, "total")


class _MemoryCountCacheCollector(Collector):
    """The memory count cache's figures (`ctxcore.pricing.memory_count_cache_stats`),
    read at scrape time. The cache is the process's: servers in one process report the
    same figures."""

    def collect(self) -> Any:
        s = memory_count_cache_stats()
        entries = GaugeMetricFamily(
            "ctxcore_memory_count_cache_entries", "Memories whose exact count the assembly keeps (no stored count)."
        )
        entries.add_metric([], s.entries)
        chars = GaugeMetricFamily(
            "ctxcore_memory_count_cache_chars", "Characters of ids and texts the memory count cache holds."
        )
        chars.add_metric([], s.chars)
        hits = CounterMetricFamily(
            "ctxcore_memory_count_cache_hits", "Lookups of memories without a stored count answered from the cache."
        )
        hits.add_metric([], s.hits)
        misses = CounterMetricFamily(
            "ctxcore_memory_count_cache_misses",
            "Lookups of memories without a stored count the cache could not answer.",
        )
        misses.add_metric([], s.misses)
        out: list[Metric] = [entries, chars, hits, misses]
        return out


class ServiceMetrics:
    """The service's metrics and the HTTP endpoint that exposes them."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "ctxcore_requests", "Calls handled, by RPC and gRPC status code.", ["rpc", "code"], registry=r
        )
        self.request_seconds = Histogram(
            "ctxcore_request_seconds",
            "Server-side call latency by RPC.",
            ["rpc"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.in_flight = Gauge("ctxcore_requests_in_flight", "Calls being handled.", registry=r)
        self.branches = Counter(
            "ctxcore_branch_outcomes", "Retrieval branch outcomes.", ["branch", "status"], registry=r
        )
        self.degraded = Counter("ctxcore_assemblies_degraded", "Assemblies that degraded.", registry=r)
        self.constrained = Counter(
            "ctxcore_assemblies_constrained", "Assemblies whose usable budget was constrained.", registry=r
        )
        self.pack_path = Counter("ctxcore_pack_path", "Which packer path decided.", ["path"], registry=r)
        self.wall = Counter("ctxcore_wall_source", "Which limit set the retrieval wall.", ["source"], registry=r)
        self.stage_seconds = Histogram(
            "ctxcore_stage_seconds", "Assembly stage latency.", ["stage"], buckets=LATENCY_BUCKETS_S, registry=r
        )
        self.usable_budget = Histogram(
            "ctxcore_usable_budget_tokens", "Usable memory budget per assembly.", buckets=USABLE_BUCKETS, registry=r
        )
        self.out_of_scope = Counter(
            "ctxcore_memories_out_of_scope", "Memories dropped because their scope did not match.", registry=r
        )
        self.refused = Counter(
            "ctxcore_admission_refused",
            "Calls refused by admission control before any work, by reason.",
            ["reason"],
            registry=r,
        )
        self.admitted = Gauge("ctxcore_admission_admitted", "Assemblies admitted and not yet finished.", registry=r)
        self.waiting = Gauge(
            "ctxcore_admission_waiting",
            "Admitted assemblies waiting for their turn to run (server.max_running).",
            registry=r,
        )
        self.admitted_calls = Counter(
            "ctxcore_admission_admitted_calls",
            "Assemblies admitted (with a deadline), by whether they ended inside it.",
            ["in_time"],
            registry=r,
        )
        self.turn = Gauge(
            "ctxcore_admission_turn_seconds",
            "How long a turn (server.max_running) lasts these days: the line's pace.",
            registry=r,
        )
        self.newest_first = Counter(
            "ctxcore_admission_newest_first_turns",
            "Turns handed to the newest waiter of an overloaded line (adaptive LIFO).",
            registry=r,
        )
        self.tail_estimate = Gauge(
            "ctxcore_admission_tail_estimate_seconds",
            "The service-time estimate after retrieval that the last admission decision used.",
            registry=r,
        )
        self.loop_lag = Gauge(
            "ctxcore_event_loop_lag_seconds", "How late the event loop's periodic probe fired.", registry=r
        )
        self.time_left = Histogram(
            "ctxcore_admission_time_left_seconds",
            "Time left to the caller's deadline when an AssembleContext call reached admission (calls with a "
            "deadline): its deadline less the client's, the network's and the server's accept time.",
            buckets=TIME_LEFT_BUCKETS_S,
            registry=r,
        )
        r.register(_MemoryCountCacheCollector())
        self._http: Any = None
        # Each labelled child once (`labels` checks and locks on every call); the label
        # values are a few fixed sets (RPCs, codes, branches, statuses, paths, stages).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_call(self, rpc: str, code: grpc.StatusCode, seconds: float) -> None:
        """One finished call."""
        self._child(self.requests, rpc, code.name).inc()
        self._child(self.request_seconds, rpc).observe(seconds)

    def observe_assembly(self, ctx: Any) -> None:
        """What one assembled context says about the pipeline."""
        for b in ctx.branches:
            self._child(self.branches, str(b.branch), str(b.status)).inc()
            if b.dropped_out_of_scope:
                self.out_of_scope.inc(b.dropped_out_of_scope)
        if ctx.degraded:
            self.degraded.inc()
        if ctx.constrained:
            self.constrained.inc()
        self._child(self.pack_path, str(ctx.pack.path) if ctx.pack is not None else "none").inc()
        self._child(self.wall, str(ctx.wall.source)).inc()
        t = ctx.timings
        for stage in _STAGES:
            self._child(self.stage_seconds, stage).observe(getattr(t, f"{stage}_ms") / 1000.0)
        self.usable_budget.observe(ctx.budget.usable)

    def serve(self, port: int, addr: str) -> int:
        """Start the /metrics endpoint (a daemon thread); returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._http = server
        return int(server.server_address[1])

    def close(self) -> None:
        """Stop the endpoint, if it runs."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
