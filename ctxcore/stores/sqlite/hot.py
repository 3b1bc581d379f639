"""Rows the SQLite store keeps in memory, each valid while its scope's write counter
(``scopes.version``, moved by every write of the scope's memories, in any process) is
unchanged:

- `HotCache`: each recently read scope's newest memories, so a hot read that finds the
  counter unchanged reads one row instead of the newest memories with their embeddings;
- `RowCache`: the rows cold reads returned, so a cold read looks up by rowid only the
  memories it has not returned since the scope's last write.

Least recently read scopes are dropped beyond a byte bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ...memory import MemoryBatch, MemoryOrigin, Scope
from ..records import STORED_COLUMNS, rows_to_batch

__all__ = ["DEFAULT_HOT_CACHE_BYTES", "DEFAULT_ROW_CACHE_BYTES", "HotCache", "HotRows", "RowCache"]

#: Upper bound on the kept rows, all scopes together (64 rows with 384-dimension
#: embeddings are ~110 KB: ~600 scopes).
DEFAULT_HOT_CACHE_BYTES = 64 << 20
#: Upper bound on the rows cold reads returned, all scopes together (~100,000 memories of
#: a few hundred characters).
DEFAULT_ROW_CACHE_BYTES = 64 << 20
_ID = STORED_COLUMNS.index("id")
_ACCESSED_AT = STORED_COLUMNS.index("accessed_at")
# Bytes counted per row beside its text and embedding (the row tuple and its values).
_ROW_OVERHEAD = 400


def _row_bytes(row: Sequence[Any]) -> int:
    return len(row[4]) + _ROW_OVERHEAD  # the text, and the row tuple with its values


def _touched(row: Sequence[Any], at: float) -> tuple[Any, ...]:
    return (*row[:_ACCESSED_AT], max(row[_ACCESSED_AT] or 0.0, at), *row[_ACCESSED_AT + 1 :])


def _merge_later(into: dict[str, float], new: Mapping[str, float]) -> None:
    """`new` into `into`, the later time of a memory in both winning.

    >>> d = {"m1": 5.0, "m2": 9.0}
    >>> _merge_later(d, {"m1": 7.0, "m2": 8.0, "m3": 1.0}); d
    {'m1': 7.0, 'm2': 9.0, 'm3': 1.0}
    """
    if not into:
        into.update(new)
        return
    for mid, at in new.items():
        old = into.get(mid)
        if old is None or at > old:
            into[mid] = at


@dataclass(slots=True)
class HotRows:
    """A scope's newest rows (``STORED_COLUMNS`` + embedding) at `version`, with their
    embeddings as one matrix per width, built on first use."""

    version: int
    rows: Sequence[Sequence[Any]]
    nbytes: int
    _matrices: dict[int, tuple[list[int], npt.NDArray[np.float32]]] = field(default_factory=dict)
    _batch: MemoryBatch | None = None
    #: Read times written since these rows were kept, not yet in them (memory id -> time).
    _touched: dict[str, float] = field(default_factory=dict)
    _ids: frozenset[str] | None = None

    def ids(self) -> frozenset[str]:
        """The memory ids of the rows."""
        got = self._ids
        if got is None:
            got = self._ids = frozenset(row[_ID] for row in self.rows)
        return got

    def batch(self, scope: Scope) -> MemoryBatch:
        """The rows as one batch of `scope` without similarities, built on first use (a
        read scores a copy: `MemoryBatch.with_similarity`)."""
        got = self._batch
        if got is None:
            n = len(self.rows)
            got = self._batch = rows_to_batch(scope, self.rows, [MemoryOrigin.HOT] * n, np.full(n, np.nan))
        return got

    def matrix(self, dim: int) -> tuple[list[int], npt.NDArray[np.float32]]:
        """The positions of the rows whose embedding has `dim` dimensions, and those
        embeddings (read-only)."""
        got = self._matrices.get(dim)
        if got is None:
            width = dim * 4
            have = [k for k, row in enumerate(self.rows) if row[-1] is not None and len(row[-1]) == width]
            mat = np.frombuffer(b"".join(self.rows[k][-1] for k in have), dtype=np.float32).reshape(len(have), dim)
            got = self._matrices[dim] = (have, mat)
        return got


class HotCache:
    """`HotRows` per (scope, limit), valid while the scope's write counter is unchanged.

    Thread-safe. Read times this store writes (no counter move) are written into the
    kept rows with `touch`.

    >>> c = HotCache(1 << 20)
    >>> _ = c.put(Scope("o", "a"), 2, 7, [(1, "m1", "o", "a", "tea", None)])
    >>> c.get(Scope("o", "a"), 2, 7).version, c.get(Scope("o", "a"), 2, 8)
    (7, None)
    """

    __slots__ = ("_lock", "_kept", "_bytes", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_HOT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[Scope, int], HotRows] = OrderedDict()
        self._bytes = 0

    def get(self, scope: Scope, limit: int, version: int) -> HotRows | None:
        """The kept rows of `scope` if read at `version`, else None."""
        key = (scope, limit)
        with self._lock:
            hit = self._kept.get(key)
            if hit is None or hit.version != version:
                return None
            self._kept.move_to_end(key)
            if hit._touched:
                # Read times written since: into the rows at this first read after them. A
                # new entry, not the kept one changed: a reader may be reading that now.
                t = hit._touched
                rows = [row if (at := t.get(row[_ID])) is None else _touched(row, at) for row in hit.rows]
                hit = self._kept[key] = HotRows(hit.version, rows, hit.nbytes, hit._matrices, _ids=hit._ids)
            return hit

    def put(self, scope: Scope, limit: int, version: int, rows: Sequence[Sequence[Any]]) -> HotRows:
        """Keep `rows`, read at `version` or later, and return them."""
        nbytes = sum(len(r[4]) + (len(r[-1]) if r[-1] is not None else 0) + _ROW_OVERHEAD for r in rows)
        hot = HotRows(version, rows, nbytes)
        if self.max_bytes <= 0 or nbytes > self.max_bytes:
            return hot
        key = (scope, limit)
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._kept[key] = hot
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, gone = self._kept.popitem(last=False)
                self._bytes -= gone.nbytes
        return hot

    def touch(self, times: Mapping[Scope, Mapping[str, float]]) -> None:
        """Write read times (memory id -> time, per scope) into the kept rows as the store
        writes them to the database: ``accessed_at`` becomes the later of the two. The
        rows stay kept (their version is unchanged: read times do not move the counter).
        The times go into the rows at the scope's next read (a flush of 27,000 read times
        rebuilt every kept row at once, on the flush's thread and under the GIL)."""
        with self._lock:
            for key, hot in self._kept.items():
                new = times.get(key[0])
                if not new:
                    continue
                ids = hot.ids()
                _merge_later(hot._touched, {mid: at for mid, at in new.items() if mid in ids})


@dataclass(slots=True)
class _ScopeRows:
    version: int
    rows: dict[int, Sequence[Any]] = field(default_factory=dict)  # rowid -> row
    ids: dict[str, int] = field(default_factory=dict)  # memory id -> rowid
    nbytes: int = 0
    touched: dict[str, float] = field(default_factory=dict)  # read times not yet in `rows`


class RowCache:
    """Rows (``STORED_COLUMNS``) by rowid, per scope, as read at the scope's write counter.

    Thread-safe. Rows read at or after a counter value are kept under it; a lookup at
    another value finds nothing (and drops the scope's rows). Read times this store writes
    (no counter move) are written into the kept rows with `touch`. Least recently read
    scopes go first beyond `max_bytes`; a scope alone over it keeps its newest rows.

    >>> c = RowCache(1 << 20)
    >>> c.put(Scope("o", "a"), 7, [(1, "m1", "o", "a", "tea", 1.0, None, 0.0, None)])
    >>> c.get(Scope("o", "a"), 7, [1, 2])
    ({1: (1, 'm1', 'o', 'a', 'tea', 1.0, None, 0.0, None)}, [2])
    >>> c.get(Scope("o", "a"), 8, [1])
    ({}, [1])
    """

    __slots__ = ("_lock", "_kept", "_bytes", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_ROW_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[Scope, _ScopeRows] = OrderedDict()
        self._bytes = 0

    def get(self, scope: Scope, version: int, rowids: Sequence[int]) -> tuple[dict[int, Sequence[Any]], list[int]]:
        """The kept rows of `rowids` in `scope` at `version`, and the rowids not kept."""
        with self._lock:
            kept = self._kept.get(scope)
            if kept is None:
                return {}, list(rowids)
            if kept.version != version:
                if kept.version < version:  # written since: nothing kept is current
                    self._drop(scope)
                return {}, list(rowids)
            self._kept.move_to_end(scope)
            rows = kept.rows
            found = {r: rows[r] for r in rowids if r in rows}
            if kept.touched:
                # Read times written since these rows were kept: into the rows read now.
                t = kept.touched
                for r, row in found.items():
                    at = t.pop(row[_ID], None)
                    if at is not None:
                        # A new tuple in place of the kept one: a reader may hold that now.
                        found[r] = rows[r] = _touched(row, at)
        return found, [r for r in rowids if r not in found]

    def put(self, scope: Scope, version: int, rows: Sequence[Sequence[Any]]) -> None:
        """Keep `rows` of `scope`, read after its counter showed `version`."""
        if self.max_bytes <= 0 or not rows:
            return
        with self._lock:
            kept = self._kept.get(scope)
            if kept is None or kept.version < version:
                if kept is not None:
                    self._drop(scope)
                kept = self._kept[scope] = _ScopeRows(version)
            elif kept.version > version:  # a newer read has kept rows already: these may be older
                return
            self._kept.move_to_end(scope)
            for row in rows:
                rowid = row[0]
                if rowid in kept.rows:
                    continue
                size = _row_bytes(row)
                kept.rows[rowid] = row
                kept.ids[row[_ID]] = rowid
                kept.nbytes += size
                self._bytes += size
            while self._bytes > self.max_bytes and len(self._kept) > 1:
                self._drop(next(iter(self._kept)))
            while self._bytes > self.max_bytes and kept.rows:
                # The scope alone is over the bound: its oldest-kept rows go.
                rowid = next(iter(kept.rows))
                row = kept.rows.pop(rowid)
                del kept.ids[row[_ID]]
                size = _row_bytes(row)
                kept.nbytes -= size
                self._bytes -= size

    def rows_room(self) -> int:
        """At most how many more rows the bound has room for (each counts at least
        `_ROW_OVERHEAD` bytes): what a warm-up need read of a scope.

        >>> RowCache(4000).rows_room(), RowCache(0).rows_room()
        (10, 0)
        """
        with self._lock:
            return max(0, self.max_bytes - self._bytes) // _ROW_OVERHEAD

    def fill(self, scope: Scope, version: int, rows: Sequence[Sequence[Any]]) -> bool:
        """Keep as many of `rows` (read after the counter showed `version`) as the bound
        has room for, dropping nothing kept (a warm-up); False once the bound is reached.

        >>> c = RowCache(1000)
        >>> c.fill(Scope("o", "a"), 1, [(k, f"m{k}", "o", "a", "x" * 100) for k in range(3)])
        False
        >>> len(c.get(Scope("o", "a"), 1, [0, 1, 2])[0])
        2
        """
        with self._lock:
            room = self.max_bytes - self._bytes
        fit = 0
        for row in rows:
            room -= _row_bytes(row)
            if room < 0:
                break
            fit += 1
        self.put(scope, version, rows[:fit])
        return fit == len(rows)

    def _drop(self, scope: Scope) -> None:
        gone = self._kept.pop(scope)
        self._bytes -= gone.nbytes

    def touch(self, times: Mapping[Scope, Mapping[str, float]]) -> None:
        """Write read times (memory id -> time, per scope) into the kept rows as the store
        writes them to the database: ``accessed_at`` becomes the later of the two."""
        with self._lock:
            for scope, new in times.items():
                kept = self._kept.get(scope)
                if kept is None:
                    continue
                ids = kept.ids
                # Into the rows when they are next read (`get`), not all here at once.
                _merge_later(kept.touched, {mid: at for mid, at in new.items() if mid in ids})
