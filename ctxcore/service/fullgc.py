"""Full collections of the cyclic garbage collector held off while large calls run, so
that walking a large request's objects does not stall every other call for the GIL."""

from __future__ import annotations

import gc
import time

__all__ = ["FULL_COLLECTIONS", "FULL_COLLECTIONS_HELD_AT_MOST_S", "HELD_FULL_COLLECTION_THRESHOLD", "FullCollections"]

#: The cyclic collector's oldest-generation threshold while a large call runs (Python's
#: default is 10): see `FullCollections`.
HELD_FULL_COLLECTION_THRESHOLD = 1 << 30
#: The longest full collections are held off at a stretch: when large calls overlap for
#: longer, each waiting collection runs (so that cyclic garbage cannot pile up under an
#: endless stream of them) until none is running.
FULL_COLLECTIONS_HELD_AT_MOST_S = 5.0


class FullCollections:
    """Holds off the cyclic collector's full collections while large calls run.

    A large call's request (20,000 messages and the objects made from them) lives for
    hundreds of milliseconds and is promoted to the oldest generation; each full collection
    while it runs walks all of it in one step that holds the GIL for 6-60 ms, which every
    other call waits out. The young generations still collect as usual (cheap, and where
    cyclic garbage is found); the last large call to end restores the threshold, and the
    next full collection finds the large call's objects gone (freed by reference counts).
    Large calls overlapping for over `FULL_COLLECTIONS_HELD_AT_MOST_S` get no more hold
    until none runs. The event loop's thread enters and leaves: plain counters suffice."""

    __slots__ = ("_held_since", "_running", "_saved")

    def __init__(self) -> None:
        self._running = 0
        self._saved = 0
        self._held_since: float | None = None

    def hold(self) -> None:
        self._running += 1
        if self._running == 1:
            t = gc.get_threshold()
            self._saved = t[2]
            gc.set_threshold(t[0], t[1], HELD_FULL_COLLECTION_THRESHOLD)
            self._held_since = time.monotonic()
        elif self._held_since is not None and time.monotonic() - self._held_since > FULL_COLLECTIONS_HELD_AT_MOST_S:
            self._put_back()

    def release(self) -> None:
        self._running -= 1
        if self._running == 0:
            self._put_back()

    def _put_back(self) -> None:
        if self._held_since is None:
            return
        self._held_since = None
        t = gc.get_threshold()
        # Only the threshold set here is put back (not one set meanwhile by the application).
        if len(t) == 3 and t[2] == HELD_FULL_COLLECTION_THRESHOLD:
            gc.set_threshold(t[0], t[1], self._saved)


#: One per process, as the collector is.
FULL_COLLECTIONS = FullCollections()
