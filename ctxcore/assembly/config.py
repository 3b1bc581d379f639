"""Service-wide assembly settings: `AssemblyConfig`, from keyword arguments or ``CTXCORE_*``
environment variables, checked when built (i.e. at start-up).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..budget import BudgetPolicy
from ..errors import ConfigError
from ..rerank import DEFAULT_RERANK_POOL, DEFAULT_RERANK_TIMEOUT_MS, check_rerank_settings
from ..retrieval import (
    DEFAULT_CLIENT_TIMEOUT_MS,
    DEFAULT_COLD_TIMEOUT_MS,
    DEFAULT_DIRECTIVE_TIMEOUT_MS,
    DEFAULT_HOT_TIMEOUT_MS,
    DEFAULT_SERVER_DEADLINE_MS,
    BranchTimeouts,
    as_milliseconds,
)
from ..scoring import DEFAULT_MIN_SIMILARITY, DEFAULT_RELEVANCE_FLOOR, ScoringConfig

#: Time kept after retrieval, under a caller deadline, for scoring, packing and formatting
#: (p99 ~2 ms for 1,000 candidates on a 2-core machine; bench/test_bench_assembly.py).
DEFAULT_PACKING_HEADROOM_MS = 5.0

_ENV = {
    "client_timeout_ms": "CTXCORE_CONTEXT_TIMEOUT_MS",
    "server_deadline_ms": "CTXCORE_CONTEXT_DEADLINE_MS",
    "directive_timeout_ms": "CTXCORE_DIRECTIVE_TIMEOUT_MS",
    "hot_timeout_ms": "CTXCORE_HOT_TIMEOUT_MS",
    "cold_timeout_ms": "CTXCORE_COLD_TIMEOUT_MS",
    "packing_headroom_ms": "CTXCORE_PACKING_HEADROOM_MS",
    "relevance_floor": "CTXCORE_RELEVANCE_FLOOR",
    "min_similarity": "CTXCORE_MIN_SIMILARITY",
    "rerank_timeout_ms": "CTXCORE_RERANK_TIMEOUT_MS",
}


@dataclass(frozen=True, slots=True)
class AssemblyConfig:
    """Service-wide assembly settings (per-request knobs live in `AssemblyOptions`).

    Every field can come from the environment (`from_env`); a setting that makes no sense
    (a negative timeout, a relevance floor at or above the full-text sentinel 0.5) is
    rejected when the config is built, i.e. at start-up.

    >>> AssemblyConfig().wall_ms
    40.0
    >>> AssemblyConfig(relevance_floor=0.6)
    Traceback (most recent call last):
    ...
    ctxcore.ConfigError: relevance_floor must be in [0, 0.5): full-text hits carry the fixed relevance 0.5 and a floor at or above it drops every one of them (got 0.6)
    """

    client_timeout_ms: float = DEFAULT_CLIENT_TIMEOUT_MS
    server_deadline_ms: float = DEFAULT_SERVER_DEADLINE_MS
    directive_timeout_ms: float = DEFAULT_DIRECTIVE_TIMEOUT_MS
    hot_timeout_ms: float = DEFAULT_HOT_TIMEOUT_MS
    cold_timeout_ms: float = DEFAULT_COLD_TIMEOUT_MS
    packing_headroom_ms: float = DEFAULT_PACKING_HEADROOM_MS
    relevance_floor: float = DEFAULT_RELEVANCE_FLOOR
    min_similarity: float = DEFAULT_MIN_SIMILARITY
    budget_policy: BudgetPolicy = field(default_factory=BudgetPolicy)
    #: The rerank stage (when `assemble` is given a reranker): how many of the best
    #: candidates it reads, and the longest it may take (``ctxcore.rerank``).
    rerank_pool: int = DEFAULT_RERANK_POOL
    rerank_timeout_ms: float = DEFAULT_RERANK_TIMEOUT_MS

    def __post_init__(self) -> None:
        pool, timeout_ms = check_rerank_settings(self.rerank_pool, self.rerank_timeout_ms)
        object.__setattr__(self, "rerank_pool", pool)
        object.__setattr__(self, "rerank_timeout_ms", timeout_ms)
        for name in _ENV:
            if name in ("relevance_floor", "min_similarity", "rerank_timeout_ms"):
                continue
            v = getattr(self, name)
            ms = as_milliseconds(v)  # any real type, numpy's too, kept as a plain float
            if ms is None:
                raise ConfigError(f"{name} must be a finite number of milliseconds >= 0, got {v!r:.40}")
            object.__setattr__(self, name, ms)
        ScoringConfig(relevance_floor=self.relevance_floor, min_similarity=self.min_similarity)

    @property
    def wall_ms(self) -> float:
        """The retrieval wall without a caller deadline: min(client timeout, server deadline)."""
        return min(self.client_timeout_ms, self.server_deadline_ms)

    @property
    def branch_timeouts(self) -> BranchTimeouts:
        """The per-branch timeouts."""
        return BranchTimeouts(self.directive_timeout_ms, self.hot_timeout_ms, self.cold_timeout_ms)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AssemblyConfig:
        """Settings from ``CTXCORE_*`` environment variables, then `overrides`, then defaults.

        >>> AssemblyConfig.from_env({"CTXCORE_CONTEXT_DEADLINE_MS": "30"}).wall_ms
        30.0
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, var in _ENV.items():
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[name] = float(raw)
            except ValueError:
                raise ConfigError(f"{var} must be a number, got {raw!r}") from None
        values.update(overrides)
        return cls(**values)
