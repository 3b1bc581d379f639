"""The three gated stages as timed subjects with their references.

`pack_stage`, `format_stage` and `assemble_stage` build, from a workload, the call a gate
times and the reference it is compared with; `run_stage` measures one and returns its
`StageResult`. ``ctxcore bench`` runs them; the pytest plugin builds the same subjects
from a user's inputs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from .gates import (
    DEFAULT_REFERENCE_ROUNDS,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    Gate,
    GateKind,
    GateUsageError,
    LatencyStats,
    StageResult,
    check_rounds,
    evaluate,
    measure,
)
from .references import MARKUPSAFE, NUMPY_DP, PACK_ONLY, markupsafe_escape, numpy_dp
from .workloads import CandidateSet

__all__ = [
    "BENCH_AGENT",
    "BENCH_ORG",
    "BENCH_QUERY",
    "Subject",
    "assemble_stage",
    "format_stage",
    "pack_stage",
    "run_stage",
]

#: The scope and question of an in-process assembly workload.
BENCH_ORG = "bench-org"
BENCH_AGENT = "bench-agent"
BENCH_QUERY = "can I get a refund for last month's invoice?"


@dataclass(frozen=True)
class Subject:
    """A timed call, its reference (or None) and what to report about the workload."""

    stage: str
    call: Callable[[], object]
    reference_name: str | None
    reference: Callable[[], object] | None
    workload: Mapping[str, Any]


def pack_stage(cs: CandidateSet, budget: int, *, family: str, reference: bool = True) -> Subject:
    """`ctxcore.pack_arrays` on the set's columns (texts priced in `family`, its pinned
    candidates pinned), beside the exact numpy DP."""
    from ..packing import pack_arrays

    ids, tokens, scores = cs.pack_columns(family)
    pinned = cs.pinned

    def call() -> object:
        return pack_arrays(ids, tokens, scores, budget, pinned=pinned)

    ref = (lambda: numpy_dp(tokens, scores, budget)) if reference else None
    info = {"name": cs.name, "candidates": len(cs), "budget": budget}
    return Subject("pack", call, NUMPY_DP if reference else None, ref, info)


def format_stage(cs: CandidateSet, *, reference: bool = True) -> Subject:
    """`ctxcore.format_context` of the set's memories, beside markupsafe escaping their
    bodies alone."""
    from ..formatting import format_context

    memories = cs.memories()

    def call() -> object:
        return format_context(memories=memories)

    ref = markupsafe_escape([str(m["text"]) for m in memories]) if reference else None
    body_bytes = sum(len(str(m["text"]).encode("utf-8")) for m in memories)
    info = {"name": cs.name, "candidates": len(cs), "body_bytes": body_bytes}
    return Subject("format", call, MARKUPSAFE if reference else None, ref, info)


@contextmanager
def assemble_stage(
    cs: CandidateSet | None,
    *,
    model: str,
    store: Any = None,
    organization_id: str = BENCH_ORG,
    agent_id: str = BENCH_AGENT,
    query: str = BENCH_QUERY,
    reference: bool = True,
) -> Iterator[Subject]:
    """`ctxcore.assemble` of one request on a private event loop: over the set's memories
    from in-process sources (half hot, half cold), or against `store` (retrieval
    included), the set's pinned candidates pinned. The reference is `ctxcore.pack_arrays`
    alone on the same candidate costs."""
    from ..assembly import assemble
    from ..memory import Query, Sources
    from ..packing import pack_arrays
    from ..request import AssemblyOptions, AssemblyRequest, Message, Role

    pins: frozenset[str] = frozenset()
    if store is not None:
        sources = Sources.from_store(store)
        max_memories = 64
        held = store.stats(organization_id).scopes
        info: dict[str, Any] = {
            "name": "store",
            "organization_id": organization_id,
            "agent_id": agent_id,
            "model": model,
            # Whether the times are those of a working assembly: the scope's memories, and
            # how many of the assemblies run degraded.
            "memories": sum(sc.memories for sc in held if sc.agent_id == agent_id),
            "assemblies": 0,
            "degraded": 0,
        }
    else:
        assert cs is not None
        mems = cs.records(organization_id, agent_id)
        half = len(mems) // 2
        hot_items, cold_items = mems[:half], mems[half:]

        async def hot(scope: Any, q: Any, limit: int) -> list[Any]:
            return hot_items

        async def cold(scope: Any, q: Any, limit: int, min_similarity: float) -> list[Any]:
            return cold_items

        async def directive(scope: Any) -> str:
            return "You are the support agent for ACME. Answer briefly."

        sources = Sources(directive, hot, cold)
        max_memories = max(1, len(mems))
        if cs.pinned is not None:
            pins = frozenset(i for i, p in zip(cs.ids, cs.pinned.tolist()) if p)
        info = {"name": cs.name, "candidates": len(cs), "model": model}
    req = AssemblyRequest(
        organization_id,
        agent_id,
        model,
        Query(query),
        messages=(Message(Role.USER, query),),
        options=AssemblyOptions(max_memories=max_memories, pinned_memory_ids=pins),
    )
    loop = asyncio.new_event_loop()
    try:
        if store is not None:
            store.warm([req.scope])
        first = loop.run_until_complete(assemble(req, sources=sources))

        def call() -> object:
            ctx = loop.run_until_complete(assemble(req, sources=sources))
            if store is not None:
                info["assemblies"] += 1
                if ctx.degraded:
                    info["degraded"] += 1
                    info.setdefault("degradation", ", ".join(ctx.degradation_reasons))
            return ctx

        ref: Callable[[], object] | None = None
        if reference and first.pack is not None:
            t = first.trace_table
            ids = [m for m, tok in zip(t.memory_id, t.tokens) if tok > 0]
            costs = np.array([tok for tok in t.tokens if tok > 0], dtype=np.int64)
            scores = np.array([s for s, tok in zip(t.score, t.tokens) if tok > 0], dtype=np.float64)
            usable = first.budget.usable

            def pack_only() -> object:
                return pack_arrays(ids, costs, scores, usable)

            ref = pack_only

        info["budget"] = first.budget.usable
        yield Subject("assemble", call, PACK_ONLY if ref is not None else None, ref, info)
    finally:
        loop.close()


def run_stage(
    subject: Subject,
    gates: tuple[Gate, ...],
    *,
    rounds: int = DEFAULT_ROUNDS,
    warmup: int = DEFAULT_WARMUP,
    reference_rounds: int = DEFAULT_REFERENCE_ROUNDS,
) -> StageResult:
    """Measure one stage and judge it."""
    check_rounds(rounds, warmup, gates, reference_rounds)
    reference = subject.reference
    if reference is None and any(g.kind is GateKind.RATIO for g in gates):
        raise GateUsageError(f"the {subject.stage} stage has a ratio bound but no reference to measure it against")
    times, ref_times = measure(
        subject.call, rounds=rounds, warmup=warmup, reference=reference, reference_rounds=reference_rounds
    )
    stats = LatencyStats.from_seconds(times)
    ref_stats = LatencyStats.from_seconds(ref_times) if ref_times is not None else None
    return StageResult(
        subject.stage,
        subject.workload,
        stats,
        evaluate(gates, stats, ref_stats),
        times,
        subject.reference_name,
        ref_stats,
        ref_times,
        warmup,
    )
