"""Pricing the candidates: each memory element's cost in the ledger's tokens, from the
store's stored exact count (no tokenizing), counted in one batch, or estimated.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .. import _core
from ..counting import boundary_allowance, count_exact_batch, memory_units
from ..formatting import _price_estimated, formatter_overhead
from ..memory import MemoryBatch, MemoryRecord, _Chain
from ..result import (
    Pricing,
)
from ..tokens import TokenKind, estimate_tokens_batch
from .gate import _Columns
from .ledger import (
    _PIECE_MEMORY,
    _PRICING_NONCE,
    COUNT_CACHE_ENTRIES,
    EXACT_COUNT_BYTES_PER_MS,
    _exact,
    _Ledger,
    _time_left_ms,
)
from .trace import _PRICING_CODE


class _ShapeCache:
    """Exact counts of the score/source unit ``M`` per family and source, by the score's
    four-decimal key ``k = rint(score * 1e4)``: a dense table over k in 0..10000 (the
    scores' range), looked up as arrays; other keys (a weighted score outside [0, 1]) in a
    bounded dict. Counted on first sight, in one batch per call. Thread-safe: a table
    entry is written once with the one value it can have."""

    SPAN = 10_001

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._tables: dict[tuple[str, str], npt.NDArray[np.int32]] = {}
        self._other: dict[tuple[str, float, str], int] = {}
        self._lock = threading.Lock()

    def _table(self, family: str, source: str) -> npt.NDArray[np.int32]:
        t = self._tables.get((family, source))
        if t is None:
            with self._lock:
                if len(self._tables) >= 256:  # sources are few; a flood of new ones resets
                    self._tables.clear()
                t = self._tables.setdefault((family, source), np.full(self.SPAN, -1, dtype=np.int32))
        return t

    def costs(self, family: str, keys: npt.NDArray[np.float64], sources: Sequence[str],
              source_code: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``M`` of each (key, ``sources[source_code]``) pair."""
        out = np.empty(keys.size, dtype=np.int64)
        if len(sources) == 1:
            groups = [(sources[0], np.arange(keys.size))]
        else:
            groups = [(src, np.flatnonzero(source_code == k)) for k, src in enumerate(sources)]
        for source, rows in groups:
            k = keys[rows]
            dense = (k >= 0) & (k < self.SPAN)
            if dense.all():
                out[rows] = self._dense(family, source, k.astype(np.intp))
                continue
            out[rows[dense]] = self._dense(family, source, k[dense].astype(np.intp))
            out[rows[~dense]] = self._sparse(family, source, k[~dense].tolist())
        return out

    def _dense(self, family: str, source: str, k: npt.NDArray[np.intp]) -> npt.NDArray[np.int32]:
        table = self._table(family, source)
        got = table[k]
        if (got < 0).any():
            new = np.unique(k[got < 0])
            counted = _exact(_shape_texts([(v / 1e4, source) for v in new.tolist()]), family)
            table[new] = counted
            got = table[k]
        return got

    def _sparse(self, family: str, source: str, keys: list[float]) -> list[int]:
        other = self._other
        new = [v for v in dict.fromkeys(keys) if (family, v, source) not in other]
        if new:
            counted = _exact(_shape_texts([(v / 1e4, source) for v in new]), family)
            with self._lock:
                if len(other) + len(new) > self._capacity:
                    other.clear()
                other.update({(family, v, source): c for v, c in zip(new, counted)})
            lookup = {**other, **{(family, v, source): c for v, c in zip(new, counted)}}
        else:
            lookup = other
        return [lookup[(family, v, source)] for v in keys]

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._other.clear()


_SHAPES = _ShapeCache(COUNT_CACHE_ENTRIES)


def _head_cost(family: str, nonce: str) -> int:
    """``P``: the element's head with this assembly's nonce. An element always follows a
    ``>`` (the element before it) or the ``.`` of the safety sentence, and for the built-in
    families that character and the head's newline are one chunk: the head's cost is what
    it adds behind either (the larger), as the whole text is counted."""
    allow = boundary_allowance(family)
    p_text = f'\n<memory nonce="{nonce}"'
    if allow == 0:
        a, b = _exact([">", "."], family)
        pa, pb = _exact([">" + p_text, "." + p_text], family, cache=False)
        return max(pa - a, pb - b)
    return _exact([p_text], family, cache=False)[0] + allow


def _memory_costs_exact(
    family: str,
    cols: _Columns,
    cand: npt.NDArray[np.intp],
    nonce: str,
    deadline: float | None,
    headroom_ms: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each candidate's exact cost ``P + (I + B) + M`` (see ``ctxcore.counting``), with
    how it was priced (`Pricing` codes) and whether it was recounted: ``I + B`` from the
    store's count, else counted in one batch when the time left allows, else estimated;
    ``P`` once per assembly, ``M`` from the score/source shape table."""
    allow = boundary_allowance(family)
    costs = cols.stored[cand]
    pricing = np.full(cand.size, _PRICING_CODE[Pricing.STORED.value], dtype=np.uint8)
    recounted = np.zeros(cand.size, dtype=bool)
    missing = np.flatnonzero(costs < 0)
    if missing.size:
        rows = cand[missing].tolist()
        units = memory_units([cols.ids[k] for k in rows], [cols.texts[k] for k in rows])
        nbytes = sum(len(u) for u in units)
        if nbytes <= (_time_left_ms(deadline) - headroom_ms) * EXACT_COUNT_BYTES_PER_MS:
            per_unit = count_exact_batch(units, family)
            how = Pricing.COUNTED.value
        else:
            per_unit = estimate_tokens_batch(units, family)
            how = Pricing.ESTIMATED.value
        costs[missing] = per_unit[0::2] + per_unit[1::2]
        pricing[missing] = _PRICING_CODE[how]
        recounted[missing] = True
    costs += _head_cost(family, nonce) + allow
    costs += _SHAPES.costs(family, np.rint(cols.scores[cand] * 1e4), cols.distinct_origins, cols.origin_code[cand])
    costs += allow
    return costs, pricing, recounted


def _store_counts(mems: Sequence[MemoryRecord]) -> list[tuple[int | None, str | None, str | None]]:
    """(token_count, token_family, token_kind) of each memory, read from a batch's columns
    or the records, part by part (no per-index lookups through a chained result)."""
    out: list[tuple[int | None, str | None, str | None]] = []
    for part in (mems.parts if isinstance(mems, _Chain) else (mems,)):
        if type(part) is MemoryBatch:
            out.extend(zip(part.token_count, part.token_family, part.token_kind))
        else:
            out.extend((m.token_count, m.token_family, m.token_kind) for m in part)
    return out


def _memory_costs_estimated(
    family: str, cols: _Columns, mems: Sequence[MemoryRecord], cand: npt.NDArray[np.intp], nonce: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each candidate's estimated cost: the estimator's price of its escaped, wrapped
    element; a store's matching estimate of the raw text plus the wrapper can only raise
    it (the larger is kept, never a mix of families or kinds)."""
    rows = cand.tolist()
    # The candidates formatted once, in the memories frame, each element a piece: the
    # estimator prices each behind what can precede it (ctxcore.formatting._price_estimated).
    text, _, _, pieces = _core.format_columns(
        None, (), cols.ids, cols.texts, cols.scores, cols.origins, cand.astype(np.int64), None, nonce, True, True
    )
    kinds = [kind for kind, _ in pieces]
    priced = _price_estimated(text, kinds, [end for _, end in pieces], family)
    costs = np.array([c for k, c in zip(kinds, priced) if k == _PIECE_MEMORY], dtype=np.int64)
    wrapper: int | None = None
    recounted = np.zeros(len(rows), dtype=bool)
    kind = TokenKind.ESTIMATE.value
    stored = _store_counts(mems)
    for k, i in enumerate(rows):
        n, fam, how = stored[i]
        if n is not None:
            if fam == family and how == kind:
                if wrapper is None:
                    wrapper = formatter_overhead((), family=family, nonce=nonce).wrapper_tokens
                costs[k] = max(int(costs[k]), n + wrapper)
            else:
                recounted[k] = True
    return costs, np.full(len(rows), _PRICING_CODE[Pricing.ESTIMATED.value], dtype=np.uint8), recounted


def _shape_texts(shapes: Sequence[tuple[float, str]]) -> list[str]:
    """The ``M`` unit of each (score, source) as the serializer writes it."""
    if not shapes:
        return []
    text, _, _, pieces = _core.format_context(
        None, (), [{"id": "m", "text": "", "score": s, "source": src} for s, src in shapes], None,
        _PRICING_NONCE, False, True,
    )
    head = len(f'\n<memory nonce="{_PRICING_NONCE}" id="m"')
    tail = len('"></memory>')
    out = []
    begin = 0
    for kind, end in pieces:
        if kind == _PIECE_MEMORY:
            out.append(text[begin + head : end - tail])
        begin = end
    return out




def price_candidates(
    cols: _Columns,
    mems: Sequence[MemoryRecord],
    cand: npt.NDArray[np.intp],
    ledger: _Ledger,
    nonce: str,
    deadline: float | None,
    headroom_ms: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each candidate's cost in the ledger's tokens, how it was priced (`Pricing` codes)
    and whether it was recounted: exact for an exact ledger, else the estimator's."""
    if ledger.exact:
        return _memory_costs_exact(ledger.family, cols, cand, nonce, deadline, headroom_ms)
    return _memory_costs_estimated(ledger.family, cols, mems, cand, nonce)
