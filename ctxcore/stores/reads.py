"""Read times: what a store's reads note, to be written later as ``accessed_at``.

A read never writes: it notes the memories it returned, and the store writes the noted
times in one batch per scope from the background. A memory read again within
`ReadTimes.resolution_s` of its last noted read is not noted again, so ``accessed_at`` is
accurate to that resolution and a memory read by every request (the newest of a busy
agent) costs one write per resolution instead of one per flush.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from ..memory import Scope

__all__ = ["ACCESS_FLUSH_SECONDS", "ACCESS_RESOLUTION_SECONDS", "ReadTimes"]

#: How precisely ``accessed_at`` follows reads, in seconds: a memory read again within this
#: long of its last noted read keeps that time.
ACCESS_RESOLUTION_SECONDS = 60.0
#: Reads note the memories they return; their ``accessed_at`` is written in one batch at
#: most this long after (never a write per request on the hot path).
ACCESS_FLUSH_SECONDS = 1.0

K = TypeVar("K", bound=Hashable)


class ReadTimes(Generic[K]):
    """Read times waiting to be written, and when each memory was last noted.

    Thread-safe. `K` is how the store names a memory within a scope (an id, a row number).

    Args:
        resolution_s: a memory's read is noted at most once in this many seconds
            (0: every read is noted).

    >>> r: ReadTimes[str] = ReadTimes(60.0)
    >>> r.note(Scope("o", "a"), ["m1", "m2"], now=100.0), r.note(Scope("o", "a"), ["m1"], now=130.0)
    (True, False)
    >>> r.take()
    {Scope(organization_id='o', agent_id='a'): {'m1': 100.0, 'm2': 100.0}}
    >>> r.note(Scope("o", "a"), ["m1"], now=161.0), r.take()[Scope("o", "a")]
    (True, {'m1': 161.0})
    """

    __slots__ = ("resolution_s", "_lock", "_pending", "_noted", "_pruned")

    def __init__(self, resolution_s: float = ACCESS_RESOLUTION_SECONDS) -> None:
        self.resolution_s = float(resolution_s)
        self._lock = threading.Lock()
        self._pending: dict[Scope, dict[K, float]] = {}
        self._noted: dict[Scope, dict[K, float]] = {}
        self._pruned = 0.0

    def note(self, scope: Scope, keys: Iterable[K], now: float | None = None) -> bool:
        """Note that `keys` of `scope` were read at `now` (default: the time); those noted
        within the resolution are skipped. Returns whether anything new is pending."""
        t = time.time() if now is None else now
        cutoff = t - self.resolution_s
        with self._lock:
            if self.resolution_s > 0:
                noted = self._noted.setdefault(scope, {})
                fresh = [k for k in keys if noted.get(k, -1.0) <= cutoff]
                if not fresh:
                    return False
                noted.update(dict.fromkeys(fresh, t))
                if t - self._pruned > self.resolution_s:
                    self._prune(cutoff)
                    self._pruned = t
            else:
                fresh = list(keys)
                if not fresh:
                    return False
            self._pending.setdefault(scope, {}).update(dict.fromkeys(fresh, t))
            return True

    def _prune(self, cutoff: float) -> None:
        # Entries older than the resolution no longer hold anything back: dropped so the
        # map holds only what was read within one resolution.
        for scope in list(self._noted):
            kept = {k: v for k, v in self._noted[scope].items() if v > cutoff}
            if kept:
                self._noted[scope] = kept
            else:
                del self._noted[scope]

    def take(self, limit: int | None = None) -> dict[Scope, dict[K, float]]:
        """The pending times, per scope, at most `limit` of them (default: all); they are
        no longer pending.

        >>> r: ReadTimes[str] = ReadTimes(0)
        >>> _ = r.note(Scope("o", "a"), ["m1", "m2", "m3"], now=5.0)
        >>> [sorted(t) for t in r.take(2).values()], [sorted(t) for t in r.take().values()]
        ([['m1', 'm2']], [['m3']])
        """
        with self._lock:
            if limit is None or self._count() <= limit:
                pending, self._pending = self._pending, {}
                return pending
            out: dict[Scope, dict[K, float]] = {}
            left = limit
            for scope in list(self._pending):
                if left <= 0:
                    break
                times = self._pending[scope]
                if len(times) <= left:
                    out[scope] = self._pending.pop(scope)
                    left -= len(times)
                    continue
                keys = list(itertools.islice(times, left))
                out[scope] = {k: times.pop(k) for k in keys}
                left = 0
            return out

    def pending_count(self) -> int:
        """How many read times wait to be written."""
        with self._lock:
            return self._count()

    def _count(self) -> int:
        return sum(map(len, self._pending.values()))

    def requeue(self, pending: dict[Scope, dict[K, float]]) -> None:
        """Put back times that could not be written (the later time wins)."""
        with self._lock:
            for scope, times in pending.items():
                mine = self._pending.setdefault(scope, {})
                for k, t in times.items():
                    mine[k] = max(t, mine.get(k, t))

    def reset(self) -> None:
        """Forget when memories were last noted (after a write through the store: a
        memory replaced under the same id is noted at its next read); pending times stay."""
        with self._lock:
            self._noted.clear()

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._pending)
