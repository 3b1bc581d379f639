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
* `context` -- `AssembledContext`, the result;
* `pipeline` -- `assemble`, which calls the stages in order.

The stages are packages and modules of their own, and this package only calls them:
the budget (``ctxcore.budget``: what is settled before retrieval, history trimming),
retrieval (``ctxcore.retrieval``), scoring (``ctxcore.scoring``: the value model and the
gate), pricing (``ctxcore.pricing``: the ledger's prices and each candidate's cost),
packing (``ctxcore.packing``), formatting (``ctxcore.formatting``), degradation
(``ctxcore.degradation``: why a context is less than the one asked for), and the record
of every decision (``ctxcore.trace``).
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
from ..scoring import RECENCY_HALF_LIFE_DAYS
from ..trace import TraceTable
from .config import DEFAULT_PACKING_HEADROOM_MS, AssemblyConfig
from .context import AssembledContext
from .pipeline import assemble

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
