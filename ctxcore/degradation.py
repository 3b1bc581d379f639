"""Degradation: why an assembly's context is less than the full one it asked for.

A context degrades when the request turns context or memory off, when no memory source is
configured, when a retrieval branch fails or runs out of time, or when the rerank stage
does not reorder the pool. It never fails the assembly and never widens what the request
may see: the context is built from what did arrive, directive-only or history-only at
worst, and `AssembledContext.degraded` / `degradation_reasons` say why.

This module names every reason and decides which apply; the pipeline only asks it. The
reasons are `DegradationReason` members, which are strings (``"hot_timeout"``), so records,
logs and the wire carry them as text.

>>> from ctxcore.result import Branch, BranchStatus
>>> degradation = Degradation.of_request(context_enabled=True, skip_memory=False, has_memory_source=True)
>>> degradation.branch(Branch.COLD, BranchStatus.TIMEOUT)
>>> degradation.degraded, degradation.reasons
(True, ('cold_timeout',))
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from .rerank import RerankStatus
from .result import Branch, BranchStatus

__all__ = ["Degradation", "DegradationReason"]


class DegradationReason(enum.StrEnum):
    """Why a context degraded: one value of `AssembledContext.degradation_reasons`."""

    CONTEXT_DISABLED = "context_disabled"  #: the request turned context off (no directive, no memory)
    MEMORY_SKIPPED = "memory_skipped"  #: the request asked for the directive without memory
    NO_MEMORY_SOURCE = "no_memory_source"  #: neither a hot nor a cold source is configured
    DIRECTIVE_TIMEOUT = "directive_timeout"  #: the directive branch ran out of time
    DIRECTIVE_ERROR = "directive_error"  #: the directive branch raised or answered malformed data
    HOT_TIMEOUT = "hot_timeout"  #: the hot-memory branch ran out of time
    HOT_ERROR = "hot_error"  #: the hot-memory branch raised or answered malformed data
    COLD_TIMEOUT = "cold_timeout"  #: the cold-memory branch ran out of time
    COLD_ERROR = "cold_error"  #: the cold-memory branch raised or answered malformed data
    RERANK_TIMEOUT = "rerank_timeout"  #: the reranker did not answer in time: the fused order stands
    RERANK_ERROR = "rerank_error"  #: the reranker raised or answered malformed scores
    RERANK_SKIPPED = "rerank_skipped"  #: too little time was left to rerank

    @classmethod
    def of_branch(cls, branch: Branch, status: BranchStatus) -> DegradationReason | None:
        """The reason a branch that ended with `status` gives, or None when it does not
        degrade the context (it answered, or it was not run on purpose)."""
        if status not in _FAILED:
            return None
        return cls(f"{branch.value}_{status.value}")

    @classmethod
    def of_rerank(cls, status: RerankStatus) -> DegradationReason | None:
        """The reason a rerank stage that ended with `status` gives, or None when it
        reordered the pool."""
        if status is RerankStatus.OK:
            return None
        return cls(f"rerank_{status.value}")


_FAILED = frozenset((BranchStatus.TIMEOUT, BranchStatus.ERROR))


@dataclass(slots=True)
class Degradation:
    """The reasons one assembly degraded, in the order they arose (the request's first,
    then the branches', then the rerank's)."""

    _reasons: list[DegradationReason] = field(default_factory=list, init=False)

    @classmethod
    def of_request(cls, *, context_enabled: bool, skip_memory: bool, has_memory_source: bool) -> Degradation:
        """What the request itself leaves out: all context, memory, or the memory source."""
        d = cls()
        if not context_enabled:
            d._reasons.append(DegradationReason.CONTEXT_DISABLED)
        elif skip_memory:
            d._reasons.append(DegradationReason.MEMORY_SKIPPED)
        elif not has_memory_source:
            d._reasons.append(DegradationReason.NO_MEMORY_SOURCE)
        return d

    def branch(self, branch: Branch, status: BranchStatus) -> None:
        """Record how a retrieval branch ended (a failed or late one degrades)."""
        reason = DegradationReason.of_branch(branch, status)
        if reason is not None:
            self._reasons.append(reason)

    def branches(self, records: Iterable[tuple[Branch, BranchStatus]]) -> None:
        """Record how each retrieval branch ended."""
        for b, status in records:
            self.branch(b, status)

    def rerank(self, status: RerankStatus) -> None:
        """Record how the rerank stage ended (anything but a reordered pool degrades)."""
        reason = DegradationReason.of_rerank(status)
        if reason is not None:
            self._reasons.append(reason)

    @property
    def degraded(self) -> bool:
        """True when any reason applies."""
        return bool(self._reasons)

    @property
    def reasons(self) -> tuple[str, ...]:
        """The reasons as text, for `AssembledContext.degradation_reasons`."""
        return tuple(r.value for r in self._reasons)
