"""Packing: choose which scored candidates go into the context, inside a hard token budget.

This is the pipeline stage between scoring and formatting. It is a 0/1 knapsack: maximize
the sum of scores subject to the sum of exact token costs <= budget, and, given groups of
near-duplicates (`ctxcore.near_duplicate_groups`), at most one member of each group in the
context (a multiple-choice knapsack, solved as exactly). The work is done by
the compiled core (``ctxcore._core``, GIL released); this module validates and converts
input, holds the policy defaults, and wraps the result in `PackResult`, which records what
was left out and why.
"""

from __future__ import annotations

import enum
import math
import numbers
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _core
from ._numbers import as_real
from .errors import InvalidCandidate, invalid

__all__ = [
    "DEFAULT_BUCKET_TOKENS",
    "DEFAULT_CELL_CEILING",
    "DEFAULT_SEARCH_NODE_LIMIT",
    "Candidate",
    "Decision",
    "PackPath",
    "PackResult",
    "Reason",
    "pack",
    "pack_arrays",
]

#: DP granularity. From the packer design: "Discretize the budget into 16-token buckets".
DEFAULT_BUCKET_TOKENS = 16
#: Largest DP table (candidates x buckets) before the fallback runs, counted on what the
#: dominance reduction leaves. The DP costs ~1 ns a cell here, so 2**20 cells (a 128 KiB
#: bit-packed choice table) keep it near a millisecond; larger problems go to the density
#: fallback, which the exact reductions, the exact core step and the search bring to the
#: same quality (bench/test_bench_pack.py and tools/pack_stress.py measure both).
DEFAULT_CELL_CEILING = 1 << 20
#: Node budget of the branch-and-bound improvement step. Enough to finish (and so prove
#: optimality) on every instance of up to ~14 candidates and on most realistic sets of a
#: few hundred; bounded so that adversarial sets cost at most a few hundred microseconds.
DEFAULT_SEARCH_NODE_LIMIT = 20_000
#: Cells of the exact (1-token) DP over the core of items around the density break item,
#: and of the exact DP over all the items the reductions leave free when that fits.
#: 2**17 cells cost ~0.1 ms and cover a window of dozens of memory-sized items.
CORE_CELL_LIMIT = 1 << 17


class PackPath(enum.StrEnum):
    """Which branch of the packer decided the selection."""

    TRIVIAL = "trivial"  #: no decision needed: no candidates, budget <= 0, or all fit
    DP = "dp"  #: dynamic program: the reduced set's table fits under the cell ceiling
    GREEDY = "greedy"  #: value-density fallback: the reduced set's table is above the ceiling


class Reason(enum.StrEnum):
    """Why a candidate was selected or left out."""

    SELECTED = "selected"
    PINNED = "pinned"
    BUDGET_EXHAUSTED = "budget_exhausted"
    PINNED_OVER_BUDGET = "pinned_over_budget"
    NON_POSITIVE_SCORE = "non_positive_score"
    REDUNDANT = "redundant"  #: left out: another member of its group is selected or pinned


# Mirrors ctxcore::Reason / ctxcore::PackPath (src_c/include/ctxcore/packer.hpp).
_REASONS = (
    Reason.SELECTED,
    Reason.PINNED,
    Reason.BUDGET_EXHAUSTED,
    Reason.PINNED_OVER_BUDGET,
    Reason.NON_POSITIVE_SCORE,
    Reason.REDUNDANT,
)
_PATHS = (PackPath.TRIVIAL, PackPath.DP, PackPath.GREEDY)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One item that may go into the context.

    Attributes:
        id: unique, non-empty identifier.
        tokens: exact token cost of the item as it will be serialized.
        score: value of including it; only positive scores can be selected unless pinned.
        pinned: taken before optimization, while it fits (guaranteed context).

    >>> Candidate("m1", 120, 0.8)
    Candidate(id='m1', tokens=120, score=0.8, pinned=False)
    """

    id: str
    tokens: int
    score: float
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """What happened to one input candidate.

    >>> d = Decision("m1", 0, Reason.SELECTED, 120, 0.8, False)
    >>> d.selected
    True
    """

    id: str
    index: int
    reason: Reason
    tokens: int
    score: float
    pinned: bool

    @property
    def selected(self) -> bool:
        """True when the candidate is in the packed context."""
        return self.reason in (Reason.SELECTED, Reason.PINNED)


def _frozen(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, slots=True, eq=False)
class PackResult:
    """The packer's selection and its record.

    Attributes:
        ids: selected ids in emit order: pinned first, then the rest; each block by
            descending score, then id.
        indices: input positions of `ids` (int64, read-only).
        tokens_used: exact sum of the selected candidates' tokens (<= budget).
        total_score: sum of the selected candidates' scores.
        upper_bound: LP-relaxation bound on the best achievable total (>= total_score).
        path: which branch decided (`PackPath`).
        evaluated: number of candidates considered (all input candidates).
        excluded_for_budget: candidates left out for lack of room (pinned ones included).
        truncated: False for an empty candidate set; True for a non-positive budget with
            candidates present; otherwise ``excluded_for_budget > 0``.
        proven_optimal: the selection is an exact optimum: the trivial case, or the exact
            reductions settled every candidate, or an exact DP (on exact token counts, as
            a table or over Pareto states) solved what they left free, or the bounded
            branch-and-bound finished. Up to float rounding of the score sums (relative
            1e-12).
        budget: the budget packed against.
        reasons: one `Reason` code per input candidate (uint8, input order, read-only);
            `decisions` gives the same as objects.
        dp_cells: size of the DP table used (0 when the DP did not run).
        search_nodes: branch-and-bound nodes explored.
        dominated: candidates the dominance reduction left out before optimizing (never
            needed: the lighter, better ones could not all fit beside them); their
            decision is `Reason.BUDGET_EXHAUSTED`.
        free_items: candidates still undecided after the exact reductions (dominance and
            LP-bound fixing): the size of the problem the DP, or the fallback, solved.
        rank_order: True when the rank-order packing was kept under ``rank_tolerance``
            (`pack`, `pack_arrays`); False when the optimized packing was.
        redundant: candidates left out because another member of their group is selected
            or pinned (`Reason.REDUNDANT`); 0 without groups. They do not count as excluded
            for budget.
    """

    ids: tuple[str, ...]
    indices: npt.NDArray[np.int64]
    tokens_used: int
    total_score: float
    upper_bound: float
    path: PackPath
    evaluated: int
    excluded_for_budget: int
    truncated: bool
    proven_optimal: bool
    budget: int
    reasons: npt.NDArray[np.uint8] = field(repr=False)
    dp_cells: int = field(repr=False, default=0)
    search_nodes: int = field(repr=False, default=0)
    dominated: int = field(repr=False, default=0)
    free_items: int = field(repr=False, default=0)
    rank_order: bool = field(repr=False, default=False)
    redundant: int = field(repr=False, default=0)
    _candidate_ids: tuple[str, ...] = field(repr=False, default=())
    _tokens: npt.NDArray[np.int64] = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))
    _scores: npt.NDArray[np.float64] = field(repr=False, default_factory=lambda: np.zeros(0))
    _pinned: npt.NDArray[np.bool_] = field(repr=False, default_factory=lambda: np.zeros(0, bool))

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """One `Decision` per input candidate, in input order."""
        return tuple(
            Decision(cid, i, _REASONS[r], int(t), float(s), bool(p))
            for i, (cid, r, t, s, p) in enumerate(
                zip(self._candidate_ids, self.reasons.tolist(), self._tokens, self._scores, self._pinned)
            )
        )

    def record(self) -> dict[str, Any]:
        """The pack record as plain JSON-ready values (no per-candidate detail).

        >>> pack([Candidate("a", 10, 1.0)], 5).record()["truncated"]
        True
        """
        return {
            "path": str(self.path),
            "budget": self.budget,
            "tokens_used": self.tokens_used,
            "total_score": self.total_score,
            "upper_bound": self.upper_bound,
            "evaluated": self.evaluated,
            "selected": len(self.ids),
            "excluded_for_budget": self.excluded_for_budget,
            "redundant": self.redundant,
            "truncated": self.truncated,
            "proven_optimal": self.proven_optimal,
            "dp_cells": self.dp_cells,
            "search_nodes": self.search_nodes,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackResult):
            return NotImplemented
        return (
            self.ids == other.ids
            and np.array_equal(self.indices, other.indices)
            and self.record() == other.record()
            and np.array_equal(self.reasons, other.reasons)
            and self._candidate_ids == other._candidate_ids
        )

    __hash__ = None  # type: ignore[assignment]


# ---- input conversion ---------------------------------------------------------------


def _name(index: int, cid: object) -> str:
    if isinstance(cid, str) and cid:
        shown = cid if len(cid) <= 80 else cid[:80] + "..."
        return f"candidate {shown!r} (index {index})"
    return f"candidate at index {index}"


def _as_int(value: object, what: str) -> int:
    """An integer from an int or an integral float; ValueError/TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got bool")
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f) and f.is_integer():
            return int(f)
        raise ValueError(f"{what} must be an integer, got {value!r}")
    raise TypeError(f"{what} must be an integer, got {type(value).__name__}")


def _as_budget(budget: object) -> int:
    try:
        return _as_int(budget, "budget")
    except (TypeError, ValueError) as exc:
        raise invalid(str(exc)) from None


def _to_int64(value: int) -> int:
    # Token sums never exceed 2**62 (see MAX_TOKENS), so clamping a budget into int64
    # changes no decision; the result still reports the budget as given.
    return min(max(value, -(2**63)), 2**63 - 1)


def _positive_option(value: object, name: str) -> int:
    n = _as_int(value, name)
    if n <= 0:
        raise ValueError(f"{name} must be > 0, got {n}")
    return n


def _tokens_array(tokens: object, ids: Sequence[object]) -> npt.NDArray[np.int64]:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise invalid(f"tokens must be a 1-D array, got {arr.ndim} dimensions")
    kind = arr.dtype.kind
    if kind == "i":
        return arr.astype(np.int64, copy=False)
    if kind == "u":
        too_big = np.flatnonzero(arr > _core.MAX_TOKENS)
        if too_big.size:
            i = int(too_big[0])
            raise invalid(f"{_name(i, ids[i])}: tokens must be <= 2**40, got {arr[i]}", i, _id_or_none(ids[i]))
        return arr.astype(np.int64)
    if kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < 0) | (arr > _core.MAX_TOKENS))
        if bad.size:
            i = int(bad[0])
            _token_error(float(arr[i]), i, ids[i])
        return arr.astype(np.int64)
    if kind == "O":
        out = np.empty(arr.shape[0], np.int64)
        for i, v in enumerate(arr.tolist()):
            try:
                t = _as_int(v, "tokens")
            except (TypeError, ValueError) as exc:
                raise invalid(f"{_name(i, ids[i])}: {exc}", i, _id_or_none(ids[i])) from None
            if not 0 <= t <= _core.MAX_TOKENS:
                _token_error(t, i, ids[i])
            out[i] = t
        return out
    raise invalid(f"tokens must be integers, got an array of dtype {arr.dtype}")


def _token_error(value: int | float, i: int, cid: object) -> None:
    # An int is shown as it is (as a float it would be rounded, or overflow past 1e308).
    if isinstance(value, int):
        sign = "a negative" if value < 0 else "an"
        shown = str(value) if value.bit_length() <= 128 else f"{sign} integer of {value.bit_length()} bits"
    elif not math.isfinite(value) or value != math.floor(value):
        raise invalid(f"{_name(i, cid)}: tokens must be an integer, got {value!r}", i, _id_or_none(cid))
    else:
        shown = f"{value:.0f}"
    what = f"tokens must be >= 0, got {shown}" if value < 0 else f"tokens must be <= 2**40, got {shown}"
    raise invalid(f"{_name(i, cid)}: {what}", i, _id_or_none(cid))


def _scores_array(scores: object) -> npt.NDArray[np.float64]:
    arr = np.asarray(scores)
    if arr.ndim != 1:
        raise invalid(f"scores must be a 1-D array, got {arr.ndim} dimensions")
    if arr.dtype.kind in "iuf":
        return arr.astype(np.float64, copy=False)
    if arr.dtype.kind == "O":
        try:
            return np.array([_as_score(v) for v in arr.tolist()], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise invalid(f"scores: {exc}") from None
    raise invalid(f"scores must be real numbers, got an array of dtype {arr.dtype}")


def _as_score(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"score must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int beyond any float
        raise ValueError("score must be a finite number, got an int too large for a float") from None


def _refuse_masked(arrays: Mapping[str, object]) -> None:
    """Raise for a masked array among `arrays` (name -> argument): numpy drops the mask
    on conversion, so its masked entries would be packed as if they were data."""
    for name, value in arrays.items():
        if isinstance(value, np.ma.MaskedArray):
            raise invalid(
                f"{name} must not be a masked array (np.ma.MaskedArray): its mask would be ignored; "
                "leave the masked candidates out, or pass .filled(value)"
            )


def _pinned_array(pinned: object) -> npt.NDArray[np.bool_]:
    arr = np.asarray(pinned)
    if arr.ndim != 1:
        raise invalid(f"pinned must be a 1-D array, got {arr.ndim} dimensions")
    if arr.size == 0:
        return np.zeros(0, bool)  # [] reads as float64: no flag to check
    if arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind in "iu" and bool(np.all((arr == 0) | (arr == 1))):
        return arr.astype(bool)
    raise invalid(f"pinned must be booleans, got an array of dtype {arr.dtype}")


def _groups_array(arr: npt.NDArray[Any], ids: Sequence[object]) -> npt.NDArray[np.int64]:
    """Group labels (1-D, one per id) as int64: integers >= 0 name a group, -1 is none."""

    def bad(i: int, what: str) -> InvalidCandidate:
        return invalid(f"{_name(i, ids[i])}: group {what}", i, _id_or_none(ids[i]))

    kind = arr.dtype.kind
    if arr.size == 0:
        return np.zeros(0, np.int64)  # [] reads as float64: no label to check
    if kind == "O":
        out = np.empty(arr.shape[0], np.int64)
        for i, v in enumerate(arr.tolist()):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise bad(i, f"must be an integer (-1 for none), got {type(v).__name__}")
            label = operator.index(v)
            if not -1 <= label < 2**63:
                raise bad(i, f"must be >= 0, or -1 for none, and < 2**63, got {label}")
            out[i] = label
        return out
    if kind == "u":
        too_big = np.flatnonzero(arr >= 2**63)
        if too_big.size:
            raise bad(int(too_big[0]), f"must be < 2**63, got {arr[int(too_big[0])]}")
        return arr.astype(np.int64)
    if kind != "i":
        raise invalid(f"groups must be integers (-1 for none), got an array of dtype {arr.dtype}")
    out = arr.astype(np.int64, copy=False)
    below = np.flatnonzero(out < -1)
    if below.size:
        raise bad(int(below[0]), f"must be >= 0, or -1 for none, got {out[int(below[0])]}")
    return out


def _id_or_none(cid: object) -> str | None:
    return cid if isinstance(cid, str) and cid else None


def _field(c: object, key: str, index: int) -> Any:
    if isinstance(c, Mapping):
        if key in c:
            return c[key]
    elif hasattr(c, key):
        return getattr(c, key)
    if key == "pinned":
        return False
    cid = c.get("id") if isinstance(c, Mapping) else getattr(c, "id", None)
    raise invalid(f"{_name(index, cid)}: missing {key!r}", index, _id_or_none(cid))


_Fields = tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]


def _extract_fast(cands: Sequence[Any]) -> _Fields | None:
    """Pull the fields out with comprehensions when every candidate is well-typed.

    Returns None (and the caller takes the checked path, which names the bad candidate)
    on anything unusual: a missing field, or a type other than str/int/float/bool. The
    core still validates the values (negative tokens, NaN, duplicates, ...).
    """
    try:
        if cands and isinstance(cands[0], Mapping):
            ids = [c["id"] for c in cands]
            tokens = [c["tokens"] for c in cands]
            scores = [c["score"] for c in cands]
            pinned = [c.get("pinned", False) for c in cands]
        else:
            ids = [c.id for c in cands]
            tokens = [c.tokens for c in cands]
            scores = [c.score for c in cands]
            pinned = [getattr(c, "pinned", False) for c in cands]
        if not (
            set(map(type, ids)) <= {str}
            and set(map(type, tokens)) <= {int}
            and set(map(type, scores)) <= {float, int}
            and set(map(type, pinned)) <= {bool}
        ):
            return None
        if any(t < 0 or t > _core.MAX_TOKENS for t in (min(tokens, default=0), max(tokens, default=0))):
            return None
        return ids, np.array(tokens, np.int64), np.array(scores, np.float64), np.array(pinned, bool)
    except (AttributeError, KeyError, TypeError, OverflowError):
        return None


def _extract_checked(cands: Sequence[Any]) -> _Fields:
    """Candidate by candidate, raising `InvalidCandidate` that names the first bad one."""
    ids: list[str] = []
    tokens: list[int] = []
    scores: list[float] = []
    pinned: list[bool] = []
    for i, c in enumerate(cands):
        cid = _field(c, "id", i)
        if not isinstance(cid, str):
            raise invalid(f"{_name(i, None)}: id must be str, got {type(cid).__name__}", i, None)
        # Fetched outside the try: a missing field is already a named InvalidCandidate.
        raw_tokens, raw_score = _field(c, "tokens", i), _field(c, "score", i)
        try:
            t = _as_int(raw_tokens, "tokens")
            s = _as_score(raw_score)
        except (TypeError, ValueError) as exc:
            raise invalid(f"{_name(i, cid)}: {exc}", i, _id_or_none(cid)) from None
        p = _field(c, "pinned", i)
        if not isinstance(p, (bool, np.bool_)):
            raise invalid(f"{_name(i, cid)}: pinned must be a bool, got {type(p).__name__}", i, _id_or_none(cid))
        if not 0 <= t <= _core.MAX_TOKENS:
            _token_error(t, i, cid)
        ids.append(cid)
        tokens.append(t)
        scores.append(s)
        pinned.append(bool(p))
    return ids, np.array(tokens, np.int64), np.array(scores, np.float64), np.array(pinned, bool)


# ---- the API ------------------------------------------------------------------------


def pack_arrays(
    ids: Sequence[str] | Iterable[str],
    tokens: npt.ArrayLike,
    scores: npt.ArrayLike,
    budget: int,
    *,
    pinned: npt.ArrayLike | None = None,
    bucket_tokens: int = DEFAULT_BUCKET_TOKENS,
    cell_ceiling: int = DEFAULT_CELL_CEILING,
    search_node_limit: int = DEFAULT_SEARCH_NODE_LIMIT,
    rank_tolerance: float = 0.0,
    groups: npt.ArrayLike | None = None,
) -> PackResult:
    """Pack candidates given as parallel arrays: the fast path.

    Args:
        ids: unique non-empty str ids (a list or tuple is used without copying).
        tokens: exact token costs, 1-D; int64 C-contiguous arrays are passed to the core
            without a copy. Integral floats are accepted; 3.5 is not.
        scores: finite scores, 1-D; float64 arrays are passed without a copy.
        budget: the hard token budget (an integer; <= 0 selects nothing).
        pinned: optional 1-D bools (or 0/1 integers): candidates taken first, in emit
            order, while they fit.
        bucket_tokens: DP granularity in tokens.
        cell_ceiling: largest DP table (items x buckets) before the fallback.
        search_node_limit: node budget of the branch-and-bound improvement (0 disables).
        rank_tolerance: in [0, 1). When > 0, the rank-order packing (by score, each
            candidate that still fits) is kept while its total score is at least
            ``1 - rank_tolerance`` of the optimized packing's, both counted over the
            candidates the packing decides (pinned and zero-token ones are in both);
            ``rank_order`` says which was kept. 0 keeps the optimized packing.
        groups: optional 1-D integers, one per candidate: candidates with the same value
            >= 0 are near-duplicates and at most one of them is selected (-1: in no
            group). Pinned members claim their group in emit order; the others left out
            of a group that has a member in get `Reason.REDUNDANT`. The packing stays
            exact and optimal or near-optimal under the constraint (a multiple-choice
            knapsack). `near_duplicate_groups` computes such labels from texts.

    Returns:
        The `PackResult`; ``tokens_used <= budget`` always.

    Raises:
        InvalidCandidate: a bad candidate (negative tokens, non-finite score, positive
            scores whose sum overflows a float, empty or duplicate id, a group below -1,
            ...), mismatched lengths, or arrays of the
            wrong shape or dtype, or masked (`numpy.ma.MaskedArray`, whose mask numpy
            drops), naming the candidate or the array.
        ValueError: an option out of range (``bucket_tokens``, ``cell_ceiling``,
            ``search_node_limit``, ``rank_tolerance``).

    >>> r = pack_arrays(["a", "b", "c"], [60, 50, 50], [6.0, 5.0, 5.0], 100)
    >>> r.ids, r.tokens_used, r.path.value
    (('b', 'c'), 100, 'dp')
    >>> r = pack_arrays(["a", "b", "c"], [60, 50, 50], [6.0, 5.0, 5.0], 110, groups=[-1, 0, 0])
    >>> r.ids, [d.reason.value for d in r.decisions]
    (('a', 'b'), ['selected', 'selected', 'redundant'])
    """
    if isinstance(ids, str):
        raise invalid("ids must be a sequence of str, not a single str")
    _refuse_masked({"ids": ids, "tokens": tokens, "scores": scores, "pinned": pinned, "groups": groups})
    id_list: list[str] | tuple[str, ...] = ids if isinstance(ids, (list, tuple)) else list(ids)
    budget_int = _as_budget(budget)
    bucket = _positive_option(bucket_tokens, "bucket_tokens")
    ceiling = _positive_option(cell_ceiling, "cell_ceiling")
    node_limit = _as_int(search_node_limit, "search_node_limit")
    if node_limit < 0:
        raise ValueError(f"search_node_limit must be >= 0, got {node_limit}")
    tolerance = as_real(rank_tolerance)  # any real number, numpy's too
    if tolerance is None or not 0.0 <= tolerance < 1.0:  # NaN fails the comparison too
        raise ValueError(f"rank_tolerance must be a number in [0, 1), got {rank_tolerance!r:.40}")

    score_arr = _scores_array(scores)
    n = len(id_list)
    tok_raw = np.asarray(tokens)
    if tok_raw.ndim != 1:
        raise invalid(f"tokens must be a 1-D array, got {tok_raw.ndim} dimensions")
    lengths = [n, tok_raw.shape[0], score_arr.shape[0]]
    pin_arr = None if pinned is None else _pinned_array(pinned)
    if pin_arr is not None:
        lengths.append(pin_arr.shape[0])
    grp_raw = None if groups is None else np.asarray(groups)
    if grp_raw is not None:
        if grp_raw.ndim != 1:
            raise invalid(f"groups must be a 1-D array, got {grp_raw.ndim} dimensions")
        lengths.append(grp_raw.shape[0])
    if len(set(lengths)) != 1:
        raise invalid(
            f"mismatched lengths: {n} ids, {lengths[1]} tokens, {lengths[2]} scores"
            + (f", {pin_arr.shape[0]} pinned flags" if pin_arr is not None else "")
            + (f", {lengths[-1]} groups" if grp_raw is not None else "")
        )
    tok_arr = _tokens_array(tok_raw, id_list)
    grp_arr = None if grp_raw is None else _groups_array(grp_raw, id_list)

    out = _core.pack_arrays(
        id_list,
        tok_arr,
        score_arr,
        pin_arr,
        _to_int64(budget_int),
        _to_int64(bucket),
        _to_int64(ceiling),
        _to_int64(node_limit),
        CORE_CELL_LIMIT,
        float(tolerance),
        grp_arr,
    )
    (
        tokens_used,
        total_score,
        upper_bound,
        path,
        evaluated,
        excluded,
        truncated,
        proven,
        dp_cells,
        nodes,
        dominated,
        free_items,
    ) = out.summary
    if pin_arr is None:
        pin_arr = np.zeros(n, dtype=bool)  # a fresh array: made read-only without a copy
        pin_arr.setflags(write=False)
    else:
        pin_arr = _frozen(pin_arr)
    return PackResult(
        ids=out.ids,
        indices=out.indices,
        tokens_used=tokens_used,
        total_score=total_score,
        upper_bound=upper_bound,
        path=_PATHS[path],
        evaluated=evaluated,
        excluded_for_budget=excluded,
        truncated=truncated,
        proven_optimal=proven,
        budget=budget_int,
        reasons=out.reasons,
        dp_cells=dp_cells,
        search_nodes=nodes,
        dominated=dominated,
        free_items=free_items,
        rank_order=out.rank_order,
        redundant=out.redundant,
        _candidate_ids=out.candidate_ids,
        _tokens=_frozen(tok_arr),
        _scores=_frozen(score_arr),
        _pinned=pin_arr,
    )


def pack(
    candidates: Iterable[Candidate | Mapping[str, Any] | Any],
    budget: int,
    *,
    bucket_tokens: int = DEFAULT_BUCKET_TOKENS,
    cell_ceiling: int = DEFAULT_CELL_CEILING,
    search_node_limit: int = DEFAULT_SEARCH_NODE_LIMIT,
    rank_tolerance: float = 0.0,
    groups: npt.ArrayLike | None = None,
) -> PackResult:
    """Pack candidate objects (or mappings) into ``budget`` tokens.

    Each candidate has ``id`` (str), ``tokens`` (int), ``score`` (float) and optionally
    ``pinned`` (bool), as attributes (e.g. `Candidate`) or mapping keys.

    Args:
        candidates: the candidates, in any order (the result does not depend on it).
        budget: the hard token budget.
        bucket_tokens: DP granularity in tokens.
        cell_ceiling: largest DP table (items x buckets) before the fallback.
        search_node_limit: node budget of the branch-and-bound improvement (0 disables).
        rank_tolerance: in [0, 1), as for `pack_arrays`: when > 0, the rank-order
            packing is kept while its total score is at least ``1 - rank_tolerance`` of
            the optimized packing's; 0 keeps the optimized packing.
        groups: optional group labels, one per candidate in the same order (see
            `pack_arrays`): at most one candidate of each group is selected.

    Returns:
        The `PackResult`.

    Raises:
        InvalidCandidate: naming the first bad candidate; or `candidates` is one mapping
            or str rather than an iterable of candidates.
        ValueError: an option out of range (``bucket_tokens``, ``cell_ceiling``,
            ``search_node_limit``, ``rank_tolerance``).

    >>> res = pack([Candidate("a", 300, 0.9), Candidate("b", 200, 0.5), {"id": "c", "tokens": 200, "score": 0.5}], 400)
    >>> res.ids, res.tokens_used, res.truncated
    (('b', 'c'), 400, True)
    >>> tied = [Candidate("a", 60, 1.0), Candidate("b", 50, 0.55), Candidate("c", 50, 0.55)]
    >>> pack(tied, 100).ids, pack(tied, 100, rank_tolerance=0.2).ids
    (('b', 'c'), ('a',))
    """
    if isinstance(candidates, (Mapping, str, bytes)):
        # Iterating one would read its keys (or characters) as candidates.
        raise invalid(
            f"candidates must be an iterable of candidates, not a single {type(candidates).__name__}: pass [candidate]"
        )
    cands = candidates if isinstance(candidates, (list, tuple)) else list(candidates)
    fields = _extract_fast(cands)
    if fields is None:
        fields = _extract_checked(cands)
    ids, tokens, scores, pinned = fields
    return pack_arrays(
        ids,
        tokens,
        scores,
        budget,
        pinned=pinned if pinned.any() else None,
        bucket_tokens=bucket_tokens,
        cell_ceiling=cell_ceiling,
        search_node_limit=search_node_limit,
        rank_tolerance=rank_tolerance,
        groups=groups,
    )
