"""Pricing: what each part of the context costs, in the tokens of the model's family.

The stage that decides every price the budget and the packer work with: exact where the
family's tokenizer is installed and the count can be had before the deadline, else the
estimator's (never a mix within one ledger). One home for it, in four modules:

* `units` -- a memory element's units (``P + I + M + B``), cut where the built-in
  families' pre-tokenizers always end a chunk, and the exact counts of a memory's own
  units that a store keeps at ingest (`count_memory_tokens`);
* `ledger` -- the prices of the formatter's fixed text, the directive, the messages and
  the tools (cached by content), and whether a request can be priced exactly in time;
* `memcounts` -- the exact counts of memories that came without a stored count, kept
  across requests, and the length-based price that ranks a memory before it is counted;
* `candidates` -- each memory candidate's cost, from the store's count, a kept count, a
  count made now for what the packing can select, or the estimator; pricing and packing
  run together there, since which memories are counted depends on what is selected.

Pricing sits among the stages: it imports the formatter (whose pieces it prices), the
packer (which it runs between counting rounds) and the core below them, and nothing of
the pipeline (``ctxcore.assembly``), which calls it.
"""

from .ledger import COUNT_CACHE_ENTRIES, DIRECTIVE_BOUNDARY_ALLOWANCE, EXACT_COUNT_BYTES_PER_MS, warm_tokenizers
from .memcounts import (
    MEMORY_COUNT_CACHE_CHARS,
    MEMORY_COUNT_CACHE_ENTRIES,
    MemoryCountCacheStats,
    memory_count_cache_stats,
)
from .units import (
    BUILTIN_SPLIT_FAMILIES,
    boundary_allowance,
    compact_body_units,
    count_exact_batch,
    count_memory_tokens,
    memory_units,
)

__all__ = [
    "BUILTIN_SPLIT_FAMILIES",
    "COUNT_CACHE_ENTRIES",
    "DIRECTIVE_BOUNDARY_ALLOWANCE",
    "EXACT_COUNT_BYTES_PER_MS",
    "MEMORY_COUNT_CACHE_CHARS",
    "MEMORY_COUNT_CACHE_ENTRIES",
    "MemoryCountCacheStats",
    "boundary_allowance",
    "compact_body_units",
    "count_exact_batch",
    "count_memory_tokens",
    "memory_count_cache_stats",
    "memory_units",
    "warm_tokenizers",
]
