"""Formatter benchmarks and gates.

`format_context` over the shipped corpora (`ctxcore.benchmarking.load_workload`): 2,000
prose memories (a few markup characters, quotes, apostrophes, some non-ASCII) and 500
markup-dense ones (about every other character needs an escape). The gate runs through
ctxcore's pytest plugin, as users' gates do: the whole `format_context` (reading the
memories, escaping ids and bodies, nonce, tags, building the str and the section map) is
not slower than markupsafe's `escape` (C speedups) escaping the bodies alone, timed among
the same rounds (ratio of medians <= 1); the target is 2x faster. markupsafe's and the
standard library's `html.escape` alone are benchmarked beside it for the table.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import markupsafe
import pytest

from ctxcore.benchmarking import DEFAULT_GATES, load_workload, workload_names

if TYPE_CHECKING:
    from pytest_benchmark.fixture import BenchmarkFixture

    from ctxcore.benchmarking.pytest_plugin import LatencyGate

#: The formatter's target: format_context at most half markupsafe.escape's time.
TARGET_RATIO = 0.5
#: Rounds for the gate (the reference takes 11 of its own among them).
ROUNDS = 41
#: The shipped bounds of the format stage.
FORMAT_GATE = DEFAULT_GATES["format"]

CORPORA = {name: load_workload(name).memories() for name in workload_names("format")}


@pytest.mark.parametrize("kind", list(CORPORA))
def test_format_context_vs_markupsafe(ctxcore_gate: LatencyGate, kind: str) -> None:
    memories = CORPORA[kind]
    gated = ctxcore_gate.format_context(memories=memories, rounds=ROUNDS, **FORMAT_GATE)
    assert gated.value.text.count("<memory ") == len(memories)
    ratio = next(v.value for v in gated.result.verdicts if v.gate == "ratio")
    reference = gated.result.reference
    assert reference is not None  # the gate ran beside its markupsafe reference
    body_mb = sum(len(str(m["text"]).encode("utf-8")) for m in memories) / 1e6
    print(
        f"\n{kind}: {len(memories)} memories, {body_mb:.2f} MB of bodies: format_context "
        f"{gated.result.stats.p50_ms:.3f} ms, markupsafe.escape {reference.p50_ms:.3f} ms "
        f"(ratio {ratio:.2f}); target {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'missed'}"
    )


@pytest.mark.parametrize("kind", list(CORPORA))
def test_markupsafe_escape_alone(benchmark: BenchmarkFixture, kind: str) -> None:
    bodies = [str(m["text"]) for m in CORPORA[kind]]
    escape = markupsafe.escape
    benchmark(lambda: [escape(b) for b in bodies])


@pytest.mark.parametrize("kind", list(CORPORA))
def test_html_escape_alone(benchmark: BenchmarkFixture, kind: str) -> None:
    bodies = [str(m["text"]) for m in CORPORA[kind]]
    html_escape = html.escape
    benchmark(lambda: [html_escape(b) for b in bodies])
