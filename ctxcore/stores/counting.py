"""Exact token counts of memories as the formatter will emit them, for every store.

The stores' entry point to `ctxcore.counting` (the implementation lives there so that
assembling does not import the store clients): a store calls `count_memory_tokens` at
ingest, for every installed exact family, and returns the counts with each record as
``MemoryRecord.exact_tokens``. The SQLite store and the PostgreSQL store call the same
function.

>>> counts = count_memory_tokens(["m1"], ["Prefers email."])
>>> sorted(counts)
['cl100k_base', 'o200k_base']
"""

from __future__ import annotations

from ..counting import (
    BUILTIN_SPLIT_FAMILIES,
    boundary_allowance,
    count_exact_batch,
    count_memory_tokens,
    memory_units,
)

__all__ = [
    "BUILTIN_SPLIT_FAMILIES",
    "boundary_allowance",
    "count_exact_batch",
    "count_memory_tokens",
    "memory_units",
]
