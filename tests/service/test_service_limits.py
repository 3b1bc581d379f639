"""Per-request bounds at the service boundary, bounded error details, a typed status for
inputs that could otherwise reach callers as INTERNAL, the drain default, and all-or-nothing
ingest of memories with their directives.

Every documented limit (`ctxcore.service.convert.LIMITS`, the table in docs/howto/serving.md) is
enforced on a real server on a loopback port: one past it is RESOURCE_EXHAUSTED (counts,
sizes, nesting) or INVALID_ARGUMENT (ids and names), naming the limit; exactly at it is
accepted. No status echoes more than a short prefix of what the caller sent.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from service_support import FakeSources, make_tenants, open_config, running

import ctxcore
from ctxcore.scoring import ScoreWeights, score_candidates
from ctxcore.service import ServiceConfig
from ctxcore.service.config import DEFAULT_DRAIN_DELAY_S, parse_service_config
from ctxcore.service.convert import (
    LIMITS,
    MAX_DETAILS_CHARS,
    MAX_ID_CHARS,
    QUOTE_CHARS,
)
from ctxcore.service.wire import METHOD_PREFIX
from ctxcore.v1 import context_assembly_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
#: The serving guide, which documents the limits and the configuration file.
SERVING_GUIDE = ROOT / "docs" / "howto" / "serving.md"
SERVICE = METHOD_PREFIX
TENANTS = make_tenants(2)
ORG, AGENT = TENANTS[0].scope.organization_id, TENANTS[0].scope.agent_id


def _req(**kw: Any) -> pb.AssembleContextRequest:
    kw.setdefault("organization_id", ORG)
    kw.setdefault("agent_id", AGENT)
    kw.setdefault("model", "gpt-4o")
    return pb.AssembleContextRequest(**kw)


Case = tuple[str, Any]


def _call_all(cases: list[Case]) -> list[tuple[grpc.StatusCode, str, Any]]:
    """Send each (rpc, message) to one real server; return (code, details, answer)."""

    async def main() -> list[tuple[grpc.StatusCode, str, Any]]:
        out = []
        async with running(open_config(), sources=FakeSources(TENANTS).sources()) as svc:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
                for rpc, msg in cases:
                    resp_cls = {
                        "AssembleContext": pb.AssembledContext,
                        "ComputeBudget": pb.Budget,
                        "GetModelCapabilities": pb.GetModelCapabilitiesResponse,
                    }[rpc]
                    call = ch.unary_unary(
                        SERVICE + rpc,
                        request_serializer=type(msg).SerializeToString,
                        response_deserializer=resp_cls.FromString,
                    )
                    try:
                        answer = await call(msg, timeout=30.0)
                        out.append((grpc.StatusCode.OK, "", answer))
                    except grpc.aio.AioRpcError as exc:
                        out.append((exc.code(), exc.details() or "", None))
        return out

    return asyncio.run(main())


def _one(rpc: str, msg: Any) -> tuple[grpc.StatusCode, str, Any]:
    return _call_all([(rpc, msg)])[0]


# ---- the documented limits ------------------------------------------------------------


def _over_and_at(name: str) -> tuple[Case, Case]:
    """A request one past limit `name`, and one exactly at it."""
    n = LIMITS[name]
    user = pb.Message(role="user", content="hi")
    if name == "max_messages":  # (a window that holds them all, so the strict policy keeps them)
        return (
            ("AssembleContext", _req(model="gemini-1.5-pro", messages=[user] * (n + 1))),
            ("AssembleContext", _req(model="gemini-1.5-pro", messages=[user] * n)),
        )
    if name == "max_tools":
        return (
            ("AssembleContext", _req(tools_json=['{"name":"t"}'] * (n + 1))),
            ("AssembleContext", _req(tools_json=['{"name":"t"}'] * n)),
        )
    if name == "max_tool_calls":

        def msgs(k: int) -> list[pb.Message]:
            calls = [pb.ToolCall(id=f"c{i}", name="f") for i in range(k)]
            return [
                user,
                pb.Message(role="assistant", tool_calls=calls),
                *[pb.Message(role="tool", tool_call_id=f"c{i}", content="ok") for i in range(k)],
            ]

        return ("AssembleContext", _req(messages=msgs(n + 1))), ("AssembleContext", _req(messages=msgs(n)))
    if name == "max_json_depth":

        def nested(d: int) -> str:  # d levels of objects and arrays in all
            return '{"a":' + "[" * (d - 1) + "]" * (d - 1) + "}"

        return (
            ("AssembleContext", _req(tools_json=[nested(n + 1)])),
            ("AssembleContext", _req(tools_json=[nested(n)])),
        )
    if name == "max_query_chars":
        return (
            ("AssembleContext", _req(query=pb.Query(text="q" * (n + 1)))),
            ("AssembleContext", _req(query=pb.Query(text="q" * n))),
        )
    if name == "max_embedding_dims":
        return (
            ("AssembleContext", _req(query=pb.Query(text="q", embedding=[0.1] * (n + 1)))),
            ("AssembleContext", _req(query=pb.Query(text="q", embedding=[0.1] * n))),
        )
    if name in ("max_memories",):
        return (
            ("AssembleContext", _req(options=pb.AssemblyOptions(max_memories=n + 1))),
            ("AssembleContext", _req(options=pb.AssemblyOptions(max_memories=n))),
        )
    if name == "max_pinned_memory_ids":
        return (
            ("AssembleContext", _req(options=pb.AssemblyOptions(pinned_memory_ids=[f"m{i}" for i in range(n + 1)]))),
            ("AssembleContext", _req(options=pb.AssemblyOptions(pinned_memory_ids=[f"m{i}" for i in range(n)]))),
        )
    if name == "max_models":
        return (
            ("GetModelCapabilities", pb.GetModelCapabilitiesRequest(models=["gpt-4o"] * (n + 1))),
            ("GetModelCapabilities", pb.GetModelCapabilitiesRequest(models=["gpt-4o"] * n)),
        )
    if name == "max_id_chars":
        return (("AssembleContext", _req(agent_id="a" * (n + 1))), ("AssembleContext", _req(agent_id="a" * n)))
    raise AssertionError(f"no case for {name}")


def test_every_limit_is_enforced_and_named() -> None:
    names = sorted(LIMITS)
    cases: list[Case] = []
    for name in names:
        cases.extend(_over_and_at(name))
    results = _call_all(cases)
    for k, name in enumerate(names):
        (code_over, details, _), (code_at, at_details, _) = results[2 * k], results[2 * k + 1]
        expected = (
            grpc.StatusCode.INVALID_ARGUMENT
            if name in ("max_id_chars", "max_memories")
            else grpc.StatusCode.RESOURCE_EXHAUSTED
        )
        assert code_over == expected, (name, code_over, details)
        assert f"{name} = {LIMITS[name]}" in details, (name, details)
        assert code_at == grpc.StatusCode.OK, (name, code_at, at_details)


def test_the_serving_guide_documents_every_limit() -> None:
    guide = (SERVING_GUIDE).read_text(encoding="utf-8")
    for name, value in LIMITS.items():
        assert re.search(rf"`{name}`\s*\|\s*{value:,}\b", guide), (
            f"{SERVING_GUIDE.name} has no row `{name}` | {value:,}"
        )


# ---- model names and bounded details -------------------------------------------------


def test_model_names_are_capped_and_never_echoed_whole() -> None:
    huge = "m" * 100_000
    cases: list[Case] = [
        ("ComputeBudget", pb.ComputeBudgetRequest(model=huge)),
        ("GetModelCapabilities", pb.GetModelCapabilitiesRequest(models=["gpt-4o", huge])),
        ("AssembleContext", _req(model=huge)),
        ("ComputeBudget", pb.ComputeBudgetRequest(model="x" * MAX_ID_CHARS)),  # at the cap: unknown
        ("GetModelCapabilities", pb.GetModelCapabilitiesRequest(models=["y" * MAX_ID_CHARS])),
        ("ComputeBudget", pb.ComputeBudgetRequest(model="gpt-4oo")),
    ]
    (c1, d1, _), (c2, d2, _), (c3, d3, _), (c4, d4, _), (c5, d5, _), (c6, d6, _) = _call_all(cases)
    assert (c1, c2, c3) == (grpc.StatusCode.INVALID_ARGUMENT,) * 3
    assert d1.startswith("model: 100000 characters, longer than max_id_chars = 256"), d1
    assert d2.startswith("models[1]: 100000 characters"), d2
    assert d3.startswith("model: 100000 characters"), d3
    assert c4 == grpc.StatusCode.INVALID_ARGUMENT and c5 == grpc.StatusCode.NOT_FOUND
    for d in (d4, d5):
        assert "unknown model" in d and f"({MAX_ID_CHARS} characters)" in d
        assert len(d) < 4 * QUOTE_CHARS + 100, d
    assert c6 == grpc.StatusCode.INVALID_ARGUMENT and "did you mean 'gpt-4o'" in d6


@pytest.mark.parametrize("field", ["organization_id", "role", "weight_key", "tool_json", "tool_call_id", "pinned"])
def test_details_quote_a_short_prefix_only(field: str) -> None:
    big = "Z" * 50_000
    msg = {
        "organization_id": _req(organization_id=big),
        "role": _req(messages=[pb.Message(role=big)]),
        "weight_key": _req(options=pb.AssemblyOptions(weights={big: 1.0})),
        "tool_json": _req(tools_json=["[" + big]),
        "tool_call_id": _req(messages=[pb.Message(role="tool", tool_call_id=big)]),
        "pinned": _req(options=pb.AssemblyOptions(pinned_memory_ids=[big])),
    }[field]
    code, details, _ = _one("AssembleContext", msg)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert len(details) <= MAX_DETAILS_CHARS
    assert "Z" * (QUOTE_CHARS + 1) not in details, details


# ---- inputs that reached callers as INTERNAL ------------------------------------------


def test_weights_near_the_float_maximum_are_scored() -> None:
    r = score_candidates([0.9, 0.2], [0.1, 0.9], weights=ScoreWeights(similarity=1e308, confidence=1e308))
    assert dict(r.weights) == {"similarity": 0.5, "confidence": 0.5}
    assert r.scores.tolist() == pytest.approx([0.5, 0.55])
    code, details, answer = _one(
        "AssembleContext",
        _req(
            query=pb.Query(text="marker"),
            options=pb.AssemblyOptions(weights={"similarity": 1e308, "confidence": 1e308}),
        ),
    )
    assert code == grpc.StatusCode.OK, details
    assert any(t.reason == pb.TRACE_REASON_SELECTED for t in answer.trace)


@pytest.mark.parametrize(
    "text",
    ['{"name":"t","x":NaN}', '{"name":"t","x":Infinity}', '{"x":-Infinity}', '{"x":1e999}', '{"x":' + "9" * 5000 + "}"],
)
def test_non_finite_json_is_invalid_argument(text: str) -> None:
    code, details, _ = _one("AssembleContext", _req(tools_json=['{"name":"ok"}', text]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert details.startswith("tools_json[1]: is not valid JSON"), details


def test_in_process_requests_refuse_non_finite_tool_json() -> None:
    with pytest.raises(ValueError, match=r"tools\[0\] is not JSON-serializable"):
        ctxcore.AssemblyRequest("o", "a", "gpt-4o", ctxcore.Query("q"), tools=({"x": float("nan")},))


# ---- drain default ----------------------------------------------------------------------


def test_drain_delay_default_is_non_zero_and_documented() -> None:
    assert ServiceConfig().drain_delay_s == DEFAULT_DRAIN_DELAY_S > 0
    assert parse_service_config("").drain_delay_s == DEFAULT_DRAIN_DELAY_S
    guide = SERVING_GUIDE.read_text(encoding="utf-8")
    documented = re.findall(r"drain_delay_s = ([0-9.]+)", guide)
    assert documented and all(float(v) == DEFAULT_DRAIN_DELAY_S for v in documented), documented
    doc = ctxcore.service.config.__doc__ or ""
    assert f"drain_delay_s = {DEFAULT_DRAIN_DELAY_S}" in doc


# ---- ingest: memories and directives in one transaction ---------------------------------


def test_ingest_is_all_or_nothing_with_directives(tmp_path: Path) -> None:
    from ctxcore.memory import Scope
    from ctxcore.stores import InvalidMemory, SqliteMemoryStore, ingest_jsonl

    good = '{"id": "m1", "organization_id": "o", "agent_id": "a", "text": "likes tea"}\n'
    directive = '{"type": "directive", "organization_id": "o", "agent_id": "a", "text": "Be brief."}\n'
    clash = '{"id": "m1", "organization_id": "o", "agent_id": "a", "text": "again"}\n'
    with SqliteMemoryStore(tmp_path / "m.db") as store:
        ingest_jsonl(store, "first.jsonl", good)
        # A directive before a memory whose id is taken: the whole file is refused, and the
        # directive is not left behind.
        with pytest.raises(InvalidMemory, match=r"second.jsonl:2: .*already stored"):
            ingest_jsonl(store, "second.jsonl", directive + clash)
        assert asyncio.run(store.directive(Scope("o", "a"))) is None
        report = ingest_jsonl(store, "third.jsonl", directive)
        assert (report.memories, report.directives) == (0, 1)
        assert asyncio.run(store.directive(Scope("o", "a"))) == "Be brief."


# ---- the largest valid request ----------------------------------------------------------


def test_the_largest_request_is_trimmed_while_health_answers() -> None:
    """20,000 turns (about 2.2 MB) with TRIM_OLDEST on gpt-4's 8k window: trimmed and
    answered inside its deadline, while health checks keep answering SERVING; with a 45 ms
    deadline it comes back inside that deadline, answered or refused with a typed status.
    (bench/test_bench_service.py gates the health and small-call p99 under it.)"""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    msgs = [
        pb.Message(
            role=("user", "assistant")[i % 2],
            content=f"Turn {i}: the order {i:05d} was shipped on time, and the customer says the delivery was fast.",
        )
        for i in range(20_000)
    ]
    big = _req(
        model="gpt-4",
        query=pb.Query(text="marker"),
        messages=msgs,
        options=pb.AssemblyOptions(history_policy=pb.HISTORY_POLICY_TRIM_OLDEST),
    )
    assert 2_000_000 < big.ByteSize() < 4 << 20

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with running(open_config(), sources=FakeSources(TENANTS).sources()) as svc:
            opts = [("grpc.max_send_message_length", 8 << 20)]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.port}", options=opts) as ch:
                call = ch.unary_unary(
                    SERVICE + "AssembleContext",
                    request_serializer=pb.AssembleContextRequest.SerializeToString,
                    response_deserializer=pb.AssembledContext.FromString,
                )
                health = health_pb2_grpc.HealthStub(ch)
                statuses: list[int] = []
                done = asyncio.Event()

                async def watch() -> None:
                    while not done.is_set():
                        r = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10.0)
                        statuses.append(r.status)
                        await asyncio.sleep(0.005)

                watcher = asyncio.ensure_future(watch())
                answer = await call(big, timeout=30.0)
                t0 = asyncio.get_running_loop().time()
                try:
                    await call(big, timeout=0.045)
                    out["short"] = "OK"
                except grpc.aio.AioRpcError as exc:
                    out["short"] = exc.code().name
                out["short_ms"] = (asyncio.get_running_loop().time() - t0) * 1000
                done.set()
                await watcher
                out["dropped"] = sum(d.count for d in answer.history_dropped)
                out["constrained_budget"] = answer.budget.messages_tokens
                out["health"] = statuses
        return out

    out = asyncio.run(main())
    print(
        f"\n20,000 turns: {out['dropped']} dropped, {out['constrained_budget']} message tokens kept; "
        f"45 ms call: {out['short']} after {out['short_ms']:.1f} ms; {len(out['health'])} health checks meanwhile"
    )
    assert 19_000 < out["dropped"] < 20_000
    assert out["short"] in ("OK", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
    assert len(out["health"]) >= 2 and set(out["health"]) == {health_pb2.HealthCheckResponse.SERVING}
