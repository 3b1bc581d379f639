"""The wire contract: generated code in sync with the .proto, every Python enum member
on the wire, conversions that round-trip, request validation naming fields, and the
service configuration (TOML, fail-closed start-up checks)."""

from __future__ import annotations

import asyncio
import enum
import tempfile
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import load_script

import ctxcore
from ctxcore import _core
from ctxcore.memory import Query
from ctxcore.request import AssemblyOptions, AssemblyRequest, HistoryPolicy, Message, ToolCall
from ctxcore.result import Branch, BranchStatus, TraceReason, WallSource
from ctxcore.service import ServiceConfig, ServiceError
from ctxcore.service.config import AuthConfig, ConfigError, Grant, parse_service_config
from ctxcore.service.convert import (
    assembled_to_proto,
    branch_error_class,
    budget_from_proto,
    budget_to_proto,
    capability_from_proto,
    capability_to_proto,
    enum_to_proto,
    request_from_proto,
    request_to_proto,
)
from ctxcore.tokens import TokenKind
from ctxcore.v1 import context_assembly_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
PKG = Path(ctxcore.__file__).resolve().parent


def _gen_module():
    return load_script(ROOT / "tools" / "gen_proto.py")


def test_generated_code_matches_the_proto() -> None:
    gen = _gen_module()
    with tempfile.TemporaryDirectory() as tmp:
        texts = gen.generate(ROOT, Path(tmp))
    for rel, text in texts.items():
        committed = (ROOT / rel).read_text(encoding="utf-8")
        assert committed == text, f"{rel} is stale: run python tools/gen_proto.py"
        installed = PKG.parent / rel
        assert installed.read_text(encoding="utf-8") == text, f"installed {rel} differs from the checkout"
    assert (PKG / "v1" / "context_assembly.proto").read_text() == (ROOT / gen.PROTO).read_text()


@pytest.mark.parametrize(
    ("py_enum", "proto_enum", "prefix"),
    [
        (TraceReason, pb.TraceReason, "TRACE_REASON"),
        (Branch, pb.Branch, "BRANCH"),
        (BranchStatus, pb.BranchStatus, "BRANCH_STATUS"),
        (WallSource, pb.WallSource, "WALL_SOURCE"),
        (TokenKind, pb.EstimateKind, "ESTIMATE_KIND"),
        (ctxcore.PackPath, pb.PackPath, "PACK_PATH"),
        (HistoryPolicy, pb.HistoryPolicy, "HISTORY_POLICY"),
    ],
)
def test_every_enum_member_has_a_wire_value(py_enum: type[enum.Enum], proto_enum: object, prefix: str) -> None:
    numbers = [enum_to_proto(m, proto_enum, prefix) for m in py_enum]
    assert 0 not in numbers, f"a {py_enum.__name__} member is missing from the proto"
    assert len(set(numbers)) == len(numbers)


def test_budget_and_capability_round_trip() -> None:
    cat = ctxcore.default_catalog()
    for name in cat:
        cap = cat[name]
        assert capability_from_proto(capability_to_proto(cap)) == cap
        b = ctxcore.compute_budget(cap, directive_tokens=123, messages_tokens=4567, tool_schema_tokens=89)
        assert budget_from_proto(budget_to_proto(b)) == b


def test_request_round_trip() -> None:
    req = AssemblyRequest(
        "org-1",
        "agent-7",
        "gpt-4o",
        Query("refund?", (0.25, -0.5)),
        messages=(
            Message("user", "hi"),
            Message("assistant", "", (ToolCall("c1", "search", '{"q": "x"}'),)),
            Message("tool", "result", tool_call_id="c1"),
        ),
        tools=({"name": "search", "parameters": {"type": "object", "n": 1}},),
        options=AssemblyOptions(
            weights={"similarity": 1.0},
            relevance_floor=0.2,
            max_memories=10,
            pinned_memory_ids=frozenset({"m1"}),
            history_policy="trim_oldest",
            skip_memory=True,
            memory_format="verbose",
            memory_attributes=("score",),
        ),
        token_budget=900,
        section_budgets={"history": 300, "memories": 0},
    )
    back = request_from_proto(pb.AssembleContextRequest.FromString(request_to_proto(req).SerializeToString()))
    assert back == req


def _bad(**fields: object) -> str:
    base: dict[str, object] = {"organization_id": "o", "agent_id": "a", "model": "gpt-4o"}
    base.update(fields)
    with pytest.raises(ServiceError) as ei:
        request_from_proto(pb.AssembleContextRequest(**base))  # type: ignore[arg-type]
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return ei.value.details


def test_bad_requests_name_the_field() -> None:
    assert _bad(organization_id="").startswith("organization_id:")
    assert _bad(agent_id="").startswith("agent_id:")
    assert _bad(model="").startswith("model:")
    assert _bad(agent_id="x" * 1000).startswith("agent_id:")
    assert _bad(organization_id=" o").startswith("organization_id:")
    assert _bad(messages=[pb.Message(role="user"), pb.Message(role="wizard")]).startswith("messages[1]:")
    assert _bad(messages=[pb.Message(role="tool", content="x")]).startswith("messages[0]:")
    assert _bad(messages=[pb.Message(role="assistant", tool_calls=[pb.ToolCall(name="f")])]).startswith(
        "messages[0].tool_calls[0]:"
    )
    assert _bad(tools_json=["{}", "[1]"]).startswith("tools_json[1]:")
    assert _bad(tools_json=["{"]).startswith("tools_json[0]:")
    assert _bad(query=pb.Query(embedding=[float("nan")])).startswith("query.embedding:")
    assert _bad(options=pb.AssemblyOptions(max_memories=10**9)).startswith("options.max_memories:")
    assert _bad(options=pb.AssemblyOptions(relevance_floor=7.0)).startswith("options.relevance_floor:")
    assert _bad(options=pb.AssemblyOptions(weights={"similarity": -1})).startswith("options.weights")
    assert _bad(options=pb.AssemblyOptions(weights={"charisma": 1})).startswith("options.weights")
    assert _bad(options=pb.AssemblyOptions(relevance_floor=0.5)).startswith("options.relevance_floor:")
    assert _bad(options=pb.AssemblyOptions(pinned_memory_ids=[""])).startswith("options.pinned_memory_ids[0]:")
    assert _bad(options=pb.AssemblyOptions(history_policy=99)).startswith("options.history_policy:")  # type: ignore[arg-type]
    assert _bad(options=pb.AssemblyOptions(memory_format="tiny")).startswith("options.memory_format:")
    assert _bad(section_budgets={"tools": 3}).startswith("section_budgets:")
    assert _bad(section_budgets={"history": -3}).startswith("section_budgets[")


def test_branch_errors_lose_their_message_on_the_wire() -> None:
    assert branch_error_class("RuntimeError: near CANARY-1") == "RuntimeError"
    assert branch_error_class("malformed result: item 0 is dict") == "malformed result"
    assert branch_error_class("no answer within 15.0 ms") == "no answer within 15.0 ms"
    assert branch_error_class("$$$ CANARY: x") == "error"


def _trace_context(value_model: str = "interim") -> ctxcore.AssembledContext:
    """A context whose trace has every kind of row (under the interim formula): another
    scope's memory, a duplicate, one under the relevance floor, one over the request's
    maximum, selected and not."""
    from ctxcore import MemoryRecord, Sources

    def rec(
        i: str, org: str = "org", sim: float | None = 0.9, text: str = "the kettle is descaled weekly"
    ) -> MemoryRecord:
        return MemoryRecord(i, org, "agent", text, similarity=sim, exact_tokens={"o200k_base": 8, "cl100k_base": 8})

    async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
        return [
            rec("m-ok"),
            rec("m-dup", sim=0.5),
            rec("m-dup", sim=0.8),
            rec("m-low", sim=0.01),
            rec("m-\u00e9t\u00e9 \u6f22", sim=0.7),
            rec("foreign-secret", org="other"),
        ]

    async def cold(scope, query, limit, min_similarity):  # type: ignore[no-untyped-def]
        return [rec(f"m-{k}", sim=None, text="kettle " * (200 + k)) for k in range(6)]

    req = AssemblyRequest(
        "org", "agent", "gpt-4o", Query("kettle"), options=AssemblyOptions(max_memories=6, value_model=value_model)
    )
    return asyncio.run(ctxcore.assemble(req, sources=Sources(hot=hot, cold=cold)))


def test_the_wire_trace_is_the_contexts_trace_entry_by_entry() -> None:
    ctx = _trace_context()
    wire = assembled_to_proto(ctx, "p").trace
    reasons = {e.reason for e in ctx.trace}
    assert {
        TraceReason.OUT_OF_SCOPE,
        TraceReason.DUPLICATE,
        TraceReason.BELOW_RELEVANCE_FLOOR,
        TraceReason.OVER_MAX_MEMORIES,
        TraceReason.SELECTED,
    } <= reasons
    assert len(wire) == len(ctx.trace)
    for got, want in zip(wire, ctx.trace):
        assert got.reason == enum_to_proto(want.reason, pb.TraceReason, "TRACE_REASON")
        # Another scope's memory id never leaves the server.
        assert got.memory_id == ("" if want.reason is TraceReason.OUT_OF_SCOPE else want.memory_id)
        assert (got.origin, got.tokens, got.score, got.relevance, got.recounted, got.signal) == (
            str(want.origin),
            want.tokens,
            want.score,
            want.relevance,
            want.recounted,
            want.signal,
        )
    assert "foreign-secret" not in str(wire) and b"foreign-secret" not in assembled_to_proto(ctx).SerializeToString()


def test_the_wire_trace_carries_each_rows_dominant_signal() -> None:
    ctx = _trace_context("fused")
    wire = assembled_to_proto(ctx, "p").trace
    assert [e.signal for e in wire] == [e.signal for e in ctx.trace]
    selected = [e for e in ctx.trace if e.reason is TraceReason.SELECTED]
    assert selected and all(e.signal == "vector" for e in selected)  # the hot rows carry similarity


_FINITE = st.floats(allow_nan=False, width=64)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=12),
            st.sampled_from(["hot", "vector", "fulltext", ""]),
            st.sampled_from(list(TraceReason)),
            st.integers(-(2**63), 2**63 - 1),
            _FINITE | st.sampled_from([0.0, -0.0, float("inf"), -float("inf")]),
            _FINITE,
        ),
        max_size=20,
    ),
    st.booleans(),
)
def test_trace_rows_encode_as_protobuf_writes_them(rows, recounted) -> None:  # type: ignore[no-untyped-def]
    ids = [r[0] for r in rows]
    at = np.arange(len(rows), dtype=np.intp)[::-1].copy()
    hidden = enum_to_proto(TraceReason.OUT_OF_SCOPE, pb.TraceReason, "TRACE_REASON")
    codes = np.array([enum_to_proto(rows[k][2], pb.TraceReason, "TRACE_REASON") for k in at], dtype=np.int32)
    tokens = np.array([rows[k][3] for k in at], dtype=np.int64)
    score = np.array([rows[k][4] for k in at])
    relevance = np.array([rows[k][5] for k in at])
    flags = np.full(len(rows), recounted)
    got = _core.encode_trace_rows(ids, [r[1] for r in rows], at, codes, tokens, score, relevance, flags, hidden, 8)
    want = pb.AssembledContext()
    for j, k in enumerate(at):
        e = want.trace.add()
        if codes[j] != hidden:
            e.memory_id = ids[k]
        e.reason, e.origin, e.tokens = int(codes[j]), rows[k][1], int(tokens[j])
        e.score, e.relevance, e.recounted = float(score[j]), float(relevance[j]), recounted
    assert got == want.SerializeToString()
    # None columns are zeros.
    zeros = _core.encode_trace_rows(ids, [r[1] for r in rows], at, codes, None, None, None, None, hidden, 8)
    for e in want.trace:
        e.tokens, e.score, e.relevance, e.recounted = 0, 0.0, 0.0, False
    assert zeros == want.SerializeToString()


def test_bad_trace_rows_are_typed_errors() -> None:
    one = np.ones(1, dtype=np.int32)
    with pytest.raises(IndexError, match="candidate 3, outside the 1 ids"):
        _core.encode_trace_rows(["m"], ["hot"], np.array([3]), one, None, None, None, None, 0, 8)
    with pytest.raises(IndexError, match="candidate -1"):
        _core.encode_trace_rows(["m"], ["hot"], np.array([-1]), one, None, None, None, None, 0, 8)
    with pytest.raises(TypeError, match="memory id of trace row 0 must be a str, got int"):
        _core.encode_trace_rows([7], ["hot"], np.array([0]), one, None, None, None, None, 0, 8)
    with pytest.raises(ValueError, match="score must be a 1-D array of 1 values"):
        _core.encode_trace_rows(["m"], ["hot"], np.array([0]), one, None, np.zeros(2), None, None, 0, 8)
    with pytest.raises(ValueError, match="reasons must be a 1-D array of 2 values"):
        _core.encode_trace_rows(["m"], ["hot"], np.array([0, 0]), one, None, None, None, None, 0, 8)
    with pytest.raises(UnicodeEncodeError):
        _core.encode_trace_rows(["\ud800"], ["hot"], np.array([0]), one, None, None, None, None, 0, 8)
    with pytest.raises(ValueError, match="field number"):
        _core.encode_trace_rows(["m"], ["hot"], np.array([0]), one, None, None, None, None, 0, 0)


# ---- configuration ------------------------------------------------------------------


def test_config_toml(tmp_path: Path) -> None:
    (tmp_path / "k.pem").write_text("x" * 40)
    cfg = parse_service_config(
        """
        [server]
        bind = "0.0.0.0:7000"
        deadline_headroom_ms = 2
        [store]
        db = "mem.db"
        [assembly]
        hot_timeout_ms = 10
        [metrics]
        port = 9464
        [auth]
        allow_plaintext = true
        [auth.jwt]
        issuer = "i"
        audience = "a"
        algorithms = ["HS256"]
        key_file = "k.pem"
        [auth.principals]
        svc = ["org-1/agent-7", "org-2/*"]
        """,
        base=tmp_path,
    )
    assert cfg.db == tmp_path / "mem.db" and cfg.metrics_port == 9464 and cfg.deadline_headroom_ms == 2
    assert cfg.auth.principals["svc"] == (Grant("org-1", "agent-7"), Grant("org-2", "*"))
    assert not cfg.loopback and not cfg.reflection_enabled
    cfg.check_start()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[server]\nbind = 'nohost'", "server.bind"),
        ("[server]\nmax_message_bytes = -1", "max_message_bytes"),
        ("[bogus]\nx = 1", "unknown sections"),
        ("[server]\nbindd = '127.0.0.1:1'", "unknown keys"),
        ("[assembly]\nhot_timeout_ms = -5", "assembly.hot_timeout_ms"),
        ("[auth.jwt]\nissuer='i'\naudience='a'\nalgorithms=['none']\nkey_file='k'", "none"),
        ("[auth.jwt]\nissuer='i'\naudience='a'\nalgorithms=['HS256','RS256']\nkey_file='k'", "not both"),
        ("[auth.principals]\nsvc = ['*/*']", "wildcard"),
        ("[auth.tls]\ncert_file='c'\nkey_file='k'\nclient_auth='require'", "client_ca_file"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_config_errors_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_service_config(text)
    assert needle in str(ei.value)


def test_fails_closed_without_auth() -> None:
    with pytest.raises(ConfigError, match="without authentication"):
        ServiceConfig(bind="0.0.0.0:7000").check_start()
    with pytest.raises(ConfigError, match="without authentication"):
        ServiceConfig(bind="127.0.0.1:7000").check_start()  # no auth and no explicit flag
    with pytest.raises(ConfigError, match="loopback binds only"):
        ServiceConfig(bind="0.0.0.0:7000", auth=AuthConfig(allow_unauthenticated=True)).check_start()
    with pytest.raises(ConfigError, match="loopback binds only"):
        ServiceConfig(bind="[::]:7000", auth=AuthConfig(allow_unauthenticated=True)).check_start()
    ServiceConfig(bind="127.0.0.1:7000", auth=AuthConfig(allow_unauthenticated=True)).check_start()
    ServiceConfig(bind="[::1]:7000", auth=AuthConfig(allow_unauthenticated=True)).check_start()


def test_plaintext_credentials_refused_off_loopback(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("")
    auth = AuthConfig(api_key_file=keys, principals={"svc": (Grant("o", "a"),)})
    with pytest.raises(ConfigError, match="plaintext"):
        ServiceConfig(bind="0.0.0.0:7000", auth=auth).check_start()
    ServiceConfig(bind="127.0.0.1:7000", auth=auth).check_start()
