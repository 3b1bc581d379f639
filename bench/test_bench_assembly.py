"""Assembly overhead: everything `ctxcore.assemble` does besides waiting for sources.

In-process sources answer at once, so the whole call is the pipeline's own work:
wall bookkeeping, scope checks, scoring and the gate, pricing (the formatter's overhead
with the token estimator), packing and formatting, over 1,000 candidates. The reference
beside it in the same run is the packer alone on the same candidate costs, so the ratio
says what the rest of the pipeline costs on top of packing.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np

import ctxcore
from ctxcore import AssemblyOptions, AssemblyRequest, MemoryRecord, Message, Query, Sources

WORDS = (
    "the customer prefers email refund policy within thirty days escalate incidents to the on-call rota "
    "pricing tier enterprise seats renewal date invoice sent in EUR not USD contact after ten am"
).split()


def _memories(n: int, seed: int = 1) -> list[MemoryRecord]:
    rng = random.Random(seed)
    return [
        MemoryRecord(
            f"mem-{i:05d}",
            "org",
            "agent",
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 80))),
            similarity=rng.uniform(0.3, 1.0),
            confidence=rng.random(),
        )
        for i in range(n)
    ]


def test_assembly_overhead_with_1000_candidates(timed) -> None:
    mems = _memories(1000)

    async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
        return mems[:500]

    async def cold(scope, query, limit, min_similarity):  # type: ignore[no-untyped-def]
        return mems[500:]

    async def directive(scope):  # type: ignore[no-untyped-def]
        return "You are the support agent for ACME. Answer briefly."

    req = AssemblyRequest(
        "org",
        "agent",
        "gpt-4o",
        Query("can I get a refund?"),
        messages=(Message("user", "can I get a refund for last month's invoice?"),),
        options=AssemblyOptions(max_memories=1000),
    )
    sources = Sources(directive, hot, cold)
    loop = asyncio.new_event_loop()
    try:
        ctx = loop.run_until_complete(ctxcore.assemble(req, sources=sources))
        times = timed(lambda: loop.run_until_complete(ctxcore.assemble(req, sources=sources)), rounds=300, warmup=10)
    finally:
        loop.close()
    assert ctx.pack is not None and len(ctx.selected_ids) > 100
    costs = np.array(ctx.trace_table.tokens, dtype=np.int64)
    ids = list(ctx.trace_table.memory_id)
    scores = np.array(ctx.trace_table.score)
    pack_only = timed(lambda: ctxcore.pack_arrays(ids, costs, scores, ctx.budget.usable), rounds=300, warmup=10)
    p50, p99 = np.percentile(times, [50, 99]) * 1e3
    ratio = float(np.median(times) / np.median(pack_only))
    print(
        f"\nassemble, 1,000 in-process candidates: p50 {p50:.2f} ms, p99 {p99:.2f} ms; "
        f"packing alone {np.median(pack_only) * 1e3:.2f} ms (assemble = {ratio:.1f}x packing); "
        f"stages {ctx.timings}"
    )
    # Target p99 <= 2 ms (quoted from a quiet machine); the gate leaves room for a shared one.
    assert p99 <= 10.0


def test_end_to_end_against_the_100k_store(store_100k) -> None:  # type: ignore[no-untyped-def]
    """The whole assembly, retrieval included, against the 100,000-memory SQLite store:
    p50/p99 reported; gate: p99 within the 45 ms client timeout."""
    store = store_100k.store
    queries = [
        "refund for shoes bought three weeks ago",
        "which carrier do we use for express delivery",
        "customer prefers email, not phone",
        "invoice currency and billing contact",
    ]
    reqs = [
        AssemblyRequest(s.organization_id, s.agent_id, "gpt-4o", Query(q), options=AssemblyOptions(max_memories=64))
        for s in (store_100k.large, store_100k.typical)
        for q in queries
    ]
    sources = Sources.from_store(store)
    loop = asyncio.new_event_loop()
    try:
        async def first_of_each() -> None:
            for r in reqs:
                await ctxcore.assemble(r, sources=sources)

        loop.run_until_complete(first_of_each())
        k = iter(range(10**9))
        results: list[ctxcore.AssembledContext] = []

        def one() -> None:
            results.append(loop.run_until_complete(ctxcore.assemble(reqs[next(k) % len(reqs)], sources=sources)))

        times = timed_rounds(one, 240)
    finally:
        loop.close()
    p50, p99 = np.percentile(times, [50, 99]) * 1e3
    degraded = sum(r.degraded for r in results)
    print(
        f"\nassemble against {store_100k.size:,} memories: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"degraded {degraded}/{len(results)}"
    )
    assert all(r.selected_ids or r.degraded for r in results)
    assert p99 <= 45.0


def timed_rounds(fn, rounds: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    import time

    out = np.empty(rounds)
    for i in range(rounds):
        t0 = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t0
    return out
