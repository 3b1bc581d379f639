"""The store's own event loop on a daemon thread, where its connection pool lives, so that
the store serves any caller's loop and its blocking methods work from plain threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class StoreLoop:
    """The store's own event loop, on a daemon thread: the connection pool lives here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="ctxcore-postgres", daemon=True)
        self.thread.start()
        ready.wait()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run `coro` on the store's loop and block for its result (any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Await `coro` run on the store's loop from another loop; cancelling the caller
        cancels it there (psycopg then cancels the statement on the server)."""
        cf: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return await asyncio.wrap_future(cf)
        except asyncio.CancelledError:
            cf.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()
