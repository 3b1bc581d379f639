"""Scoring and the relevance gate: which retrieved candidates are worth ranking, and how much.

The stage between retrieval and packing. Two thresholds and one score, kept apart:

- the retrieval-time ANN cutoff (`ScoringConfig.min_similarity`, 0.70), which the vector
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import ConfigError
from .memory import FULLTEXT_RELEVANCE_SENTINEL

__all__ = [
    "COMPONENTS",
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
#: Retrieval-time ANN cutoff of the vector path ("min_similarity around 0.70").
DEFAULT_MIN_SIMILARITY = 0.70
#: The components a weighted score may combine, in a fixed order.
COMPONENTS = ("similarity", "confidence", "recency", "importance")

FloatArray = npt.NDArray[np.float64]


class ScoreFormula(enum.StrEnum):
    """Which formula produced the scores."""

    INTERIM = "interim"  #: 0.85 x similarity + 0.15 x confidence
    WEIGHTED = "weighted"  #: the caller's weights over the components present


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
        f = self.relevance_floor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f):
            raise ConfigError(f"relevance_floor must be a finite number, got {f!r}")
        if not 0 <= f < FULL_TEXT_RELEVANCE:
            raise ConfigError(
                f"relevance_floor must be in [0, {FULL_TEXT_RELEVANCE}): full-text hits carry the fixed relevance "
                f"{FULL_TEXT_RELEVANCE} and a floor at or above it drops every one of them (got {f!r})"
            )
        m = self.min_similarity
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or not -1 <= m <= 1:
            raise ConfigError(f"min_similarity must be a number in [-1, 1], got {m!r}")


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
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ConfigError(f"weight for {name} must be a finite number >= 0, got {w!r}")

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
