"""The trace: one row per memory candidate, saying why it is in or out of the context.

Rows are added in blocks that share the pipeline's column arrays, so building the trace
costs no per-row work; `TraceTable` joins the columns when someone reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .pricing.candidates import PRICINGS
from .result import (
    TraceEntry,
    TraceReason,
)

TRACE_REASONS: tuple[TraceReason, ...] = tuple(TraceReason)
REASON_CODE = {r: np.uint8(k) for k, r in enumerate(TRACE_REASONS)}


@dataclass(frozen=True, slots=True)
class TraceRows:
    """Rows of the trace that share their columns with the assembly's arrays: row k is
    candidate ``at[k]`` of the ``ids``/``origins`` columns; numbers are arrays aligned with
    ``at`` (None: zeros / not priced)."""

    ids: Sequence[str]
    origins: Sequence[str]
    at: npt.NDArray[np.intp]
    reason: npt.NDArray[np.uint8]
    score: npt.NDArray[np.float64] | None = None
    relevance: npt.NDArray[np.float64] | None = None
    tokens: npt.NDArray[np.int64] | None = None
    recounted: npt.NDArray[np.bool_] | None = None
    pricing: npt.NDArray[np.uint8] | None = None
    signal: Sequence[str] | None = None


class TraceTable:
    """The trace as parallel columns, one row per memory candidate.

    Assembling adds rows in blocks that share the pipeline's arrays (no per-row work);
    the columns (`memory_id`, `reason`, `origin`, `tokens`, `score`, `relevance`,
    `recounted`, `pricing`, each a list) are joined on first read, and `entries` turns
    them into `TraceEntry` objects.

    >>> t = TraceTable()
    >>> t.add("m1", TraceReason.OUT_OF_SCOPE, "hot")
    >>> (len(t), t.reason, t.entries()[0].memory_id)
    (1, [<TraceReason.OUT_OF_SCOPE: 'out_of_scope'>], 'm1')
    """

    __slots__ = ("_blocks", "_columns")

    _FIELDS = ("memory_id", "reason", "origin", "tokens", "score", "relevance", "recounted", "pricing", "signal")

    def __init__(self) -> None:
        self._blocks: list[TraceRows | tuple[Any, ...]] = []
        self._columns: dict[str, list[Any]] | None = None

    def add(
        self,
        memory_id: str,
        reason: TraceReason,
        origin: str,
        tokens: int = 0,
        score: float = 0.0,
        relevance: float = 0.0,
        recounted: bool = False,
        pricing: str = "",
    ) -> None:
        """Append one row."""
        self._blocks.append((memory_id, reason, origin, tokens, score, relevance, recounted, pricing))
        self._columns = None

    def add_rows(self, rows: TraceRows) -> None:
        """Append a block of rows (the assembly's columnar path)."""
        if rows.at.size:
            self._blocks.append(rows)
            self._columns = None

    def blocks(self) -> list[TraceRows | tuple[Any, ...]]:
        """The rows as added, in order: blocks sharing the pipeline's columns, and single
        rows as tuples of (memory_id, reason, origin, tokens, score, relevance, recounted,
        pricing). For encoders that read the columns without joining them."""
        return list(self._blocks)

    def __len__(self) -> int:
        return sum(b.at.size if isinstance(b, TraceRows) else 1 for b in self._blocks)

    def _joined(self) -> dict[str, list[Any]]:
        if self._columns is not None:
            return self._columns
        cols: dict[str, list[Any]] = {f: [] for f in self._FIELDS}
        for b in self._blocks:
            if not isinstance(b, TraceRows):
                for f, v in zip(self._FIELDS, b):
                    cols[f].append(v)
                if len(b) < len(self._FIELDS):
                    cols["signal"].append("")
                continue
            at = b.at.tolist()
            n = len(at)
            cols["memory_id"].extend(map(b.ids.__getitem__, at))
            cols["origin"].extend(map(b.origins.__getitem__, at))
            cols["reason"].extend(map(TRACE_REASONS.__getitem__, b.reason.tolist()))
            for name, arr, zero in (
                ("tokens", b.tokens, 0),
                ("score", b.score, 0.0),
                ("relevance", b.relevance, 0.0),
                ("recounted", b.recounted, False),
            ):
                cols[name].extend(arr.tolist() if arr is not None else [zero] * n)
            cols["pricing"].extend(map(PRICINGS.__getitem__, b.pricing.tolist()) if b.pricing is not None else [""] * n)
            cols["signal"].extend(b.signal if b.signal is not None else [""] * n)
        self._columns = cols
        return cols

    @property
    def memory_id(self) -> list[str]:
        """Each row's memory id."""
        return self._joined()["memory_id"]

    @property
    def reason(self) -> list[TraceReason]:
        """Each row's `TraceReason`."""
        return self._joined()["reason"]

    @property
    def origin(self) -> list[str]:
        """Each row's origin (the retrieval path)."""
        return self._joined()["origin"]

    @property
    def tokens(self) -> list[int]:
        """Each row's priced cost (0 when it never reached pricing)."""
        return self._joined()["tokens"]

    @property
    def score(self) -> list[float]:
        """Each row's score."""
        return self._joined()["score"]

    @property
    def relevance(self) -> list[float]:
        """Each row's relevance, as the gate saw it."""
        return self._joined()["relevance"]

    @property
    def recounted(self) -> list[bool]:
        """Each row's recount flag."""
        return self._joined()["recounted"]

    @property
    def pricing(self) -> list[str]:
        """How each row's cost was obtained (a `Pricing` value, or empty)."""
        return self._joined()["pricing"]

    @property
    def signal(self) -> list[str]:
        """Each row's dominant signal under the fused value model (``fulltext``,
        ``vector``, ``pinned``), or empty."""
        return self._joined()["signal"]

    def entries(self) -> tuple[TraceEntry, ...]:
        """The rows as `TraceEntry` objects, in order."""
        c = self._joined()
        return tuple(map(TraceEntry, *(c[f] for f in self._FIELDS)))


# The packer's reasons (ctxcore.Reason, by its uint8 code) as trace reason codes.
PACK_REASON_CODES = np.array(
    [
        REASON_CODE[r]
        for r in (
            TraceReason.SELECTED,
            TraceReason.PINNED,
            TraceReason.BUDGET_EXHAUSTED,
            TraceReason.BUDGET_EXHAUSTED,  # pinned, but no room left after the earlier pinned
            TraceReason.NON_POSITIVE_SCORE,
            TraceReason.REDUNDANT,  # another member of its near-duplicate group is in
        )
    ],
    dtype=np.uint8,
)
