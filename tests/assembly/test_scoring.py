"""Scoring and the relevance gate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ctxcore
from ctxcore import ScoreFormula, ScoreWeights, ScoringConfig, score_candidates

unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def test_constants_are_the_designed_ones() -> None:
    assert (ctxcore.INTERIM_SIMILARITY_WEIGHT, ctxcore.INTERIM_CONFIDENCE_WEIGHT) == (0.85, 0.15)
    assert ctxcore.DEFAULT_RELEVANCE_FLOOR == 0.15 < ctxcore.FULL_TEXT_RELEVANCE == 0.5
    assert ctxcore.DEFAULT_MIN_SIMILARITY == 0.0
    cfg = ScoringConfig()
    assert (cfg.relevance_floor, cfg.min_similarity) == (0.15, 0.0)


@given(st.lists(st.tuples(unit, unit), max_size=50))
def test_interim_score_is_the_weighted_sum(pairs: list[tuple[float, float]]) -> None:
    sim = [p[0] for p in pairs]
    conf = [p[1] for p in pairs]
    got = ctxcore.interim_score(sim, conf)
    want = [0.85 * s + 0.15 * c for s, c in pairs]
    assert np.allclose(got, want, rtol=0, atol=1e-12)
    r = score_candidates(sim, conf)
    assert r.formula is ScoreFormula.INTERIM
    assert np.array_equal(r.scores, got)
    assert dict(r.weights) == {"similarity": 0.85, "confidence": 0.15}


def test_gate_keeps_exactly_at_the_floor_and_drops_below() -> None:
    r = score_candidates([0.15, 0.1499999, 0.0, 0.9], [1.0, 1.0, 1.0, 1.0])
    assert r.kept.tolist() == [True, False, False, True]
    assert r.dropped == 2
    assert r.record()["below_relevance_floor"] == 2
    # Gated candidates keep their scores (the trace can show what they would have had).
    assert r.scores.shape == (4,)
    assert ctxcore.relevance_gate([0.15, 0.149]).tolist() == [True, False]
    assert ctxcore.relevance_gate([0.3, 0.2], floor=0.25).tolist() == [True, False]


def test_full_text_hits_carry_the_sentinel_and_pass_the_floor() -> None:
    sim = [float("nan"), 0.05, 0.8]  # the full-text hit has no cosine score
    r = score_candidates(sim, [0.4, 0.4, 0.4], full_text=[True, False, False])
    assert r.relevance.tolist() == [0.5, 0.05, 0.8]
    assert r.kept.tolist() == [True, False, True]
    assert r.scores[0] == pytest.approx(0.85 * 0.5 + 0.15 * 0.4)
    # Even the highest legal floor keeps full-text hits.
    r = score_candidates(
        sim, [0.4, 0.4, 0.4], full_text=[True, False, False], config=ScoringConfig(relevance_floor=0.4999)
    )
    assert r.kept.tolist() == [True, False, True]


@pytest.mark.parametrize("floor", [0.5, 0.75, 1.0, -0.01, float("nan"), float("inf"), True, "0.1"])
def test_a_floor_that_would_drop_full_text_hits_is_rejected_at_start_up(floor: object) -> None:
    with pytest.raises(ctxcore.ConfigError):
        ScoringConfig(relevance_floor=floor)  # type: ignore[arg-type]
    with pytest.raises(ctxcore.ConfigError):
        ctxcore.relevance_gate([0.3], floor=floor)  # type: ignore[arg-type]


def test_floor_error_says_why() -> None:
    with pytest.raises(ctxcore.ConfigError, match="full-text hits carry the fixed relevance 0.5"):
        ScoringConfig(relevance_floor=0.6)


@pytest.mark.parametrize("value", [1.5, -1.5, float("nan")])
def test_ann_cutoff_is_validated_separately(value: float) -> None:
    with pytest.raises(ctxcore.ConfigError, match="min_similarity"):
        ScoringConfig(min_similarity=value)
    # The ANN cutoff is a retrieval-time setting: it does not gate at scoring time.
    r = score_candidates([0.3], [0.5], config=ScoringConfig(min_similarity=0.9))
    assert r.kept.tolist() == [True]


def test_caller_weights_take_effect_for_present_components() -> None:
    sim, conf = [0.9, 0.2], [0.1, 0.9]
    rec, imp = [0.0, 1.0], [0.5, 0.5]
    r = score_candidates(
        sim,
        conf,
        recency=rec,
        importance=imp,
        weights=ScoreWeights(similarity=2, confidence=1, recency=1, importance=0),
    )
    assert r.formula is ScoreFormula.WEIGHTED
    assert dict(r.weights) == {"similarity": 0.5, "confidence": 0.25, "recency": 0.25}
    assert r.scores.tolist() == pytest.approx([0.5 * 0.9 + 0.25 * 0.1, 0.5 * 0.2 + 0.25 * 0.9 + 0.25])
    assert r.record()["formula"] == "weighted"


def test_weights_for_absent_components_are_ignored_and_reported() -> None:
    r = score_candidates([0.9], [0.1], weights=ScoreWeights(similarity=1, recency=3))
    assert r.formula is ScoreFormula.WEIGHTED
    assert dict(r.weights) == {"similarity": 1.0}
    assert r.ignored_weights == ("recency",)
    assert r.scores.tolist() == [0.9]


def test_weights_that_cannot_apply_fall_back_to_interim() -> None:
    r = score_candidates([0.9], [0.1], weights=ScoreWeights(recency=1.0))
    assert r.formula is ScoreFormula.INTERIM and r.ignored_weights == ("recency",)
    r = score_candidates([0.9], [0.1], weights=ScoreWeights(similarity=0.0, confidence=0.0))
    assert r.formula is ScoreFormula.INTERIM
    r = score_candidates([0.9], [0.1], weights=ScoreWeights())
    assert r.formula is ScoreFormula.INTERIM


@pytest.mark.parametrize("w", [-1.0, float("nan"), float("inf"), True])
def test_bad_weights_are_rejected(w: object) -> None:
    with pytest.raises(ctxcore.ConfigError, match="weight for confidence"):
        ScoreWeights(confidence=w)  # type: ignore[arg-type]


def test_bad_arrays_are_named() -> None:
    with pytest.raises(ValueError, match="confidence has 1 values but similarity has 2"):
        score_candidates([0.1, 0.2], [0.3])
    with pytest.raises(ValueError, match="similarity at index 1 is not finite"):
        score_candidates([0.1, float("nan")], [0.3, 0.3])
    with pytest.raises(ValueError, match="recency at index 0 is not finite"):
        score_candidates([0.1], [0.3], recency=[float("inf")])
    with pytest.raises(ValueError, match="1-D"):
        score_candidates([[0.1]], [[0.3]])
    with pytest.raises(TypeError, match="similarity must be a 1-D sequence of numbers"):
        score_candidates(["high"], [0.3])
    with pytest.raises(ValueError, match="full_text"):
        score_candidates([0.1, 0.2], [0.3, 0.3], full_text=[True])
    with pytest.raises(TypeError, match="config"):
        score_candidates([0.1], [0.3], config={"relevance_floor": 0.2})  # type: ignore[arg-type]


def test_results_are_read_only_and_empty_input_works() -> None:
    r = score_candidates(np.array([0.5, 0.7]), np.array([0.1, 0.2]))
    with pytest.raises(ValueError):
        r.scores[0] = 1.0
    e = score_candidates([], [])
    assert e.scores.shape == (0,) and e.dropped == 0


def test_scores_feed_the_packer() -> None:
    sim = np.array([0.95, 0.10, 0.60, 0.80])
    conf = np.array([0.9, 0.9, 0.1, 0.5])
    r = score_candidates(sim, conf)
    ids = [f"m{i}" for i in range(4)]
    kept = np.flatnonzero(r.kept)
    res = ctxcore.pack_arrays([ids[i] for i in kept], np.array([100, 100, 100, 100])[kept], r.scores[kept], 200)
    assert res.ids == ("m0", "m3")
