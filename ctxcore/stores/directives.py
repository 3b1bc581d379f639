"""The directive cache both stores serve the directive branch from: a directive read from
the database is served from memory for a short while, then served stale while one
background read refreshes it, so the directive branch (5 ms by default) rarely waits for
the database. The stores read and write directives in their own SQL; an
organization-wide directive is stored under the agent id `ORG_WIDE`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

from ..memory import LATER, Later, Scope

__all__ = [
    "DIRECTIVE_CACHE_SECONDS",
    "DIRECTIVE_STALE_SECONDS",
    "ORG_WIDE",
    "SCOPE_CACHE_ENTRIES",
    "DirectiveCache",
]

#: Seconds a directive read from the database is served from memory. The directive branch
#: has 5 ms (the design's default) and directives change rarely: a cached one costs no
#: thread hop. Directives set through this store are seen at once; set by another
#: process, within this time.
DIRECTIVE_CACHE_SECONDS = 1.0
#: Seconds an older cached directive is still served, at once, while one read refreshes it
#: in the background: a scope called less often than every `DIRECTIVE_CACHE_SECONDS` but
#: at least this often never waits for the database on its directive branch. A directive
#: set by another process is then seen from the call after the refresh (at most this long
#: after the change for a scope that is called at all).
DIRECTIVE_STALE_SECONDS = 60.0
#: Entries a per-scope cache of a store (directives, scope sizes, term counts) holds
#: before it is emptied: a bound on memory whatever the number of scopes called.
SCOPE_CACHE_ENTRIES = 100_000
#: Agent id of an organization-wide directive: `Scope` forbids empty agent ids, so no
#: agent's own directive can collide with it, and it sorts before every agent's.
ORG_WIDE = ""


class DirectiveCache:
    """Directives read from the database: fresh for `ttl` seconds, then served stale for
    up to `stale` seconds while one background read refreshes them. A read that began
    before an `invalidate` (its `generation` is older) is not cached."""

    __slots__ = ("_entries", "_ttl", "_stale", "_refreshing", "generation")

    FRESH, STALE, MISS = "fresh", "stale", "miss"

    def __init__(self, ttl: float, stale: float = DIRECTIVE_STALE_SECONDS) -> None:
        self._ttl = ttl
        self._stale = max(ttl, stale) if ttl > 0 else 0.0
        self._entries: dict[Scope, tuple[float, str | None]] = {}
        self._refreshing: set[Scope] = set()
        self.generation = 0

    def lookup(self, scope: Scope, now: float) -> tuple[str, str | None]:
        """(`FRESH` | `STALE` | `MISS`, the cached directive or None) at `now`."""
        hit = self._entries.get(scope)
        if hit is None:
            return self.MISS, None
        age = now - hit[0]
        if age < self._ttl:
            return self.FRESH, hit[1]
        if age < self._stale:
            return self.STALE, hit[1]
        return self.MISS, None

    def start_refresh(self, scope: Scope) -> bool:
        """Claim `scope`'s background refresh; False when one is already running."""
        if scope in self._refreshing:
            return False
        self._refreshing.add(scope)
        return True

    def end_refresh(self, scope: Scope) -> None:
        """The background refresh of `scope` is over (cached or failed)."""
        self._refreshing.discard(scope)

    def put(self, scope: Scope, generation: int, now: float, value: str | None) -> None:
        """Cache `value`, read at `now` from generation `generation`, unless a write came since."""
        if generation == self.generation:  # no set_directive meanwhile
            if len(self._entries) >= SCOPE_CACHE_ENTRIES:
                self._entries.clear()
            self._entries[scope] = (now, value)

    async def fetch(
        self,
        scope: Scope,
        read: Callable[[], Awaitable[str | None]],
        start_read: Callable[[], Future[str | None] | None],
    ) -> str | None:
        """`scope`'s directive: from the cache while fresh; from the cache while stale, with
        one background read begun by `start_read` (None: none could start); else awaited
        from `read` and cached."""
        cached = self.at_hand(scope, start_read)
        if cached is not LATER:
            return cached
        now = time.monotonic()
        generation = self.generation
        value = await read()
        self.put(scope, generation, now, value)
        return value

    def at_hand(self, scope: Scope, start_read: Callable[[], Future[str | None] | None]) -> str | None | Later:
        """`scope`'s directive from the cache while fresh; from the cache while stale, with
        one background read begun by `start_read`; else `LATER` (it must be read)."""
        now = time.monotonic()
        state, cached = self.lookup(scope, now)
        if state == self.FRESH:
            return cached
        if state == self.STALE:
            self._refresh(scope, now, start_read)
            return cached
        return LATER

    def _refresh(self, scope: Scope, now: float, start_read: Callable[[], Future[str | None] | None]) -> None:
        if not self.start_refresh(scope):
            return
        generation = self.generation
        fut = start_read()
        if fut is None:
            self.end_refresh(scope)
            return

        def done(f: Future[str | None]) -> None:
            try:
                if not f.cancelled() and f.exception() is None:
                    self.put(scope, generation, now, f.result())
            finally:
                self.end_refresh(scope)

        fut.add_done_callback(done)

    def invalidate(self) -> None:
        """Forget every cached directive (after a write, or a write rolled back)."""
        self.generation += 1
        self._entries.clear()
