"""Pricing the candidates: each memory element's cost in the ledger's tokens, from the
store's stored exact count (no tokenizing), a count kept from an earlier request, a count
made now for the candidates the packing can select, or estimated. Pricing and packing
run together here: which memories are counted depends on what the packer selects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from .. import _core
from ..formatting import FORMAT_CODES, MEMORY_ATTRIBUTES, PIECE_MEMORY, created_at_text, price_estimated
from ..memory import Chain, MemoryBatch, MemoryRecord
from ..packing import PackResult
from ..result import (
    Pricing,
)
from ..tokens import TokenKind, estimate_tokens_batch
from .ledger import (
    COUNT_CACHE_ENTRIES,
    EXACT_COUNT_BYTES_PER_MS,
    PRICING_NONCE,
    Ledger,
    exact_counts,
    time_left_ms,
)
from .memcounts import MEMORY_COUNTS, TOKENS_PER_BYTE, rank_prices, utf8_lengths
from .units import boundary_allowance, compact_body_units, count_exact_batch, memory_units

#: How each candidate was priced, as a code per row (0: not priced): pricing writes the
#: codes, the trace (``ctxcore.trace``) reads them back as `Pricing` values.
PRICINGS: tuple[str, ...] = ("", *(p.value for p in Pricing))
PRICING_CODE = {p: np.uint8(k) for k, p in enumerate(PRICINGS)}


class Columns(Protocol):
    """What pricing reads of the retrieved memories' columns (the gate's columns): str
    fields as lists, numbers as arrays aligned with them (-1 in `stored` for no stored
    count of the ledger's family)."""

    @property
    def ids(self) -> list[str]: ...
    @property
    def texts(self) -> list[str]: ...
    @property
    def origins(self) -> list[str]: ...
    @property
    def scores(self) -> npt.NDArray[np.float64]: ...
    @property
    def created_at(self) -> npt.NDArray[np.float64]: ...
    @property
    def stored(self) -> npt.NDArray[np.int64]: ...
    @property
    def distinct_origins(self) -> list[str]: ...
    @property
    def origin_code(self) -> npt.NDArray[np.int64]: ...
    @property
    def n(self) -> int: ...


class _ShapeCache:
    """Exact counts of the attribute unit ``M`` per family, source and attribute mask
    (1 the score, 2 the source; the verbose rendering writes both), by the score's
    four-decimal key ``k = rint(score * 1e4)``: a dense table over k in 0..10000 (the
    scores' range), looked up as arrays; other keys (a weighted score outside [0, 1]) in a
    bounded dict. Counted on first sight, in one batch per call. Thread-safe: a table
    entry is written once with the one value it can have."""

    SPAN = 10_001

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._tables: dict[tuple[str, str, int], npt.NDArray[np.int32]] = {}
        self._other: dict[tuple[str, float, str, int], int] = {}
        self._lock = threading.Lock()

    def _table(self, family: str, source: str, mask: int) -> npt.NDArray[np.int32]:
        t = self._tables.get((family, source, mask))
        if t is None:
            with self._lock:
                if len(self._tables) >= 256:  # sources are few; a flood of new ones resets
                    self._tables.clear()
                t = self._tables.setdefault((family, source, mask), np.full(self.SPAN, -1, dtype=np.int32))
        return t

    def costs(
        self,
        family: str,
        keys: npt.NDArray[np.float64],
        sources: Sequence[str],
        source_code: npt.NDArray[np.int64],
        mask: int = 3,
    ) -> npt.NDArray[np.int64]:
        """``M`` of each (key, ``sources[source_code]``) pair, for the attributes in `mask`."""
        out = np.empty(keys.size, dtype=np.int64)
        if mask == 0:
            out.fill(0)
            return out
        if len(sources) == 1:
            groups = [(sources[0], np.arange(keys.size))]
        else:
            groups = [(src, np.flatnonzero(source_code == k)) for k, src in enumerate(sources)]
        for source, rows in groups:
            k = keys[rows]
            dense = (k >= 0) & (k < self.SPAN)
            if dense.all():
                out[rows] = self._dense(family, source, k.astype(np.intp), mask)
                continue
            out[rows[dense]] = self._dense(family, source, k[dense].astype(np.intp), mask)
            out[rows[~dense]] = self._sparse(family, source, k[~dense].tolist(), mask)
        return out

    def _dense(self, family: str, source: str, k: npt.NDArray[np.intp], mask: int) -> npt.NDArray[np.int32]:
        table = self._table(family, source, mask)
        got = table[k]
        if (got < 0).any():
            new = np.unique(k[got < 0])
            counted = exact_counts(_shape_texts([(v / 1e4, source) for v in new.tolist()], mask), family)
            table[new] = counted
            got = table[k]
        return got

    def _sparse(self, family: str, source: str, keys: list[float], mask: int) -> list[int]:
        other = self._other
        new = [v for v in dict.fromkeys(keys) if (family, v, source, mask) not in other]
        if new:
            counted = exact_counts(_shape_texts([(v / 1e4, source) for v in new], mask), family)
            with self._lock:
                if len(other) + len(new) > self._capacity:
                    other.clear()
                other.update({(family, v, source, mask): c for v, c in zip(new, counted)})
            lookup = {**other, **{(family, v, source, mask): c for v, c in zip(new, counted)}}
        else:
            lookup = other
        return [lookup[(family, v, source, mask)] for v in keys]

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._other.clear()


_SHAPES = _ShapeCache(COUNT_CACHE_ENTRIES)


def _head_cost(family: str, nonce: str, fmt: int = 0) -> int:
    """``P``: the element's head with this assembly's nonce. An element always follows a
    ``>`` (the element before it) or the ``.`` of the safety sentence, and for the built-in
    families that character and the head's newline are one chunk: the head's cost is what
    it adds behind either (the larger), as the whole text is counted. In the compact
    rendering the handle stands between the head's two parts, ``\\n<m`` and ``="NONCE``
    (cut where a letter meets a space and a digit meets ``=``); the handle is priced apart."""
    allow = boundary_allowance(family)
    compact = fmt == _COMPACT
    p_text = "\n<m" if compact else f'\n<memory nonce="{nonce}"'
    after = [f'="{nonce}'] if compact else []  # one tokenizer call for every part
    if allow == 0:
        a, b = exact_counts([">", "."], family)
        pa, pb, *rest = exact_counts([">" + p_text, "." + p_text, *after], family, cache=False)
        return max(pa - a, pb - b) + sum(rest)
    parts = exact_counts([p_text, *after], family, cache=False)
    return sum(parts) + allow * len(parts)


class _HandleCosts:
    """The compact rendering's handle unit ``I = ' mK'`` per family: the most any of
    the handles m1..mN costs (an element's handle is its place in the context, known only
    after packing), from a table of exact counts grown as needed. Thread-safe: a grown
    table replaces the old one whole."""

    def __init__(self) -> None:
        self._most: dict[str, npt.NDArray[np.int64]] = {}
        self._lock = threading.Lock()

    def most(self, family: str, n: int) -> int:
        """The largest cost of the handles m1..m`n` (n >= 1)."""
        table = self._most.get(family)
        if table is None or table.size < n:
            size = max(n, 1024, 0 if table is None else 2 * table.size)
            counted = np.asarray(
                exact_counts([f" m{k}" for k in range(1, size + 1)], family, cache=False), dtype=np.int64
            )
            table = np.maximum.accumulate(counted)
            with self._lock:
                self._most[family] = table
        return int(table[n - 1])

    def clear(self) -> None:
        with self._lock:
            self._most.clear()


_HANDLES = _HandleCosts()


class _IdCosts:
    """Exact counts of the verbose id unit ``I = ' id="ID"'`` by family and id: a store's
    count is ``I + B`` of the verbose rendering, so the compact rendering's body unit is
    that count less ``I``. Ids repeat across a scope's requests, so they are kept in two
    generations of at most `capacity` ids each (a full young generation becomes the old
    one, the previous old one is dropped; a hit in the old one moves back), never cleared
    all at once. Thread-safe: lookups read dicts; writes and rotations take the lock."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._young: dict[str, dict[str, int]] = {}
        self._old: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def costs(self, family: str, ids: Sequence[str]) -> npt.NDArray[np.int64]:
        young = self._young.get(family, {})
        old = self._old.get(family, {})
        got = [young.get(i, -1) for i in ids]
        missing = [k for k, v in enumerate(got) if v < 0]
        if not missing:
            return np.array(got, dtype=np.int64)
        promoted = {ids[k]: old[ids[k]] for k in missing if ids[k] in old}
        for k in missing:
            if ids[k] in promoted:
                got[k] = promoted[ids[k]]
        new_ids = list(dict.fromkeys(ids[k] for k in missing if got[k] < 0))
        counted: dict[str, int] = {}
        if new_ids:
            units = memory_units(new_ids, [""] * len(new_ids))[0::2]
            counted = dict(zip(new_ids, count_exact_batch(units, family).tolist()))
            for k in missing:
                if got[k] < 0:
                    got[k] = counted[ids[k]]
        with self._lock:
            table = self._young.setdefault(family, {})
            if len(table) + len(promoted) + len(counted) > self._capacity:
                self._old[family] = table
                table = self._young[family] = {}
            table.update(promoted)
            table.update(counted)
        return np.array(got, dtype=np.int64)

    def clear(self) -> None:
        with self._lock:
            self._young.clear()
            self._old.clear()


#: Store ids whose verbose id unit count is kept, per generation (two generations).
ID_COST_ENTRIES = 1 << 17
_IDS = _IdCosts(ID_COST_ENTRIES)
_COMPACT = FORMAT_CODES["compact"]
#: The count cache's family key suffix for compact body units.
_COMPACT_KEY = "\x00compact"
_FORMAT_NAMES = {code: name for name, code in FORMAT_CODES.items()}
#: The verbose closing tag and the compact one: the only difference between the two
#: renderings' body units (after a cut the built-in families always make, at ``</``).
_CLOSE_TAGS = ("</memory>", "</m>")


#: Rounds of pack-then-count before the last packing, over the counted candidates only (a
#: round is one packer call, ~0.1 ms at 1,000 candidates). Measured: 1 round when the
#: selection is cached, 2-3 when nothing is; more only where the packing keeps trying
#: uncounted fillers for the last few tokens of room.
COUNT_ROUNDS = 6
#: How far below its length-based price a memory's count may turn out (a share of that
#: price) for it still to be counted as a boundary candidate: one left out whose score
#: per token at this share of its price would beat the selection's break density
#: (`_break_density`) is counted before the packing is accepted.
BOUNDARY_SHARE = 0.6
#: Rounds that count the boundary as well as the selection; later ones count only what
#: the packing selects (measured: the selection matches full exact pricing's in every one
#: of 200 random candidate sets; tools/lazy_pricing.py --quality).
BOUNDARY_ROUNDS = 2
#: How far (a share) the tokens-per-byte ratio of what this request has counted may move
#: from the one its length-based prices use before they are re-priced.
RATIO_DRIFT = 0.05
#: The share of the selection's tokens, densest first, whose end sets the density a
#: boundary candidate is held to (`_break_density`).
BREAK_TOKEN_SHARE = 0.9


def _break_density(scores: npt.NDArray[np.float64], costs: npt.NDArray[np.int64]) -> float:
    """The score per token where the selection's densest 90% of tokens end: what a
    candidate must offer to displace one of the selection's marginal members (the last
    small ones, which fill what room is left whatever their density, do not set it)."""
    density = scores / np.maximum(costs, 1)
    order = np.argsort(-density)
    covered = np.cumsum(costs[order])
    k = int(np.searchsorted(covered, BREAK_TOKEN_SHARE * covered[-1]))
    return float(density[order[min(k, order.size - 1)]])


def _memory_costs_exact(
    family: str,
    cols: Columns,
    cand: npt.NDArray[np.intp],
    nonce: str,
    deadline: float | None,
    headroom_ms: float,
    pack: Callable[[npt.NDArray[np.int64]], PackResult],
    pinned: npt.NDArray[np.bool_] | None,
    fmt: int = 0,
    mask: int = 3,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_], PackResult]:
    """Each candidate's cost ``P + (I + B) + M`` (see ``ctxcore.pricing.units``), how it was
    priced (`Pricing` codes), whether it was recounted, and the packing. In the compact
    rendering (`fmt` 1) ``I`` is the dearest handle of the candidates' count, ``M`` has
    the attributes in `mask`, and a memory's own unit is its compact body: the store's
    ``I + B`` less the verbose id unit with the closing tag swapped, or counted as such.

    ``I + B`` comes from the store's count, else from the count cache (a count made on an
    earlier request), else it is counted on this one, but only where it can matter: the
    candidates are packed with the length-based price standing in for the counts not
    known, the selected ones without a count (and, in the first rounds, the boundary:
    those left out that could displace a selected one if their count came out well under
    their length price) are counted, and they are packed again, until every selected
    candidate is priced by a count. The final packing is over exact costs for everything
    it selects, so the context's exact count stays inside the budget; a candidate still
    priced by its length was left out on that price (`Pricing.APPROXIMATE`). A batch that would not finish before the
    deadline is estimated instead. ``P`` is counted once per assembly, ``M`` comes from
    the score/source shape table."""
    allow = boundary_allowance(family)
    compact = fmt == _COMPACT
    code = PRICING_CODE
    own = cols.stored[cand].astype(np.int64, copy=True)
    pricing = np.full(cand.size, code[Pricing.STORED.value], dtype=np.uint8)
    recounted = np.zeros(cand.size, dtype=bool)
    fixed = np.full(cand.size, _head_cost(family, nonce, fmt) + allow, dtype=np.int64)
    if compact:
        fixed += _HANDLES.most(family, max(int(cand.size), 1)) + allow
        have = np.flatnonzero(own >= 0)
        if have.size:
            # The store's ``I + B`` less the verbose ``I``, with the closing tag swapped (a
            # cut of its own on either side: an allowance each for a registered family).
            close_v, close_c = exact_counts(list(_CLOSE_TAGS), family)
            ids = [cols.ids[k] for k in cand[have].tolist()]
            own[have] += close_c - close_v + 2 * allow - _IDS.costs(family, ids)
    if mask & 3:
        fixed += (
            _SHAPES.costs(
                family, np.rint(cols.scores[cand] * 1e4), cols.distinct_origins, cols.origin_code[cand], mask & 3
            )
            + allow
        )
        if compact:
            # The shape unit starts at the space after the attribute before it; in the
            # compact rendering that attribute (the nonce) ends without its quote, a chunk
            # of its own between the nonce's last word or digit and the space.
            fixed += exact_counts(['"'], family)[0] + allow
    if mask & _CREATED:
        # ``C = '" created_at="TIME'`` for the memories with a time: a unit of its own, cut
        # after the attribute before it and before the body unit's quote. Times repeat
        # across requests, so their counts are kept.
        created = created_column(cols, cand)
        known = [k for k, i in enumerate(cand.tolist()) if created[i] is not None]
        if known:
            units = [f'" created_at="{created[i]}' for i in cand[known].tolist()]
            fixed[known] += np.asarray(exact_counts(units, family), dtype=np.int64) + allow
    # Counts kept across requests are of the rendering's own units: a compact body unit
    # under its own key.
    kept_as = family if not compact else family + _COMPACT_KEY
    missing = np.flatnonzero(own < 0)
    if not missing.size:
        costs = own + fixed
        return costs, pricing, recounted, pack(costs)

    rows = cand[missing].tolist()
    ids = list(map(cols.ids.__getitem__, rows))
    texts = list(map(cols.texts.__getitem__, rows))
    got = MEMORY_COUNTS.get_many(kept_as, ids, texts)
    pending = np.zeros(cand.size, dtype=bool)
    nbytes = np.zeros(cand.size, dtype=np.int64)
    hit = got >= 0
    if hit.any():
        at = missing[hit]
        own[at] = got[hit]
        pricing[at] = code[Pricing.CACHED.value]
        recounted[at] = True
    counted_tokens = counted_bytes = 0
    priced_at = [TOKENS_PER_BYTE.get(kept_as)]  # the ratio the length-based prices use
    if not hit.all():
        at = missing[~hit]
        pending[at] = True
        lengths = utf8_lengths([""] * len(ids) if compact else ids, texts)
        nbytes[at] = lengths[~hit]
        ratio = TOKENS_PER_BYTE.get(kept_as)
        if hit.any():
            # The kept counts of this request's own memories price the rest better than
            # the running ratio of other requests' (whose texts may be nothing alike).
            counted_tokens = int(got[hit].sum())
            counted_bytes = int(lengths[hit].sum())
            ratio = counted_tokens / max(counted_bytes, 1)
        own[at] = rank_prices(nbytes[at], ratio)
        pricing[at] = code[Pricing.APPROXIMATE.value]
        priced_at[0] = ratio
    # What this request counts is added to the cached counts above for the ratio; only
    # what it counts itself goes into the running ratio.
    base_tokens, base_bytes = counted_tokens, counted_bytes

    def count(at: npt.NDArray[np.intp]) -> None:
        nonlocal counted_tokens, counted_bytes
        at = at[pending[at]]
        if not at.size:
            return
        r = cand[at].tolist()
        r_ids = list(map(cols.ids.__getitem__, r))
        r_texts = list(map(cols.texts.__getitem__, r))
        units = compact_body_units(r_texts) if compact else memory_units(r_ids, r_texts)
        size = sum(map(len, units))
        if size <= (time_left_ms(deadline) - headroom_ms) * EXACT_COUNT_BYTES_PER_MS:
            per_unit = count_exact_batch(units, family)
            how = Pricing.COUNTED.value
        else:
            per_unit = estimate_tokens_batch(units, family)
            how = Pricing.ESTIMATED.value
        n = per_unit if compact else per_unit[0::2] + per_unit[1::2]
        own[at] = n
        pricing[at] = code[how]
        recounted[at] = True
        pending[at] = False
        if how == Pricing.COUNTED.value:
            MEMORY_COUNTS.put_many(kept_as, list(zip(zip(r_ids, r_texts), n.tolist())))
            counted_tokens += int(n.sum())
            counted_bytes += int(nbytes[at].sum())
            # What this request has counted prices the rest better than the running ratio;
            # re-priced only when the ratio has moved (every re-pricing moves the boundary).
            seen = counted_tokens / max(counted_bytes, 1)
            rest = np.flatnonzero(pending)
            if rest.size and abs(seen - priced_at[0]) > RATIO_DRIFT * priced_at[0]:
                own[rest] = rank_prices(nbytes[rest], seen)
                priced_at[0] = seen

    # A pinned candidate is taken while it fits, whatever its score: priced by a count
    # from the start, so that whether it fits is never decided on its length.
    if pinned is not None:
        count(np.flatnonzero(pinned))
    scores = cols.scores[cand]
    for round_ in range(COUNT_ROUNDS):
        costs = own + fixed
        result = pack(costs)
        sel = result.indices
        new = sel[pending[sel]]
        if sel.size and round_ < BOUNDARY_ROUNDS:
            # The boundary: uncounted candidates left out that would be worth their place
            # if their count came out at BOUNDARY_SHARE of their length-based price.
            taken = sel if pinned is None else sel[~pinned[sel]]
            if taken.size:
                edge = np.flatnonzero(
                    pending
                    & (scores > 0)
                    & (scores >= _break_density(scores[taken], costs[taken]) * BOUNDARY_SHARE * costs)
                )
                new = np.union1d(new, edge)
        if not new.size:
            break
        count(new.astype(np.intp))
    else:
        # Still selecting uncounted memories (each round a filler or two for the room the
        # counted ones leave, each costlier than its length said): the last packing is of
        # the counted ones only, and the rest stay out on their length-based price.
        # (Priced one token over the budget, so that none of them fits.)
        result = pack(np.where(pending, max(result.budget, 0) + 1, own + fixed))
        costs = own + fixed
    TOKENS_PER_BYTE.update(kept_as, counted_tokens - base_tokens, counted_bytes - base_bytes)
    return costs, pricing, recounted, result


def _store_counts(mems: Sequence[MemoryRecord]) -> list[tuple[int | None, str | None, str | None]]:
    """(token_count, token_family, token_kind) of each memory, read from a batch's columns
    or the records, part by part (no per-index lookups through a chained result)."""
    out: list[tuple[int | None, str | None, str | None]] = []
    for part in mems.parts if isinstance(mems, Chain) else (mems,):
        if type(part) is MemoryBatch:
            out.extend(zip(part.token_count, part.token_family, part.token_kind))
        else:
            out.extend((m.token_count, m.token_family, m.token_kind) for m in part)
    return out


def _memory_costs_estimated(
    family: str,
    cols: Columns,
    mems: Sequence[MemoryRecord],
    cand: npt.NDArray[np.intp],
    nonce: str,
    fmt: int = 0,
    mask: int = 3,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each candidate's estimated cost: the estimator's price of its escaped, wrapped
    element (in the compact rendering with the widest handle of the candidates' count);
    a store's matching estimate of the raw text plus the wrapper can only raise it (the
    larger is kept, never a mix of families or kinds)."""
    rows = cand.tolist()
    compact = fmt == _COMPACT
    ids = [f"m{'9' * len(str(max(len(rows), 1)))}"] * cols.n if compact else cols.ids
    # The candidates formatted once, in the memories frame, each element a piece: the
    # estimator prices each behind what can precede it (ctxcore.formatting.price_estimated).
    text, _, _, pieces = _core.format_columns(
        None,
        (),
        ids,
        cols.texts,
        cols.scores,
        cols.origins,
        cand.astype(np.int64),
        None,
        nonce,
        True,
        True,
        fmt,
        mask,
        False,
        created_column(cols, cand) if mask & _CREATED else None,
    )
    kinds = [kind for kind, _ in pieces]
    priced = price_estimated(text, kinds, [end for _, end in pieces], family)
    costs = np.array([c for k, c in zip(kinds, priced) if k == PIECE_MEMORY], dtype=np.int64)
    wrapper: int | None = None
    recounted = np.zeros(len(rows), dtype=bool)
    kind = TokenKind.ESTIMATE.value
    stored = _store_counts(mems)
    for k, i in enumerate(rows):
        n, fam, how = stored[i]
        if n is not None:
            if fam == family and how == kind:
                if wrapper is None:
                    wrapper = (
                        _estimated_wrapper(family, nonce, fmt, mask, ids[0])
                        if compact
                        else _estimated_wrapper(family, nonce, fmt, 0, "m")
                    )
                costs[k] = max(int(costs[k]), n + wrapper)
            else:
                recounted[k] = True
    return costs, np.full(len(rows), PRICING_CODE[Pricing.ESTIMATED.value], dtype=np.uint8), recounted


def _estimated_wrapper(family: str, nonce: str, fmt: int, mask: int, mid: str) -> int:
    """The estimator's price of an element with an empty body (id `mid`, the attributes
    in `mask`), behind what can precede it, as the candidates are priced."""
    item: dict[str, object] = {"id": mid, "text": "", "score": 1.0, "source": ""}
    if not mask & 1:
        del item["score"]
    if not mask & 2:
        del item["source"]
    text, _, _, pieces = _core.format_context(None, (), [item], None, nonce, True, True, fmt)
    kinds = [kind for kind, _ in pieces]
    priced = price_estimated(text, kinds, [end for _, end in pieces], family)
    return next(c for k, c in zip(kinds, priced) if k == PIECE_MEMORY)


def _shape_texts(shapes: Sequence[tuple[float, str]], mask: int = 3) -> list[str]:
    """The ``M`` unit of each (score, source) as the serializer writes it, with the
    attributes in `mask` (1 the score, 2 the source)."""
    if not shapes:
        return []
    items = []
    for score, src in shapes:
        item: dict[str, object] = {"id": "m", "text": ""}
        if mask & 1:
            item["score"] = score
        if mask & 2:
            item["source"] = src
        items.append(item)
    text, _, _, pieces = _core.format_context(None, (), items, None, PRICING_NONCE, False, True)
    head = len(f'\n<memory nonce="{PRICING_NONCE}" id="m"')
    tail = len('"></memory>')
    out = []
    begin = 0
    for kind, end in pieces:
        if kind == PIECE_MEMORY:
            out.append(text[begin + head : end - tail])
        begin = end
    return out


def price_candidates(
    cols: Columns,
    mems: Sequence[MemoryRecord],
    cand: npt.NDArray[np.intp],
    ledger: Ledger,
    nonce: str,
    deadline: float | None,
    headroom_ms: float,
    pack: Callable[[npt.NDArray[np.int64]], PackResult],
    pinned: npt.NDArray[np.bool_] | None = None,
    attributes: Sequence[str] = MEMORY_ATTRIBUTES,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_], PackResult]:
    """Each candidate's cost in the ledger's tokens, how it was priced (`Pricing` codes),
    whether it was recounted, and `pack` of the costs (the packing the context takes):
    exact for an exact ledger (counting only what the packing can select), else the
    estimator's; in the ledger's rendering of the memory elements, with `attributes`
    written (the compact rendering's opt-in ones; the verbose rendering writes them
    all). `pinned` marks the pinned candidates (aligned with `cand`)."""
    fmt = ledger.format_code
    mask = 3 if fmt != _COMPACT else attribute_mask(attributes)
    if ledger.exact:
        return _memory_costs_exact(ledger.family, cols, cand, nonce, deadline, headroom_ms, pack, pinned, fmt, mask)
    costs, pricing, recounted = _memory_costs_estimated(ledger.family, cols, mems, cand, nonce, fmt, mask)
    return costs, pricing, recounted, pack(costs)


#: The serializer's mask bit of the ``created_at`` attribute.
_CREATED = 4


def created_column(cols: Columns, rows: npt.NDArray[np.intp]) -> list[str | None]:
    """The ``created_at`` column the serializer takes: each of `rows` its creation time as
    the compact rendering writes it, every other row None. A record's time is a finite
    number of seconds (`MemoryRecord` checks it); one outside the years ISO 8601 writes in
    four digits (before 0001 or after 9999, `created_at_text`) is written as unknown, None,
    like a record without a time."""
    out: list[str | None] = [None] * cols.n
    for i, when in zip(rows.tolist(), cols.created_at[rows].tolist()):
        try:
            out[i] = created_at_text(when)
        except ValueError:
            out[i] = None
    return out


def attribute_mask(attributes: Sequence[str]) -> int:
    """The serializer's mask of the optional attributes named (1 the score, 2 the source,
    4 the creation time)."""
    return sum(1 << b for b, name in enumerate(MEMORY_ATTRIBUTES) if name in attributes)
