"""What an assembly returns: the context, and the record of how it was made.

The last stage of the pipeline. Besides the text, an `AssembledContext` carries the budget
ledger, the pack record, one `TraceEntry` per memory candidate (why it is in or out), one
`BranchRecord` per retrieval branch (ok / timeout / error / skipped, with its latency), the
wall that bounded retrieval, whether and why the assembly degraded, and stage timings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

__all__ = [
    "STAGES",
    "Branch",
    "BranchRecord",
    "BranchStatus",
    "HistoryDrop",
    "Pricing",
    "StageTimings",
    "TraceEntry",
    "TraceReason",
    "Wall",
    "WallSource",
]


class Branch(enum.StrEnum):
    """The three retrieval branches."""

    DIRECTIVE = "directive"
    HOT = "hot"
    COLD = "cold"


class BranchStatus(enum.StrEnum):
    """How a retrieval branch ended."""

    OK = "ok"
    TIMEOUT = "timeout"  #: cancelled at its own timeout or at the wall
    ERROR = "error"  #: raised, or returned malformed data
    SKIPPED = "skipped"  #: not run (no source, context disabled, memory skipped)


@dataclass(frozen=True, slots=True)
class BranchRecord:
    """One retrieval branch's outcome.

    >>> BranchRecord(Branch.HOT, BranchStatus.OK, 3.2, items=12).status.value
    'ok'
    """

    branch: Branch
    status: BranchStatus
    latency_ms: float
    error: str | None = None
    items: int = 0
    dropped_out_of_scope: int = 0


class TraceReason(enum.StrEnum):
    """Why a memory candidate is in or out of the context (exactly one per candidate)."""

    SELECTED = "selected"
    PINNED = "pinned"
    BUDGET_EXHAUSTED = "budget_exhausted"
    BELOW_RELEVANCE_FLOOR = "below_relevance_floor"
    OUT_OF_SCOPE = "out_of_scope"
    DUPLICATE = "duplicate"
    OVER_MAX_MEMORIES = "over_max_memories"
    NON_POSITIVE_SCORE = "non_positive_score"  #: scored <= 0: it cannot raise the total
    REDUNDANT = "redundant"  #: a near-duplicate of a memory in the context (the packer's groups)


class Pricing(enum.StrEnum):
    """How a memory candidate's cost was obtained."""

    STORED = "stored"  #: the store's exact count (taken at ingest): no tokenizing
    COUNTED = "counted"  #: counted exactly on the request path (the memory came without a count)
    ESTIMATED = "estimated"  #: the estimator (no exact tokenizer, or no time left to count)
    CACHED = "cached"  #: an exact count made on an earlier request and kept: no tokenizing
    #: not counted: priced by its length (UTF-8 bytes), and the packer left it out on that
    #: price; a selected memory is never priced this way
    APPROXIMATE = "approximate"


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """The decision about one memory candidate.

    Attributes:
        memory_id: the memory's id.
        reason: why it is in or out.
        origin: which retrieval path returned it (``hot``, ``vector``, ``fulltext``, ...).
        tokens: its cost in the packer (tokens of its escaped, wrapped form); 0 when it
            never reached the packer.
        score: its score (0 when it never reached scoring).
        relevance: the relevance the gate saw.
        recounted: True when the store's token count was of another tokenizer family or
            kind (or missing) and was recomputed rather than mixed (False for a memory
            left out uncounted, `Pricing.APPROXIMATE`).
        pricing: how `tokens` was obtained (`Pricing`); empty when it never reached pricing.
        signal: under the fused value model, the signal that contributed most to its
            relevance (``fulltext``, ``vector``, ``recency``, or ``context`` when the
            memories created next to it matched more than it did), or ``pinned`` for a
            pinned memory;
            empty under the other formulas or when it never reached scoring.
    """

    memory_id: str
    reason: TraceReason
    origin: str
    tokens: int = 0
    score: float = 0.0
    relevance: float = 0.0
    recounted: bool = False
    pricing: str = ""
    signal: str = ""


class WallSource(enum.StrEnum):
    """Which limit set the retrieval wall."""

    CLIENT_TIMEOUT = "client_timeout"
    SERVER_DEADLINE = "server_deadline"
    CALLER_DEADLINE = "caller_deadline"


@dataclass(frozen=True, slots=True)
class Wall:
    """The retrieval wall that applied: its length and where it came from."""

    limit_ms: float
    source: WallSource


@dataclass(frozen=True, slots=True)
class HistoryDrop:
    """A group of turns dropped from the history, oldest first: to fit the window or the
    token budget (``reason="budget"``: ``history_policy="trim_oldest"``, or any policy
    under a ``token_budget``), or the request's history cap (``"history_budget"``)."""

    first_index: int
    count: int
    tokens: int
    roles: tuple[str, ...] = ()
    reason: str = "budget"


@dataclass(frozen=True, slots=True)
class StageTimings:
    """Milliseconds spent per pipeline stage."""

    budget_ms: float = 0.0
    retrieval_ms: float = 0.0
    scoring_ms: float = 0.0
    packing_ms: float = 0.0
    formatting_ms: float = 0.0
    total_ms: float = 0.0


#: The pipeline's stages in the order they run, as `StageTimings` names them
#: (``<stage>_ms``); traces and metrics label stages with these names.
STAGES: tuple[str, ...] = tuple(f.name[: -len("_ms")] for f in fields(StageTimings) if f.name != "total_ms")
