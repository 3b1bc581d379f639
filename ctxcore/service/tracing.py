"""OpenTelemetry spans for `ctxcore serve`, when ``opentelemetry-api`` is installed.

One SERVER span per call, continuing the caller's trace (W3C ``traceparent`` in the call
metadata), named for the RPC and carrying its status code, the principal and the
requested organization and agent; under an AssembleContext span, one child span per
pipeline stage (budget, retrieval, scoring, packing, formatting) placed on the timeline
from the assembly's own stage timings (the stages run one after another, so each starts
where the one before ended), with the branch outcomes, the wall, the pack path and the
usable budget as attributes. Memory text, queries and messages never become attributes.

Without ``opentelemetry-api`` (``pip install 'ctxcore-llm[otel]'``) every function here is a
no-op. Exporting is the process's business: install an SDK and exporter and run
``opentelemetry-instrument ctxcore serve ...``, or configure a tracer provider before
building a `ContextService` (or pass one as its ``tracer_provider``).
"""

from __future__ import annotations

import time
from typing import Any

from ..result import STAGES
from .wire import SERVICE_NAME

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - the extra is not installed
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

__all__ = ["CallTracer"]


class CallTracer:
    """Spans for one server's calls (no-ops when OpenTelemetry is not installed)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.enabled = trace is not None
        self._tracer: Any = (
            trace.get_tracer("ctxcore.service", tracer_provider=tracer_provider) if trace is not None else None
        )

    def start(self, rpc: str, metadata: Any) -> Any:
        """Start the call's SERVER span (None when tracing is off)."""
        if self._tracer is None:
            return None
        carrier = {k: v for k, v in (metadata or ()) if isinstance(v, str)}
        parent = propagate.extract(carrier)
        return self._tracer.start_span(
            f"{SERVICE_NAME}/{rpc}",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": SERVICE_NAME, "rpc.method": rpc},
        )

    def assembly(self, span: Any, ctx: Any, started_ns: int) -> None:
        """Stage spans under `span` and the assembly's outcome as its attributes."""
        if span is None or self._tracer is None or not span.is_recording():
            return  # no tracer provider set up (the API's default): nothing would be kept
        parent = trace.set_span_in_context(span)
        t = started_ns
        for stage in STAGES:
            ms = float(getattr(ctx.timings, f"{stage}_ms"))
            end = t + int(ms * 1e6)
            child = self._tracer.start_span(f"ctxcore.{stage}", context=parent, start_time=t)
            if stage == "retrieval":
                for b in ctx.branches:
                    child.set_attribute(f"ctxcore.branch.{b.branch}.status", str(b.status))
                    child.set_attribute(f"ctxcore.branch.{b.branch}.latency_ms", float(b.latency_ms))
                child.set_attribute("ctxcore.wall.limit_ms", float(ctx.wall.limit_ms))
                child.set_attribute("ctxcore.wall.source", str(ctx.wall.source))
            if stage == "packing" and ctx.pack is not None:
                child.set_attribute("ctxcore.pack.path", str(ctx.pack.path))
                child.set_attribute("ctxcore.pack.selected", len(ctx.pack.ids))
            child.end(end_time=end)
            t = end
        span.set_attribute("ctxcore.degraded", bool(ctx.degraded))
        span.set_attribute("ctxcore.degradation_reasons", [str(r) for r in ctx.degradation_reasons])
        span.set_attribute("ctxcore.constrained", bool(ctx.constrained))
        span.set_attribute("ctxcore.budget.usable", int(ctx.budget.usable))
        span.set_attribute("ctxcore.wall.source", str(ctx.wall.source))

    def end(self, span: Any, code_name: str, code_value: int, fields: dict[str, Any]) -> None:
        """Close the call's span with its gRPC status."""
        if span is None:
            return
        if not span.is_recording():
            span.end()
            return
        span.set_attribute("rpc.grpc.status_code", code_value)
        for key in ("principal", "organization_id", "agent_id"):
            if fields.get(key):
                span.set_attribute(f"ctxcore.{key}", str(fields[key]))
        if code_name != "OK":
            span.set_status(trace.Status(trace.StatusCode.ERROR, code_name))
        span.end()

    @staticmethod
    def now_ns() -> int:
        """The clock spans are placed on."""
        return time.time_ns()
