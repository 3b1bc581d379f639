"""ctxcore's latency gates as a pytest plugin, on top of pytest-benchmark.

The ``pytest11`` entry point ``ctxcore`` (the light `ctxcore_pytest` module, which loads
this one when a test asks for a gate) makes it available once ctxcore is installed; it does nothing unless a test asks for the ``ctxcore_gate`` fixture (it adds
the ``ctxcore_gate`` marker's description, and a summary section only when a gate ran).
Without pytest-benchmark (``pip install 'ctxcore-llm[bench]'``, or when disabled with ``-p
no:benchmark``) it still loads, and a test that asks for a gate fails saying what is missing.

Use it in a test::

    @pytest.mark.ctxcore_gate(p99_ms=10, median_ms=2)
    def test_packing_my_candidates(ctxcore_gate):
        ids, tokens, scores = load_my_candidates()
        ctxcore_gate.pack_arrays(ids, tokens, scores, 8000, max_ratio=0.5)

Each gate times one call per round through pytest-benchmark (``benchmark.pedantic``), so
its rounds are in pytest-benchmark's table, its saved runs and ``--benchmark-compare`` /
``--benchmark-compare-fail``; the p50/p90/p99/max, the reference and every verdict go into
the benchmark's ``extra_info["ctxcore_gate"]`` (``--benchmark-json``) and a "ctxcore
latency gates" section of the terminal summary. A gate that misses a bound fails the test
with `LatencyGateFailed` naming the gate. Under ``--benchmark-disable`` the call runs once
and the test is skipped, since nothing was measured; ``--benchmark-skip`` skips it.
Warm-up, GC handling, round counts and percentiles: see `ctxcore.benchmarking.gates`.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from ctxcore_pytest.names import MARKER
from ctxcore_pytest.names import RESULTS as _RESULTS

from .gates import (
    DEFAULT_REFERENCE_ROUNDS,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    GateKind,
    GateUsageError,
    Interleaver,
    LatencyGateFailed,
    LatencyStats,
    StageResult,
    check_rounds,
    evaluate,
    make_gates,
)
from .references import MARKUPSAFE, NUMPY_DP, PACK_ONLY, columns_of, markupsafe_escape, numpy_dp, texts_of

__all__ = ["MARKER", "Gated", "LatencyGate"]

_SETTINGS = ("p99_ms", "median_ms", "max_ratio", "rounds", "warmup", "reference_rounds")
#: A reference argument: True for the stage's own, False/None for none, or a call.
ReferenceArg = bool | Callable[[], object] | None


@dataclass(frozen=True)
class Gated:
    """What a gate returns: the subject's return value (from its last round) and the
    measurement with its verdicts."""

    value: Any
    result: StageResult

    @property
    def passed(self) -> bool:
        """Every bound held (a failed gate raises, so this is True when you see it)."""
        return self.result.passed


class LatencyGate:
    """The ``ctxcore_gate`` fixture: time a stage on your inputs and hold it to bounds.

    Bounds (keyword arguments of every method, or of the ``ctxcore_gate`` marker, which
    sets the test's defaults): ``p99_ms``, ``median_ms``, ``max_ratio`` (the subject's
    median over the reference's, at most), and ``rounds``, ``warmup``,
    ``reference_rounds``. One gate per test (pytest-benchmark times one subject per test;
    parametrize for more).
    """

    def __init__(self, request: pytest.FixtureRequest, benchmark: Any) -> None:
        self._request = request
        self._benchmark = benchmark
        self._used = False

    # ---- the stages ------------------------------------------------------------------

    def pack(
        self,
        candidates: Iterable[Any],
        budget: int,
        *,
        packer: Callable[..., Any] | None = None,
        reference: ReferenceArg = True,
        **options: Any,
    ) -> Gated:
        """Gate ``ctxcore.pack(candidates, budget, **options)``; the reference is the
        exact numpy DP on the same costs and scores. `packer` replaces ``ctxcore.pack``
        (same signature), e.g. your wrapper around it. An iterator of candidates is read
        once, and every round packs all of them."""
        __tracebackhide__ = True
        from ..packing import pack

        if not isinstance(candidates, (Sequence, Mapping)):  # ctxcore.pack names a lone mapping
            candidates = list(candidates)
        bounds, opts = self._split(options)
        ref = reference
        if ref is True:
            toks, scores = columns_of(candidates)
            ref = lambda: numpy_dp(toks, scores, budget)  # noqa: E731
        return self._gate("pack", packer or pack, (candidates, budget), opts, ref, NUMPY_DP, bounds)

    def pack_arrays(
        self,
        ids: Iterable[str],
        tokens: Any,
        scores: Any,
        budget: int,
        *,
        packer: Callable[..., Any] | None = None,
        reference: ReferenceArg = True,
        **options: Any,
    ) -> Gated:
        """Gate ``ctxcore.pack_arrays(ids, tokens, scores, budget, **options)`` beside
        the exact numpy DP. `packer` replaces ``ctxcore.pack_arrays``. An iterator of
        ids is read once, and every round packs all of them."""
        __tracebackhide__ = True
        from ..packing import pack_arrays

        if not isinstance(ids, Sequence):
            ids = list(ids)
        bounds, opts = self._split(options)
        ref = reference
        if ref is True:
            ref = lambda: numpy_dp(tokens, scores, budget)  # noqa: E731
        return self._gate("pack", packer or pack_arrays, (ids, tokens, scores, budget), opts, ref, NUMPY_DP, bounds)

    def format_context(
        self, *, formatter: Callable[..., Any] | None = None, reference: ReferenceArg = True, **options: Any
    ) -> Gated:
        """Gate ``ctxcore.format_context(**options)`` (``directive``, ``history``,
        ``memories``, ``tools``, ...) beside markupsafe escaping the memory bodies alone.
        An iterator of history, memories or tools is read once, and every round formats
        all of it."""
        __tracebackhide__ = True
        from ..formatting import format_context

        bounds, opts = self._split(options)
        for name in ("history", "memories", "tools"):
            given = opts.get(name)
            if given is not None and not isinstance(given, (Sequence, Mapping)):
                opts[name] = list(given)
        ref = reference
        if ref is True:
            ref = markupsafe_escape(texts_of(opts.get("memories") or ()))
        return self._gate("format", formatter or format_context, (), opts, ref, MARKUPSAFE, bounds)

    def assemble(
        self,
        request: Any,
        *,
        sources: Any,
        assembler: Callable[..., Any] | None = None,
        reference: ReferenceArg = True,
        **options: Any,
    ) -> Gated:
        """Gate ``await ctxcore.assemble(request, sources=sources, **options)`` on a
        private event loop (use in-process sources: a network store's latency is not
        ctxcore's). The reference is ``ctxcore.pack_arrays`` alone on the same candidate
        costs, so the ratio is what the rest of the pipeline costs on top of packing."""
        __tracebackhide__ = True
        from ..assembly import assemble
        from ..packing import pack_arrays

        bounds, opts = self._split(options)
        fn = assembler or assemble
        loop = asyncio.new_event_loop()
        try:

            def run() -> Any:
                return loop.run_until_complete(fn(request, sources=sources, **opts))

            ref = reference
            if ref is True:
                first = run()
                if getattr(first, "pack", None) is None:
                    raise GateUsageError(
                        "the assembly packed nothing, so there is no packing to compare it with "
                        "(give it memories, or pass reference=None)"
                    )
                t = first.trace_table
                keep = [k for k, tok in enumerate(t.tokens) if tok > 0]
                ids = [t.memory_id[k] for k in keep]
                import numpy as np

                costs = np.array([t.tokens[k] for k in keep], dtype=np.int64)
                scores = np.array([t.score[k] for k in keep], dtype=np.float64)
                usable = first.budget.usable
                ref = lambda: pack_arrays(ids, costs, scores, usable)  # noqa: E731
            return self._gate("assemble", run, (), {}, ref, PACK_ONLY, bounds)
        finally:
            loop.close()

    def __call__(
        self,
        fn: Callable[..., Any],
        *args: Any,
        stage: str = "custom",
        reference: Callable[[], object] | None = None,
        reference_name: str | None = None,
        **options: Any,
    ) -> Gated:
        """Gate any call: ``fn(*args, **options)`` (bounds taken out of `options`),
        beside `reference` if given."""
        __tracebackhide__ = True
        bounds, opts = self._split(options)
        return self._gate(stage, fn, args, opts, reference, reference_name or "reference", bounds)

    # ---- machinery -------------------------------------------------------------------

    @staticmethod
    def _split(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        bounds = {k: v for k, v in options.items() if k in _SETTINGS}
        rest = {k: v for k, v in options.items() if k not in _SETTINGS}
        return bounds, rest

    def _settings(self, given: Mapping[str, Any]) -> dict[str, Any]:
        marker = self._request.node.get_closest_marker(MARKER)
        out: dict[str, Any] = {
            "rounds": DEFAULT_ROUNDS,
            "warmup": DEFAULT_WARMUP,
            "reference_rounds": DEFAULT_REFERENCE_ROUNDS,
        }
        if marker is not None:
            if marker.args:
                raise GateUsageError(f"the {MARKER} marker takes keyword arguments only ({', '.join(_SETTINGS)})")
            unknown = set(marker.kwargs) - set(_SETTINGS)
            if unknown:
                raise GateUsageError(
                    f"the {MARKER} marker has no {', '.join(sorted(unknown))} (it takes {', '.join(_SETTINGS)})"
                )
            out.update(marker.kwargs)
        out.update({k: v for k, v in given.items() if v is not None})
        return out

    def _gate(
        self,
        stage: str,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        reference: ReferenceArg,
        reference_name: str,
        given: Mapping[str, Any],
    ) -> Gated:
        __tracebackhide__ = True
        if self._used:
            raise GateUsageError(
                "one ctxcore_gate per test: pytest-benchmark times one subject per test (parametrize the test for more)"
            )
        self._used = True
        s = self._settings(given)
        gates = make_gates(p99_ms=s.get("p99_ms"), median_ms=s.get("median_ms"), max_ratio=s.get("max_ratio"))
        check_rounds(s["rounds"], s["warmup"], gates, s["reference_rounds"])
        ref = reference if callable(reference) else None
        if ref is None and any(g.kind is GateKind.RATIO for g in gates):
            raise GateUsageError(f"max_ratio needs a reference, but the {stage} gate was given none")
        bench = self._benchmark
        call_args, call_kwargs = tuple(args), dict(kwargs)
        if bench.disabled:
            fn(*call_args, **call_kwargs)  # the inputs are still checked, as pytest-benchmark does
            pytest.skip(f"ctxcore latency gate ({stage}) not measured: benchmarks are disabled (--benchmark-disable)")
        if bench.group is None:
            bench.group = f"ctxcore gate: {stage}"
        rounds, warmup = int(s["rounds"]), int(s["warmup"])

        def subject() -> object:
            return fn(*call_args, **call_kwargs)

        inter = Interleaver(subject, ref, rounds, int(s["reference_rounds"]), skip=warmup)
        gc.collect()
        if ref is not None:
            ref()  # the reference's own warm-up
        value = bench.pedantic(
            fn, args=call_args, kwargs=call_kwargs, setup=inter.before_round, rounds=rounds, warmup_rounds=warmup
        )
        stats = LatencyStats.from_seconds(bench.stats.stats.data)
        ref_stats = LatencyStats.from_seconds(inter.reference_times) if ref is not None else None
        import numpy as np

        result = StageResult(
            stage,
            {"test": self._request.node.nodeid},
            stats,
            evaluate(gates, stats, ref_stats),
            np.asarray(bench.stats.stats.data, dtype=np.float64),
            reference_name if ref is not None else None,
            ref_stats,
            None if ref is None else np.asarray(inter.reference_times),
            warmup,
        )
        bench.extra_info[MARKER] = result.record()
        self._request.config.stash.setdefault(_RESULTS, []).append((self._request.node.nodeid, result))
        if not result.passed:
            lines = "; ".join(result.failures())
            raise LatencyGateFailed(
                f"ctxcore latency gate failed: {lines} ({stats.rounds} rounds after {warmup} warm-up: "
                f"p50 {stats.p50_ms:.3f} ms, p90 {stats.p90_ms:.3f} ms, p99 {stats.p99_ms:.3f} ms, "
                f"max {stats.max_ms:.3f} ms)"
            )
        return Gated(value, result)


def write_summary(terminalreporter: Any, results: Sequence[tuple[str, StageResult]]) -> None:
    """The "ctxcore latency gates" section: percentiles and verdicts of every gate that ran."""
    tr = terminalreporter
    tr.write_sep("-", "ctxcore latency gates")
    width = max(len(n) for n, _ in results)
    tr.write_line(
        f"{'test':<{width}}  {'stage':<8} {'rounds':>6} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} "
        f"{'max ms':>9}  reference"
    )
    for nodeid, r in results:
        st = r.stats
        ref = (
            f"{r.reference_name} p50 {r.reference.p50_ms:.3f} ms ({r.reference.rounds} rounds)"
            if r.reference is not None
            else "-"
        )
        tr.write_line(
            f"{nodeid:<{width}}  {r.stage:<8} {st.rounds:>6} {st.p50_ms:>9.3f} {st.p90_ms:>9.3f} "
            f"{st.p99_ms:>9.3f} {st.max_ms:>9.3f}  {ref}"
        )
        for v in r.verdicts:
            tr.write_line(f"{'':<{width}}  {v.describe(r.stage, r.reference_name)}", green=v.passed, red=not v.passed)
