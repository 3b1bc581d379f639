"""Assembly: the whole pipeline for one request, end to end.

request -> budget -> retrieval -> gate -> price -> pack -> format -> result. `assemble`
looks the model up in the capability catalog, prices messages and tools and settles what
history must go before any store is queried, runs the three retrieval branches under one
shared wall, gates and scores what came back, prices every candidate as the tokens of its
escaped, wrapped form, packs them into what the budget leaves, formats the context, and
returns it with the full record: the budget ledger, the pack record, one trace entry per
candidate, one record per branch, the wall, and whether and why it degraded. A failing
or slow source degrades the context (directive-only or history-only) and never widens
what the request may see.

Its modules:

* `config` -- `AssemblyConfig`, the service-wide settings;
* `gate` -- the retrieved memories as columns; scoring, the relevance gate,
  de-duplication, the per-request cap;
* `trace` -- the trace, as blocks of rows over the pipeline's columns;
* `context` -- `AssembledContext`, the result;
* `pipeline` -- `assemble`, which calls the stages in order.

The budget (``ctxcore.budget``: what is settled before retrieval, history trimming) and
pricing (``ctxcore.pricing``: the ledger's prices and each candidate's cost) are stages
of their own, beside retrieval, scoring, packing and formatting; this package calls them.
Pricing's cache settings and `memory_count_cache_stats` are also named here, where 0.2.0
published them.
"""

from ..pricing import (
    COUNT_CACHE_ENTRIES,
    DIRECTIVE_BOUNDARY_ALLOWANCE,
    EXACT_COUNT_BYTES_PER_MS,
    MEMORY_COUNT_CACHE_CHARS,
    MEMORY_COUNT_CACHE_ENTRIES,
    MemoryCountCacheStats,
    memory_count_cache_stats,
    warm_tokenizers,
)
from .config import DEFAULT_PACKING_HEADROOM_MS, RECENCY_HALF_LIFE_DAYS, AssemblyConfig
from .context import AssembledContext
from .pipeline import assemble
from .trace import TraceTable

__all__ = [
    "COUNT_CACHE_ENTRIES",
    "DEFAULT_PACKING_HEADROOM_MS",
    "DIRECTIVE_BOUNDARY_ALLOWANCE",
    "EXACT_COUNT_BYTES_PER_MS",
    "MEMORY_COUNT_CACHE_CHARS",
    "MEMORY_COUNT_CACHE_ENTRIES",
    "RECENCY_HALF_LIFE_DAYS",
    "AssembledContext",
    "AssemblyConfig",
    "MemoryCountCacheStats",
    "TraceTable",
    "assemble",
    "memory_count_cache_stats",
    "warm_tokenizers",
]
