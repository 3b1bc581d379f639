"""The gate: the retrieved memories as columns, scored, gated on relevance, de-duplicated
by id and capped at the request's maximum, every row that goes no further traced.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..memory import Chain, MemoryBatch, MemoryOrigin, MemoryRecord
from ..redundancy import normalized_text_key
from ..result import TraceReason
from ..trace import REASON_CODE, TraceRows, TraceTable
from .value import (
    RECENCY_HALF_LIFE_DAYS,
    SIGNALS,
    ScoreFormula,
    ScoreWeights,
    ScoringConfig,
    ValueModel,
    context_boost,
    fuse,
    score_candidates,
    value_scores,
)


@dataclass(slots=True)
class Columns:
    """The retrieved memories as columns (one C-level pass over the records): str fields
    as lists, numbers as arrays (NaN for None; -1 for no stored count of the family)."""

    ids: list[str]
    texts: list[str]
    origins: list[str]
    similarity: npt.NDArray[np.float64]
    confidence: npt.NDArray[np.float64]
    importance: npt.NDArray[np.float64]
    created_at: npt.NDArray[np.float64]
    stored: npt.NDArray[np.int64]
    distinct_origins: list[str]
    origin_code: npt.NDArray[np.int64]
    fulltext: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0))
    reference: dict[str, tuple[float, float]] = field(default_factory=dict)
    scores: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0))
    relevance: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0))
    _distinct: bool | None = None
    _codes: npt.NDArray[np.int64] | None = None

    @property
    def n(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, mems: Sequence[MemoryRecord], family: str) -> Columns:
        """The columns of `mems`: batches give their own (joined without going through one
        set of columns per part), records are read in one C pass, and the parts of a
        chained result are joined."""
        parts = mems.parts if isinstance(mems, Chain) else (mems,)
        out = cls._of_parts(parts, family)
        for p in parts:
            if type(p) is MemoryBatch:
                for k, v in p.reference.items():
                    out.reference.setdefault(k, v)
        return out

    @classmethod
    def _of_parts(cls, parts: Sequence[Sequence[MemoryRecord]], family: str) -> Columns:
        if not parts:
            return cls(*_core.memory_columns((), MemoryRecord, family))
        if all(type(p) is MemoryBatch for p in parts):
            return cls._of_batches(parts, family)  # type: ignore[arg-type]
        cols = [
            cls._of_batches((p,), family)
            if type(p) is MemoryBatch
            else cls(*_core.memory_columns(p, MemoryRecord, family))
            for p in parts
        ]
        if len(cols) == 1:
            return cols[0]
        return cls._joined(
            list(itertools.chain.from_iterable(c.ids for c in cols)),
            list(itertools.chain.from_iterable(c.texts for c in cols)),
            list(itertools.chain.from_iterable(c.origins for c in cols)),
            [
                [getattr(c, f) for c in cols]
                for f in ("similarity", "confidence", "importance", "created_at", "stored", "fulltext")
            ],
        )

    @classmethod
    def _of_batches(cls, parts: Sequence[MemoryBatch], family: str) -> Columns:
        if len(parts) == 1:
            b = parts[0]
            return cls._joined(
                b.ids,
                b.texts,
                list(b.origins),
                [
                    [b.similarity],
                    [b.confidence],
                    [b.importance],
                    [b.created_at],
                    [b.counts(family)],
                    [b.fulltext_score],
                ],
            )
        return cls._joined(
            [i for p in parts for i in p.ids],
            [t for p in parts for t in p.texts],
            [o for p in parts for o in p.origins],
            [
                [p.similarity for p in parts],
                [p.confidence for p in parts],
                [p.importance for p in parts],
                [p.created_at for p in parts],
                [p.counts(family) for p in parts],
                [p.fulltext_score for p in parts],
            ],
        )

    @classmethod
    def _joined(
        cls, ids: list[str], texts: list[str], origins: list[str], numbers: list[list[npt.NDArray[Any]]]
    ) -> Columns:
        """Columns from the parts' arrays of similarity, confidence, importance, creation
        time, stored count and full-text score (one array each: used as it is)."""
        distinct = list(dict.fromkeys(origins))
        if len(distinct) == 1:
            code = np.zeros(len(origins), dtype=np.int64)
        else:
            index = {o: k for k, o in enumerate(distinct)}
            code = np.fromiter(map(index.__getitem__, origins), dtype=np.int64, count=len(origins))
        sim, conf, imp, created, stored, fts = (a[0] if len(a) == 1 else np.concatenate(a) for a in numbers)
        return cls(ids, texts, origins, sim, conf, imp, created, stored, distinct, code, fts)

    def of_origin(self, origin: str) -> npt.NDArray[np.bool_]:
        """Which rows came by `origin`."""
        try:
            k = self.distinct_origins.index(origin)
        except ValueError:
            return np.zeros(self.n, dtype=bool)
        mask: npt.NDArray[np.bool_] = self.origin_code == k
        return mask

    @property
    def ids_distinct(self) -> bool:
        """Whether no id repeats (one dict build, kept)."""
        if self._distinct is None:
            self._distinct = len(dict.fromkeys(self.ids)) == len(self.ids)
        return self._distinct

    @property
    def id_codes(self) -> npt.NDArray[np.int64]:
        """Each row's id as a number: the ids numbered in order of first appearance (kept)."""
        if self._codes is None:
            number = {mid: k for k, mid in enumerate(dict.fromkeys(self.ids))}
            self._codes = np.fromiter(map(number.__getitem__, self.ids), dtype=np.int64, count=self.n)
            self._distinct = len(number) == self.n
        return self._codes


#: The dominant signal's name by its index + 1 (0: none).
_SIGNAL_NAMES = np.array(["", *SIGNALS], dtype=object)


def _best_of_each_id(cols: Columns, passing: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_] | None:
    """Which rows are the best-scored of their id among its `passing` rows (those the gate
    lets through), or among all its rows when none passes (the first among equals); None
    when every id is distinct (the common case). A memory that one path found relevant
    enough is never dropped because another path's row of it scores higher but fails
    the floor."""
    if cols.ids_distinct:
        return None
    codes = cols.id_codes
    # By id, then passing rows first, then best score first, then row: the first row of
    # each id's run is its best.
    order = np.lexsort((np.arange(cols.n), -cols.scores, ~passing, codes))
    lead = np.ones(cols.n, dtype=bool)
    run = codes[order]
    lead[1:] = run[1:] != run[:-1]
    first = np.zeros(cols.n, dtype=bool)
    first[order[lead]] = True
    return first


def _recency(created_at: npt.NDArray[np.float64], now: float) -> npt.NDArray[np.float64] | None:
    if not created_at.size or np.isnan(created_at).any():
        return None
    age_days = np.maximum(0.0, now - created_at) / 86400.0
    return np.power(0.5, age_days / RECENCY_HALF_LIFE_DAYS)


def _merge_signals(cols: Columns) -> None:
    """A memory returned by more than one path (the hot and the cold one, say) carries the
    signals of all of them: each row of an id gets the id's best similarity and full-text
    score (rows that are alike then score alike; the first is kept)."""
    if cols.ids_distinct:
        return
    codes = cols.id_codes
    merged = []
    for a in (cols.similarity, cols.fulltext):
        best = np.full(int(codes.max()) + 1, np.nan)
        np.fmax.at(best, codes, a)  # fmax: NaN only where every row of the id has NaN
        merged.append(best[codes])
    cols.similarity, cols.fulltext = merged


def _fused(
    cols: Columns, model: ValueModel, config: ScoringConfig, now: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], list[str], dict[str, Any]]:
    """Scores, the floors' verdict, each row's dominant signal and the record, under the
    fused value model."""
    _merge_signals(cols)
    is_fulltext = cols.of_origin(MemoryOrigin.FULLTEXT)
    is_hot = cols.of_origin(MemoryOrigin.HOT)
    if is_hot.any():
        # The hot path's order is newest first; creation times rank it where known.
        order = -np.arange(cols.n, dtype=np.float64)
        created = (
            np.where(np.isnan(cols.created_at), order, cols.created_at)
            if not np.isnan(cols.created_at[is_hot]).any()
            else order
        )
        recency = np.where(is_hot, created, np.nan)
    else:
        recency = None
    relevance, dominant = fuse(
        cols.similarity, cols.fulltext, fulltext=is_fulltext, recency=recency, model=model, reference=cols.reference
    )
    if model.context_weight > 0:
        own = relevance
        relevance, added = context_boost(
            own,
            cols.created_at,
            weight=model.context_weight,
            window_s=model.context_window_s,
            id_codes=None if cols.ids_distinct else cols.id_codes,
        )
        dominant = np.where(added > own, SIGNALS.index("context"), dominant)
    age = (now - cols.created_at) / 86400.0
    scores = value_scores(relevance, cols.confidence, importance=cols.importance, age_days=age, model=model)
    best = float(relevance.max()) if relevance.size else 0.0
    kept = (relevance >= model.absolute_floor) & (relevance >= model.relative_floor * best) & (relevance > 0)
    cols.relevance = relevance
    signals: list[str] = _SIGNAL_NAMES[dominant + 1].tolist()
    record = {
        "formula": ScoreFormula.FUSED.value,
        "weights": {"fulltext": model.fulltext_weight, "vector": model.vector_weight, "recency": model.recency_weight},
        "ignored_weights": [],
        "value_model": model.record(),
        "relevance_floor": model.absolute_floor,
        "relative_floor": model.relative_floor,
        "evaluated": int(cols.n),
        "below_relevance_floor": int(cols.n - np.count_nonzero(kept)),
    }
    return scores, kept, signals, record


def normalized_keys(texts: Sequence[str]) -> list[str]:
    """`normalized_text_key` of each text."""
    return [normalized_text_key(t) for t in texts]


def gate(
    cols: Columns,
    weights: ScoreWeights | None,
    config: ScoringConfig,
    max_memories: int | None,
    trace: TraceTable,
    model: ValueModel | None = None,
    pinned: frozenset[str] = frozenset(),
    text_keys: Callable[[Sequence[str]], list[str]] = normalized_keys,
) -> tuple[npt.NDArray[np.intp], dict[str, Any], list[str]]:
    """Score the candidates, gate them on relevance, keep the best-scored row of each id
    and at most `max_memories` of them (the `pinned` ids first, then best first, then by
    id; None: no count cap). A pinned memory passes the relevance floor: it is the
    request's guaranteed context, taken first while it fits. With `model` and no
    `weights`, the fused value model scores; otherwise the interim or the weighted
    formula. Sets ``cols.scores`` and ``cols.relevance``; every row that goes no further
    is added to `trace` with its reason. Near-duplicates (one non-empty `text_keys` key)
    count once against `max_memories`: the packer takes at most one of them, so a memory
    ranked after them is not left out on their account. Returns the rows that go on to pricing and
    packing, the scoring record, and each row's dominant signal (empty strings outside the
    fused model)."""
    if not cols.n:
        return np.empty(0, dtype=np.intp), {}, []
    if model is not None and weights is None:
        scores, kept, signals, record = _fused(cols, model, config, time.time())
        cols.scores = scores
    else:
        full_text = np.isnan(cols.similarity)
        imp = cols.importance
        scored = score_candidates(
            np.where(full_text, 0.0, cols.similarity),
            cols.confidence,
            recency=_recency(cols.created_at, time.time()) if weights is not None else None,
            importance=None if weights is None or np.isnan(imp).any() else imp,
            full_text=full_text,
            weights=weights,
            config=config,
        )
        cols.scores = scored.scores
        cols.relevance = scored.relevance
        kept = scored.kept
        signals = [""] * cols.n
        record = scored.record()
    keep = kept.copy()
    is_pinned = np.fromiter((i in pinned for i in cols.ids), dtype=bool, count=cols.n) if pinned else None
    if is_pinned is not None:
        keep |= is_pinned
    first = _best_of_each_id(cols, keep)
    reason = np.full(cols.n, REASON_CODE[TraceReason.BELOW_RELEVANCE_FLOOR], dtype=np.uint8)
    if first is not None:
        keep &= first
        reason[~first] = REASON_CODE[TraceReason.DUPLICATE]
    out = np.flatnonzero(~keep)
    trace.add_rows(
        TraceRows(
            cols.ids,
            cols.origins,
            out,
            reason[out],
            cols.scores[out],
            cols.relevance[out],
            signal=[signals[i] for i in out.tolist()],
        )
    )
    cand = np.flatnonzero(keep)
    if max_memories is not None and cand.size > max_memories:
        ids, sc = cols.ids, cols.scores
        pin = is_pinned if is_pinned is not None else np.zeros(cols.n, dtype=bool)
        ranked = np.array(sorted(cand.tolist(), key=lambda i: (not pin[i], -sc[i], ids[i])), dtype=np.intp)
        counted = _counted(text_keys([cols.texts[i] for i in ranked.tolist()]), max_memories)
        over = ranked[~counted]
        trace.add_rows(
            TraceRows(
                cols.ids,
                cols.origins,
                over,
                np.full(over.size, REASON_CODE[TraceReason.OVER_MAX_MEMORIES], np.uint8),
                cols.scores[over],
                cols.relevance[over],
                signal=[signals[i] for i in over.tolist()],
            )
        )
        cand = ranked[counted]
    return cand, record, signals


def _counted(keys: Sequence[str], cap: int) -> npt.NDArray[np.bool_]:
    """Which of the ranked rows with these text keys go on under a cap of `cap` memories:
    the first `cap` distinct keys (an empty key is distinct from every other), and every
    later row with the key of one of them (a near-duplicate, of which the packer takes at
    most one per key)."""
    out = np.zeros(len(keys), dtype=bool)
    seen: set[str] = set()
    taken = 0
    for k, key in enumerate(keys):
        if key and key in seen:
            out[k] = True
        elif taken < cap:
            out[k] = True
            taken += 1
            if key:
                seen.add(key)
    return out
