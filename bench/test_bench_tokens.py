"""Token estimator benchmarks and gates.

On the held-out part of the calibration corpus (``tools/calibrate_estimator.py`` builds it
from this machine's text and splits it by document; the estimator's tables never saw it),
the estimator of each family with an exact tokenizer (cl100k_base, o200k_base, each
fitted on its own counts) is compared with that family's exact counts, beside the two
common heuristics (chars/4, bytes/3) as references, and timed against tiktoken's
``encode`` in the same run. `count_tokens_batch` is timed against counting one text at a
time with tiktoken.
Gates: undercount rate <= 1% of texts and median overestimate <= 30% per family (the
corpus is built from the machine's own files, so another machine's held-out part differs:
the gates leave room above the measured 0.2-0.5% and +19-20%), and >= 15x faster than
tiktoken in batch and one text at a time (ratios of medians, each measured interleaved with
its own tiktoken rounds in the same process). Targets, printed and recorded in extra_info:
<= 0.5% undercounts, median overestimate <= 20%, >= 200x in batch and >= 100x one text at
a time.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from testkit import REPO, load_script

import ctxcore
from ctxcore.benchmarking.gates import measure

if TYPE_CHECKING:
    from bench_support import Timed
    from pytest_benchmark.fixture import BenchmarkFixture

FAMILIES = ("cl100k_base", "o200k_base")
#: The estimator's gates and targets.
GATE_UNDERCOUNT = 0.01
GATE_MEDIAN_OVER = 0.30
TARGET_UNDERCOUNT = 0.005
TARGET_MEDIAN_OVER = 0.20
#: Speed against tiktoken ``encode`` over the held-out corpus, ratio of medians, each form
#: of the estimator against its own interleaved reference rounds. Targets: 200x in batch,
#: 100x one text at a time (`estimate_tokens` in a loop, each call returning its
#: TokenCount). Not met: every code point is priced by its pair and every word looked up in
#: the vocabulary, which is what keeps the estimate tight, and on this machine that costs
#: about 30-45 cycles a word (357,000 words) and 1-3 a code point (2.4 million). Measured on
#: the shared 2-core machine: 32-33x (cl100k_base) and 25x (o200k_base) in batch, 32x and
#: 24x per text (see docs/performance-estimator.md); the gates are floors below that, with
#: room for other tenants' load.
GATE_SPEEDUP_BATCH = 15.0
GATE_SPEEDUP_PER_TEXT = 15.0
TARGET_SPEEDUP_BATCH = 200.0
TARGET_SPEEDUP_PER_TEXT = 100.0


def _calibration_module() -> ModuleType:
    return load_script(REPO / "tools" / "calibrate_estimator.py")


@pytest.fixture(scope="module")
def held_out_corpus() -> list[Any]:
    cal = _calibration_module()
    return [s for s in cal.build_corpus() if cal.held_out(s)]


@pytest.fixture(scope="module", params=FAMILIES)
def held_out(request: pytest.FixtureRequest, held_out_corpus: list[Any]) -> dict[str, Any]:
    family = request.param
    corpus = held_out_corpus
    texts = [s.text for s in corpus]
    exact = ctxcore.count_tokens_batch(texts, family).astype(np.float64)
    keep = exact > 0
    texts = [t for t, k in zip(texts, keep) if k]
    return {
        "family": family,
        "texts": texts,
        "exact": exact[keep],
        "kinds": [s.kind for s, k in zip(corpus, keep) if k],
    }


def _stats(est: np.ndarray, exact: np.ndarray) -> dict[str, float]:
    rel = est / exact - 1.0
    return {
        "undercount": float(np.mean(est < exact)),
        "median_over": float(np.median(rel)),
        "p95_over": float(np.percentile(rel, 95)),
    }


def _chars4(texts: list[str]) -> np.ndarray:
    return np.array([math.ceil(len(t) / 4) for t in texts], dtype=np.float64)


def _bytes3(texts: list[str]) -> np.ndarray:
    return np.array([math.ceil(len(t.encode("utf-8", "surrogatepass")) / 3) for t in texts], dtype=np.float64)


def test_estimator_accuracy_on_held_out_text(benchmark: BenchmarkFixture, held_out: dict[str, Any]) -> None:
    texts, exact, family = held_out["texts"], held_out["exact"], held_out["family"]
    est = benchmark(ctxcore.estimate_tokens_batch, texts, family).astype(np.float64)
    rows = {
        "ctxcore estimator": _stats(est, exact),
        "chars/4": _stats(_chars4(texts), exact),
        "bytes/3": _stats(_bytes3(texts), exact),
    }
    print(f"\n{family}: held-out texts: {len(texts)}, exact tokens: {int(exact.sum())}")
    print(f"{'method':<18} {'undercount':>10} {'median over':>12} {'p95 over':>9}")
    for name, r in rows.items():
        print(f"{name:<18} {r['undercount']:>10.2%} {r['median_over']:>+12.1%} {r['p95_over']:>+9.1%}")
    kinds = np.array(held_out["kinds"])
    for kind in sorted(set(held_out["kinds"])):
        m = kinds == kind
        r = _stats(est[m], exact[m])
        print(f"  {kind:<16} n={int(m.sum()):<5} undercount {r['undercount']:.2%}  median over {r['median_over']:+.1%}")
    benchmark.extra_info.update({f"{k}:{m}": round(v, 4) for k, r in rows.items() for m, v in r.items()})
    ours = rows["ctxcore estimator"]
    print(
        f"targets: undercount <= {TARGET_UNDERCOUNT:.1%} ({'met' if ours['undercount'] <= TARGET_UNDERCOUNT else 'MISSED'}), "
        f"median over <= {TARGET_MEDIAN_OVER:.0%} ({'met' if ours['median_over'] <= TARGET_MEDIAN_OVER else 'MISSED'})"
    )
    assert ours["undercount"] <= GATE_UNDERCOUNT
    assert ours["median_over"] <= GATE_MEDIAN_OVER
    # Never wildly above: at most 2.5x the exact count on texts of 20 tokens or more
    # (measured: 2.35x cl100k_base, 2.16x o200k_base), and on short texts at most 3x plus
    # the margin of a few tokens. The widest short case is o200k_base's: its vocabulary
    # holds long runs of spaces as single tokens, so 24 spaces of indentation and a ")"
    # are 2 tokens, estimated as 11 (every space priced as the average space).
    big = exact >= 20
    ratio = est / exact
    print(f"largest estimate / exact: {ratio[big].max():.2f}x (>= 20 tokens), {ratio.max():.2f}x (all)")
    assert np.all(est[big] <= 2.5 * exact[big])
    assert np.all(est <= 3 * exact + 10)
    # Both heuristics undercount far more often: the estimator is doing real work.
    assert rows["chars/4"]["undercount"] > 10 * max(ours["undercount"], 0.001)
    assert rows["bytes/3"]["undercount"] > 10 * max(ours["undercount"], 0.001)


def test_estimator_speed_vs_tiktoken(benchmark: BenchmarkFixture, timed: Timed, held_out: dict[str, Any]) -> None:
    texts, family = held_out["texts"], held_out["family"]
    from ctxcore.tokens import _encoding

    enc = _encoding(family)

    def encode() -> list[int]:
        return [len(enc.encode(t, disallowed_special=())) for t in texts]

    def per_text() -> list[ctxcore.TokenCount]:
        return [ctxcore.estimate_tokens(t, family) for t in texts]

    benchmark(ctxcore.estimate_tokens_batch, texts, family)
    # tiktoken's rounds are spread among the estimator's, so that both see the same load;
    # each form of the estimator against its own interleaved reference rounds.
    ours, encoded = measure(
        lambda: ctxcore.estimate_tokens_batch(texts, family), rounds=30, reference=encode, reference_rounds=5
    )
    ours_single, encoded_single = measure(per_text, rounds=20, reference=encode, reference_rounds=5)
    assert encoded is not None and encoded_single is not None
    batch, ref = float(np.median(ours)), float(np.median(encoded))
    single, ref_single = float(np.median(ours_single)), float(np.median(encoded_single))
    chars4 = float(np.median(timed(lambda: _chars4(texts), rounds=10)))
    bytes3 = float(np.median(timed(lambda: _bytes3(texts), rounds=10)))
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    speedup, speedup_single = ref / batch, ref_single / single
    benchmark.extra_info.update(
        speedup_batch_vs_tiktoken=round(speedup, 1), speedup_per_call_vs_tiktoken=round(speedup_single, 1)
    )

    def verdict(ratio: float, target: float) -> str:
        return f"target {target:.0f}x {'met' if ratio >= target else 'MISSED'}"

    print(
        f"\n{family}: {len(texts)} texts, {mb:.2f} MB: tiktoken encode {ref * 1e3:.1f} ms; "
        f"estimate_tokens_batch {batch * 1e3:.2f} ms ({speedup:.0f}x, {verdict(speedup, TARGET_SPEEDUP_BATCH)}); "
        f"tiktoken encode {ref_single * 1e3:.1f} ms; estimate_tokens per text {single * 1e3:.2f} ms "
        f"({speedup_single:.0f}x, {verdict(speedup_single, TARGET_SPEEDUP_PER_TEXT)}); "
        f"chars/4 {chars4 * 1e3:.2f} ms; bytes/3 {bytes3 * 1e3:.2f} ms"
    )
    assert speedup >= GATE_SPEEDUP_BATCH, f"batch {speedup:.0f}x tiktoken, gate {GATE_SPEEDUP_BATCH:.0f}x"
    assert speedup_single >= GATE_SPEEDUP_PER_TEXT, (
        f"per text {speedup_single:.0f}x tiktoken, gate {GATE_SPEEDUP_PER_TEXT:.0f}x"
    )


def test_count_tokens_batch_vs_tiktoken_one_at_a_time(
    benchmark: BenchmarkFixture, timed: Timed, held_out: dict[str, Any]
) -> None:
    # Exact counts for a whole batch in one call against the same tiktoken encoding called
    # once per text and against tiktoken's own encode_ordinary_batch (a thread pool), in
    # the same run.
    texts, family = held_out["texts"], held_out["family"]
    from ctxcore.tokens import _encoding

    enc = _encoding(family)
    want = np.array([len(enc.encode_ordinary(t)) for t in texts])
    assert np.array_equal(benchmark(ctxcore.count_tokens_batch, texts, family), want)
    # A reference round before each timed round, so that both see the same load (timed one
    # after the other, a burst during either moved the ratio to 0.63x in a CI run).
    ours, one_at_a_time = measure(
        lambda: ctxcore.count_tokens_batch(texts, family),
        rounds=5,
        warmup=1,
        reference=lambda: [len(enc.encode_ordinary(t)) for t in texts],
        reference_rounds=5,
    )
    assert one_at_a_time is not None
    batch, ref = float(np.median(ours)), float(np.median(one_at_a_time))
    pool = float(np.median(timed(lambda: enc.encode_ordinary_batch(texts), rounds=5, warmup=1)))
    per_text = batch / len(texts)
    benchmark.extra_info.update(
        ratio_vs_one_at_a_time=round(ref / batch, 2),
        us_per_text=round(per_text * 1e6, 1),
        ratio_vs_encode_ordinary_batch=round(pool / batch, 2),
    )
    print(
        f"\n{family}: count_tokens_batch {batch * 1e3:.1f} ms for {len(texts)} texts "
        f"({per_text * 1e6:.0f} us/text); tiktoken one at a time {ref * 1e3:.1f} ms ({ref / batch:.2f}x), "
        f"tiktoken encode_ordinary_batch {pool * 1e3:.1f} ms ({pool / batch:.2f}x)"
    )
    # The checks and the array cost little beside the encoding itself (gate with headroom
    # for a busy machine).
    assert batch <= 1.5 * ref
