"""Scoring and the relevance gate: which retrieved candidates are worth ranking, and how much.

The stage between retrieval and packing. Two thresholds and one score, kept apart:

- the retrieval-time ANN cutoff (`ScoringConfig.min_similarity`, 0), which the vector
  path applies before hydration to decide what is worth loading;
- the scoring-time relevance floor (`ScoringConfig.relevance_floor`, 0.15), which drops
  loaded candidates whose relevance is below it before ranking. It must stay below 0.5,
  the fixed relevance that full-text hits carry when they have no cosine score, or every
  full-text hit would be dropped; a config that breaks this is rejected when it is built;
- the score: the *interim* formula 0.85 x similarity + 0.15 x confidence, named as
  interim because it is not the memory service's five-part composite. Per-request weights
  are accepted; when a caller sets weights for components that are present (similarity,
  confidence, recency, importance), a weighted formula runs instead, and the result says
  which formula ran and with what weights.

Everything is vectorized over numpy arrays, one entry per candidate.
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from .._numbers import as_real
from ..errors import ConfigError
from ..memory import FULLTEXT_RELEVANCE_SENTINEL

__all__ = [
    "COMPONENTS",
    "CONTEXT_SPAN",
    "DEFAULT_ABSOLUTE_FLOOR",
    "DEFAULT_CONTEXT_WEIGHT",
    "DEFAULT_CONTEXT_WINDOW_S",
    "DEFAULT_IMPORTANCE_WEIGHT",
    "DEFAULT_RECENCY_WEIGHT",
    "DEFAULT_RELATIVE_FLOOR",
    "DEFAULT_RRF_K",
    "RECENCY_HALF_LIFE_DAYS",
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

#: The interim score's weights ("interim = 0.85 x similarity + 0.15 x confidence").
INTERIM_SIMILARITY_WEIGHT = 0.85
INTERIM_CONFIDENCE_WEIGHT = 0.15
#: Scoring-time relevance floor ("The default floor is 0.15").
DEFAULT_RELEVANCE_FLOOR = 0.15
#: Relevance of a full-text hit with no cosine score ("a fixed relevance sentinel of 0.5");
#: the floor must stay below it. One value: `ctxcore.memory.FULLTEXT_RELEVANCE_SENTINEL`.
FULL_TEXT_RELEVANCE = FULLTEXT_RELEVANCE_SENTINEL
#: Retrieval-time ANN cutoff of the vector path: 0 keeps every memory of positive cosine,
#: so the vector path returns the request's `pool` nearest and the value model ranks
#: them. An absolute cutoff such as 0.70 suits only embedders whose cosines are
#: calibrated to it; a static or lexical embedder's relevant matches score well below.
DEFAULT_MIN_SIMILARITY = 0.0
#: Half-life of the recency component used by weighted scores: a memory a week old
#: counts half as recent as a new one.
RECENCY_HALF_LIFE_DAYS = 7.0
#: The components a weighted score may combine, in a fixed order.
COMPONENTS = ("similarity", "confidence", "recency", "importance")

FloatArray = npt.NDArray[np.float64]


class ScoreFormula(enum.StrEnum):
    """Which formula produced the scores."""

    INTERIM = "interim"  #: 0.85 x similarity + 0.15 x confidence
    WEIGHTED = "weighted"  #: the caller's weights over the components present
    FUSED = "fused"  #: the fused value model (`ValueModel`): ranked signals fused, then factors


@dataclass(frozen=True, slots=True)
class ScoringConfig:
    """The gate's settings, checked when built (at start-up).

    Attributes:
        relevance_floor: candidates with relevance below it are dropped; in [0, 0.5).
        min_similarity: the vector path's ANN cutoff, applied at retrieval time; in [-1, 1].

    >>> ScoringConfig().relevance_floor
    0.15
    >>> ScoringConfig(relevance_floor=0.5)
    Traceback (most recent call last):
    ...
    ctxcore.ConfigError: relevance_floor must be in [0, 0.5): full-text hits carry the fixed relevance 0.5 and a floor at or above it drops every one of them (got 0.5)
    """

    relevance_floor: float = DEFAULT_RELEVANCE_FLOOR
    min_similarity: float = DEFAULT_MIN_SIMILARITY

    def __post_init__(self) -> None:
        f = as_real(self.relevance_floor)
        if f is None or not -math.inf < f < math.inf:  # NaN, infinities and ints past float range
            raise ConfigError(f"relevance_floor must be a finite number, got {self.relevance_floor!r:.40}")
        if not 0 <= f < FULL_TEXT_RELEVANCE:
            raise ConfigError(
                f"relevance_floor must be in [0, {FULL_TEXT_RELEVANCE}): full-text hits carry the fixed relevance "
                f"{FULL_TEXT_RELEVANCE} and a floor at or above it drops every one of them (got {self.relevance_floor!r:.40})"
            )
        m = as_real(self.min_similarity)
        if m is None or not -1 <= m <= 1:  # NaN fails the comparison too
            raise ConfigError(f"min_similarity must be a number in [-1, 1], got {self.min_similarity!r:.40}")
        object.__setattr__(self, "relevance_floor", f)
        object.__setattr__(self, "min_similarity", m)


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Per-request weights; a component left as None takes no part.

    >>> ScoreWeights(similarity=0.6, recency=0.4).given()
    {'similarity': 0.6, 'recency': 0.4}
    """

    similarity: float | None = None
    confidence: float | None = None
    recency: float | None = None
    importance: float | None = None

    def __post_init__(self) -> None:
        for name in COMPONENTS:
            w = getattr(self, name)
            if w is None:
                continue
            x = as_real(w)
            if x is None or not 0 <= x <= sys.float_info.max:  # NaN, inf and ints past float range fail too
                raise ConfigError(f"weight for {name} must be a finite number >= 0, got {w!r:.40}")
            object.__setattr__(self, name, x)

    def given(self) -> dict[str, float]:
        """The weights that were set, by component.

        >>> ScoreWeights(confidence=1.0).given()
        {'confidence': 1.0}
        """
        return {name: float(w) for name in COMPONENTS if (w := getattr(self, name)) is not None}


@dataclass(frozen=True, slots=True, eq=False)
class ScoredCandidates:
    """Scores and the gate's verdict for one candidate set.

    Attributes:
        scores: one score per candidate (float64, read-only), gated ones included.
        relevance: the relevance the gate judged (similarity, or 0.5 for full-text hits).
        kept: True where the candidate passed the relevance floor (bool, read-only).
        formula: which formula produced `scores`.
        weights: the weights it used, by component (normalized to sum to 1).
        ignored_weights: components the caller weighted but gave no values for.
        relevance_floor: the floor applied.
    """

    scores: FloatArray
    relevance: FloatArray
    kept: npt.NDArray[np.bool_]
    formula: ScoreFormula
    weights: Mapping[str, float]
    ignored_weights: tuple[str, ...]
    relevance_floor: float
    dropped: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dropped", int(self.kept.size - np.count_nonzero(self.kept)))

    def record(self) -> dict[str, Any]:
        """Which formula ran, with which weights, and how many the floor dropped.

        >>> score_candidates([0.9, 0.05], [0.5, 0.5]).record()["below_relevance_floor"]
        1
        """
        return {
            "formula": self.formula.value,
            "weights": dict(self.weights),
            "ignored_weights": list(self.ignored_weights),
            "relevance_floor": self.relevance_floor,
            "evaluated": int(self.kept.size),
            "below_relevance_floor": self.dropped,
        }


def _array(name: str, values: Any, n: int | None) -> FloatArray:
    try:
        a = np.asarray(values, dtype=np.float64)
    except OverflowError:
        raise ValueError(f"{name} holds an int too large for a float (not finite)") from None
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a 1-D sequence of numbers") from None
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {a.ndim} dimensions")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} values but similarity has {n}")
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"{name} at index {int(bad[0])} is not finite ({a[bad[0]]})")
    return a


def _frozen(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def _normalized(weights: Mapping[str, float]) -> dict[str, float]:
    """The positive weights scaled to sum to 1, or {} when none is positive.

    Each weight is first divided by the largest, so the sum that follows is at most the
    number of components: finite weights near the float maximum (1e308 each) would
    otherwise overflow it.

    >>> _normalized({"similarity": 1e308, "confidence": 1e308})
    {'similarity': 0.5, 'confidence': 0.5}
    >>> _normalized({"similarity": 0.0})
    {}
    """
    top = max(weights.values(), default=0.0)
    if not top > 0:
        return {}
    scaled = {k: w / top for k, w in weights.items() if w > 0}
    total = math.fsum(scaled.values())
    return {k: w / total for k, w in scaled.items()}


def interim_score(similarity: Any, confidence: Any) -> FloatArray:
    """The interim score, 0.85 x similarity + 0.15 x confidence, element-wise.

    Interim: the memory service's full composite is not on the wire yet.

    >>> interim_score([1.0, 0.5], [0.0, 1.0]).tolist()
    [0.85, 0.575]
    """
    s = _array("similarity", similarity, None)
    c = _array("confidence", confidence, s.shape[0])
    return INTERIM_SIMILARITY_WEIGHT * s + INTERIM_CONFIDENCE_WEIGHT * c


def relevance_gate(relevance: Any, floor: float = DEFAULT_RELEVANCE_FLOOR) -> npt.NDArray[np.bool_]:
    """True where a candidate's relevance reaches the floor (exactly at the floor passes).

    >>> relevance_gate([0.1, 0.15, 0.5]).tolist()
    [False, True, True]
    """
    floor = ScoringConfig(relevance_floor=floor).relevance_floor
    return _array("relevance", relevance, None) >= floor


def score_candidates(
    similarity: Any,
    confidence: Any,
    *,
    recency: Any = None,
    importance: Any = None,
    full_text: Any = None,
    weights: ScoreWeights | None = None,
    config: ScoringConfig | None = None,
) -> ScoredCandidates:
    """Gate and score a candidate set.

    Args:
        similarity: cosine similarity per candidate (full-text hits: anything; replaced).
        confidence: confidence per candidate.
        recency: optional recency component per candidate.
        importance: optional importance component per candidate.
        full_text: optional bool per candidate: a full-text hit with no cosine score. Its
            similarity and relevance become the fixed 0.5.
        weights: per-request weights. Used when at least one weighted component has
            values and the used weights sum above 0; otherwise the interim formula runs.
        config: the gate's settings; `ScoringConfig()` by default.

    Returns:
        `ScoredCandidates`: scores, the gate's mask, and which formula ran.

    Raises:
        TypeError, ValueError: an array is not 1-D numbers, has the wrong length, or holds
            a non-finite value (its index is named).

    >>> r = score_candidates([0.9, 0.1, 0.0], [0.5, 0.5, 0.2], full_text=[False, False, True])
    >>> (r.formula.value, r.kept.tolist(), [round(x, 3) for x in r.scores.tolist()])
    ('interim', [True, False, True], [0.84, 0.16, 0.455])
    >>> r = score_candidates([0.9, 0.6], [0.1, 0.9], recency=[0.0, 1.0],
    ...                      weights=ScoreWeights(similarity=1, recency=1))
    >>> (r.formula.value, dict(r.weights), r.scores.tolist())
    ('weighted', {'similarity': 0.5, 'recency': 0.5}, [0.45, 0.8])
    """
    if config is None:
        config = ScoringConfig()
    elif not isinstance(config, ScoringConfig):
        raise TypeError(f"config must be a ScoringConfig, got {type(config).__name__}")
    if weights is not None and not isinstance(weights, ScoreWeights):
        raise TypeError(f"weights must be a ScoreWeights, got {type(weights).__name__}")
    if full_text is None:
        sim = _array("similarity", similarity, None)
    else:
        try:
            sim = np.asarray(similarity, dtype=np.float64)
        except OverflowError:
            raise ValueError("similarity holds an int too large for a float (not finite)") from None
        except (TypeError, ValueError):
            raise TypeError("similarity must be a 1-D sequence of numbers") from None
    n = sim.shape[0] if sim.ndim == 1 else -1
    if full_text is not None:
        ft = np.asarray(full_text)
        if ft.dtype != np.bool_ or ft.ndim != 1 or ft.shape[0] != n:
            raise ValueError("full_text must be a 1-D array of bool, one per similarity value")
        sim = np.where(ft, FULL_TEXT_RELEVANCE, sim)
        sim = _array("similarity", sim, None)
    components: dict[str, FloatArray] = {
        "similarity": sim,
        "confidence": _array("confidence", confidence, n),
    }
    if recency is not None:
        components["recency"] = _array("recency", recency, n)
    if importance is not None:
        components["importance"] = _array("importance", importance, n)

    formula = ScoreFormula.INTERIM
    used: dict[str, float] = {
        "similarity": INTERIM_SIMILARITY_WEIGHT,
        "confidence": INTERIM_CONFIDENCE_WEIGHT,
    }
    ignored: tuple[str, ...] = ()
    if weights is not None:
        given = weights.given()
        present = {k: w for k, w in given.items() if k in components}
        ignored = tuple(k for k in given if k not in components)
        used_weights = _normalized(present)
        if used_weights:
            formula = ScoreFormula.WEIGHTED
            used = used_weights
    scores = np.zeros(n, dtype=np.float64)
    for name, w in used.items():
        scores += w * components[name]
    kept = sim >= config.relevance_floor
    return ScoredCandidates(
        scores=_frozen(scores),
        relevance=_frozen(sim),
        kept=_frozen(kept),
        formula=formula,
        weights=MappingProxyType(used),
        ignored_weights=ignored,
        relevance_floor=config.relevance_floor,
    )


# ---- the fused value model ------------------------------------------------------------

#: Reciprocal-rank fusion's constant (`FusionMethod.RRF`): a candidate ranked r-th
#: (1 = best) in a signal adds weight / (k + r); 20 ranked better than the customary 60 on
#: the labelled conversational corpora (docs/quality.md).
DEFAULT_RRF_K = 20.0
#: The value model's sharpness: value = relevance ** sharpness (before the factors). Fused
#: relevance falls slowly with rank; raised to this power, a candidate well below the best
#: is worth a small fraction of it, so the knapsack does not prefer several short, weakly
#: related memories to the one that answers (docs/quality.md gives the sweep).
DEFAULT_SHARPNESS = 8.0
#: Z-score fusion (`FusionMethod.ZSCORE`, the default): relevance = exp((z - z_best) /
#: temperature), z the weighted sum of the standardized signals, each standardized over the
#: whole scope where the store gives its mean and spread, and capped at `DEFAULT_Z_CAP` (a
#: word only one memory holds would otherwise outweigh every other signal). A signal's
#: distance above its scope's mean says how strong a match is, where its rank or its place
#: between the pool's best and worst does not: measured on real and generated
#: conversations with three embedders, it holds the most evidence at every spend of the
#: three fusions, in the worst case as on average (docs/quality.md).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_Z_CAP = 8.0
#: The packer keeps the rank-order packing (best value first, each memory that still fits)
#: unless the knapsack's optimum is worth more than this share above it: the knapsack
#: decides where the values differ materially, never by trading one memory for several
#: shorter, barely valued ones in the tail of the ranking (docs/quality.md).
DEFAULT_RANK_TOLERANCE = 0.01
#: Candidates whose relevance is below this fraction of the request's best are dropped.
DEFAULT_RELATIVE_FLOOR = 0.02
#: Candidates whose fused relevance is below this are dropped, whatever the best is.
DEFAULT_ABSOLUTE_FLOOR = 0.01
#: Weight of the recency list (the hot path's newest memories) beside full text and
#: vector (1 each): enough that recent memories are worth something when nothing else
#: matches, too little to outrank a match.
DEFAULT_RECENCY_WEIGHT = 0.1
#: Importance's factor is ``1 - w + w * importance`` (1 when a memory has none).
DEFAULT_IMPORTANCE_WEIGHT = 0.5
#: The conversational-context signal: a memory created next to a strong match (within
#: `DEFAULT_CONTEXT_WINDOW_S` of it, at most `CONTEXT_SPAN` candidates away on each side
#: in creation order) gains this share of that match's relevance, divided by its distance.
#: A conversation stored one turn per memory answers a question across neighbouring turns
#: (the question, the reply that holds the answer, the follow-up that dates it); small
#: enough that a neighbour never outranks a match of its own (docs/quality.md).
DEFAULT_CONTEXT_WEIGHT = 0.3
DEFAULT_CONTEXT_WINDOW_S = 1800.0
CONTEXT_SPAN = 2
#: Signals a fused relevance combines, in a fixed order, and why a selected memory is in
#: ("context": its neighbours in the conversation matched more than it did).
SIGNALS = ("fulltext", "vector", "recency", "context")


class FusionMethod(enum.StrEnum):
    """How the fused value model combines the ranked signals."""

    RRF = "rrf"  #: reciprocal-rank fusion: sum of weight / (k + rank)
    WEIGHTED = "weighted"  #: weighted mean of each signal min-max scaled to [0, 1] over the candidates
    ZSCORE = "zscore"  #: weighted sum of each signal standardized over the scope, as a softmax share of the best


def _weight(name: str, v: object, *, positive: bool = False) -> float:
    """`v` as a float: a real number of any type (numpy's too), finite, >= 0 (> 0 when
    `positive`); else a `ConfigError` naming it."""
    x = as_real(v)
    if x is None or not 0 <= x <= sys.float_info.max or (positive and x == 0):  # NaN, inf, huge ints fail
        raise ConfigError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r:.40}")
    return float(x)


@dataclass(frozen=True, slots=True)
class ValueModel:
    """The fused value model: what a candidate memory is worth to the packer.

    Relevance is the base. The full-text, vector and recency signals each rank the
    request's candidates (a memory two retrieval paths found carries both signals; the
    recency list is the hot path's newest memories), and they are fused (`FusionMethod`,
    each signal weighted) into a relevance in [0, 1] where 1 is the best place in every
    signal present; a candidate with no signal is worth 0. The value is then

        value = relevance ** sharpness * confidence ** confidence_exponent
                * (1 - importance_weight + importance_weight * importance)
                * recency factor

    where a missing importance counts 1 and the recency factor is
    ``0.5 ** (age_days / recency_half_life_days)`` when a half-life is set, else 1. The
    packer keeps the rank-order packing of these values (best first, each memory that
    still fits) unless the knapsack's optimum is worth more than `rank_tolerance` above
    it (0: the knapsack's optimum always). Before the value, each candidate's relevance
    gains `context_weight` times the relevance of the candidates created next to it (at
    most `CONTEXT_SPAN` on each side in creation order, within `context_window_s` seconds),
    divided by the distance (`context_boost`); 0 turns it off. A candidate is dropped when
    its relevance is below `absolute_floor` or below `relative_floor` times the best
    relevance of the request; a request's ``AssemblyOptions.relevance_floor``, when set,
    takes the place of `absolute_floor`. (`ScoringConfig`'s relevance floor is the
    interim and weighted formulas' floor on similarity.)

    >>> ValueModel().record()["fusion"]
    'zscore'
    >>> ValueModel(rrf_k=0)
    Traceback (most recent call last):
    ...
    ctxcore.ConfigError: rrf_k must be a finite number > 0, got 0
    """

    fusion: FusionMethod = FusionMethod.ZSCORE
    rrf_k: float = DEFAULT_RRF_K
    fulltext_weight: float = 1.0
    vector_weight: float = 1.0
    recency_weight: float = DEFAULT_RECENCY_WEIGHT
    sharpness: float = DEFAULT_SHARPNESS
    relative_floor: float = DEFAULT_RELATIVE_FLOOR
    absolute_floor: float = DEFAULT_ABSOLUTE_FLOOR
    confidence_exponent: float = 1.0
    importance_weight: float = DEFAULT_IMPORTANCE_WEIGHT
    recency_half_life_days: float | None = None
    temperature: float = DEFAULT_TEMPERATURE
    z_cap: float = DEFAULT_Z_CAP
    rank_tolerance: float = DEFAULT_RANK_TOLERANCE
    context_weight: float = DEFAULT_CONTEXT_WEIGHT
    context_window_s: float = DEFAULT_CONTEXT_WINDOW_S

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "fusion", FusionMethod(self.fusion))
        except ValueError:
            raise ConfigError(
                f"fusion must be one of {[m.value for m in FusionMethod]}, got {self.fusion!r:.40}"
            ) from None
        object.__setattr__(self, "rrf_k", _weight("rrf_k", self.rrf_k, positive=True))
        object.__setattr__(self, "temperature", _weight("temperature", self.temperature, positive=True))
        object.__setattr__(self, "z_cap", _weight("z_cap", self.z_cap, positive=True))
        object.__setattr__(self, "context_window_s", _weight("context_window_s", self.context_window_s, positive=True))
        for name in (
            "fulltext_weight",
            "vector_weight",
            "recency_weight",
            "sharpness",
            "confidence_exponent",
            "context_weight",
        ):
            object.__setattr__(self, name, _weight(name, getattr(self, name)))
        if self.fulltext_weight + self.vector_weight + self.recency_weight == 0:
            raise ConfigError("fulltext_weight, vector_weight and recency_weight may not all be 0")
        tol = _weight("rank_tolerance", self.rank_tolerance)
        if tol >= 1:
            raise ConfigError(f"rank_tolerance must be in [0, 1), got {tol!r}")
        object.__setattr__(self, "rank_tolerance", tol)
        for name in ("relative_floor", "absolute_floor", "importance_weight"):
            v = _weight(name, getattr(self, name))
            if v > 1:
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
            object.__setattr__(self, name, v)
        if self.recency_half_life_days is not None:
            object.__setattr__(
                self,
                "recency_half_life_days",
                _weight("recency_half_life_days", self.recency_half_life_days, positive=True),
            )

    def record(self) -> dict[str, Any]:
        """The model's parameters, as a result records them."""
        return {
            "fusion": self.fusion.value,
            "rrf_k": self.rrf_k,
            "fulltext_weight": self.fulltext_weight,
            "vector_weight": self.vector_weight,
            "recency_weight": self.recency_weight,
            "sharpness": self.sharpness,
            "relative_floor": self.relative_floor,
            "absolute_floor": self.absolute_floor,
            "confidence_exponent": self.confidence_exponent,
            "importance_weight": self.importance_weight,
            "recency_half_life_days": self.recency_half_life_days,
            "temperature": self.temperature,
            "z_cap": self.z_cap,
            "rank_tolerance": self.rank_tolerance,
            "context_weight": self.context_weight,
            "context_window_s": self.context_window_s,
        }


#: The least a standardized signal counts in z-score fusion. Far below any z that matters
#: (its relevance, exp of the distance to the best, is 0 long before), it keeps the
#: weighted sum of the signals finite when a store's reference spread is tiny beside a
#: candidate's score.
_Z_FLOOR = -1e100


def _binary_scaled(values: FloatArray) -> FloatArray:
    """`values` (finite) times the power of two that brings the largest magnitude into
    [0.5, 1); all zeros stay as they are.

    Scaling by a power of two is exact (but for values some 2**1022 times smaller than
    the largest, which lose bits or become 0 beside it), so a scale-free statistic of the
    result (a z-score, a min-max scaling) equals the same statistic of `values` bit for
    bit, while its sums and squares stay far from overflow whatever the finite inputs.

    >>> _binary_scaled(np.array([1.7e308, 3.0, -8.0e307])).tolist()[0] < 1.0
    True
    >>> _binary_scaled(np.array([3.0, -1.0])).tolist()
    [0.75, -0.25]
    """
    top = float(np.max(np.abs(values))) if values.size else 0.0
    if top == 0.0:
        return values
    return np.ldexp(values, -math.frexp(top)[1])


def _standardized(values: FloatArray, cap: float) -> FloatArray:
    """`values` (finite) as z-scores over themselves, capped at `cap`; all zeros when they
    do not vary.

    The mean and spread are taken after `_binary_scaled`, so any finite scores (1e308
    and 1e-300 in one list) standardize without overflow, to the z-scores the direct
    computation gives where it does not overflow.

    >>> _standardized(np.array([1e308, 1e308, 0.0]), 8.0).round(3).tolist()
    [0.707, 0.707, -1.414]
    """
    u = _binary_scaled(values)
    mean, std = float(u.mean()), float(u.std())
    if not std > 0:
        return np.zeros(values.shape[0])
    return np.minimum((u - mean) / std, cap)


def _ranks(key: FloatArray, present: npt.NDArray[np.bool_]) -> FloatArray:
    """1-based rank of each present entry by `key`, best (largest) first; equal keys share
    the better rank. NaN where absent."""
    out = np.full(key.shape[0], np.nan)
    vals = key[present]
    if vals.size:
        s = np.sort(vals)
        out[present] = (vals.size - np.searchsorted(s, vals, side="right") + 1).astype(np.float64)
    return out


def fuse(
    similarity: Any,
    fulltext_score: Any,
    *,
    fulltext: Any = None,
    recency: Any = None,
    model: ValueModel | None = None,
    reference: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """The fused relevance of each candidate, in [0, 1], and its dominant signal (an index
    into `SIGNALS`, -1 for none).

    Args:
        similarity: cosine similarity per candidate, NaN where it has none.
        fulltext_score: the full-text ranker's score per candidate (>= 0), NaN where the
            full-text path did not score it.
        fulltext: optional bool per candidate: found by full text without a score (a source
            that gives only a ranked list); such hits rank after the scored ones, in the
            order given.
        recency: optional creation time per candidate of the recency list (the hot path:
            the newest memories), NaN for the others; newer ranks higher.
        model: the value model (`ValueModel()` by default).
        reference: per signal (``"vector"``, ``"fulltext"``), the (mean, standard
            deviation) of its score over the whole scope, which z-score fusion
            standardizes by; a signal without one, or with a mean or deviation that is
            not finite, is standardized over the candidates.

    >>> rel, dom = fuse([0.9, 0.2, float("nan")], [float("nan"), 3.0, 1.0])
    >>> [round(x, 3) for x in rel.tolist()], dom.tolist()
    ([0.868, 1.0, 0.449], [1, 0, 0])
    >>> rel, dom = fuse([0.9, 0.2, float("nan")], [float("nan"), 3.0, 1.0], model=ValueModel(fusion="weighted"))
    >>> [round(x, 3) for x in rel.tolist()], dom.tolist()
    ([0.5, 0.667, 0.167], [1, 0, 0])
    >>> rel, _ = fuse([0.9, 0.2, float("nan")], [float("nan"), 3.0, 1.0], model=ValueModel(fusion="rrf", rrf_k=1))
    >>> [round(x, 3) for x in rel.tolist()]
    [0.5, 0.833, 0.333]
    """
    model = model if model is not None else ValueModel()
    sim = np.asarray(similarity, dtype=np.float64)
    fts = np.asarray(fulltext_score, dtype=np.float64)
    if sim.ndim != 1 or fts.shape != sim.shape:
        raise ValueError("similarity and fulltext_score must be 1-D arrays of one length")
    n = sim.shape[0]
    lex_key = np.where(np.isnan(fts), -np.inf, fts)
    lex_present = ~np.isnan(fts)
    if fulltext is not None:
        ft = np.asarray(fulltext, dtype=bool)
        if ft.shape != sim.shape:
            raise ValueError("fulltext must be one bool per candidate")
        unscored = ft & ~lex_present
        if unscored.any():
            # After every scored hit (scores are >= 0), in the order given.
            lex_key = lex_key.copy()
            lex_key[unscored] = -1.0 - np.arange(int(unscored.sum()), dtype=np.float64)
            lex_present = lex_present | unscored
    vec_present = ~np.isnan(sim)
    rec = np.full(n, np.nan) if recency is None else np.asarray(recency, dtype=np.float64)
    if rec.shape != sim.shape:
        raise ValueError("recency must be one number (or NaN) per candidate")
    rec_present = ~np.isnan(rec)
    weights = np.array(
        [
            model.fulltext_weight if lex_present.any() else 0.0,
            model.vector_weight if vec_present.any() else 0.0,
            model.recency_weight if rec_present.any() else 0.0,
        ]
    )
    if n == 0 or weights.sum() == 0:
        return np.zeros(n), np.full(n, -1, dtype=np.int64)
    if model.fusion is FusionMethod.RRF:
        k = model.rrf_k
        parts = np.stack(
            [
                np.nan_to_num(weights[0] / (k + _ranks(lex_key, lex_present)), nan=0.0),
                np.nan_to_num(weights[1] / (k + _ranks(np.where(vec_present, sim, -np.inf), vec_present)), nan=0.0),
                np.nan_to_num(weights[2] / (k + _ranks(np.where(rec_present, rec, -np.inf), rec_present)), nan=0.0),
            ]
        )
        top = float(weights.sum() / (k + 1.0))
    elif model.fusion is FusionMethod.ZSCORE:
        ref = reference or {}

        def standard(v: FloatArray, present: npt.NDArray[np.bool_], name: str, absent: float) -> FloatArray:
            vals = np.where(present, v, absent)
            given = ref.get(name)
            if given is None or not all(map(math.isfinite, given)):
                # None, or not a usable one (a NaN or infinite mean or spread): the
                # candidates' own statistics.
                return _standardized(vals, model.z_cap)
            mean, std = given
            if not std > 0:
                return np.zeros(n)
            # A score far outside the scope's spread overflows to an infinite z, which the
            # bounds make finite.
            with np.errstate(over="ignore"):
                z = (vals - mean) / std
            return np.clip(z, _Z_FLOOR, model.z_cap)

        lex_val = np.where(lex_present & (lex_key >= 0), lex_key, 0.0)
        parts = np.stack(
            [
                weights[0] * standard(lex_val, lex_present, "fulltext", 0.0),
                weights[1] * standard(sim, vec_present, "vector", float(np.nanmin(sim)) if vec_present.any() else 0.0),
                weights[2] * standard(rec, rec_present, "recency", float(np.nanmin(rec)) if rec_present.any() else 0.0),
            ]
        )
        # A candidate no signal carries is worth 0, as in the other fusions; the dominant
        # signal is among those the candidate carries (a standardized signal may be
        # negative: an absent one's 0 must not win).
        carried = np.stack([lex_present, vec_present, rec_present]) & (weights[:, None] > 0)
        found = carried.any(axis=0)
        z = parts.sum(axis=0) / weights.sum()
        z_best = float(z[found].max()) if found.any() else 0.0
        relevance = np.where(found, np.exp(np.minimum(z - z_best, 0.0) / model.temperature), 0.0)
        dominant = np.where(found, np.argmax(np.where(carried, parts, -np.inf), axis=0), -1).astype(np.int64)
        return relevance, dominant
    else:
        # Each signal min-max scaled over the m candidates that carry it: the best is 1,
        # the weakest 1 / (m + 1) (the spread within the pool is what tells candidates
        # apart; the scope's mean, below every pooled cosine, compresses it and measured
        # worse).
        def scaled(v: FloatArray, present: npt.NDArray[np.bool_]) -> FloatArray:
            out = np.zeros(n)
            if present.any():
                vals = _binary_scaled(v[present])
                lo, hi = float(vals.min()), float(vals.max())
                lo -= (hi - lo) / vals.size
                out[present] = 1.0 if hi == lo else (vals - lo) / (hi - lo)
            return out

        lex, vec = scaled(lex_key, lex_present), scaled(sim, vec_present)
        parts = np.stack([weights[0] * lex, weights[1] * vec, weights[2] * scaled(rec, rec_present)])
        top = float(weights.sum())
    total = parts.sum(axis=0)
    relevance = np.clip(total / top, 0.0, 1.0)
    dominant = np.where(total > 0, np.argmax(parts, axis=0), -1).astype(np.int64)
    return relevance, dominant


def context_boost(
    relevance: Any,
    created_at: Any,
    ids: Sequence[str] | None = None,
    *,
    weight: float = DEFAULT_CONTEXT_WEIGHT,
    window_s: float = DEFAULT_CONTEXT_WINDOW_S,
    id_codes: npt.NDArray[np.int64] | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Relevance with the conversational-context signal added, and the part it added.

    The candidates with a creation time are put in creation order (one place per memory
    id, holding its best relevance). A candidate gains ``weight * relevance / d`` from
    each candidate ``d`` places away (``d <= CONTEXT_SPAN``) created within `window_s`
    seconds of it. The result is rescaled so the best relevance stays what it was:
    the signal reorders, it never inflates. Candidates without a creation time neither
    give nor gain.

    Args:
        relevance: fused relevance per candidate, in [0, 1].
        created_at: creation time per candidate (seconds), NaN where unknown.
        ids: the memory id of each candidate, where one memory may be several rows
            (found by several retrieval paths); None: every row is its own memory.
        weight: the share of a neighbour's relevance a candidate gains (0: none).
        window_s: neighbours created further apart than this give nothing.
        id_codes: instead of `ids`, each row's memory as a number >= 0 (rows of one
            memory share it).

    >>> rel, add = context_boost([1.0, 0.0, 0.2], [0.0, 10.0, 5000.0])
    >>> [round(x, 3) for x in rel.tolist()], [round(x, 3) for x in add.tolist()]
    ([1.0, 0.3, 0.2], [0.0, 0.3, 0.0])
    """
    rel = np.asarray(relevance, dtype=np.float64)
    t = np.asarray(created_at, dtype=np.float64)
    if rel.ndim != 1 or t.shape != rel.shape:
        raise ValueError("relevance and created_at must be 1-D arrays of one length")
    n = rel.shape[0]
    added = np.zeros(n)
    if weight <= 0 or n < 2:
        return rel.copy(), added
    known = np.flatnonzero(~np.isnan(t))
    if known.size < 2:
        return rel.copy(), added
    codes: npt.NDArray[np.int64] | None = None
    if id_codes is not None:
        codes = np.asarray(id_codes, dtype=np.int64)
        if codes.shape != rel.shape:
            raise ValueError("id_codes must be one number per candidate")
    elif ids is not None and len(set(ids)) != n:
        number = {mid: k for k, mid in enumerate(dict.fromkeys(ids))}
        codes = np.fromiter(map(number.__getitem__, ids), dtype=np.int64, count=n)
    if codes is None:
        slot = np.arange(known.size)
        best, when = rel[known], t[known]
    else:
        _, slot = np.unique(codes[known], return_inverse=True)
        best = np.zeros(int(slot.max()) + 1)
        when = np.zeros(best.shape[0])
        np.maximum.at(best, slot, rel[known])
        when[slot] = t[known]
    m = best.shape[0]
    order = np.argsort(when, kind="stable")
    r, w = best[order], when[order]
    gain = np.zeros(m)
    for d in range(1, CONTEXT_SPAN + 1):
        if d >= m:
            break
        with np.errstate(over="ignore"):  # a gap beyond the float range is inf: not close
            close = (w[d:] - w[:-d]) <= window_s
        gain[d:] += np.where(close, r[:-d], 0.0) / d
        gain[:-d] += np.where(close, r[d:], 0.0) / d
    boost = np.zeros(m)
    boost[order] = weight * gain
    added[known] = boost[slot]
    out = rel + added
    top = float(out.max())
    if top > 0:
        scale = float(rel.max()) / top
        out *= scale
        added *= scale
    return out, added


def value_scores(
    relevance: Any,
    confidence: Any,
    *,
    importance: Any = None,
    age_days: Any = None,
    model: ValueModel | None = None,
) -> FloatArray:
    """Each candidate's value under `model` from its fused relevance and factors (see
    `ValueModel`); `importance` and `age_days` may hold NaN (no factor).

    >>> value_scores([1.0, 0.5], [1.0, 1.0], model=ValueModel(sharpness=2)).tolist()
    [1.0, 0.25]
    """
    model = model if model is not None else ValueModel()
    rel = _array("relevance", relevance, None)
    n = rel.shape[0]
    v = np.power(rel, model.sharpness)
    conf = _array("confidence", confidence, n)
    if model.confidence_exponent != 1.0:
        conf = np.power(conf, model.confidence_exponent)
    v = v * conf
    if importance is not None and model.importance_weight > 0:
        imp = np.asarray(importance, dtype=np.float64)
        w = model.importance_weight
        v = v * np.where(np.isnan(imp), 1.0, 1.0 - w + w * np.nan_to_num(imp))
    if age_days is not None and model.recency_half_life_days is not None:
        age = np.asarray(age_days, dtype=np.float64)
        v = v * np.where(
            np.isnan(age), 1.0, np.power(0.5, np.maximum(0.0, np.nan_to_num(age)) / model.recency_half_life_days)
        )
    return v
