"""The SQLite store itself: `SqliteMemoryStore`, which ties the schema, the reader
threads, the full-text and vector paths, the directive cache and the writes together
behind the `ctxcore.memory.MemoryStore` protocol."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ...memory import (
    LATER,
    ForgetReport,
    Later,
    MemoryBatch,
    MemoryOrigin,
    MemoryRecord,
    Query,
    Scope,
    ScopeStats,
    StoreStats,
    check_limit,
    check_min_similarity,
    check_query,
    check_scope,
)
from ...tokens import estimator_families, exact_families
from ..counting import DEFAULT_TOKEN_FAMILY, count_memory_tokens, exact_json, stored_token_counts
from ..directives import DIRECTIVE_CACHE_SECONDS, DirectiveCache
from ..embedders import DEFAULT_BATCH, embed, embed_many, embedder_from_name
from ..embedding import Embedder
from ..errors import InvalidMemory, MemoryStoreError
from ..fusion import cold_batch, merge_hits
from ..query_vectors import QueryVectors
from ..reads import ACCESS_FLUSH_SECONDS, ACCESS_RESOLUTION_SECONDS, ReadTimes
from ..records import (
    Directive,
    NewMemory,
    check_batch,
    check_ids,
    check_owner,
    check_update,
    expiry_cutoff,
    rows_to_batch,
)
from . import fulltext
from .directives import read_directive, write_directive
from .fulltext import DocFrequencies
from .hot import DEFAULT_HOT_CACHE_BYTES, DEFAULT_ROW_CACHE_BYTES, HotCache, HotRows, RowCache
from .ingest import (
    PROGRESS_CHUNK,
    OnConflict,
    check_dims,
    insert_batch,
    insert_memory,
    next_rowid,
    remove_rows,
    remove_where,
)
from .readers import DEFAULT_READERS, Busy, Job, ReaderPool
from .schema import (
    ACCESSED_AT_SQL,
    BUSY_TIMEOUT_MS,
    EMBEDDING_GENERATION,
    MEMORY_COLUMNS,
    MEMORY_FROM,
    check_not_foreign,
    connect,
    embedding_generation,
    init_schema,
    scope_version,
    stored_dim,
)
from .vectors import DEFAULT_CACHE_BYTES, VectorCache, nearest

__all__ = ["FLUSH_ROWS", "PACED_BACKLOG_ROWS", "SqliteMemoryStore"]

#: Read times the background flush writes a transaction; it pauses between transactions
#: unless more than PACED_BACKLOG_ROWS wait.
FLUSH_ROWS = 2000
PACED_BACKLOG_ROWS = 200_000

_T = TypeVar("_T")


class _HandOff(Exception):
    """A read begun on the caller's thread that needs a reader thread (`_cold_here`)."""


class _Reembedded(Exception):
    """The store was re-embedded by another process after a write embedded its memories
    (`add_many` embeds them again with the new embedder)."""


def _by_time(times: Mapping[str, float]) -> dict[float, list[str]]:
    """Memory ids per read time.

    >>> _by_time({"m1": 5.0, "m2": 7.5, "m3": 5.0})
    {5.0: ['m1', 'm3'], 7.5: ['m2']}
    """
    out: dict[float, list[str]] = {}
    for mid, at in times.items():
        got = out.get(at)
        if got is None:
            out[at] = [mid]
        else:
            got.append(mid)
    return out


class SqliteMemoryStore:
    """A memory store in one SQLite database file; implements `ctxcore.memory.MemoryStore`.

    Args:
        path: the database file; created (with its directory entry) if missing.
        embedder: computes embeddings for memories stored without one and for queries
            without one (e.g. `HashingEmbedder`). Its `name` is recorded in the database,
            and opening it later with a different embedder raises `MemoryStoreError`;
            opening it with None uses the recorded `HashingEmbedder`, if that is one.
            The store takes up the embedder another process records later (the first
            one, or a `reembed`) at its next read or write.
        token_family: the tokenizer family memory token counts are taken in: exact where
            ``ctxcore.count_tokens`` has that family, else ``ctxcore.estimate_tokens``;
            every count is stored with its family and kind.
        readers: reader threads (one connection each) that async queries run on.
        cache_bytes: bound on the in-memory embedding matrices (least recently used
            scopes are dropped first). Recently read scopes' newest memories
            (``DEFAULT_HOT_CACHE_BYTES``) and the memories cold reads returned
            (``DEFAULT_ROW_CACHE_BYTES``) are kept too, each scope's until it is written,
            by any process; 0 keeps none of them.
        directive_cache_seconds: how long a directive is served from memory (0: always
            read); directives set through this store are seen at once regardless.
        access_resolution_seconds: a memory read again within this long of its last
            noted read keeps that ``accessed_at`` (0: every read is written), so a memory
            that every request reads costs one write per resolution.

    The ingest methods (`add`, `add_many`, `set_directive`) block; from async code call
    them through ``asyncio.to_thread``. `close` (or ``with``) releases the threads and
    connections.

    >>> import asyncio, tempfile, os
    >>> from ctxcore.stores import HashingEmbedder
    >>> path = os.path.join(tempfile.mkdtemp(), "mem.db")
    >>> with SqliteMemoryStore(path, embedder=HashingEmbedder(64)) as store:
    ...     _ = store.add(NewMemory("m1", "acme", "support", "Customer prefers email."))
    ...     [r.id for r in asyncio.run(store.hot(Scope("acme", "support"), Query(""), 5))]
    ['m1']
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        embedder: Embedder | None = None,
        token_family: str = DEFAULT_TOKEN_FAMILY,
        readers: int = DEFAULT_READERS,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        directive_cache_seconds: float = DIRECTIVE_CACHE_SECONDS,
        access_resolution_seconds: float = ACCESS_RESOLUTION_SECONDS,
    ) -> None:
        self._path = os.fspath(path)
        if self._path in ("", ":memory:") or self._path.startswith("file:"):
            raise ValueError(f"SqliteMemoryStore needs a database file path, got {self._path!r}")
        if not isinstance(token_family, str) or token_family not in estimator_families():
            raise ValueError(f"unknown token_family {token_family!r}; known: {', '.join(estimator_families())}")
        if isinstance(readers, bool) or not isinstance(readers, int) or readers < 1:
            raise ValueError(f"readers must be an int >= 1, got {readers!r}")
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be an int >= 0, got {cache_bytes!r}")
        for name, value in (
            ("directive_cache_seconds", directive_cache_seconds),
            ("access_resolution_seconds", access_resolution_seconds),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        self._directives = DirectiveCache(float(directive_cache_seconds))
        self._reads: ReadTimes[str] = ReadTimes(float(access_resolution_seconds))
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError(f"embedder must have a name and an embed(text) method, got {type(embedder).__name__}")
        self._embedder: Embedder | None = embedder
        # The embedder a `reembed` of this store is swapping in (`_follow_embedder`).
        self._incoming: Embedder | None = None
        self._dim_of_embedder: int | None = None
        self._family = token_family
        self._exact = token_family in exact_families()
        self._vectors_cache = VectorCache(cache_bytes)
        self._query_vectors = QueryVectors()
        self._hot_rows = HotCache(DEFAULT_HOT_CACHE_BYTES if cache_bytes else 0)
        self._cold_rows = RowCache(DEFAULT_ROW_CACHE_BYTES if cache_bytes else 0)
        self._state_lock = threading.Lock()
        self._df = DocFrequencies()
        self._closed = False
        self._write_lock = threading.Lock()
        self._writer = connect(self._path)
        try:
            check_not_foreign(self._writer, self._path)
            self._writer.execute("PRAGMA journal_mode = WAL")
            self._writer.execute("PRAGMA synchronous = NORMAL")
            with self._write_lock:
                self._embedder, self._embedder_name = init_schema(self._writer, self._path, self._embedder)
                # Moved by each `reembed`, in any process: `_follow_embedder`.
                self._generation = embedding_generation(self._writer)
        except sqlite3.Error as exc:
            self._writer.close()
            raise MemoryStoreError(f"{self._path} is not a usable memory database: {exc}") from exc
        except BaseException:
            self._writer.close()
            raise
        try:
            self._readers = ReaderPool(self._path, readers)
        except BaseException:
            self._writer.close()
            raise

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    @property
    def embedder(self) -> Embedder | None:
        """The embedder for memories and queries that come without an embedding."""
        return self._embedder

    @property
    def embedder_name(self) -> str | None:
        """The embedder the database records (its embeddings' space), None when it records
        none. Set even when `embedder` is None: a store opened without an embedder whose
        recorded one ctxcore cannot rebuild from its name (an endpoint, a local model)."""
        return self._embedder_name

    @property
    def dimensions(self) -> int | None:
        """The dimension of the stored embeddings (read from the database, so a first
        embedding written by another process counts), None before the first one.

        >>> import tempfile, os
        >>> from ctxcore.stores import HashingEmbedder
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db"), embedder=HashingEmbedder(64)) as s:
        ...     _ = s.add(NewMemory("m1", "o", "a", "likes tea"))
        ...     s.dimensions
        64
        """
        self._check_open()
        with self._write_lock:
            return stored_dim(self._writer)

    @property
    def token_family(self) -> str:
        """The tokenizer family memory token counts are taken in."""
        return self._family

    @property
    def interrupted_queries(self) -> int:
        """How many running queries were interrupted because their caller cancelled."""
        return self._readers.interrupted

    def warm(self, scopes: Iterable[Scope] | None = None) -> int:
        """Load the embedding matrices of `scopes` (default: every scope with embeddings,
        as far as the cache holds them) so that no cold query pays for it, and keep their
        memories' rows as far as their bound (``DEFAULT_ROW_CACHE_BYTES``) allows, so that a
        cold read finds the rows it returns already read; returns how many scopes' matrices
        were loaded. Blocks.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.warm()
        0
        """
        self._check_open()
        conn = self._readers.connection()
        if scopes is None:
            rows = conn.execute("SELECT organization_id, agent_id FROM scopes WHERE embedded > 0").fetchall()
            targets = [Scope(o, a) for o, a in rows]
        else:
            targets = list(scopes)
            for sc in targets:
                check_scope(sc)
        loaded = 0
        room = self._cold_rows.max_bytes > 0
        for sc in targets:
            if self._vectors_cache.matrix(conn, Job(), sc) is not None:
                loaded += 1
            if room:
                room = self._warm_rows(conn, sc)
        return loaded

    def _warm_rows(self, conn: sqlite3.Connection, scope: Scope) -> bool:
        """Keep `scope`'s rows for cold reads, as far as the bound has room; False once full.
        The counter is read first: rows read after it are at least as new."""
        version = scope_version(conn, scope)
        if version is None:
            return True
        # No more rows than could fit (a scope of millions is not read whole to keep a few).
        room = self._cold_rows.rows_room()
        rows = conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM {MEMORY_FROM} WHERE organization_id = ? AND agent_id = ? "
            "ORDER BY memories.rowid DESC LIMIT ?",
            (scope.organization_id, scope.agent_id, room + 1),
        ).fetchall()
        return len(rows) <= room and self._cold_rows.fill(scope, version, rows)

    def journal_mode(self) -> str:
        """The database's journal mode (``"wal"``).

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.journal_mode()
        'wal'
        """
        with self._write_lock:
            mode: str = self._writer.execute("PRAGMA journal_mode").fetchone()[0]
        return mode

    def close(self) -> None:
        """Stop the reader threads and close every connection. Idempotent."""
        if self._closed:
            return
        self._flush_at_close()
        self._closed = True
        self._readers.close()
        with self._write_lock:
            self._writer.close()

    def __enter__(self) -> SqliteMemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteMemoryStore({self._path!r}, token_family={self._family!r}, embedder={self._embedder!r})"

    # ---- ingest --------------------------------------------------------------------------

    def add(self, memory: NewMemory | Mapping[str, Any]) -> str:
        """Store one memory; returns its id.

        Raises:
            InvalidMemory: the memory is not valid, its id is taken, or its embedding's
                dimension differs from the store's.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.add({"id": "m1", "organization_id": "o", "agent_id": "a", "text": "hi"})
        'm1'
        """
        return self.add_many([memory])[0]

    def add_many(
        self,
        memories: Iterable[NewMemory | Mapping[str, Any]],
        *,
        directives: Sequence[Directive] = (),
        on_conflict: OnConflict = "error",
        progress: Callable[[int], object] | None = None,
    ) -> list[str]:
        """Store several memories in one transaction: all of them, or none. `directives`
        (set as `set_directive` sets them) join the same transaction.

        Each memory's token count is taken at insert in the store's tokenizer family and
        tagged exact or estimate; memories without an embedding get one from the store's
        embedder, if it has one.

        Args:
            memories: the memories (`NewMemory` or mappings of its fields).
            directives: directives written in the same transaction.
            on_conflict: an id that is already stored: ``"error"`` fails the batch,
                ``"skip"`` keeps the stored memory, ``"replace"`` replaces it.
            progress: called with the number of memories just prepared (counted and
                embedded, the slow part), a chunk at a time.

        Returns:
            The ids stored, in input order (without the skipped ones).

        Raises:
            InvalidMemory: naming the first bad memory (its `index` in `memories` and id):
                invalid fields, an id used twice or already stored (``on_conflict="error"``),
                or an embedding whose dimension differs from the store's.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.add_many([{"id": "a", "organization_id": "o", "agent_id": "x", "text": "one"},
        ...                 {"id": "a", "organization_id": "o", "agent_id": "x", "text": "two"}])
        Traceback (most recent call last):
        ...
        ctxcore.stores.InvalidMemory: memory 'a' (index 1): id 'a' is used twice in this batch
        """
        self._check_open()
        batch, seen = check_batch(memories)
        if not all(isinstance(d, Directive) for d in directives):
            raise TypeError("directives must be Directive records")
        if on_conflict not in ("error", "skip", "replace"):
            raise ValueError(f"on_conflict must be 'error', 'skip' or 'replace', got {on_conflict!r}")
        if not batch and not directives:
            return []
        want = self._wanted_dim(batch)
        counts: list[int] = []
        exact: list[str | None] = []
        vectors: list[npt.NDArray[np.float32] | None] = []
        for lo in range(0, len(batch), PROGRESS_CHUNK):
            part = batch[lo : lo + PROGRESS_CHUNK]
            texts = [m.text for m in part]
            counts += self._count(texts)
            exact += exact_json([m.id for m in part], texts)
            vectors += self._vectors(part)
            if progress is not None:
                progress(len(part))
        now = time.time()
        kind = "exact" if self._exact else "estimate"
        while True:
            try:
                return self._add_prepared(batch, seen, counts, exact, vectors, want, directives, on_conflict, now, kind)
            except _Reembedded:
                # Another process re-embedded the store meanwhile: the new embedder's vectors.
                want = self._wanted_dim(batch)
                vectors = self._vectors(batch)

    def _wanted_dim(self, batch: list[NewMemory]) -> int | None:
        """The dimension the batch's given embeddings must have (None: any), checked."""
        # An embedding of another dimension than the embedder's is refused before any work
        # (and would make every later embedding of the store incomparable).
        want = self._embedder_dim() if any(m.embedding is not None for m in batch) else None
        if want is not None:
            check_dims(batch, [None if m.embedding is None else len(m.embedding) for m in batch], want, self._wanted())
        return want

    def _add_prepared(
        self,
        batch: list[NewMemory],
        seen: dict[str, int],
        counts: list[int],
        exact: list[str | None],
        vectors: list[npt.NDArray[np.float32] | None],
        want: int | None,
        directives: Sequence[Directive],
        on_conflict: OnConflict,
        now: float,
        kind: str,
    ) -> list[str]:
        """`add_many`'s transaction; `_Reembedded` when the vectors are of an embedder the
        store has since replaced."""
        embedder = self._embedder

        def write(conn: sqlite3.Connection) -> list[NewMemory]:
            self._follow_embedder(conn)
            if self._embedder is not embedder:
                raise _Reembedded
            written = insert_batch(
                conn,
                batch,
                seen,
                counts,
                vectors,
                exact,
                family=self._family,
                kind=kind,
                on_conflict=on_conflict,
                now=now,
                expected_dim=want,
                expected_from=self._wanted(),
            )
            for d in directives:
                write_directive(conn, d.organization_id, d.agent_id, d.text)
            return written

        try:
            batch = self._transaction(write)
        finally:
            if directives:  # written or rolled back: either way no cached read stays valid
                self._directives.invalidate()
            if on_conflict == "replace":  # a replaced memory is noted at its next read
                self._reads.reset()
        return [m.id for m in batch]

    def _follow_embedder(self, conn: sqlite3.Connection) -> None:
        """Take up the embedder the file records, when another process changed it since
        this store last looked: a `reembed` (its vectors replaced every stored one), or the
        first embedder recorded in a file this store opened without one. Queries and new
        memories are embedded with it from now on (a store without an embedder, when
        ctxcore cannot rebuild it from its name, as opening the file would leave it).

        Raises:
            MemoryStoreError: the file was re-embedded with an embedder ctxcore cannot
                rebuild from its name while this store embeds with another: the store must
                be opened again with it.
        """
        rows = dict(conn.execute("SELECT key, value FROM meta WHERE key IN (?, 'embedder')", (EMBEDDING_GENERATION,)))
        generation = int(rows.get(EMBEDDING_GENERATION, 0))
        name = rows.get("embedder")
        if generation == self._generation and (name is None or self._embedder_name is not None):
            return
        with self._state_lock:
            if name != self._embedder_name:
                incoming = self._incoming
                if incoming is not None and incoming.name == name:
                    new: Embedder | None = incoming  # this store's own reembed, ending
                else:
                    new = None if name is None else embedder_from_name(str(name))
                if new is None and self._embedder is not None:
                    raise MemoryStoreError(
                        f"{self._path} was re-embedded with {name!r} by another process, which ctxcore cannot "
                        "rebuild from its name: open the store again with that embedder"
                    )
                self._embedder, self._embedder_name = new, None if name is None else str(name)
                self._dim_of_embedder = None
                self._query_vectors = QueryVectors()
            self._generation = generation

    def set_directive(self, organization_id: str, agent_id: str | None, text: str | None) -> None:
        """Set (or with ``text=None`` remove) the directive of an organization
        (``agent_id=None``: all its agents) or of one agent.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.set_directive("acme", None, "Never share card numbers.")
        ...     s.set_directive("acme", "support", "You are Acme's support agent.")
        ...     print(asyncio.run(s.directive(Scope("acme", "support"))))
        Never share card numbers.
        <BLANKLINE>
        You are Acme's support agent.
        """
        self._check_open()
        if text is None:
            Directive(organization_id, agent_id, "-")  # validates the ids
        else:
            Directive(organization_id, agent_id, text)
        with self._write_lock:
            try:
                write_directive(self._writer, organization_id, agent_id, text)
            except sqlite3.Error as exc:
                raise self._write_error(exc) from exc
            # After the write: a read that began before it will not be cached (its
            # generation is older), and every read from now on sees the new text.
            self._directives.invalidate()

    def reembed(
        self, embedder: Embedder, *, batch: int = DEFAULT_BATCH, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Embed every memory again with `embedder` and make it the store's embedder.

        The new vectors go to a side table in one short write transaction per batch, so
        the store keeps serving with its current embedder meanwhile; the last transaction
        swaps them in, records the new embedder's name and dimension, and moves every
        scope's write counter (cached vectors are read again, in every process). Every
        store open on the file takes up `embedder` at its next read or write (one that
        cannot rebuild it from its name raises `MemoryStoreError` until opened again with
        it). An interrupted run resumes where it stopped when called again with the same
        embedder (memories added meanwhile are embedded too); another embedder is refused
        until that run completes. Memories stored with caller-supplied embeddings get the
        new embedder's. `progress(done, total)` is called after each batch. Returns how
        many memories were embedded by this call.

        Raises:
            MemoryStoreError: a re-embedding to another embedder is under way.
        """
        self._check_open()
        if not isinstance(embedder, Embedder):
            raise TypeError(f"embedder must have a name and an embed(text) method, got {type(embedder).__name__}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        w = self._writer
        with self._write_lock:
            w.execute("BEGIN IMMEDIATE")
            try:
                w.execute(
                    "CREATE TABLE IF NOT EXISTS reembed_vectors (memory_rowid INTEGER PRIMARY KEY, embedding BLOB)"
                )
                row = w.execute("SELECT value FROM meta WHERE key = 'reembed_to'").fetchone()
                if row is not None and row[0] != embedder.name:
                    raise MemoryStoreError(
                        f"{self._path} is being re-embedded with {row[0]!r}: finish that run "
                        f"(`ctxcore memories reembed` with it) before {embedder.name!r}"
                    )
                if row is None:
                    w.execute("DELETE FROM reembed_vectors")
                    w.execute("INSERT INTO meta VALUES ('reembed_to', ?)", (embedder.name,))
                w.execute("COMMIT")
            except BaseException:
                if w.in_transaction:
                    w.execute("ROLLBACK")
                raise
        self._incoming = embedder
        try:
            return self._reembed(embedder, batch, progress)
        finally:
            self._incoming = None

    def _reembed(self, embedder: Embedder, batch: int, progress: Callable[[int, int], None] | None) -> int:
        """`reembed` after its run is recorded: the batches, the swap."""
        w = self._writer
        embedded = 0
        dim: int | None = None
        while True:
            with self._write_lock:
                last = w.execute("SELECT coalesce(max(memory_rowid), 0) FROM reembed_vectors").fetchone()[0]
                total = int(w.execute("SELECT count(*) FROM memories").fetchone()[0])
                done = int(w.execute("SELECT count(*) FROM reembed_vectors").fetchone()[0])
                rows = w.execute(
                    "SELECT rowid, text FROM memories WHERE rowid > ? ORDER BY rowid LIMIT ?", (last, batch)
                ).fetchall()
            if rows:
                vecs = embed_many(embedder, [r[1] for r in rows])
                for v in vecs:
                    if v is not None:
                        if dim is None:
                            dim = v.size
                        elif v.size != dim:
                            raise MemoryStoreError(
                                f"embedder {embedder.name!r} returned {v.size} dimensions after {dim}"
                            )
            with self._write_lock:
                w.execute("BEGIN IMMEDIATE")
                try:
                    if rows:
                        w.executemany(
                            "INSERT OR REPLACE INTO reembed_vectors VALUES (?, ?)",
                            [(r[0], None if v is None else v.tobytes()) for r, v in zip(rows, vecs)],
                        )
                    elif w.execute("SELECT 1 FROM memories WHERE rowid > ? LIMIT 1", (last,)).fetchone() is None:
                        self._swap_in(w, embedder, dim)
                        w.execute("COMMIT")
                        break
                    w.execute("COMMIT")
                except BaseException:
                    if w.in_transaction:
                        w.execute("ROLLBACK")
                    raise
            embedded += len(rows)
            if progress is not None and rows:
                progress(min(done + len(rows), total), total)
        with self._write_lock:
            generation = embedding_generation(w)
        with self._state_lock:
            self._embedder = embedder
            self._embedder_name = embedder.name
            self._dim_of_embedder = None  # the new embedder's, found at its first need
            self._query_vectors = QueryVectors()
            self._generation = generation
        return embedded

    def _swap_in(self, w: sqlite3.Connection, embedder: Embedder, dim: int | None) -> None:
        """The last step of `reembed`, inside its transaction."""
        if dim is None:
            row = w.execute("SELECT embedding FROM reembed_vectors WHERE embedding IS NOT NULL LIMIT 1").fetchone()
            dim = None if row is None else len(row[0]) // 4
        w.execute(
            "UPDATE memories SET embedding = (SELECT r.embedding FROM reembed_vectors r "
            "WHERE r.memory_rowid = memories.rowid)"
        )
        w.execute("INSERT OR REPLACE INTO meta VALUES ('embedder', ?)", (embedder.name,))
        if dim is None:
            w.execute("DELETE FROM meta WHERE key = 'embedding_dim'")
        else:
            w.execute("INSERT OR REPLACE INTO meta VALUES ('embedding_dim', ?)", (str(dim),))
        w.execute(
            "UPDATE scopes SET version = version + 1, embedded = (SELECT count(*) FROM memories m "
            "WHERE m.organization_id = scopes.organization_id AND m.agent_id = scopes.agent_id "
            "AND m.embedding IS NOT NULL)"
        )
        # Every kept embedding matrix (in every process) is read again whole.
        w.execute(
            "INSERT INTO meta VALUES (?, '1') ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
            (EMBEDDING_GENERATION,),
        )
        w.execute("DELETE FROM meta WHERE key = 'reembed_to'")
        w.execute("DROP TABLE reembed_vectors")

    def recount(self, families: Sequence[str] | None = None, *, batch: int = 2000) -> int:
        """Count every memory that lacks an exact count for one of `families` (default:
        every installed exact family) and store the counts: the backfill for a database
        written before version 2 or before a family was installed. Blocks; safe to run
        while the store serves (one short write transaction per batch). Returns how many
        memories were updated.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add(NewMemory("m1", "o", "a", "hello"))
        ...     s.recount()
        0
        """
        self._check_open()
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        fams = tuple(exact_families()) if families is None else tuple(families)
        updated = 0
        last = 0
        while True:
            with self._write_lock:
                rows = self._writer.execute(
                    "SELECT rowid, id, text, exact_tokens FROM memories WHERE rowid > ? ORDER BY rowid LIMIT ?",
                    (last, batch),
                ).fetchall()
            if not rows:
                return updated
            last = rows[-1][0]
            have = [json.loads(r[3]) if r[3] else {} for r in rows]
            todo = [k for k, h in enumerate(have) if any(f not in h for f in fams)]
            if not todo:
                continue
            counts = count_memory_tokens([rows[k][1] for k in todo], [rows[k][2] for k in todo], fams)
            params = []
            for j, k in enumerate(todo):
                merged = dict(have[k])
                merged.update({f: int(counts[f][j]) for f in fams})
                params.append((json.dumps(merged, separators=(",", ":"), sort_keys=True), rows[k][0]))
            with self._write_lock:
                conn = self._writer
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany("UPDATE memories SET exact_tokens = ? WHERE rowid = ?", params)
                    # The scopes' write counters move: kept hot rows (in every process)
                    # are read again with their counts.
                    conn.execute(
                        "UPDATE scopes SET version = version + 1 WHERE EXISTS (SELECT 1 FROM memories m "
                        "WHERE m.rowid IN (SELECT value FROM json_each(?)) "
                        "AND m.organization_id = scopes.organization_id AND m.agent_id = scopes.agent_id)",
                        (json.dumps([p[1] for p in params]),),
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            updated += len(params)

    def optimize(self) -> int:
        """Merge the full-text index into one segment (FTS5's ``optimize``) and refresh the
        query planner's statistics (``PRAGMA optimize``): the maintenance after a bulk load.

        Each write transaction leaves the full-text index a segment of its own; FTS5 merges
        segments of a size as they pile up, so a loaded store keeps several, and a
        full-text read looks each query word up in every one (the load driver's
        100k-memory store: 7 segments, 42 lookups a cold read; after `optimize`, 1 and 6,
        and 8% fewer instructions an assembly). Rewrites the whole index: time and disk
        in proportion to it (0.3 s for 100k memories). Blocks, holding the store's write
        lock; readers go on (write-ahead log). Returns how many segments there were.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     for k in range(3):
        ...         _ = s.add(NewMemory(f"m{k}", "o", "a", f"note {k}"))
        ...     s.optimize(), s.optimize()
        (3, 1)
        """
        self._check_open()
        with self._write_lock:
            conn = self._writer
            before = int(conn.execute("SELECT count(DISTINCT segid) FROM memory_words_idx").fetchone()[0])
            conn.execute("INSERT INTO memory_words (memory_words) VALUES ('optimize')")
            conn.execute("PRAGMA optimize")
        return before

    def _count(self, texts: list[str]) -> list[int]:
        return stored_token_counts(texts, self._family, exact=self._exact)

    def _vectors(self, batch: Sequence[NewMemory]) -> list[npt.NDArray[np.float32] | None]:
        out: list[npt.NDArray[np.float32] | None] = [
            None if m.embedding is None else np.asarray(m.embedding, dtype=np.float32) for m in batch
        ]
        todo = [i for i, m in enumerate(batch) if m.embedding is None]
        if self._embedder is not None and todo:
            # One batch call for the memories without an embedding (None: a featureless text).
            for i, v in zip(todo, embed_many(self._embedder, [batch[i].text for i in todo])):
                out[i] = v
        return out

    def _embedder_dim(self) -> int | None:
        """The dimension of the store's embedder's vectors (None without an embedder): its
        ``dim``, else the size of one embedding it makes (once per store)."""
        if self._embedder is None:
            return None
        if self._dim_of_embedder is None:
            dim = getattr(self._embedder, "dim", None)
            if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
                self._dim_of_embedder = dim
            else:
                probe = embed(self._embedder, "dimension probe")
                self._dim_of_embedder = None if probe is None else int(probe.size)
        return self._dim_of_embedder

    def _wanted(self) -> str:
        """Whose dimension an embedding must have, as messages name it."""
        return "the store's" if self._embedder is None else f"the store's embedder ({self._embedder.name}) makes"

    def _check_open(self) -> None:
        if self._closed:
            raise MemoryStoreError(f"the memory store {self._path!r} is closed")

    # ---- retrieval (the MemoryStore protocol) --------------------------------------------

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        self._check_open()
        return await self._readers.run(fn, *args)

    async def directive(self, scope: Scope) -> str | None:
        """The organization's directive followed by the agent's (a blank line between),
        or whichever exists, or None.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.set_directive("acme", "support", "Be brief.")
        ...     asyncio.run(s.directive(Scope("acme", "support"))), asyncio.run(s.directive(Scope("acme", "sales")))
        ('Be brief.', None)
        """
        check_scope(scope)
        return await self._directives.fetch(
            scope,
            lambda: self._run(self._directive_job, scope),
            lambda: self._readers.submit(self._directive_job, scope),
        )

    def directive_now(self, scope: Scope) -> str | None | Later:
        """`directive` from the store's directive cache, or `LATER` when it must be read
        (`Sources.from_store` asks this first: see `NowOrLater`)."""
        check_scope(scope)
        self._check_open()
        return self._directives.at_hand(scope, lambda: self._readers.submit(self._directive_job, scope))

    async def hot(self, scope: Scope, query: Query, limit: int) -> Sequence[MemoryRecord]:
        """The agent's most recent memories, newest first, at most `limit`. Each carries
        its cosine similarity to the query when both have an embedding, else None.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory(f"m{k}", "o", "a", f"note {k}", created_at=k) for k in range(5)])
        ...     [r.id for r in asyncio.run(s.hot(Scope("o", "a"), Query(""), 2))]
        ['m4', 'm3']
        """
        out = self.hot_now(scope, query, limit)
        if out is LATER:
            out = await self._run(self._hot_job, scope, query, limit)
            self._note_access(scope, out)
        return out

    def hot_now(self, scope: Scope, query: Query, limit: int) -> Sequence[MemoryRecord] | Later:
        """`hot` from the scope's rows kept in memory when they are current (one read of
        the scope's write counter, microseconds), else `LATER`: a reader thread must read
        them (`Sources.from_store` asks this first: see `NowOrLater`)."""
        check_scope(scope)
        check_limit(limit)
        check_query(query)
        self._check_open()
        out = self._hot_kept(scope, query, limit)
        if out is None:
            return LATER
        self._note_access(scope, out)
        return out

    def _hot_kept(self, scope: Scope, query: Query, limit: int) -> MemoryBatch | None:
        """The hot read where it is called, when the scope's kept rows are current: one
        read of the write counter (microseconds) and a product over the kept embeddings,
        without a hand-off to a reader thread and back. None when the rows are not kept at
        that counter, or the database is busy: a reader thread reads them."""
        if limit == 0 or self._hot_rows.max_bytes <= 0:
            return None
        try:
            version = self._readers.quick(lambda conn: scope_version(conn, scope))
        except (Busy, sqlite3.OperationalError, sqlite3.ProgrammingError):  # busy, or closing: a reader thread decides
            return None
        hot = self._hot_rows.get(scope, limit, version) if version is not None else None
        return None if hot is None else self._hot_batch(scope, query, hot)

    async def cold(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> Sequence[MemoryRecord]:
        """Each path's ranked list, one entry per memory with both signals: at most
        `limit` vector hits (cosine >= `min_similarity`, best first), then at most `limit`
        full-text hits (BM25, best first, then newest first) the vector path did not
        return. Every record carries its cosine `similarity` where it has an embedding and
        its `fulltext_score` (BM25) where full text found it. The `rank` of each record is
        its position in the result.

        Full-text search leaves out words found in more than `FTS_MAX_DOC_FRACTION` of all
        memories (stop words) and searches the `FTS_QUERY_TERMS` rarest of the rest.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory("v", "o", "a", "x", embedding=[1.0, 0.0]),
        ...                     NewMemory("w", "o", "a", "y", embedding=[0.0, 1.0]),
        ...                     NewMemory("t", "o", "a", "the kettle was refunded")])
        ...     [(r.id, r.origin.value) for r in asyncio.run(
        ...         s.cold(Scope("o", "a"), Query("kettle", (0.9, 0.1)), 5, 0.7))]
        [('v', 'vector'), ('t', 'fulltext')]

        Raises:
            MemoryStoreError: the query embedding's dimension differs from the store's.
        """
        out = self.cold_now(scope, query, limit, min_similarity)
        if out is LATER:
            out = await self._run(self._cold_job, scope, query, limit, check_min_similarity(min_similarity))
            self._note_access(scope, out)
        return out

    def cold_now(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> Sequence[MemoryRecord] | Later:
        """`cold` where it is called when the scope's embedding matrix is kept and current
        (see `_cold_here`: a few statements, a fraction of a millisecond), else `LATER`: a
        reader thread must read (`Sources.from_store` asks this first: see `NowOrLater`)."""
        check_scope(scope)
        check_limit(limit)
        min_similarity = check_min_similarity(min_similarity)
        check_query(query)
        self._check_open()
        out = self._cold_here(scope, query, limit, min_similarity)
        if out is None:
            return LATER
        self._note_access(scope, out)
        return out

    def _cold_here(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> MemoryBatch | None:
        """The cold read where it is called, when the scope's embedding matrix is kept and
        current: a few statements (the scope's counters, one full-text statement, the rows
        not kept) and a product over the kept matrix, without a hand-off to a reader thread
        and back. A hand-off costs more than the read under load: the reader waits for the
        GIL at each statement while the caller's thread runs (served at 4 in flight:
        206-283 calls/s with the hand-off, 346-404 without). None when the matrix must be
        read or rebuilt first, or the database is busy: a reader thread reads it."""
        try:
            return self._readers.quick(
                lambda conn: self._cold_job(conn, Job(), scope, query, limit, min_similarity, here=True)
            )
        except (_HandOff, Busy, sqlite3.OperationalError, sqlite3.ProgrammingError):
            return None

    def _query_vector(self, query: Query) -> npt.NDArray[np.float32] | None:
        return self._query_vectors.get(self._embedder, query)

    def _directive_job(self, conn: sqlite3.Connection, job: Job, scope: Scope) -> str | None:
        return read_directive(conn, scope)

    def _hot_job(self, conn: sqlite3.Connection, job: Job, scope: Scope, query: Query, limit: int) -> MemoryBatch:
        if limit == 0:
            return rows_to_batch(scope, [], [], np.empty(0))
        # The scope's write counter first: rows read after it are at least as new.
        version = scope_version(conn, scope)
        if version is None:  # nothing was ever written to the scope
            return rows_to_batch(scope, [], [], np.empty(0))
        hot = self._hot_rows.get(scope, limit, version)
        if hot is None:
            self._follow_embedder(conn)
            fetched = conn.execute(
                f"SELECT {MEMORY_COLUMNS}, embedding FROM {MEMORY_FROM} WHERE organization_id = ? AND agent_id = ? "
                "ORDER BY created_at DESC, memories.rowid DESC LIMIT ?",
                (scope.organization_id, scope.agent_id, limit),
            ).fetchall()
            hot = self._hot_rows.put(scope, limit, version, fetched)
        return self._hot_batch(scope, query, hot)

    def _hot_batch(self, scope: Scope, query: Query, hot: HotRows) -> MemoryBatch:
        rows = hot.rows
        qv = self._query_vector(query)
        sims = np.full(len(rows), np.nan)
        if qv is not None and rows:
            # One product for the rows whose embedding has the query's size.
            have, mat = hot.matrix(qv.size)
            if have:
                sims[have] = np.clip(np.einsum("ij,j->i", mat, qv), -1.0, 1.0)
        return hot.batch(scope).with_similarity(sims)

    def _cold_job(
        self,
        conn: sqlite3.Connection,
        job: Job,
        scope: Scope,
        query: Query,
        limit: int,
        min_similarity: float,
        here: bool = False,
    ) -> MemoryBatch:
        """The cold read on `conn`; `here` (the caller's thread, see `_cold_here`): raises
        `_HandOff` rather than read or rebuild an embedding matrix."""
        if limit == 0:
            return rows_to_batch(scope, [], [], np.empty(0))
        if self._embedder_name is None and query.embedding is None and query.text:
            self._follow_embedder(conn)  # another process may have recorded one since
        qv = self._query_vector(query)
        # The scope's counters, read once for both paths: a kept embedding matrix of this
        # write counter is current, and full-text search weighs its terms by the count.
        row = conn.execute(
            "SELECT version, memories FROM scopes WHERE organization_id = ? AND agent_id = ?",
            (scope.organization_id, scope.agent_id),
        ).fetchone()
        if row is None:  # nothing was ever written to the scope
            return rows_to_batch(scope, [], [], np.empty(0))
        version = int(row[0])
        text_hits, text_scores = fulltext.search(
            conn, job, scope, query.text, limit, self._df, (int(row[1]), int(row[0]))
        )
        job.check()
        vector_hits: list[tuple[int, float]] = []
        text_sims: list[float | None] = [None] * len(text_hits)
        vector_stats: tuple[float, float] | None = None
        if qv is not None:
            if here:
                mat = self._vectors_cache.kept(scope, version)
                if mat is None:
                    raise _HandOff
            else:
                mat = self._vectors_cache.matrix(conn, job, scope, version)
            if mat is not None and mat.generation != self._generation:
                if here:
                    raise _HandOff
                self._follow_embedder(conn)  # the matrix holds another embedder's vectors
                qv = self._query_vector(query)
            if mat is not None and qv is not None:
                version = mat.version
                if mat.n:
                    vector_hits, text_sims, vector_stats = nearest(mat, qv, min_similarity, limit, text_hits)
        # Both paths' lists, each memory once with both signals (ctxcore.stores.fusion).
        merged = merge_hits(vector_hits, text_hits, text_scores, text_sims)
        if not merged:
            return rows_to_batch(scope, [], [], np.empty(0))
        job.check()
        # Rows returned since the scope's last write are kept (`RowCache`): only the others
        # are looked up, and kept for the next read (they are read after `version` was).
        rows, missing = self._cold_rows.get(scope, version, [m[0] for m in merged])
        if missing:
            fetched = conn.execute(
                f"SELECT {MEMORY_COLUMNS} FROM {MEMORY_FROM} WHERE memories.rowid IN (SELECT value FROM json_each(?)) "
                "AND organization_id = ? AND agent_id = ?",
                (json.dumps(missing), scope.organization_id, scope.agent_id),
            ).fetchall()
            self._cold_rows.put(scope, version, fetched)
            rows.update((row[0], row) for row in fetched)
        found = [(rows[m[0]], m) for m in merged if m[0] in rows]  # a row gone since is not returned
        return cold_batch(
            scope,
            [row for row, _ in found],
            [m[3] for _, m in found],
            [m[1] for _, m in found],
            [m[2] for _, m in found],
            vector_stats=vector_stats,
            text_scores=text_scores,
            in_scope=int(row[1]),
        )

    # ---- lifecycle (ctxcore.memory.MemoryLifecycle) ----------------------------------------

    def _note_access(self, scope: Scope, found: Sequence[MemoryRecord]) -> None:
        # Reads only note what they returned (a memory at most once per access
        # resolution); a timer thread writes the times (`flush_accesses`, paced) at most
        # ACCESS_FLUSH_SECONDS later.
        if not found:
            return
        if not self._reads.note(scope, found.ids if isinstance(found, MemoryBatch) else [r.id for r in found]):
            return
        self._start_flush_timer()

    def _start_flush_timer(self) -> None:
        with self._state_lock:
            if self.__dict__.get("_access_timer") is None and not self._closed:
                timer = threading.Timer(ACCESS_FLUSH_SECONDS, self._flush_from_timer)
                timer.daemon = True
                self.__dict__["_access_timer"] = timer
                timer.start()

    def _flush_from_timer(self) -> None:
        # Paced: FLUSH_ROWS read times a transaction, then a pause four times as long as it
        # took, so that the first reads of many memories (27,000 rows in a server's first
        # seconds: 0.2 s of SQLite) do not take a core from the reads all at once. A
        # backlog over PACED_BACKLOG_ROWS is written without pauses.
        try:
            while not self._closed and self._reads:
                t0 = time.perf_counter()
                self._flush(FLUSH_ROWS)
                if self._reads and self._reads.pending_count() <= PACED_BACKLOG_ROWS:
                    time.sleep(min(0.25, 4 * (time.perf_counter() - t0)))
        except (sqlite3.Error, MemoryStoreError):
            pass  # the database is busy or closing: the times wait for the next flush
        finally:
            with self._state_lock:
                self.__dict__["_access_timer"] = None
        if self._reads:  # noted as this flush ended, or left by a busy database
            self._start_flush_timer()

    def _flush_at_close(self) -> None:
        with self._state_lock:
            timer = self.__dict__.get("_access_timer")
            self.__dict__["_access_timer"] = None
        if timer is not None:
            timer.cancel()
        try:
            self.flush_accesses()
        except sqlite3.Error:
            pass

    def flush_accesses(self) -> int:
        """Write the read times noted since the last flush as ``accessed_at`` (one
        statement per scope and read time); returns how many memories were updated. Runs by itself at
        most `ACCESS_FLUSH_SECONDS` after a read, and at `close`. A memory read again
        within the store's ``access_resolution_seconds`` of its last noted read keeps
        that time.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add(NewMemory("m1", "o", "a", "tea"))
        ...     _ = asyncio.run(s.hot(Scope("o", "a"), Query(""), 5))
        ...     s.flush_accesses(), asyncio.run(s.hot(Scope("o", "a"), Query(""), 5))[0].accessed_at is not None
        (1, True)
        """
        return self._flush(None)

    def _flush(self, limit: int | None) -> int:
        """`flush_accesses` of at most `limit` read times."""
        if self._closed:
            return 0
        batch = self._reads.take(limit)
        if not batch:
            return 0
        n = 0
        with self._write_lock:
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
                for scope, times in batch.items():
                    # A narrow row per memory (the memory's own row, text and embedding,
                    # is not rewritten); the later time wins. One statement per read
                    # time (a read notes all it returned at one time), not one per
                    # memory: a statement runs without the GIL from start to end, where
                    # one per memory took the GIL back 27,000 times in a flush (145 ms).
                    for at, ids in _by_time(times).items():
                        cur = conn.execute(
                            # CROSS JOIN: the ids drive the join (a lookup each), not the
                            # scope's index (a scan of the scope for every statement).
                            "INSERT INTO memory_reads (id, accessed_at) SELECT m.id, ? FROM json_each(?) AS j "
                            "CROSS JOIN memories AS m ON m.id = j.value WHERE m.organization_id = ? AND m.agent_id = ? "
                            "ON CONFLICT (id) DO UPDATE SET accessed_at = max(accessed_at, excluded.accessed_at)",
                            (at, json.dumps(ids), scope.organization_id, scope.agent_id),
                        )
                        n += cur.rowcount
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                self._reads.requeue(batch)  # kept for the next flush, never dropped
                raise
        # The rows changed without a write-counter move: this store's kept hot rows of
        # those scopes take the same times (other processes see them at the scope's next
        # write).
        self._hot_rows.touch(batch)
        self._cold_rows.touch(batch)
        return n

    def _transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """`fn` on the writer connection in one transaction: committed, or rolled back with
        a SQLite error told as `MemoryStoreError`."""
        with self._write_lock:
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
                out = fn(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                _roll_back(conn)
                if isinstance(exc, sqlite3.Error):
                    raise self._write_error(exc) from exc
                raise
        return out

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        self._check_open()
        out = self._transaction(fn)
        with self._state_lock:
            self._df.clear()
        self._reads.reset()
        return out

    def _write_error(self, exc: sqlite3.Error) -> MemoryStoreError:
        """What a failed write says: the database and SQLite's reason."""
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return MemoryStoreError(
                f"{self._path}: the database stayed locked by another writer for "
                f"{BUSY_TIMEOUT_MS / 1000:g} s; nothing was written"
            )
        return MemoryStoreError(f"{self._path}: the write failed and nothing was written ({type(exc).__name__}: {exc})")

    def delete(self, scope: Scope, ids: Iterable[str]) -> int:
        """Delete the memories of `scope` with these ids, with their embeddings and
        full-text entries; returns how many were deleted (ids of other scopes or unknown
        ones delete nothing).

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory("m1", "o", "a", "tea"), NewMemory("m2", "o", "b", "tea")])
        ...     s.delete(Scope("o", "a"), ["m1", "m2"])
        1
        """
        check_scope(scope)
        wanted = check_ids(ids)
        if not wanted:
            return 0

        def run(conn: sqlite3.Connection) -> int:
            return remove_where(
                conn,
                "id IN (SELECT value FROM json_each(?)) AND organization_id = ? AND agent_id = ?",
                (json.dumps(wanted), scope.organization_id, scope.agent_id),
            )

        return self._write(run)

    def forget(self, organization_id: str, agent_id: str | None = None) -> ForgetReport:
        """Delete everything of an agent (or, with ``agent_id=None``, of the whole
        organization): memories with their embeddings and full-text entries, and
        directives. Returns the counts.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory("m1", "o", "a", "tea"), NewMemory("m2", "o", "b", "tea")])
        ...     s.set_directive("o", None, "Be brief.")
        ...     s.forget("o")
        ForgetReport(memories=2, directives=1)
        """
        check_owner(organization_id, agent_id, "forget")

        def run(conn: sqlite3.Connection) -> ForgetReport:
            args: tuple[str, ...]
            if agent_id is None:
                where, args = "organization_id = ?", (organization_id,)
            else:
                where, args = "organization_id = ? AND agent_id = ?", (organization_id, agent_id)
            n = remove_where(conn, where, args)
            d = conn.execute(f"DELETE FROM directives WHERE {where}", args).rowcount
            return ForgetReport(n, d)

        report = self._write(run)
        self._directives.invalidate()
        return report

    def update(
        self,
        scope: Scope,
        memory_id: str,
        *,
        text: str | None = None,
        confidence: float | None = None,
        importance: float | None = None,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None = None,
    ) -> bool:
        """Change a memory of `scope`: its text (re-counted, re-indexed and re-embedded by
        the embedder unless `embedding` is given; without either, the stale embedding is
        dropped), confidence, importance or embedding. Returns False when `scope` has no
        such memory.

        Raises:
            InvalidMemory: a new value is invalid (named), or the embedding's dimension
                differs from the store's.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add(NewMemory("m1", "o", "a", "likes tea"))
        ...     s.update(Scope("o", "a"), "m1", text="likes coffee", importance=0.9)
        ...     [(r.text, r.importance) for r in asyncio.run(s.hot(Scope("o", "a"), Query(""), 1))]
        True
        [('likes coffee', 0.9)]
        """
        check_scope(scope)
        fields = check_update(scope, memory_id, text, confidence, importance, embedding)
        new_vec: npt.NDArray[np.float32] | None = None
        if embedding is not None:
            new_vec = np.asarray(fields["embedding"], dtype=np.float32)
        elif text is not None and self._embedder is not None:
            new_vec = embed(self._embedder, text)
        n_tokens = self._count([text])[0] if text is not None else None
        new_exact = exact_json([memory_id], [text])[0] if text is not None else None

        def run(conn: sqlite3.Connection) -> bool:
            nonlocal new_vec
            before = self._embedder
            self._follow_embedder(conn)
            if self._embedder is not before and embedding is None and text is not None:
                # Re-embedded by another process since: the new embedder's vector.
                new_vec = None if self._embedder is None else embed(self._embedder, text)
            row = conn.execute(
                "SELECT memories.rowid, text, embedding, confidence, importance, created_at, "
                f"{ACCESSED_AT_SQL}, token_count, token_family, token_kind, exact_tokens FROM {MEMORY_FROM} "
                "WHERE memories.id = ? AND organization_id = ? AND agent_id = ?",
                (memory_id, scope.organization_id, scope.agent_id),
            ).fetchone()
            if row is None:
                return False
            rowid, old_text, blob, conf, imp, created, accessed, tokens, family, kind, stored_exact = row
            if new_vec is not None:
                dim = stored_dim(conn)
                if dim is None and embedding is not None:
                    dim = self._embedder_dim()
                if dim is not None and new_vec.size != dim:
                    raise InvalidMemory(
                        f"memory {memory_id!r}: embedding has {new_vec.size} dimensions, the store's have {dim}",
                        -1,
                        memory_id,
                    )
                if dim is None:
                    conn.execute("INSERT INTO meta VALUES ('embedding_dim', ?)", (str(new_vec.size),))
            if text is not None or embedding is not None:
                blob = None if new_vec is None else new_vec.tobytes()
            if text is not None:
                old_text, tokens, family, kind = text, n_tokens, self._family, "exact" if self._exact else "estimate"
                stored_exact = new_exact
            if confidence is not None:
                conf = fields["confidence"]
            if importance is not None:
                imp = fields["importance"]
            # A new rowid: the row leaves every cached embedding matrix of the scope (they
            # are rebuilt), and its new vector is read like any new memory's.
            remove_rows(conn, [(rowid, scope.organization_id, scope.agent_id, row[2] is not None)])
            insert_memory(
                conn,
                next_rowid(conn),
                (
                    memory_id,
                    scope.organization_id,
                    scope.agent_id,
                    old_text,
                    blob,
                    conf,
                    imp,
                    created,
                    accessed,
                    tokens,
                    family,
                    kind,
                    stored_exact,
                ),
            )
            conn.execute(
                "UPDATE scopes SET memories = memories + 1, embedded = embedded + ? "
                "WHERE organization_id = ? AND agent_id = ?",
                (int(blob is not None), scope.organization_id, scope.agent_id),
            )
            return True

        return self._write(run)

    def expire(self, max_age_seconds: float, *, organization_id: str | None = None, now: float | None = None) -> int:
        """Retention by age: delete memories created more than `max_age_seconds` before
        `now` (default: the current time), of one organization or of all. Returns how
        many were deleted.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory("old", "o", "a", "tea", created_at=100),
        ...                     NewMemory("new", "o", "a", "tea", created_at=1000)])
        ...     s.expire(500, now=1000)
        1
        """
        cutoff = expiry_cutoff(max_age_seconds, now)
        if organization_id is not None:
            check_owner(organization_id, None, "expire")

        def run(conn: sqlite3.Connection) -> int:
            args: tuple[float | str, ...]
            if organization_id is None:
                where, args = "created_at < ?", (cutoff,)
            else:
                where, args = "created_at < ? AND organization_id = ?", (cutoff, organization_id)
            return remove_where(conn, where, args)

        return self._write(run)

    def memories(self, scope: Scope) -> MemoryBatch:
        """Every memory of `scope`, oldest first (ties: first stored first), as a batch
        without similarities: what an evaluation ranks its baselines over
        (``ctxcore eval``). It reads the whole scope; the assembly never calls it.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory("m1", "o", "a", "tea", created_at=2.0), NewMemory("m2", "o", "a", "jam", created_at=1.0)])
        ...     list(s.memories(Scope("o", "a")).ids)
        ['m2', 'm1']
        """
        self._check_open()
        check_scope(scope)
        rows = (
            self._readers.connection()
            .execute(
                f"SELECT {MEMORY_COLUMNS} FROM {MEMORY_FROM} WHERE organization_id = ? AND agent_id = ? "
                "ORDER BY created_at, memories.rowid",
                (scope.organization_id, scope.agent_id),
            )
            .fetchall()
        )
        return rows_to_batch(scope, rows, [MemoryOrigin.HOT] * len(rows), np.full(len(rows), np.nan))

    def stats(self, organization_id: str | None = None) -> StoreStats:
        """Memories, embedded memories and stored tokens per scope (of one organization, or
        of the whole store), and the directive count.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory("m1", "o", "a", "tea"), NewMemory("m2", "o", "b", "tea")])
        ...     s.stats().memories, [x.agent_id for x in s.stats("o").scopes]
        (2, ['a', 'b'])
        """
        self._check_open()
        if organization_id is not None:
            check_owner(organization_id, None, "stats")
        where, args = ("", ()) if organization_id is None else ("WHERE organization_id = ?", (organization_id,))
        conn = self._readers.connection()
        rows = conn.execute(
            "SELECT organization_id, agent_id, count(*), count(embedding), sum(token_count) FROM memories "
            f"{where} GROUP BY organization_id, agent_id ORDER BY organization_id, agent_id",
            args,
        ).fetchall()
        (directives,) = conn.execute(f"SELECT count(*) FROM directives {where}", args).fetchone()
        return StoreStats(
            tuple(ScopeStats(o, a, int(n), int(e), int(t or 0)) for o, a, n, e, t in rows), int(directives)
        )


def _roll_back(conn: sqlite3.Connection) -> None:
    """End a failed write's transaction, if one is open (a rollback that fails too, on a
    damaged file, leaves the first error to be told)."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
