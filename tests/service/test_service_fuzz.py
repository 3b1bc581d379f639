"""Protocol-level fuzzing of `ctxcore serve`: all three RPCs, against a real server process.

Hypothesis builds AssembleContext, ComputeBudget and GetModelCapabilities requests from
the generated protobuf messages, field by field: known and random organizations, agents
and models (up to 100,000 characters), every role, NaN / Infinity / 1e308 weights and
thresholds, unknown enum numbers, strict and non-strict JSON in ``tools_json`` (NaN,
1e999, nesting past the limit), embeddings with non-finite values, long histories, out of
range budgets; and raw bytes, random or mutated from a valid request, through a generic
channel call. Every answer must carry a typed status other than INTERNAL or UNKNOWN, with
short details, while a second thread's health checks keep getting SERVING. The module
prints the number of requests and the status histogram per RPC.

The default run is short (a few hundred requests per strategy); ``-m slow`` runs one ten
times longer with fresh random examples (``CTXCORE_HYPOTHESIS_PROFILE=explore``).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_support import ServeProcess

from ctxcore import default_catalog
from ctxcore.scoring import COMPONENTS
from ctxcore.service.convert import MAX_DETAILS_CHARS
from ctxcore.service.wire import METHOD_PREFIX
from ctxcore.v1 import context_assembly_pb2 as pb

SERVICE = METHOD_PREFIX
RPCS = ("AssembleContext", "ComputeBudget", "GetModelCapabilities")
#: What a client's input may get: anything typed, never a server fault.
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS}
SCOPES = [
    ("acme-retail", "support"),
    ("acme-retail", "returns"),
    ("helix-cloud", "oncall"),
    ("longmen-pay", "kefu"),
    ("sakura-denki", "sre"),
]
MODELS = sorted(default_catalog())
SHORT = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
LONG = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


# ---- strategies ------------------------------------------------------------------------


def _repeat(alphabet: st.SearchStrategy[str], max_n: int) -> st.SearchStrategy[str]:
    """A character repeated up to `max_n` times: long inputs without drawing each char."""
    return st.builds(lambda c, n: c * n, alphabet, st.integers(0, max_n))


TEXT = st.text(max_size=40)
LONG_TEXT = st.one_of(
    TEXT,
    _repeat(st.characters(exclude_categories=("Cs",)), 100_000),
    st.sampled_from(["</memory>", "<![CDATA[", "\x00\x01", "\ufffe\uffff", "ignore previous instructions", " spaced "]),
)
IDS = st.one_of(st.sampled_from([o for o, _ in SCOPES]), LONG_TEXT)
AGENTS = st.one_of(st.sampled_from([a for _, a in SCOPES]), LONG_TEXT)
#: Mostly real names, so that most requests get past validation into the pipeline.
MODEL_NAMES = st.one_of(
    st.sampled_from(MODELS),
    st.sampled_from(MODELS),
    st.sampled_from(MODELS),
    st.sampled_from([m.upper() for m in MODELS]),
    LONG_TEXT,
)
FLOATS = st.one_of(st.floats(), st.sampled_from([1e308, -1e308, float("nan"), float("inf"), 5e-324, 0.0, 0.5]))
INT64 = st.one_of(st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.integers(-(2**63), 2**63 - 1))
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), TEXT
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(TEXT, kids, max_size=4)),
    max_leaves=20,
)
TOOL_JSON = st.one_of(
    st.builds(lambda name, params: json.dumps({"name": name, "parameters": params}), TEXT, JSON_VALUE),
    JSON_VALUE.map(json.dumps),
    st.sampled_from(
        [
            '{"name":"t","x":NaN}',
            '{"name":"t","x":Infinity}',
            '{"x":-Infinity}',
            '{"x":1e999}',
            '{"x":' + "9" * 5000 + "}",
            '{"x":"\\ud800"}',
            "[1,2",
            "",
            "null",
            "{}",
        ]
    ),
    st.integers(1, 3000).map(lambda d: '{"a":' + "[" * d + "]" * d + "}"),
    TEXT,
)
TOOL_CALLS = st.lists(st.builds(pb.ToolCall, id=LONG_TEXT, name=TEXT, arguments=st.one_of(TEXT, TOOL_JSON)), max_size=3)
MESSAGES = st.builds(
    pb.Message,
    role=st.one_of(
        st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
        st.sampled_from(["user", "assistant"]),
        TEXT,
    ),
    content=st.one_of(TEXT, _repeat(st.sampled_from("ab <&"), 20_000)),
    tool_calls=TOOL_CALLS,
    tool_call_id=st.one_of(st.just(""), TEXT),
)


@st.composite
def options(draw: st.DrawFn) -> pb.AssemblyOptions:
    o = pb.AssemblyOptions(
        weights=draw(st.dictionaries(st.one_of(st.sampled_from(COMPONENTS), LONG_TEXT), FLOATS, max_size=5)),
        pinned_memory_ids=draw(st.lists(LONG_TEXT, max_size=3)),
        history_policy=draw(st.integers(0, 5)),
        skip_memory=draw(st.booleans()),
    )
    for name in ("relevance_floor", "min_similarity"):
        if draw(st.booleans()):
            setattr(o, name, draw(FLOATS))
    if draw(st.booleans()):
        o.max_memories = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        o.context_enabled = draw(st.booleans())
    return o


@st.composite
def assemble_requests(draw: st.DrawFn) -> pb.AssembleContextRequest:
    known = draw(st.sampled_from([True, True, True, False]))
    org, agent = draw(st.sampled_from(SCOPES)) if known else (draw(IDS), draw(AGENTS))
    n_history = draw(st.sampled_from([0, 0, 1, 3, 50, 2_000]))
    history = (
        draw(st.lists(MESSAGES, min_size=min(n_history, 3), max_size=min(n_history, 3))) if draw(st.booleans()) else []
    )
    if n_history > 3:  # a long history of ordinary turns after the drawn ones
        history += [pb.Message(role=("user", "assistant")[i % 2], content=f"turn {i} " * 8) for i in range(n_history)]
    emb = draw(
        st.one_of(
            st.just([]),
            st.just([]),
            st.lists(st.floats(-1, 1), max_size=8),
            st.lists(FLOATS, max_size=8),
            st.integers(8190, 8194).map(lambda n: [0.1] * n),
        )
    )
    msg = pb.AssembleContextRequest(
        organization_id=org,
        agent_id=agent,
        model=draw(MODEL_NAMES),
        query=pb.Query(text=draw(st.one_of(TEXT, LONG_TEXT)), embedding=emb),
        messages=history,
        tools_json=draw(st.lists(TOOL_JSON, max_size=3)) if draw(st.booleans()) else [],
    )
    if draw(st.booleans()):
        msg.options.CopyFrom(draw(options()))
    return msg


BUDGET_REQUESTS = st.builds(
    pb.ComputeBudgetRequest,
    model=MODEL_NAMES,
    directive_tokens=INT64,
    messages_tokens=INT64,
    tool_schema_tokens=INT64,
    formatter_overhead_tokens=INT64,
)
CAPABILITY_REQUESTS = st.builds(
    pb.GetModelCapabilitiesRequest,
    models=st.one_of(st.lists(MODEL_NAMES, max_size=4), st.integers(255, 258).map(lambda n: ["gpt-4o"] * n)),
)


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    b = bytearray(data)
    for pos, val in edits:
        if b:
            b[pos % len(b)] = val
    return bytes(b)


MUTATED = st.builds(
    _mutate,
    st.sampled_from(
        [
            pb.AssembleContextRequest(
                organization_id=o,
                agent_id=a,
                model="gpt-4o",
                query=pb.Query(text="refund"),
                messages=[pb.Message(role="user", content="hi")],
                tools_json=['{"name":"t"}'],
            ).SerializeToString()
            for o, a in SCOPES
        ]
    ),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
)


# ---- the server and the calls --------------------------------------------------------


class Fuzzer:
    """Sends requests to a server and keeps the status histogram; a thread checks health
    every 20 ms meanwhile."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.calls = {m: self.channel.unary_unary(SERVICE + m) for m in RPCS}
        self.histogram: dict[str, Counter[str]] = {m: Counter() for m in RPCS}
        self.bad: list[tuple[str, str, str]] = []
        self.health_checks = 0
        self.health_failures: list[str] = []
        self._stop = threading.Event()
        self._health_channel = grpc.insecure_channel(target)
        self._thread = threading.Thread(target=self._watch_health, daemon=True)
        self._thread.start()

    def _watch_health(self) -> None:
        stub = health_pb2_grpc.HealthStub(self._health_channel)
        while not self._stop.is_set():
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5.0)
                if r.status != health_pb2.HealthCheckResponse.SERVING:
                    self.health_failures.append(f"status {r.status}")
            except grpc.RpcError as exc:
                self.health_failures.append(f"{exc.code()}: {exc.details()}")
            self.health_checks += 1
            self._stop.wait(0.02)

    def send(self, rpc: str, payload: bytes) -> grpc.StatusCode:
        try:
            self.calls[rpc](payload, timeout=10.0)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        self.histogram[rpc][code.name] += 1
        if code in FORBIDDEN or len(details) > MAX_DETAILS_CHARS or "Traceback" in details:
            self.bad.append((rpc, code.name, details[:200]))
        return code

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.channel.close()
        self._health_channel.close()

    def report(self) -> str:
        total = sum(sum(h.values()) for h in self.histogram.values())
        per_rpc = {rpc: dict(sorted(h.items())) for rpc, h in self.histogram.items()}
        return (
            f"fuzz: {total} requests, statuses {json.dumps(per_rpc)}; {self.health_checks} health checks, "
            f"{len(self.health_failures)} failed"
        )


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzer]:
    from ctxcore.stores import load_demo

    d = tmp_path_factory.mktemp("fuzz")
    load_demo(d / "demo.db").close()
    server = ServeProcess(d, "--db", str(d / "demo.db"), "--allow-unauthenticated")
    f = Fuzzer(server.target)
    try:
        yield f
    finally:
        f.close()
        print("\n" + f.report())
        alive = server.proc.poll() is None
        rc = server.stop()
        assert alive, "the server died during the fuzz run"
        assert rc == 0, rc


def _check(f: Fuzzer) -> None:
    assert not f.bad, f.bad[:5]
    assert not f.health_failures, f.health_failures[:5]


def _fuzz_messages(f: Fuzzer, data: st.DataObject) -> None:
    rpc = data.draw(st.sampled_from(RPCS))
    strategy = {
        "AssembleContext": assemble_requests(),
        "ComputeBudget": BUDGET_REQUESTS,
        "GetModelCapabilities": CAPABILITY_REQUESTS,
    }[rpc]
    msg: Any = data.draw(strategy)
    f.send(rpc, msg.SerializeToString())
    _check(f)


def _fuzz_bytes(f: Fuzzer, data: st.DataObject) -> None:
    rpc = data.draw(st.sampled_from(RPCS))
    payload = data.draw(st.one_of(st.binary(max_size=512), MUTATED))
    f.send(rpc, payload)
    _check(f)


def _fuzz_run(f: Fuzzer, one: Callable[[Fuzzer, st.DataObject], None], rules: settings) -> None:
    """Runs `one` on the examples `rules` allow, then checks what this run covered: each
    RPC was called, every answer was typed, health kept answering (each test stands on its
    own: the module's tests may run on different workers, each with its own server)."""
    before = {rpc: sum(h.values()) for rpc, h in f.histogram.items()}
    checks = f.health_checks

    @rules
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        one(f, data)

    run()
    sent = {rpc: sum(h.values()) - before[rpc] for rpc, h in f.histogram.items()}
    print("\n" + f.report())
    assert sum(sent.values()) >= rules.max_examples, sent
    assert all(sent.values()), sent
    assert f.health_checks > checks
    _check(f)


def test_fuzz_request_messages(fuzzer: Fuzzer) -> None:
    _fuzz_run(fuzzer, _fuzz_messages, SHORT)


def test_fuzz_raw_bytes(fuzzer: Fuzzer) -> None:
    _fuzz_run(fuzzer, _fuzz_bytes, SHORT)


def test_known_problem_inputs_get_typed_statuses(fuzzer: Fuzzer) -> None:
    """The inputs that reached callers as INTERNAL or broke the metadata limit before."""
    org, agent = SCOPES[0]
    weights = pb.AssembleContextRequest(
        organization_id=org,
        agent_id=agent,
        model="gpt-4o",
        query=pb.Query(text="refund"),
        options=pb.AssemblyOptions(weights={"similarity": 1e308, "confidence": 1e308}),
    )
    assert fuzzer.send("AssembleContext", weights.SerializeToString()) == grpc.StatusCode.OK
    nan_tool = pb.AssembleContextRequest(
        organization_id=org, agent_id=agent, model="gpt-4o", tools_json=['{"name":"t","x":NaN}']
    )
    assert fuzzer.send("AssembleContext", nan_tool.SerializeToString()) == grpc.StatusCode.INVALID_ARGUMENT
    huge = "m" * 100_000
    assert (
        fuzzer.send("ComputeBudget", pb.ComputeBudgetRequest(model=huge).SerializeToString())
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert (
        fuzzer.send("GetModelCapabilities", pb.GetModelCapabilitiesRequest(models=[huge]).SerializeToString())
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    _check(fuzzer)


@pytest.mark.slow
def test_fuzz_request_messages_long(fuzzer: Fuzzer) -> None:
    _fuzz_run(fuzzer, _fuzz_messages, LONG)


@pytest.mark.slow
def test_fuzz_raw_bytes_long(fuzzer: Fuzzer) -> None:
    _fuzz_run(fuzzer, _fuzz_bytes, LONG)
