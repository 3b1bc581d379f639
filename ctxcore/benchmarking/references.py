"""References a gate's ratio bound is measured against, in the same process.

Each is the usual way to do the job without ctxcore, so the ratio says what ctxcore buys
on this machine today: an exact 0/1 knapsack DP in numpy (row-vectorized, the usual
pure-Python answer) for packing, and its multiple-choice form (at most one member of each
group) for packing with near-duplicate groups; markupsafe's ``escape`` (C speedups) over the memory
bodies alone for formatting (escaping is most of what a formatter does); the packer alone
on the same candidate costs for assembly (what the rest of the pipeline costs on top).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .gates import GateUsageError

__all__ = [
    "NUMPY_DP",
    "MARKUPSAFE",
    "PACK_ONLY",
    "numpy_bucket_dp",
    "numpy_dp",
    "numpy_mckp",
    "markupsafe_escape",
    "texts_of",
]

#: Reference names, as reports and extra_info give them.
NUMPY_DP = "numpy DP"
MARKUPSAFE = "markupsafe.escape"
PACK_ONLY = "pack_arrays alone"
#: The largest row a DP reference allocates (float64 cells: 256 MiB). Its budget is first
#: cut to what the positively scored candidates weigh together (beyond it everything
#: fits, so the optimum is the same); a row still larger is refused by name.
MAX_DP_CELLS = 1 << 25


def _dp_capacity(weights: npt.NDArray[np.int64], scores: npt.NDArray[np.float64], budget: int) -> int:
    """`budget` cut to the total weight of the positively scored candidates (exact: a
    larger budget holds all of them), or a `GateUsageError` when the DP row would still
    exceed `MAX_DP_CELLS`."""
    total = int(sum(weights[scores > 0].tolist()))
    cap = min(int(budget), total)
    if cap + 1 > MAX_DP_CELLS:
        raise GateUsageError(
            f"the numpy DP reference needs a row of {cap + 1:,} cells for a budget of {budget:,} "
            f"(at most {MAX_DP_CELLS:,}): gate a smaller budget, or without the reference "
            "(reference=None, or ctxcore bench --no-reference)"
        )
    return cap


def numpy_dp(tokens: npt.ArrayLike, scores: npt.ArrayLike, budget: int) -> float:
    """The exact optimum of the 0/1 knapsack, by a row-vectorized DP over the budget.

    >>> numpy_dp([120, 90, 60], [0.9, 0.4, 0.45], 180)
    1.35
    """
    t = np.asarray(tokens, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    if budget < 0:
        return 0.0
    cap = _dp_capacity(t, s, budget)
    dp = np.zeros(cap + 1)
    for ti, si in zip(t.tolist(), s.tolist()):
        if ti == 0:
            dp += max(si, 0.0)
        elif ti <= cap:
            np.maximum(dp[ti:], dp[:-ti] + si, out=dp[ti:])
    return float(dp[cap])


def numpy_mckp(tokens: npt.ArrayLike, scores: npt.ArrayLike, groups: npt.ArrayLike, budget: int) -> float:
    """The exact optimum with at most one member of each group (label -1: a group of its
    own), by a row-vectorized DP over the budget: one row per group, each member read off
    the row before the group.

    >>> numpy_mckp([120, 90, 60], [0.9, 0.4, 0.45], [0, -1, 0], 210)  # 120 + 90: 120 and 60 share a group
    1.3
    """
    t = np.asarray(tokens, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    g = np.asarray(groups, dtype=np.int64)
    if budget < 0:
        return 0.0
    rows: dict[int, list[int]] = {}
    for i, label in enumerate(g.tolist()):
        rows.setdefault(label if label >= 0 else -1 - i, []).append(i)
    cap = _dp_capacity(t, s, budget)
    dp = np.zeros(cap + 1)
    for members in rows.values():
        row = dp.copy()
        for i in members:
            ti, si = int(t[i]), float(s[i])
            if si <= 0 or ti > cap:
                continue
            if ti == 0:
                np.maximum(row, dp + si, out=row)
            else:
                np.maximum(row[ti:], dp[:-ti] + si, out=row[ti:])
        dp = row
    return float(dp[cap])


def numpy_bucket_dp(tokens: npt.ArrayLike, scores: npt.ArrayLike, budget: int, bucket: int = 16) -> float:
    """The packer's DP done in numpy: weights and budget rounded to the nearest `bucket`
    tokens (each weight at least one bucket), one row-vectorized pass per candidate.

    >>> numpy_bucket_dp([120, 90, 60], [0.9, 0.4, 0.45], 180)  # 8 + 6 + 4 buckets against 11
    0.9
    """
    t = np.asarray(tokens, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    weights = np.maximum(1, (t + bucket // 2) // bucket)
    if budget < 0:
        return 0.0
    cap = _dp_capacity(weights, s, (budget + bucket // 2) // bucket)
    dp = np.zeros(cap + 1)
    for w, si in zip(weights.tolist(), s.tolist()):
        if w <= cap:
            np.maximum(dp[w:], dp[:-w] + si, out=dp[w:])
    return float(dp[cap])


def markupsafe_escape(texts: Sequence[str]) -> Callable[[], object]:
    """A call that escapes every text with markupsafe (needs ``ctxcore-llm[bench]``).

    >>> markupsafe_escape(["a < b"])()
    [Markup('a &lt; b')]
    """
    try:
        import markupsafe
    except ImportError:
        raise GateUsageError(
            "the formatter's reference is markupsafe.escape, and markupsafe is not installed "
            "(pip install 'ctxcore-llm[bench]', or pass reference=None)"
        ) from None
    escape = markupsafe.escape
    bodies = list(texts)
    return lambda: [escape(b) for b in bodies]


def texts_of(memories: Iterable[Mapping[str, Any] | Any]) -> list[str]:
    """The ``text`` of each memory (mappings or objects), as `format_context` reads them."""
    out = []
    for m in memories:
        t = m.get("text") if isinstance(m, Mapping) else getattr(m, "text", None)
        out.append(t if isinstance(t, str) else "")
    return out


def columns_of(candidates: Iterable[Mapping[str, Any] | Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Token costs and scores of `ctxcore.pack`'s candidates (mappings or objects)."""
    toks, scores = [], []
    for c in candidates:
        if isinstance(c, Mapping):
            toks.append(int(c["tokens"]))
            scores.append(float(c["score"]))
        else:
            toks.append(int(c.tokens))
            scores.append(float(c.score))
    return np.array(toks, dtype=np.int64), np.array(scores, dtype=np.float64)
