"""The SQLite store's reader threads: a small pool of threads with one read-only
connection each, on which async queries run; a cancelled query is interrupted
(``Connection.interrupt``), not left to finish."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from .schema import connect

__all__ = ["DEFAULT_READERS", "Busy", "Cancelled", "Job", "ReaderPool"]

#: Reader threads (and connections). Two of the three retrieval branches read the store
#: at once per assembly; four leaves room for a second assembly in flight.
DEFAULT_READERS = 4

_T = TypeVar("_T")


class Cancelled(Exception):
    """Raised inside a job whose caller has cancelled it."""


class Busy(Exception):
    """The quick connection is in use by another thread (`ReaderPool.quick`)."""


class Job:
    """One query on a reader thread; `cancel` interrupts it from the event loop's thread."""

    __slots__ = ("cancelled", "conn", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: sqlite3.Connection | None = None
        self.cancelled = False

    def check(self) -> None:
        if self.cancelled:
            raise Cancelled

    def cancel(self) -> bool:
        with self.lock:
            self.cancelled = True
            if self.conn is None:
                return False
            # Safe from another thread: sqlite3_interrupt only sets a flag that the running
            # statement checks; the job clears `conn` (under this lock) before its
            # connection can serve another job, so no other query is ever interrupted.
            self.conn.interrupt()
            return True


class ReaderPool:
    """`readers` threads, each with its own read-only connection to `path`, started (with
    their connections) at once so that the first queries (under a 5 ms directive timeout)
    do not pay for threads and connections."""

    def __init__(self, path: str, readers: int) -> None:
        self._path = path
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._quick: sqlite3.Connection | None = None
        self._quick_lock = threading.Lock()
        self.interrupted = 0
        self._executor = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="ctxcore-sqlite")
        try:
            barrier = threading.Barrier(readers)

            def start() -> None:
                self.connection()
                barrier.wait(timeout=10)

            for f in [self._executor.submit(start) for _ in range(readers)]:
                f.result()
        except BaseException:
            self.close()
            raise

    def connection(self) -> sqlite3.Connection:
        """This thread's reader connection (opened on first use)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self._path)
            conn.execute("PRAGMA query_only = ON")  # readers never write, whatever they run
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def quick(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """``fn(conn)`` here and now, for a read of a few microseconds (on an event loop's
        thread, say), on the pool's one quick connection: read-only, and it never waits
        for a lock (a busy database raises `sqlite3.OperationalError` at once). Raises
        `Busy` when another thread is using it; either way the caller hands the read to a
        reader thread instead."""
        if not self._quick_lock.acquire(blocking=False):
            raise Busy
        try:
            conn = self._quick
            if conn is None:
                conn = connect(self._path)
                conn.execute("PRAGMA query_only = ON")
                conn.execute("PRAGMA busy_timeout = 0")
                with self._lock:
                    self._conns.append(conn)
                self._quick = conn
            return fn(conn)
        finally:
            self._quick_lock.release()

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(conn, job, *args)`` on a reader thread; cancelling the await interrupts it."""
        job = Job()
        fut = asyncio.get_running_loop().run_in_executor(self._executor, self._in_thread, job, fn, args)
        try:
            return await fut
        except asyncio.CancelledError:
            if job.cancel():
                self.interrupted += 1
            raise

    def submit(self, fn: Callable[..., _T], *args: Any) -> Future[_T] | None:
        """``fn(conn, job, *args)`` on a reader thread, not awaited (a background refresh);
        None once the pool is closed."""
        try:
            return self._executor.submit(self._in_thread, Job(), fn, args)
        except RuntimeError:  # shut down
            return None

    def _in_thread(self, job: Job, fn: Callable[..., _T], args: tuple[Any, ...]) -> _T:
        conn = self.connection()
        with job.lock:
            job.check()
            job.conn = conn
        try:
            return fn(conn, job, *args)
        finally:
            with job.lock:
                job.conn = None
            # No interrupt can reach this connection any more; leave it with no read
            # transaction open (an interrupted job may have left one), so the next job on
            # it sees the current database.
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def close(self) -> None:
        """Stop the threads and close their connections."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
