"""Exact counts of memories that arrive without a stored count, kept across requests, and
the length-based price that ranks a memory before it is counted.

Pricing (``ctxcore.pricing.candidates``) counts exactly only the memories that can end up
in the context; what it counts it keeps here, keyed by tokenizer family and the memory's
id and text, so a memory retrieved again (the same hot memories on every turn of a
conversation) costs a dictionary lookup instead of a tokenizer call. The key is the text
itself, found by its hash and compared in full on a hit: a hash collision can never hand
back another text's count. Memory is bounded by entries and by characters held.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "MEMORY_COUNT_CACHE_CHARS",
    "MEMORY_COUNT_CACHE_ENTRIES",
    "MemoryCountCacheStats",
    "memory_count_cache_stats",
]

#: Memories whose exact counts are kept (all families together): a few hundred
#: conversations' worth of retrieved memories at ~100 candidates counted per request.
MEMORY_COUNT_CACHE_ENTRIES = 1 << 15
#: Characters of ids and texts the cache may hold (the keys are the texts): 16 Mi chars,
#: at most 64 MiB of string data (4 bytes a character at worst, 1 for ASCII).
MEMORY_COUNT_CACHE_CHARS = 1 << 24


@dataclass(frozen=True, slots=True)
class MemoryCountCacheStats:
    """What the memory count cache holds and how often it answered.

    Attributes:
        entries: memories whose exact count is kept (all families).
        chars: characters of ids and texts held as keys.
        max_entries: the bound on `entries`.
        max_chars: the bound on `chars`.
        hits: lookups answered from the cache since start (or `clear`).
        misses: lookups the cache could not answer (the memory was then counted, or
            ranked by its length and left out uncounted).
    """

    entries: int
    chars: int
    max_entries: int
    max_chars: int
    hits: int
    misses: int


class _MemoryCountCache:
    """Exact ``I + B`` counts (``ctxcore.pricing.units``) by family and (id, text), in two
    generations of at most half the bounds each: new entries go to the young one; when it
    is full it becomes the old one (the previous old one is dropped), and a hit in the old
    one moves the entry back. Approximately least recently used out, with O(1) work per entry.

    Thread-safe: lookups read a generation without the lock (a dict read is atomic; a
    value once stored is the exact count of its key, so a reader racing a rotation sees a
    right count or a miss); writes, rotations and the counters take the lock."""

    def __init__(self, max_entries: int, max_chars: int) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._young: dict[str, dict[tuple[str, str], int]] = {}
        self._old: dict[str, dict[tuple[str, str], int]] = {}
        self._young_entries = 0
        self._young_chars = 0
        self._old_entries = 0
        self._old_chars = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def get_many(self, family: str, ids: Sequence[str], texts: Sequence[str]) -> npt.NDArray[np.int64]:
        """The kept count of each (id, text), -1 where there is none."""
        n = len(ids)
        young = self._young.get(family)
        if young is None:
            got = np.full(n, -1, dtype=np.int64)
        else:
            got = np.fromiter(map(young.get, zip(ids, texts), itertools.repeat(-1, n)), dtype=np.int64, count=n)
        old = self._old.get(family)
        if old is not None:
            lost = np.flatnonzero(got < 0)
            if lost.size:
                back = [((ids[k], texts[k]), old.get((ids[k], texts[k]), -1)) for k in lost.tolist()]
                got[lost] = [v for _, v in back]
                promote = [(key, v) for key, v in back if v >= 0]
                if promote:
                    self.put_many(family, promote)
        misses = int(np.count_nonzero(got < 0))
        with self._lock:
            self._hits += n - misses
            self._misses += misses
        return got

    def put_many(self, family: str, items: Sequence[tuple[tuple[str, str], int]]) -> None:
        """Keep the exact count of each (id, text); a key longer than a tenth of the
        character bound is not kept."""
        limit = self.max_chars // 10
        with self._lock:
            young = self._young.get(family)
            if young is None:
                young = self._young[family] = {}
            for key, n in items:
                size = len(key[0]) + len(key[1])
                if size > limit or key in young:
                    continue
                # Each generation stays within half of each bound: the young one turns old
                # before an entry would take it past.
                if (self._young_entries + 1) * 2 > self.max_entries or (self._young_chars + size) * 2 > self.max_chars:
                    self._rotate()
                    young = self._young[family] = {}
                young[key] = n
                self._young_entries += 1
                self._young_chars += size

    def _rotate(self) -> None:
        # Under the lock. Replacing the dicts (not clearing them) keeps lock-free readers
        # on a consistent generation.
        self._old, self._young = self._young, {}
        self._old_entries, self._old_chars = self._young_entries, self._young_chars
        self._young_entries = self._young_chars = 0

    def stats(self) -> MemoryCountCacheStats:
        with self._lock:
            return MemoryCountCacheStats(
                self._young_entries + self._old_entries,
                self._young_chars + self._old_chars,
                self.max_entries,
                self.max_chars,
                self._hits,
                self._misses,
            )

    def clear(self) -> None:
        with self._lock:
            self._young, self._old = {}, {}
            self._young_entries = self._young_chars = self._old_entries = self._old_chars = 0
            self._hits = self._misses = 0


MEMORY_COUNTS = _MemoryCountCache(MEMORY_COUNT_CACHE_ENTRIES, MEMORY_COUNT_CACHE_CHARS)


def memory_count_cache_stats() -> MemoryCountCacheStats:
    """Entries, characters held and hits/misses of the cache of exact memory counts that
    assembling keeps for memories without a stored count.

    >>> s = memory_count_cache_stats()
    >>> s.entries <= s.max_entries and s.chars <= s.max_chars
    True
    """
    return MEMORY_COUNTS.stats()


#: Tokens per UTF-8 byte assumed for a memory before any of its family's memories has
#: been counted: English prose runs ~0.22 in cl100k_base and o200k_base; the figure then
#: follows what each request counts (`_TokensPerByte`).
INITIAL_TOKENS_PER_BYTE = 0.25


class _TokensPerByte:
    """Each family's running ratio of exact tokens to UTF-8 bytes of the memories counted
    (an exponential average over requests): the length-based price before counting.
    A lost update between threads costs only a slightly older ratio."""

    def __init__(self) -> None:
        self._ratio: dict[str, float] = {}

    def get(self, family: str) -> float:
        return self._ratio.get(family, INITIAL_TOKENS_PER_BYTE)

    def update(self, family: str, tokens: int, nbytes: int) -> None:
        if nbytes <= 0:
            return
        seen = tokens / nbytes
        old = self._ratio.get(family)
        self._ratio[family] = seen if old is None else 0.8 * old + 0.2 * seen


TOKENS_PER_BYTE = _TokensPerByte()


def utf8_lengths(ids: Sequence[str], texts: Sequence[str]) -> npt.NDArray[np.int64]:
    """UTF-8 bytes of each text, plus its id's length in characters (ids are short; the
    price this feeds ranks, it need not be exact). An ASCII str's length is its byte
    count, which ``str.isascii`` tells without a scan."""
    n = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    n += np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if not all(map(str.isascii, texts)):
        for k, t in enumerate(texts):
            if not t.isascii():
                n[k] += len(t.encode("utf-8", "surrogatepass")) - len(t)
    return n


def rank_prices(nbytes: npt.NDArray[np.int64], tokens_per_byte: float) -> npt.NDArray[np.int64]:
    """The length-based price of memories of `nbytes` bytes: what ranks a memory in the
    packer before it is counted (never the price of one that is selected)."""
    out: npt.NDArray[np.int64] = np.ceil(nbytes * tokens_per_byte).astype(np.int64) + 1
    return out
