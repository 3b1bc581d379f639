"""The query vectors both stores share: each query text embedded once, however many
branches of a request ask for it at the same time, and kept for the texts asked again."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future

import numpy as np
import numpy.typing as npt

from ..memory import Query
from .embedders import embed
from .embedding import Embedder, unit

__all__ = ["QUERY_VECTORS_KEPT", "QueryVectors"]


#: Query texts whose vectors a store keeps (least recently asked dropped first).
QUERY_VECTORS_KEPT = 1024


class QueryVectors:
    """The unit vectors of query texts, each embedded once: the hot and cold branches of
    one request ask for the same text at the same time (the second waits for the first
    instead of calling the embedder again), and a text asked again later is not embedded
    again. The vectors are read-only. Thread-safe.

    >>> from ctxcore.stores import HashingEmbedder
    >>> qv = QueryVectors()
    >>> e = HashingEmbedder()
    >>> qv.get(e, Query("refund policy")) is qv.get(e, Query("refund policy")), qv.get(e, Query("")) is None
    (True, True)
    """

    __slots__ = ("_lock", "_kept", "_pending", "_embedder")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, npt.NDArray[np.float32] | None] = OrderedDict()
        self._pending: dict[str, Future[npt.NDArray[np.float32] | None]] = {}
        self._embedder: Embedder | None = None

    def get(self, embedder: Embedder | None, query: Query) -> npt.NDArray[np.float32] | None:
        """`query`'s unit vector: its own embedding if it has one, else `embedder`'s
        vector of its text; None without either (or for a featureless text)."""
        if query.embedding is not None:
            return unit(np.asarray(query.embedding, dtype=np.float64))
        if embedder is None or not query.text:
            return None
        text = query.text
        with self._lock:
            if embedder is not self._embedder:
                self._kept.clear()
                self._embedder = embedder
            if text in self._kept:
                self._kept.move_to_end(text)
                return self._kept[text]
            waiting = self._pending.get(text)
            if waiting is None:
                mine: Future[npt.NDArray[np.float32] | None] = Future()
                self._pending[text] = mine
        if waiting is not None:
            return waiting.result()
        try:
            v = embed(embedder, text)
            if v is not None:
                v.flags.writeable = False
        except BaseException as exc:
            with self._lock:
                del self._pending[text]
            mine.set_exception(exc)
            raise
        with self._lock:
            del self._pending[text]
            if embedder is self._embedder:
                self._kept[text] = v
                if len(self._kept) > QUERY_VECTORS_KEPT:
                    self._kept.popitem(last=False)
        mine.set_result(v)
        return v
