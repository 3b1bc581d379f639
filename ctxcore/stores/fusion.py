"""How a store's cold read fuses its two retrieval paths into one batch, in both stores.

The vector path gives the scope's nearest memories at or above the ANN cutoff (best
first); the full-text path gives BM25 hits (best first). One batch comes back, each
memory once with both signals: the vector hits first, each with its BM25 score where
full text found it too, then the full-text hits the vector path did not return, each
with its cosine where it has an embedding. The batch's `reference` holds each signal's
mean and standard deviation over the scope, which scoring normalises against. The
SQLite store merges the two lists here (`merge_hits`); the PostgreSQL store's cold
statement does the same merge in SQL, and both build the batch with `cold_batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..memory import MemoryBatch, MemoryOrigin, Scope
from .records import fulltext_stats, rows_to_batch

__all__ = ["cold_batch", "merge_hits"]


def merge_hits(
    vector_hits: Sequence[tuple[int, float]],
    text_hits: Sequence[int],
    text_scores: Sequence[float],
    text_similarities: Sequence[float | None],
) -> list[tuple[int, float | None, float | None, MemoryOrigin]]:
    """Both paths' lists as one: (key, cosine, BM25 score, origin) per memory, the vector
    hits first, then the full-text hits the vector path did not return. Each path's keys
    are distinct.

    >>> [(k, o.value) for k, _, _, o in merge_hits([(7, 0.9)], [3, 7], [2.0, 1.0], [0.4, 0.9])]
    [(7, 'vector'), (3, 'fulltext')]
    """
    by_text = dict(zip(text_hits, text_scores))
    merged: list[tuple[int, float | None, float | None, MemoryOrigin]] = [
        (key, sim, by_text.get(key), MemoryOrigin.VECTOR) for key, sim in vector_hits
    ]
    vector_keys = {key for key, _ in vector_hits}
    merged += [
        (key, sim, score, MemoryOrigin.FULLTEXT)
        for key, score, sim in zip(text_hits, text_scores, text_similarities)
        if key not in vector_keys
    ]
    return merged


def cold_batch(
    scope: Scope,
    rows: Sequence[Sequence[Any]],
    origins: Sequence[MemoryOrigin],
    similarities: Sequence[float | None],
    scores: Sequence[float | None],
    *,
    vector_stats: tuple[float, float] | None,
    text_scores: Sequence[float],
    in_scope: int,
) -> MemoryBatch:
    """The cold read's batch: `rows` (stored columns first) with their origins, cosines
    (None: no embedding; clipped to [-1, 1]) and BM25 scores (None: not a full-text hit);
    its `reference` gets the cosine's (mean, std) over the scope when `vector_stats` is
    given and the BM25 scores' when there are `text_scores` (`in_scope`: the scope's size).
    """
    sims = np.clip(np.array([np.nan if s is None else s for s in similarities], dtype=np.float64), -1.0, 1.0)
    bm25 = np.array([np.nan if s is None else s for s in scores], dtype=np.float64)
    out = rows_to_batch(scope, rows, origins, sims, bm25)
    if vector_stats is not None:
        out.reference["vector"] = vector_stats
    if text_scores:
        out.reference["fulltext"] = fulltext_stats(text_scores, in_scope)
    return out
