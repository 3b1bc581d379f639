"""Vector retrieval in the SQLite store: each scope's embeddings as an in-memory float32
matrix (kept up to date incrementally, checked against the scope's write counter in the
database so writes by other processes are seen too, least recently used scopes dropped
beyond a byte bound), and the cosine search over it with the ANN cutoff applied before
any row is read back."""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ...memory import Scope
from ..errors import MemoryStoreError
from .readers import Job
from .schema import embedding_generation

__all__ = ["DEFAULT_CACHE_BYTES", "Matrix", "VectorCache", "nearest"]

#: Upper bound on the in-memory embedding matrices, all scopes together: 1 GiB holds
#: ~700k memories of 384 float32 dimensions. Least recently used scopes go first.
DEFAULT_CACHE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Matrix:
    """A scope's embeddings as of `version` and re-embedding `generation`: the first `n`
    rows of the buffers are valid and never written again (appends go past `n`, or into
    new buffers)."""

    version: int
    n: int
    rowids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]
    generation: int = 0

    @property
    def nbytes(self) -> int:
        return int(self.rowids.nbytes + self.vectors.nbytes)


def nearest(
    mat: Matrix, qv: npt.NDArray[np.float32], min_similarity: float, limit: int, also: Sequence[int] = ()
) -> tuple[list[tuple[int, float]], list[float | None], tuple[float, float]]:
    """(rowid, cosine) of the rows of `mat` with cosine >= `min_similarity` to `qv`, best
    first (ties: lower rowid first), at most `limit`; the cosine of each rowid of `also`
    (None for one without a row in `mat`); and the mean and standard deviation of the
    cosine over every row."""
    if mat.vectors.shape[1] != qv.size:
        raise MemoryStoreError(f"query embedding has {qv.size} dimensions, the store's have {mat.vectors.shape[1]}")
    # The ANN cutoff, before anything is read back from the database. einsum, not `@`:
    # BLAS splits a matrix-vector product over threads, and on a busy machine waking them
    # costs more than the product (measured 12 ms against 0.4 ms for 10k x 256 with two
    # loaded cores).
    sims = np.einsum("ij,j->i", mat.vectors[: mat.n], qv)
    idx = np.flatnonzero(sims >= min_similarity)
    if idx.size > limit:
        idx = idx[np.argpartition(-sims[idx], limit - 1)[:limit]] if limit else idx[:0]
    rowids = mat.rowids[idx]
    order = np.lexsort((rowids, -sims[idx]))
    hits = list(zip(rowids[order].tolist(), sims[idx[order]].astype(np.float64).tolist()))
    extra: list[float | None] = []
    if len(also):
        # Rows are appended in rowid order: a binary search finds each.
        have = mat.rowids[: mat.n]
        want = np.asarray(also, dtype=np.int64)
        at = np.minimum(np.searchsorted(have, want), max(mat.n - 1, 0))
        found = (have[at] == want) if mat.n else np.zeros(want.size, dtype=bool)
        vals = sims[at].astype(np.float64) if mat.n else np.zeros(want.size)
        extra = [float(v) if f else None for v, f in zip(vals.tolist(), found.tolist())]
    stats = (float(sims.mean()), float(sims.std())) if sims.size else (0.0, 0.0)
    return hits, extra, stats


class VectorCache:
    """The scopes' embedding matrices, at most `cache_bytes` together."""

    def __init__(self, cache_bytes: int) -> None:
        self._cache_bytes = cache_bytes
        self._cache: OrderedDict[Scope, Matrix] = OrderedDict()
        self._lock = threading.Lock()
        self._build_locks: dict[Scope, threading.Lock] = {}

    def kept(self, scope: Scope, version: int) -> Matrix | None:
        """`scope`'s kept matrix if it is of write counter `version` (current), else None."""
        with self._lock:
            cached = self._cache.get(scope)
            if cached is None or cached.version != version:
                return None
            self._cache.move_to_end(scope)
            return cached

    def matrix(self, conn: sqlite3.Connection, job: Job, scope: Scope, version: int | None = None) -> Matrix | None:
        """`scope`'s current matrix (read or brought up to date on `conn`), None when the
        scope has no memories. `version`: the scope's write counter as the caller just
        read it on `conn`; a kept matrix of that version is returned without a statement."""
        if version is not None:
            kept = self.kept(scope, version)
            if kept is not None:
                return kept
        with self._lock:
            cached = self._cache.get(scope)
            lock = self._build_locks.setdefault(scope, threading.Lock())
        with lock:
            # One read transaction: the write counter and the rows are one snapshot.
            conn.execute("BEGIN")
            try:
                row = conn.execute(
                    "SELECT version, embedded FROM scopes WHERE organization_id = ? AND agent_id = ?",
                    (scope.organization_id, scope.agent_id),
                ).fetchone()
                if row is None:
                    return None
                version, embedded = int(row[0]), int(row[1])
                with self._lock:
                    cached = self._cache.get(scope)
                if cached is not None and cached.version == version:
                    with self._lock:
                        if scope in self._cache:
                            self._cache.move_to_end(scope)
                    return cached
                job.check()
                generation = embedding_generation(conn)
                if cached is not None and cached.generation != generation:
                    cached = None  # re-embedded since: every vector is another
                since = int(cached.rowids[cached.n - 1]) if cached is not None and cached.n else 0
                fresh = _load(conn, scope, since)
                if cached is not None and cached.n + len(fresh[0]) == embedded:
                    mat = _append(cached, version, generation, *fresh)
                else:  # not a pure append (or nothing cached): rebuild the scope
                    rowids, blobs = fresh if cached is None else _load(conn, scope, 0)
                    mat = _append(None, version, generation, rowids, blobs)
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")
            with self._lock:
                self._cache[scope] = mat
                self._cache.move_to_end(scope)
                total = sum(m.nbytes for m in self._cache.values())
                while total > self._cache_bytes and len(self._cache) > 1:
                    _, dropped = self._cache.popitem(last=False)
                    total -= dropped.nbytes
                if total > self._cache_bytes:
                    self._cache.clear()
            return mat


def _load(conn: sqlite3.Connection, scope: Scope, since: int) -> tuple[list[int], list[bytes]]:
    rows = conn.execute(
        "SELECT rowid, embedding FROM memories WHERE organization_id = ? AND agent_id = ? AND rowid > ? "
        "AND embedding IS NOT NULL ORDER BY rowid",
        (scope.organization_id, scope.agent_id, since),
    ).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


def _append(base: Matrix | None, version: int, generation: int, rowids: list[int], blobs: list[bytes]) -> Matrix:
    k = len(rowids)
    if k == 0 and base is not None:
        return Matrix(version, base.n, base.rowids, base.vectors, generation)
    if base is not None and base.n == 0:
        base = None  # an empty matrix (e.g. after a forget) has no dimension to append to
    dim = len(blobs[0]) // 4 if k else 0
    new_vecs = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(k, dim)
    n = base.n if base is not None else 0
    if base is not None and n + k <= base.rowids.size:
        # Room left: write past row n, which no published snapshot reads.
        base.rowids[n : n + k] = rowids
        base.vectors[n : n + k] = new_vecs
        return Matrix(version, n + k, base.rowids, base.vectors, generation)
    capacity = max(n + k, 2 * n)  # doubling: appending one memory at a time stays linear
    ids = np.empty(capacity, dtype=np.int64)
    vecs = np.empty((capacity, dim), dtype=np.float32)
    if base is not None:
        ids[:n] = base.rowids[:n]
        vecs[:n] = base.vectors[:n]
    ids[n : n + k] = rowids
    vecs[n : n + k] = new_vecs
    return Matrix(version, n + k, ids, vecs, generation)
