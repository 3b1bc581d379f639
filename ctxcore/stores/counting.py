"""Exact token counts of memories as the formatter will emit them, for every store.

The stores' entry point to `ctxcore.pricing.units` (the implementation lives there so that
assembling does not import the store clients): a store calls `count_memory_tokens` at
ingest, for every installed exact family, and returns the counts with each record as
``MemoryRecord.exact_tokens``. The SQLite store and the PostgreSQL store call the same
function.

>>> counts = count_memory_tokens(["m1"], ["Prefers email."])
>>> sorted(counts)
['cl100k_base', 'o200k_base']
"""

from __future__ import annotations

import json

from ..pricing.units import (
    BUILTIN_SPLIT_FAMILIES,
    boundary_allowance,
    count_exact_batch,
    count_memory_tokens,
    memory_units,
)
from ..tokens import count_tokens, estimate_tokens_batch, exact_families

__all__ = [
    "BUILTIN_SPLIT_FAMILIES",
    "DEFAULT_TOKEN_FAMILY",
    "boundary_allowance",
    "count_exact_batch",
    "count_memory_tokens",
    "exact_json",
    "memory_units",
    "stored_token_counts",
]

#: Tokenizer family memories are counted in when a store is not told otherwise: the one
#: with an exact tokenizer shipped offline (``ctxcore.exact_families()``).
DEFAULT_TOKEN_FAMILY = "cl100k_base"


def stored_token_counts(texts: list[str], family: str, *, exact: bool) -> list[int]:
    """The token count a store keeps with each text, in its `family`: exact
    (``ctxcore.count_tokens``) when `exact`, else the estimator's.

    >>> stored_token_counts(["Prefers email."], "cl100k_base", exact=True)
    [4]
    """
    if exact:
        return [count_tokens(t, family).value for t in texts]
    return [int(x) for x in estimate_tokens_batch(texts, family).tolist()]


def exact_json(ids: list[str], texts: list[str]) -> list[str | None]:
    """Each memory's exact counts in every installed exact family, as the JSON stored in
    ``memories.exact_tokens`` (None when no exact family is installed)."""
    fams = exact_families()
    if not fams:
        return [None] * len(ids)
    counts = {f: c.tolist() for f, c in count_memory_tokens(ids, texts, fams).items()}
    return [json.dumps({f: counts[f][k] for f in fams}, separators=(",", ":"), sort_keys=True) for k in range(len(ids))]
