"""OpenTelemetry spans of the service (the ``otel`` extra): one SERVER span per call that
continues the caller's trace, stage spans under AssembleContext placed one after another,
outcomes as attributes, errors marked, and no memory text anywhere in a span."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

sdk = pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from service_support import FakeSources, FaultPlan, make_tenants, open_config, running

from ctxcore.memory import Query
from ctxcore.request import AssemblyRequest
from ctxcore.service.convert import request_to_proto
from ctxcore.v1 import context_assembly_pb2 as pb

EXPORTER = InMemorySpanExporter()
PROVIDER = sdk.TracerProvider()  # this server's own: the process-wide provider stays as it is
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def test_spans_per_call_and_stage() -> None:
    EXPORTER.clear()
    tenants = make_tenants(2)
    t = tenants[0]
    fake = FakeSources(tenants, FaultPlan({"cold": "raise"}))

    async def main() -> None:
        async with running(open_config(), sources=fake.sources(), tracer_provider=PROVIDER) as svc:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
                call = ch.unary_unary(
                    "/ctxcore.v1.ContextAssemblyService/AssembleContext",
                    request_serializer=pb.AssembleContextRequest.SerializeToString,
                    response_deserializer=pb.AssembledContext.FromString,
                )
                req = request_to_proto(
                    AssemblyRequest(t.scope.organization_id, t.scope.agent_id, "gpt-4o", Query("marker"))
                )
                r = await call(req, timeout=2.0, metadata=(("traceparent", TRACEPARENT),))
                assert r.degraded
                with pytest.raises(grpc.aio.AioRpcError):
                    await call(pb.AssembleContextRequest(), timeout=2.0)

    asyncio.run(main())
    spans = EXPORTER.get_finished_spans()
    servers = [s for s in spans if s.kind == trace.SpanKind.SERVER]
    assert len(servers) == 2
    ok, bad = servers
    assert ok.name == "ctxcore.v1.ContextAssemblyService/AssembleContext"
    assert format(ok.context.trace_id, "032x") == TRACE_ID  # the caller's trace goes on
    assert ok.attributes["rpc.grpc.status_code"] == 0
    assert ok.attributes["ctxcore.organization_id"] == t.scope.organization_id
    assert ok.attributes["ctxcore.degraded"] is True
    stages = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == ok.context.span_id),
        key=lambda s: s.start_time,
    )
    assert [s.name for s in stages] == [
        f"ctxcore.{n}" for n in ("budget", "retrieval", "scoring", "packing", "formatting")
    ]
    for a, b in zip(stages, stages[1:]):
        assert a.end_time == b.start_time
    retrieval = stages[1].attributes
    assert retrieval["ctxcore.branch.cold.status"] == "error" and retrieval["ctxcore.branch.hot.status"] == "ok"
    assert bad.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert bad.status.status_code == trace.StatusCode.ERROR
    everything = json.dumps([s.to_json() for s in spans])
    assert "CANARY" not in everything and "marker" not in everything
