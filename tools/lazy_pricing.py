"""The ways of pricing memories that come without a stored count, side by side.

The bench's request (bench/test_bench_assembly.py, ``test_assembly_with_1000_uncounted_candidates``):
1,000 in-process candidates as text only, on gpt-4 (8k window, ~80 selected). Each approach
is timed as CPU time of the calling thread (the whole call runs on it), repeated (the same
1,000 memories on every call) and all-new (1,000 new texts on every call):

* ``both`` (shipped): packed on a length-based price, only the selection and its boundary
  counted, packed again; counts kept across requests;
* ``cache-only``: every candidate that could be selected counted up front, counts kept;
* ``lazy-only``: the shipped rounds with the count cache switched off;
* ``estimator-first`` / ``estimator-only``: the rounds with the calibrated estimator's price
  of each element in place of the length-based one, with and without the cache;
* ``count-all``: the request with every candidate counted per call (no cache, no rounds):
  what pricing did before; on an older install (``PYTHONPATH=...``) it is that install's own
  pricing.

    python tools/lazy_pricing.py [APPROACH ...]
    python tools/lazy_pricing.py --quality [--trials N]

``--quality`` compares the shipped pricing's selection with full exact pricing (the same
memories with stored counts) on random candidate sets (gpt-4 and gpt-4o; 30 to 3,000
memories; English, multilingual and repetitive texts of 3 to 300 words), under one fixed
nonce so that both price every element's head alike: the total score of each selection,
their ratio, and the fill of each.

The approaches other than ``both`` switch internals of ``ctxcore.assembly`` in this process;
each runs in its own process.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

APPROACHES = ("both", "cache-only", "lazy-only", "estimator-first", "estimator-only", "count-all")
WORDS = (
    "the customer prefers email refund policy within thirty days escalate incidents to the on-call rota "
    "pricing tier enterprise seats renewal date invoice sent in EUR not USD contact after ten am"
).split()


def _switch(approach: str) -> None:
    import ctxcore.pricing.candidates as pricing
    from ctxcore.pricing import memcounts

    if approach in ("lazy-only", "estimator-only", "count-all"):
        memcounts.MEMORY_COUNTS.get_many = lambda family, ids, texts: np.full(len(ids), -1, dtype=np.int64)  # type: ignore[method-assign]
        memcounts.MEMORY_COUNTS.put_many = lambda family, items: None  # type: ignore[method-assign]
    if approach in ("cache-only", "count-all"):
        pricing.BOUNDARY_SHARE = 1e-12  # the first round's boundary: every candidate with a score
    if approach.startswith("estimator"):
        from ctxcore.pricing.units import memory_units
        from ctxcore.tokens import estimate_tokens_batch

        def estimate(ids: Sequence[str], texts: Sequence[str]) -> np.ndarray:
            per_unit = estimate_tokens_batch(memory_units(ids, texts), "cl100k_base")
            return (per_unit[0::2] + per_unit[1::2]).astype(np.int64)

        # Switching a module's internals for the comparison.
        setattr(pricing, "utf8_lengths", estimate)  # noqa: B010
        setattr(pricing, "rank_prices", lambda n, ratio: n.copy())  # noqa: B010


def _run(approach: str) -> str:
    _switch(approach)
    import ctxcore
    from ctxcore import AssemblyOptions, AssemblyRequest, MemoryRecord, Message, Query, Sources
    from ctxcore.benchmarking.gates import measure

    rng = random.Random(1)
    base = [
        (
            f"mem-{i:05d}",
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 80))),
            rng.uniform(0.3, 1.0),
            rng.random(),
        )
        for i in range(1000)
    ]

    def sources(suffix: str = "") -> Sources:
        mems = [MemoryRecord(i, "org", "agent", t + suffix, similarity=s, confidence=c) for i, t, s, c in base]

        async def hot(scope: object, query: object, limit: int) -> list[MemoryRecord]:
            return mems[:500]

        async def cold(scope: object, query: object, limit: int, min_similarity: float) -> list[MemoryRecord]:
            return mems[500:]

        async def directive(scope: object) -> str:
            return "You are the support agent for ACME. Answer briefly."

        return Sources(directive, hot, cold)

    req = AssemblyRequest(
        "org",
        "agent",
        "gpt-4",
        Query("can I get a refund?"),
        messages=(Message("user", "can I get a refund for last month's invoice?"),),
        options=AssemblyOptions(max_memories=1000),
    )
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    same = sources()
    run(ctxcore.assemble(req, sources=same))
    repeated = np.concatenate(
        [
            measure(lambda: run(ctxcore.assemble(req, sources=same)), rounds=200, warmup=5, timer=time.thread_time)[0]
            for _ in range(3)
        ]
    )
    it = iter([sources(f" (call {r})") for r in range(45)])
    new = measure(lambda: run(ctxcore.assemble(req, sources=next(it))), rounds=40, warmup=2, timer=time.thread_time)[0]
    ctx = run(ctxcore.assemble(req, sources=same))
    loop.close()
    assert ctx.pack is not None
    exact = ctxcore.count_tokens(ctx.text, "cl100k_base").value
    assert exact <= ctx.budget.context_window - ctx.budget.response_reserve
    r50, r99 = np.percentile(repeated, [50, 99]) * 1e3
    n50, n99 = np.percentile(new, [50, 99]) * 1e3
    return (
        f"| {approach:<15} | {r50:6.2f} | {r99:6.2f} | {n50:6.2f} | {n99:6.2f} | "
        f"{ctx.pack.tokens_used / ctx.budget.usable:.4f} |"
    )


MULTILINGUAL = (
    "The customer prefers email and asked us not to call before 10am. "
    "Der Kunde bevorzugt E-Mail und möchte vor 10 Uhr nicht angerufen werden. "
    "お客様はメールを希望しており、午前10時前の電話は避けてほしいとのことです。 "
    "客户更喜欢电子邮件，并要求上午10点前不要打电话。 Клиент предпочитает электронную почту. "
    "العميل يفضل البريد الإلكتروني. def refund(order): return order.total if order.days < 30 else 0 "
    '{"plan": "pro", "seats": 12} Escalate <P1> incidents & page #ops; 🚨🔥'
).split()


def _quality(trials: int) -> None:
    import types

    import ctxcore
    import ctxcore.formatting as formatting
    from ctxcore import AssemblyOptions, AssemblyRequest, MemoryRecord, Query, Sources
    from ctxcore.stores.counting import count_memory_tokens

    # One nonce for every assembly, in either rendering: the runs compare selections.
    setattr(formatting, "secrets", types.SimpleNamespace(token_hex=lambda n: "5f" * n, randbelow=lambda n: 5))  # noqa: B010

    def assemble(model: str, mems: list[MemoryRecord]) -> ctxcore.AssembledContext:
        async def hot(scope: object, query: object, limit: int) -> list[MemoryRecord]:
            return mems

        req = AssemblyRequest("o", "a", model, Query("q"), options=AssemblyOptions(max_memories=len(mems)))
        return asyncio.run(ctxcore.assemble(req, sources=Sources(hot=hot)))

    rng = random.Random(5)
    ratios, fills, counted = [], [], []
    for trial in range(trials):
        model = rng.choice(["gpt-4", "gpt-4o"])
        n = rng.choice([50, 300, 1000, 3000] if model == "gpt-4o" else [30, 200, 1000])
        words = rng.choice(
            [MULTILINGUAL, "alpha beta gamma delta refund invoice".split(), MULTILINGUAL + ["x" * 30, "0123456789" * 3]]
        )
        lo, hi = rng.choice([(3, 20), (10, 80), (5, 300)])
        ids = [f"q{trial}-{i}" for i in range(n)]
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(lo, hi))) for _ in range(n)]
        sims = [rng.uniform(0.2, 1.0) for _ in range(n)]
        family = ctxcore.default_catalog().get_model(model).tokenizer_family
        counts = count_memory_tokens(ids, texts, [family])[family]
        exact = assemble(
            model,
            [
                MemoryRecord(i, "o", "a", t, similarity=s, exact_tokens={family: int(c)})
                for i, t, s, c in zip(ids, texts, sims, counts)
            ],
        )
        lazy = assemble(model, [MemoryRecord(i, "o", "a", t, similarity=s) for i, t, s in zip(ids, texts, sims)])
        assert exact.pack is not None and lazy.pack is not None
        assert (
            ctxcore.count_tokens(lazy.text, family).value <= lazy.budget.context_window - lazy.budget.response_reserve
        )
        ratios.append(lazy.pack.total_score / exact.pack.total_score if exact.pack.total_score else 1.0)
        if exact.pack.truncated:  # plentiful: not everything fits
            fills.append((lazy.pack.tokens_used / lazy.budget.usable, exact.pack.tokens_used / exact.budget.usable))
            priced = [e.pricing for e in lazy.trace if e.pricing]
            counted.append(priced.count("counted") / len(priced))
    r = np.array(ratios)
    print(
        f"{trials} candidate sets: score of the selection / full exact pricing's: min {r.min():.8f}, "
        f"median {np.median(r):.6f}, equal in {int((np.abs(r - 1) < 1e-12).sum())}; where not everything fits "
        f"({len(fills)} sets): fill of usable min {min(f for f, _ in fills):.4f}, median "
        f"{np.median([f for f, _ in fills]):.4f} (full exact pricing: min {min(e for _, e in fills):.4f}), "
        f"share of candidates counted median {np.median(counted):.3f}, max {max(counted):.3f}"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["--quality"]:
        _quality(int(argv[2]) if len(argv) > 2 and argv[1] == "--trials" else 40)
        return 0
    if len(argv) == 2 and argv[0] == "--one":
        print(_run(argv[1]))
        return 0
    names = argv or list(APPROACHES)
    for name in names:
        if name not in APPROACHES:
            print(f"unknown approach {name!r}; one of {', '.join(APPROACHES)}", file=sys.stderr)
            return 2
    print("| approach        | repeated p50 ms | p99 | all-new p50 ms | p99 | fill of usable |")
    print("|-----------------|------:|------:|------:|------:|-------:|")
    for name in names:
        out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, check=True)
        print(out.stdout.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
