"""Scoring: what a candidate memory is worth, and which candidates go on.

- `value`: the score formulas (the interim score, caller weights) and the fused value
  model (`ValueModel`: fused relevance, the conversational-context signal, the factors).
- `gate`: the retrieved memories as columns, scored under the request's formula, gated
  on relevance, de-duplicated by id and capped, every row that goes no further traced.

This package re-exports `value`'s public names; the pipeline imports `gate` by name.
"""

from __future__ import annotations

from .value import (
    COMPONENTS,
    CONTEXT_SPAN,
    DEFAULT_ABSOLUTE_FLOOR,
    DEFAULT_CONTEXT_WEIGHT,
    DEFAULT_CONTEXT_WINDOW_S,
    DEFAULT_IMPORTANCE_WEIGHT,
    DEFAULT_MIN_SIMILARITY,
    DEFAULT_RECENCY_WEIGHT,
    DEFAULT_RELATIVE_FLOOR,
    DEFAULT_RELEVANCE_FLOOR,
    DEFAULT_RRF_K,
    DEFAULT_SHARPNESS,
    FULL_TEXT_RELEVANCE,
    INTERIM_CONFIDENCE_WEIGHT,
    INTERIM_SIMILARITY_WEIGHT,
    RECENCY_HALF_LIFE_DAYS,
    SIGNALS,
    FusionMethod,
    ScoredCandidates,
    ScoreFormula,
    ScoreWeights,
    ScoringConfig,
    ValueModel,
    context_boost,
    fuse,
    interim_score,
    relevance_gate,
    score_candidates,
    value_scores,
)

__all__ = [
    "RECENCY_HALF_LIFE_DAYS",
    "COMPONENTS",
    "CONTEXT_SPAN",
    "DEFAULT_ABSOLUTE_FLOOR",
    "DEFAULT_CONTEXT_WEIGHT",
    "DEFAULT_CONTEXT_WINDOW_S",
    "DEFAULT_IMPORTANCE_WEIGHT",
    "DEFAULT_RECENCY_WEIGHT",
    "DEFAULT_RELATIVE_FLOOR",
    "DEFAULT_RRF_K",
    "DEFAULT_SHARPNESS",
    "SIGNALS",
    "FusionMethod",
    "ValueModel",
    "context_boost",
    "fuse",
    "value_scores",
    "DEFAULT_MIN_SIMILARITY",
    "DEFAULT_RELEVANCE_FLOOR",
    "FULL_TEXT_RELEVANCE",
    "INTERIM_CONFIDENCE_WEIGHT",
    "INTERIM_SIMILARITY_WEIGHT",
    "ScoreFormula",
    "ScoreWeights",
    "ScoredCandidates",
    "ScoringConfig",
    "interim_score",
    "relevance_gate",
    "score_candidates",
]
