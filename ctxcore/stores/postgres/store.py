"""`PostgresMemoryStore`: the store's reads (hot, cold, directives), writes, lifecycle and
maintenance over its connection pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import DictRow, TupleRow, dict_row
from psycopg_pool import AsyncConnectionPool

from ...memory import (
    ForgetReport,
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
from ..counting import DEFAULT_TOKEN_FAMILY, exact_json, stored_token_counts
from ..directives import DIRECTIVE_CACHE_SECONDS, ORG_WIDE, SCOPE_CACHE_ENTRIES, DirectiveCache
from ..embedders import embed, embedder_from_name
from ..embedding import Embedder
from ..errors import InvalidMemory, MemoryStoreError
from ..fusion import cold_batch
from ..query_vectors import QueryVectors
from ..reads import ACCESS_FLUSH_SECONDS, ACCESS_RESOLUTION_SECONDS, ReadTimes
from ..records import (
    SEQ,
    Directive,
    NewMemory,
    check_batch,
    check_ids,
    check_owner,
    check_update,
    created_times,
    expiry_cutoff,
    rows_to_batch,
)
from ..text import FTS_MAX_DOC_FRACTION, FTS_PRUNE_MIN_DOCS, FTS_QUERY_TERMS, fts_terms
from . import statements as stmt
from .dsn import connect_error, password_of, redact_dsn, scrub_secret
from .loop import StoreLoop
from .schema import MIGRATION_LOCK, MIGRATIONS, PG_SCHEMA_VERSION, VECTOR_INDEX, insert_terms
from .statements import (
    COLD_COUNT,
    COLD_KEY,
    COLD_SCORE,
    COLD_SIM,
    COLD_SOURCE,
    COLD_STATS,
    COLD_VECTOR_HIT,
    HOT_SIM,
    WARM_SCOPE,
)
from .terms import doc_terms, query_keys

_log = logging.getLogger("ctxcore.stores.postgres")

#: The largest embedding dimension the store takes: the cold path searches pgvector's
#: HNSW index, which indexes ``vector`` columns of at most 2,000 dimensions.
MAX_DIMENSIONS = 2000
#: Connections the pool keeps open at most (two retrieval branches read at once per
#: assembly; eight leaves room for several assemblies and a writer).
DEFAULT_POOL_SIZE = 8
#: Where a row `add` builds for the insert holds the memory's vector (as text, or None).
_ROW_VECTOR = 4
#: Scopes with at least this many memories search the HNSW index; smaller ones are scanned
#: exactly (a few thousand cosines cost less than an index walk filtered to one scope).
HNSW_MIN_SCOPE = 2_000
#: How long a scope's memory count (for the stop-word threshold and the plan) is reused.
SCOPE_SIZE_SECONDS = 60.0
#: While the schema fixes no embedding dimension, a query with a vector reads it again at
#: most this often (seconds): another process fixes it with its first embedded memory.
DIMENSION_RECHECK_SECONDS = 1.0
# A search key's noted count when it is a stop word of the scope.
_STOP_WORD = -1
# HNSW candidates per probe; with iterative scans (pgvector >= 0.8) a scope's filter keeps
# the scan going until `limit` rows of the scope are found.
_EF_SEARCH = 64
#: The oldest pgvector the store runs on (HNSW indexes came in 0.5.0).
MIN_PGVECTOR = (0, 5, 0)
#: From this pgvector on, a filtered HNSW scan goes on until it has `limit` rows of the
#: scope (``hnsw.iterative_scan``).
ITERATIVE_SCAN_PGVECTOR = (0, 8, 0)
#: Without iterative scans, an HNSW scan stops after ``hnsw.ef_search`` candidates of the
#: whole partition, however few are of the scope: scopes below this size are scanned
#: exactly (all their k nearest, ~10 ms at this size), larger ones walk the index with the
#: largest candidate list pgvector allows.
HNSW_MIN_SCOPE_NO_ITERATIVE = 50_000
_EF_SEARCH_MAX = 1_000


class UnsupportedPgvector(MemoryStoreError):
    """The database's pgvector is older than `MIN_PGVECTOR`. `found` and `needed` are the
    versions as ``"0.4.4"`` strings."""

    def __init__(self, message: str, found: str, needed: str) -> None:
        super().__init__(message)
        self.found = found
        self.needed = needed


def _version(text: str) -> tuple[int, ...]:
    """A pgvector version string as a tuple of ints (``"0.8.0"`` -> (0, 8, 0)); trailing
    text after a number is ignored (``"0.7.0-dev"``)."""
    out: list[int] = []
    for part in text.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


_T = TypeVar("_T")


def _vector_text(v: npt.NDArray[np.float32]) -> str:
    # pgvector's text form; repr of the float32 value as a double round-trips exactly.
    return "[" + ",".join(map(repr, v.tolist())) + "]"


async def _one(
    conn: psycopg.AsyncConnection[TupleRow], statement: str | sql.Composed, params: Sequence[Any] | None = None
) -> DictRow | None:
    """The first row of `statement`, by column name."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement, params)
        return await cur.fetchone()


async def _all(
    conn: psycopg.AsyncConnection[TupleRow], statement: str | sql.Composed, params: Sequence[Any] | None = None
) -> list[DictRow]:
    """The rows of `statement`, by column name."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement, params)
        return await cur.fetchall()


def _holds_nul(organization_id: str | None, agent_id: str | None = None) -> bool:
    """Whether an organization or agent id holds NUL (U+0000): PostgreSQL text cannot, so
    the store holds no memory or directive of it, and a read or change of it finds nothing
    (without asking the server, which would refuse the statement)."""
    return "\x00" in (organization_id or "") or "\x00" in (agent_id or "")


def _check_directive_nul(organization_id: str, agent_id: str | None, text: str | None) -> None:
    if any("\x00" in v for v in (organization_id, agent_id or "", text or "")):
        raise InvalidMemory("directive: contains NUL (U+0000), which PostgreSQL text cannot hold")


def _check_nul(mem: NewMemory, i: int) -> None:
    for name in ("id", "organization_id", "agent_id", "text"):
        if "\x00" in getattr(mem, name):
            raise InvalidMemory(
                f"memory {mem.id!r} (index {i}): {name} contains NUL (U+0000), which PostgreSQL text cannot hold",
                i,
                mem.id,
            )


class PostgresMemoryStore:
    """A memory store in a PostgreSQL database with pgvector; implements
    `ctxcore.memory.MemoryStore` and `ctxcore.memory.MemoryLifecycle`.

    Args:
        dsn: a ``postgresql://`` URL or a libpq ``key=value`` string. What it leaves out
            (host, user, password, database) comes from the ``PG*`` environment variables
            and the password file (``PGPASSFILE`` or ``~/.pgpass``), as libpq does.
        embedder: computes embeddings for memories stored without one and for queries
            without one. Its `name` is recorded in the database; opening it later with a
            different embedder raises `MemoryStoreError`; with None the recorded one is
            used when ctxcore can rebuild it from its name (`embedder_from_name`: the
            hashing, WordLlama and MiniLM embedders).
        token_family: the tokenizer family memory token counts are taken in (exact where
            ``ctxcore.count_tokens`` has it, else an estimate; both tagged).
        dimensions: the embedding dimension, fixed in the schema (the ``vector`` column and
            its HNSW index). Default: the embedder's, else the first embedded memory's
            (added through any store: one opened before reads it again, and the embedder
            recorded, at most once per `DIMENSION_RECHECK_SECONDS`, while it knows none).
        migrate: apply missing migrations at open (the role must own the schema or may
            create in it); False only checks that the schema is current.
        grant_to: a role to grant the app privileges to while migrating (``SELECT``,
            ``INSERT``, ``UPDATE``, ``DELETE`` on the tables; RLS still applies to it).
        pool_size: connections at most in the pool.
        directive_cache_seconds: how long a directive is served from memory.
        access_flush_seconds: how often the noted reads are written as ``accessed_at``.
        access_resolution_seconds: a memory read again within this long of its last
            noted read keeps that ``accessed_at`` (0: every read is written).

    Raises:
        MemoryStoreError: the server cannot be reached, pgvector is missing, the schema
            is newer than this ctxcore or was built with another embedder; the message
            names the database with its password redacted.
    """

    def __init__(
        self,
        dsn: str,
        *,
        embedder: Embedder | None = None,
        token_family: str = DEFAULT_TOKEN_FAMILY,
        dimensions: int | None = None,
        migrate: bool = True,
        grant_to: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        directive_cache_seconds: float = DIRECTIVE_CACHE_SECONDS,
        access_flush_seconds: float = ACCESS_FLUSH_SECONDS,
        access_resolution_seconds: float = ACCESS_RESOLUTION_SECONDS,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise ValueError("PostgresMemoryStore needs a postgresql:// URL or a libpq connection string")
        if not isinstance(token_family, str) or token_family not in estimator_families():
            raise ValueError(f"unknown token_family {token_family!r}; known: {', '.join(estimator_families())}")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= MAX_DIMENSIONS
        ):
            raise ValueError(
                f"dimensions must be an int in [1, {MAX_DIMENSIONS}] (pgvector's HNSW index takes at most "
                f"{MAX_DIMENSIONS}), got {dimensions!r}"
            )
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        for name, value in (
            ("directive_cache_seconds", directive_cache_seconds),
            ("access_flush_seconds", access_flush_seconds),
            ("access_resolution_seconds", access_resolution_seconds),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError(f"embedder must have a name and an embed(text) method, got {type(embedder).__name__}")
        self._dsn = dsn
        self._shown = redact_dsn(dsn)
        self._secret = password_of(dsn)
        self._embedder: Embedder | None = embedder
        self._embedder_name: str | None = None if embedder is None else embedder.name
        self._family = token_family
        self._exact = token_family in exact_families()
        self._dim: int | None = dimensions
        self._dim_checked = -math.inf  # when `_read_recorded` last read the schema's
        self._directives = DirectiveCache(float(directive_cache_seconds))
        self._flush_every = float(access_flush_seconds)
        self._reads: ReadTimes[int] = ReadTimes(float(access_resolution_seconds))
        self._query_vectors = QueryVectors()
        self._accessed_lock = threading.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._flush_sleeping = False
        self._sizes: dict[Scope, tuple[float, int]] = {}
        # Per scope: when first noted, then each search key's match count read, or
        # _STOP_WORD for a key in more of the scope's memories than the threshold.
        self._key_counts: dict[Scope, tuple[float, dict[str, int]]] = {}
        self._closed = False
        self._loop = StoreLoop()
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] | None = None
        self._pgvector: tuple[int, ...] = ()
        try:
            self._loop.run(self._open(pool_size, migrate, grant_to))
        except BaseException:
            self._loop.run(self._close_pool())
            self._loop.stop()
            raise

    # ---- opening, migrations ---------------------------------------------------------------

    def _connect_error(self, exc: BaseException) -> MemoryStoreError:
        return connect_error(self._shown, exc, self._secret)

    def _error(self, what: str, exc: BaseException) -> MemoryStoreError:
        msg = scrub_secret(" ".join(str(exc).split()), self._secret)
        return MemoryStoreError(f"{what} ({self._shown}): {msg}")

    async def _open(self, pool_size: int, migrate: bool, grant_to: str | None) -> None:
        # One connection first: a failure is said in one line (the pool would retry and
        # log each attempt).
        try:
            probe = await psycopg.AsyncConnection.connect(self._dsn, connect_timeout=10)
            await probe.close()
        except psycopg.Error as exc:
            raise self._connect_error(exc) from None
        self._pool = AsyncConnectionPool(
            self._dsn,
            min_size=1,
            max_size=pool_size,
            open=False,
            name="ctxcore",
            kwargs={"autocommit": False},
            timeout=10.0,
        )
        try:
            await self._pool.open(wait=True, timeout=10.0)
        except psycopg_pool.PoolTimeout as exc:
            # The pool keeps the last connection error; say what it was.
            try:
                conn = await psycopg.AsyncConnection.connect(self._dsn, connect_timeout=5)
                await conn.close()
            except psycopg.Error as inner:
                raise self._connect_error(inner) from None
            raise self._error("cannot connect to the memory database", exc) from None
        async with self._pool.connection() as conn:
            try:
                await self._check_pgvector(conn)
                if migrate and (grant_to is not None or await self._behind(conn)):
                    await self._migrate(conn, grant_to)
                await self._check_schema(conn)
            except psycopg.Error as exc:
                raise self._error("cannot prepare the memory database", exc) from None

    async def _check_pgvector(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        row = await _one(conn, stmt.PGVECTOR_VERSIONS)
        await conn.commit()
        assert row is not None
        installed, available = row["installed"], row["available"]
        self._pgvector = _version(str(installed or available or ""))
        if installed is None and available is None:
            raise MemoryStoreError(
                f"the PostgreSQL server of {self._shown} does not have the pgvector extension: install it "
                "(e.g. the postgresql-NN-pgvector package) and run CREATE EXTENSION vector in the database"
            )
        if installed is None:
            try:
                await conn.execute(stmt.CREATE_PGVECTOR)
                await conn.commit()
            except psycopg.errors.InsufficientPrivilege:
                await conn.rollback()
                raise MemoryStoreError(
                    f"pgvector is available but not created in the database of {self._shown}, and this role may "
                    "not create it: a superuser must run CREATE EXTENSION vector there"
                ) from None
        found = str(installed or available)
        needed = ".".join(map(str, MIN_PGVECTOR))
        if self._pgvector < MIN_PGVECTOR:
            raise UnsupportedPgvector(
                f"the database of {self._shown} has pgvector {found}; ctxcore needs pgvector {needed} or later "
                "(ALTER EXTENSION vector UPDATE after installing a newer one)",
                found,
                needed,
            )

    @staticmethod
    async def _behind(conn: psycopg.AsyncConnection[TupleRow]) -> bool:
        # Read first, so that a role without CREATE opens an up-to-date schema.
        async with conn.transaction():
            row = await _one(conn, stmt.HAS_MIGRATIONS)
            if not row or not row["present"]:
                return True
            row = await _one(conn, stmt.APPLIED_VERSION)
            return (int(row["version"]) if row else 0) < PG_SCHEMA_VERSION

    async def _migrate(self, conn: psycopg.AsyncConnection[TupleRow], grant_to: str | None) -> None:
        async with conn.transaction():
            await conn.execute(stmt.TAKE_MIGRATION_LOCK, (MIGRATION_LOCK,))
            await conn.execute(stmt.CREATE_MIGRATIONS)
            row = await _one(conn, stmt.APPLIED_VERSION)
            current = int(row["version"]) if row else 0
            if current > PG_SCHEMA_VERSION:
                raise MemoryStoreError(
                    f"{self._shown}: database schema version {current} is newer than this ctxcore understands "
                    f"({PG_SCHEMA_VERSION}); upgrade ctxcore"
                )
            for version, description, statements in MIGRATIONS:
                if version <= current:
                    continue
                for statement in statements:
                    if isinstance(statement, str):
                        await conn.execute(statement)  # constant DDL: no user input
                    else:
                        await statement(conn)
                await conn.execute(stmt.RECORD_MIGRATION, (version, description))
                _log.info("applied migration %d (%s) to %s", version, description, self._shown)
            dim = await self._meta(conn, "embedding_dim")
            if dim is None and self._dim is None and self._embedder is not None:
                probe = embed(self._embedder, "dimension probe")
                if probe is not None and probe.size > MAX_DIMENSIONS:
                    raise MemoryStoreError(
                        f"the embedder {self._embedder.name!r} makes embeddings of {probe.size} dimensions; "
                        f"pgvector's HNSW index, which the store searches, takes at most {MAX_DIMENSIONS}"
                    )
                self._dim = None if probe is None else int(probe.size)
            if dim is None and self._dim is not None:
                await self._set_dim(conn, self._dim)
            if grant_to is not None:
                role = sql.Identifier(grant_to)
                await conn.execute(sql.SQL(stmt.GRANT_TABLES).format(role))
                await conn.execute(sql.SQL(stmt.GRANT_META).format(role))

    async def _read_recorded(self, *, now: bool = False) -> None:
        """The embedding dimension and the embedder the schema records, read again while
        this store knows none (at most once per `DIMENSION_RECHECK_SECONDS` unless `now`):
        another process fixes the dimension with its first embedded memory and records its
        embedder, and a store opened before then searches, embeds and updates with them
        from that moment on (an embedder ctxcore cannot rebuild from its name is left out,
        as opening the database would)."""
        if self._dim is not None and self._embedder_name is not None:
            return
        if not now and time.monotonic() < self._dim_checked + DIMENSION_RECHECK_SECONDS:
            return
        self._dim_checked = time.monotonic()
        assert self._pool is not None
        async with self._pool.connection() as conn:
            async with conn.transaction():
                dim = await self._meta(conn, "embedding_dim")
                name = await self._meta(conn, "embedder")
        if dim is not None and self._dim is None:
            self._dim = int(dim)
        if name is not None and self._embedder_name is None:
            self._embedder_name = name
            if self._embedder is None:
                self._embedder = embedder_from_name(name)
                self._query_vectors = QueryVectors()

    def _knows_too_little(self, qv: npt.NDArray[np.float32] | None, query: Query) -> bool:
        """Whether a read of `query` (its vector `qv`) needs what the schema may have
        recorded since this store opened: a dimension for its vector, or an embedder for
        its text."""
        if qv is not None:
            return self._dim is None
        return self._embedder_name is None and query.embedding is None and bool(query.text)

    async def _set_dim(self, conn: psycopg.AsyncConnection[TupleRow], dim: int) -> None:
        # Fixing the dimension makes the column indexable; the HNSW index (cosine) follows.
        # `dim` is an int checked by the caller: safe to format into DDL.
        await conn.execute(sql.SQL(stmt.SET_DIMENSIONS).format(sql.Literal(int(dim))))
        await conn.execute(VECTOR_INDEX)
        await conn.execute(stmt.RECORD_DIMENSIONS, (str(dim),))

    @staticmethod
    async def _meta(conn: psycopg.AsyncConnection[TupleRow], key: str) -> str | None:
        row = await _one(conn, stmt.READ_META, (key,))
        return None if row is None else str(row["value"])

    async def _check_schema(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        async with conn.transaction():
            row = await _one(conn, stmt.HAS_MIGRATIONS)
            if not row or not row["present"]:
                raise MemoryStoreError(
                    f"{self._shown} has no ctxcore schema: create it with `ctxcore memories init --db URL` "
                    "as the schema owner"
                )
            row = await _one(conn, stmt.APPLIED_VERSION)
            version = int(row["version"]) if row else 0
            if version > PG_SCHEMA_VERSION:
                raise MemoryStoreError(
                    f"{self._shown}: database schema version {version} is newer than this ctxcore understands "
                    f"({PG_SCHEMA_VERSION}); upgrade ctxcore"
                )
            if version < PG_SCHEMA_VERSION:
                raise MemoryStoreError(
                    f"{self._shown}: database schema version {version}, this ctxcore needs {PG_SCHEMA_VERSION}: "
                    "run `ctxcore memories init --db URL` as the schema owner"
                )
            dim = await self._meta(conn, "embedding_dim")
            if dim is not None:
                if self._dim is not None and self._dim != int(dim):
                    raise MemoryStoreError(f"{self._shown} stores embeddings of {dim} dimensions, not {self._dim}")
                self._dim = int(dim)
            recorded = await self._meta(conn, "embedder")
            self._embedder_name = recorded
            if self._embedder is None and recorded is not None:
                # Opened without an embedder: the one the database was built with, when
                # ctxcore can rebuild it from its name.
                self._embedder = embedder_from_name(recorded)
            elif self._embedder is not None:
                self._embedder_name = self._embedder.name
                if recorded is None:
                    try:
                        await conn.execute(stmt.RECORD_EMBEDDER, (self._embedder.name,))
                    except psycopg.errors.InsufficientPrivilege:
                        raise MemoryStoreError(
                            f"{self._shown} has no embedder recorded and this role may not record one: open it "
                            "once as the schema owner (`ctxcore memories init`) with the embedder"
                        ) from None
                elif recorded != self._embedder.name:
                    raise MemoryStoreError(
                        f"{self._shown} was built with the embedder {recorded!r}, not {self._embedder.name!r}: "
                        "their embeddings cannot be compared"
                    )

    # ---- properties, closing ---------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """The database, with its password redacted."""
        return self._shown

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
    def token_family(self) -> str:
        """The tokenizer family memory token counts are taken in."""
        return self._family

    @property
    def dimensions(self) -> int | None:
        """The embedding dimension fixed in the schema, once known."""
        return self._dim

    def warm(self, scopes: Iterable[Scope] | None = None) -> int:
        """Open the pool's connections so that no first query pays for them; returns 0
        (the database keeps its own caches: there are no per-scope matrices to load)."""
        self._check_open()
        if scopes is not None:
            for sc in scopes:
                check_scope(sc)
        self._run(self._warm())
        return 0

    async def _warm(self) -> None:
        assert self._pool is not None
        conns = []
        try:
            for _ in range(min(4, self._pool.max_size)):
                conns.append(await self._pool.getconn())
            for conn in conns:
                await self._prepare_reads(conn)
        finally:
            for c in conns:
                await self._pool.putconn(c)

    async def _prepare_reads(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        # Each read statement, run once with `limit` 0 and prepared at once: a connection's
        # first run of a statement loads its catalog caches and plans it (the cold
        # statement's generic plan over the 16 vector partitions: ~20 ms), which a request
        # would otherwise pay on each pooled connection, at whatever call first takes it.
        w = WARM_SCOPE
        q = None if self._dim is None else _vector_text(np.zeros(self._dim, dtype=np.float32))
        for vec, large in [(q, True), (q, False), (None, False)] if q is not None else [(None, False)]:
            await self._cold_rows(conn, w, w, vec, large, [w], 0, 1.0, 1, 1, prepare=True)
        # One hot statement whatever the query vector (a missing one binds the same types).
        await self._hot_rows(conn, w, w, q, 0, prepare=True)

    def close(self) -> None:
        """Write pending ``accessed_at`` times, close the pool and stop the loop. Idempotent."""
        if self._closed:
            return
        try:
            self.flush_accesses()
        except MemoryStoreError as exc:
            _log.warning("could not record read times at close: %s", exc)
        self._closed = True
        self._loop.run(self._close_pool())
        self._loop.stop()

    async def _close_pool(self) -> None:
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            if self._flush_sleeping:
                flusher.cancel()  # nothing in flight: close() has flushed already
            else:
                await asyncio.gather(flusher, return_exceptions=True)  # let a running flush commit
        if self._pool is not None:
            await self._pool.close()

    def __enter__(self) -> PostgresMemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresMemoryStore({self._shown!r}, token_family={self._family!r}, embedder={self._embedder!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise MemoryStoreError(f"the memory store {self._shown!r} is closed")

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        try:
            return self._loop.run(coro)
        except psycopg.Error as exc:
            raise self._error("memory database error", exc) from None

    async def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        self._check_open()
        try:
            return await self._loop.call(coro)
        except psycopg.Error as exc:
            raise self._error("memory database error", exc) from None

    # ---- transactions with a scope -----------------------------------------------------------

    @staticmethod
    async def _set_scope(
        conn: psycopg.AsyncConnection[TupleRow], organization_id: str, agent_id: str | None, admin: bool = False
    ) -> None:
        # Transaction-local (is_local = true): the next transaction on this pooled
        # connection starts with no scope, so it sees nothing until it sets its own.
        await conn.execute(
            stmt.SET_SCOPE,
            (organization_id, agent_id or "", "on" if agent_id is None else "off", "on" if admin else "off"),
        )

    @contextlib.asynccontextmanager
    async def _scoped(
        self, org: str, agent: str | None, *, admin: str | None = None, writes: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled connection inside one transaction of one scope (`agent` None: every
        agent of `org`), or, with `admin` (what it is for, named in the error a role that
        may not gets), of every scope as the schema owner. `writes`: the scope sizes and
        key counts read so far are forgotten first."""
        assert self._pool is not None
        if writes:
            self._forget_counts()
        async with self._pool.connection() as conn:
            async with conn.transaction():
                if admin is not None:
                    await self._as_admin(conn, admin)
                else:
                    await self._set_scope(conn, org, agent)
                yield conn

    def _forget_counts(self) -> None:
        # After a write through this store its scopes' sizes and key counts are read again.
        self._sizes.clear()
        self._key_counts.clear()

    # ---- ingest ------------------------------------------------------------------------------

    def add(self, memory: NewMemory | Mapping[str, Any]) -> str:
        """Store one memory; returns its id.

        Raises:
            InvalidMemory: the memory is not valid, its id is taken, or its embedding's
                dimension differs from the store's.
        """
        return self.add_many([memory])[0]

    def add_many(
        self, memories: Iterable[NewMemory | Mapping[str, Any]], *, directives: Sequence[Directive] = ()
    ) -> list[str]:
        """Store several memories in one transaction: all of them, or none. `directives`
        (set as `set_directive` sets them) join the same transaction.

        Token counts are taken at insert in the store's family (tagged exact or
        estimate); memories without an embedding get one from the embedder, if any.

        Raises:
            InvalidMemory: naming the first bad memory (its `index` and id): invalid
                fields, an id used twice or already stored, or an embedding of another
                dimension than the store's; or a directive PostgreSQL cannot hold.
        """
        self._check_open()
        batch, _ = check_batch(memories, _check_nul)
        if isinstance(directives, Directive) or not all(isinstance(d, Directive) for d in directives):
            raise TypeError("directives must be a sequence of Directive records")
        for d in directives:
            _check_directive_nul(d.organization_id, d.agent_id, d.text)
        if not batch and not directives:
            return []
        if self._embedder_name is None and any(m.embedding is None for m in batch):
            self._run(self._read_recorded())  # an embedder another process recorded since
        counts = self._count([m.text for m in batch])
        exact = exact_json([m.id for m in batch], [m.text for m in batch])
        vectors = [self._vector_of(m) for m in batch]
        dims = {v.size for v in vectors if v is not None}
        for i, v in enumerate(vectors):
            want = self._dim if self._dim is not None else next(iter(dims)) if len(dims) == 1 else None
            if v is not None and want is not None and v.size != want:
                mid = batch[i].id
                raise InvalidMemory(
                    f"memory {mid!r} (index {i}): embedding has {v.size} dimensions, the store's have {want}", i, mid
                )
            if v is not None and v.size > MAX_DIMENSIONS:
                mid = batch[i].id
                raise InvalidMemory(
                    f"memory {mid!r} (index {i}): embedding has {v.size} dimensions; pgvector's HNSW index, "
                    f"which the store searches, takes at most {MAX_DIMENSIONS}",
                    i,
                    mid,
                )
            if v is not None and want is None:  # mixed dimensions in a batch for a store without one
                first = next(u for u in vectors if u is not None)
                mid = batch[i].id
                raise InvalidMemory(
                    f"memory {mid!r} (index {i}): embedding has {v.size} dimensions, the store's have {first.size}",
                    i,
                    mid,
                )
        kind = "exact" if self._exact else "estimate"
        rows = [
            (
                m.id,
                m.organization_id,
                m.agent_id,
                m.text,
                None if v is None else _vector_text(v),  # _ROW_VECTOR
                m.confidence,
                m.importance,
                created,
                m.accessed_at,
                n,
                self._family,
                kind,
                ex,
            )
            for m, created, n, v, ex in zip(batch, created_times(batch, time.time()), counts, vectors, exact)
        ]
        terms = [doc_terms(m.text) for m in batch]
        dim = next(iter(dims)) if dims else None
        try:
            self._run(self._insert(batch, rows, terms, dim, directives))
        finally:
            if directives:  # written or rolled back: either way no cached read stays valid
                self._directives.invalidate()
        self._forget_counts()
        return [m.id for m in batch]

    async def _insert(
        self,
        batch: list[NewMemory],
        rows: list[tuple[Any, ...]],
        terms: list[list[str]],
        dim: int | None,
        directives: Sequence[Directive] = (),
    ) -> None:
        assert self._pool is not None
        by_scope: dict[tuple[str, str], list[int]] = {}
        for i, m in enumerate(batch):
            by_scope.setdefault((m.organization_id, m.agent_id), []).append(i)
        async with self._pool.connection() as conn:
            async with conn.transaction():
                if dim is not None and self._dim is None:
                    await conn.execute(stmt.TAKE_MIGRATION_LOCK, (MIGRATION_LOCK,))
                    stored = await self._meta(conn, "embedding_dim")
                    if stored is None:
                        try:
                            await self._set_dim(conn, dim)
                        except psycopg.errors.InsufficientPrivilege:
                            raise MemoryStoreError(
                                f"{self._shown}: the embedding dimension is not set yet and this role may not set "
                                "it: run `ctxcore memories init --db URL --dimensions N` as the schema owner"
                            ) from None
                        stored = str(dim)
                    self._dim = int(stored)
                    if dim != self._dim:
                        i = next(k for k, r in enumerate(rows) if r[_ROW_VECTOR] is not None)
                        raise InvalidMemory(
                            f"memory {batch[i].id!r} (index {i}): embedding has {dim} dimensions, "
                            f"the store's have {self._dim}",
                            i,
                            batch[i].id,
                        )
                inserted: dict[str, int] = {}
                for (org, agent), idx in by_scope.items():
                    await self._set_scope(conn, org, agent)
                    # One statement per scope: the rows as arrays, inserted in batch order (so
                    # `seq` follows it), a taken id skipped here and named below.
                    cols = list(zip(*(rows[i] for i in idx)))
                    got = {
                        str(r["id"]): int(r["seq"])
                        for r in await _all(conn, stmt.INSERT_MEMORIES, [list(c) for k, c in enumerate(cols) if k != 4])
                    }
                    inserted.update(got)
                    embedded = [(got[batch[i].id], rows[i][4]) for i in idx if batch[i].id in got and rows[i][4]]
                    if embedded:
                        await conn.execute(
                            stmt.INSERT_VECTORS, (org, agent, [e[0] for e in embedded], [e[1] for e in embedded])
                        )
                    await insert_terms(
                        conn, [(got[batch[i].id], org, agent, terms[i]) for i in idx if batch[i].id in got]
                    )
                if len(inserted) != len(batch):
                    # Ids are unique across the whole store; which scope holds a taken id is
                    # not told (row-level security would hide it anyway).
                    first = next(i for i, m in enumerate(batch) if m.id not in inserted)
                    mid = batch[first].id
                    raise InvalidMemory(f"memory {mid!r} (index {first}): id {mid!r} is already stored", first, mid)
                for d in directives:
                    await self._set_scope(conn, d.organization_id, d.agent_id)
                    key = (d.organization_id, ORG_WIDE if d.agent_id is None else d.agent_id)
                    await conn.execute(stmt.UPSERT_DIRECTIVE, (*key, d.text, time.time()))

    def set_directive(self, organization_id: str, agent_id: str | None, text: str | None) -> None:
        """Set (or with ``text=None`` remove) the directive of an organization
        (``agent_id=None``: all its agents) or of one agent."""
        self._check_open()
        Directive(organization_id, agent_id, "-" if text is None else text)  # validates
        _check_directive_nul(organization_id, agent_id, text)
        self._run(self._set_directive(organization_id, agent_id, text))
        self._directives.invalidate()

    async def _set_directive(self, organization_id: str, agent_id: str | None, text: str | None) -> None:
        key = (organization_id, ORG_WIDE if agent_id is None else agent_id)
        async with self._scoped(organization_id, agent_id) as conn:
            if text is None:
                await conn.execute(stmt.DELETE_AGENT_DIRECTIVES, key)
            else:
                await conn.execute(stmt.UPSERT_DIRECTIVE, (*key, text, time.time()))

    def _count(self, texts: list[str]) -> list[int]:
        return stored_token_counts(texts, self._family, exact=self._exact)

    def _vector_of(self, m: NewMemory) -> npt.NDArray[np.float32] | None:
        if m.embedding is not None:
            return np.asarray(m.embedding, dtype=np.float32)
        if self._embedder is not None:
            return embed(self._embedder, m.text)
        return None

    def _query_vector(self, query: Query) -> npt.NDArray[np.float32] | None:
        return self._query_vectors.get(self._embedder, query)

    # ---- retrieval (the MemoryStore protocol) ------------------------------------------------

    async def directive(self, scope: Scope) -> str | None:
        """The organization's directive followed by the agent's (a blank line between),
        or whichever exists, or None. Served from memory for `directive_cache_seconds`,
        then (as in the SQLite store) served at once for up to a minute more while one
        background read refreshes it."""
        check_scope(scope)
        if _holds_nul(scope.organization_id):
            return None
        return await self._directives.fetch(
            scope,
            lambda: self._call(self._directive(scope)),
            lambda: None if self._closed else asyncio.run_coroutine_threadsafe(self._directive(scope), self._loop.loop),
        )

    async def _directive(self, scope: Scope) -> str | None:
        assert self._pool is not None
        # An agent id holding NUL has no directive of its own: the organization's alone.
        agent = None if _holds_nul(None, scope.agent_id) else scope.agent_id
        async with self._pool.connection() as conn:
            async with conn.pipeline(), conn.transaction():  # one round trip
                await self._set_scope(conn, scope.organization_id, agent)
                cur = await conn.execute(
                    stmt.READ_DIRECTIVES, (scope.organization_id, ORG_WIDE, ORG_WIDE if agent is None else agent)
                )
                rows = await cur.fetchall()
        return "\n\n".join(text for (text,) in rows) if rows else None

    async def hot(self, scope: Scope, query: Query, limit: int) -> Sequence[MemoryRecord]:
        """The agent's most recent memories, newest first, at most `limit`; each with its
        cosine similarity to the query when both have an embedding, else None."""
        check_scope(scope)
        check_limit(limit)
        check_query(query)
        if limit == 0 or _holds_nul(scope.organization_id, scope.agent_id):
            return []
        qv = self._query_vector(query)
        if self._knows_too_little(qv, query):
            await self._call(self._read_recorded())
            qv = self._query_vector(query)
        if qv is not None and self._dim is not None and qv.size != self._dim:
            qv = None
        seqs, batch = await self._call(self._hot(scope, qv, limit))
        self._note(scope, seqs)
        return batch

    async def _hot(self, scope: Scope, qv: npt.NDArray[np.float32] | None, limit: int) -> tuple[list[int], MemoryBatch]:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            rows = await self._hot_rows(
                conn, scope.organization_id, scope.agent_id, None if qv is None else _vector_text(qv), limit
            )
        sims = np.clip(
            np.array([np.nan if r[HOT_SIM] is None else r[HOT_SIM] for r in rows], dtype=np.float64), -1.0, 1.0
        )
        return [r[SEQ] for r in rows], rows_to_batch(scope, rows, [MemoryOrigin.HOT] * len(rows), sims)

    async def _hot_rows(
        self,
        conn: psycopg.AsyncConnection[TupleRow],
        org: str,
        agent: str,
        q: str | None,
        limit: int,
        prepare: bool | None = None,
    ) -> list[TupleRow]:
        async with conn.pipeline(), conn.transaction():  # one round trip
            await self._set_scope(conn, org, agent)
            cur = await conn.execute(stmt.HOT, {"q": q, "org": org, "agent": agent, "limit": limit}, prepare=prepare)
            return await cur.fetchall()

    def memories(self, scope: Scope) -> MemoryBatch:
        """Every memory of `scope`, oldest first (ties: first stored first), as a batch
        without similarities: what an evaluation ranks its baselines over
        (``ctxcore eval``). It reads the whole scope; the assembly never calls it."""
        self._check_open()
        check_scope(scope)
        if _holds_nul(scope.organization_id, scope.agent_id):
            return rows_to_batch(scope, [], [], np.empty(0))
        return self._run(self._memories(scope))

    async def _memories(self, scope: Scope) -> MemoryBatch:
        async with self._scoped(scope.organization_id, scope.agent_id) as conn:
            cur = await conn.execute(stmt.SCOPE_MEMORIES, {"org": scope.organization_id, "agent": scope.agent_id})
            rows = await cur.fetchall()
        return rows_to_batch(scope, rows, [MemoryOrigin.HOT] * len(rows), np.full(len(rows), np.nan))

    async def cold(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> Sequence[MemoryRecord]:
        """Each path's ranked list, one entry per memory with both signals: at most
        `limit` vector hits (cosine >= `min_similarity`, best first), then at most `limit`
        full-text hits (BM25 over the query terms a memory holds, its length its count
        of distinct terms; best first, then newest first) the vector path did not return. Every record carries its
        cosine `similarity` where it has an embedding and its `fulltext_score` where full
        text found it; the batch's `reference` holds each signal's mean and standard
        deviation over the scope (the cosine's over its newest 2,000 embeddings at most).

        Full-text search leaves out words found in more than `FTS_MAX_DOC_FRACTION` of the
        scope's memories (stop words) and searches the `FTS_QUERY_TERMS` rarest of the rest.

        Raises:
            MemoryStoreError: the query embedding's dimension differs from the store's.
        """
        check_scope(scope)
        check_limit(limit)
        min_similarity = check_min_similarity(min_similarity)
        check_query(query)
        if limit == 0 or _holds_nul(scope.organization_id, scope.agent_id):
            return []
        qv = self._query_vector(query)
        if self._knows_too_little(qv, query):
            await self._call(self._read_recorded())
            qv = self._query_vector(query)
        if qv is not None and self._dim is not None and qv.size != self._dim:
            raise MemoryStoreError(f"query embedding has {qv.size} dimensions, the store's have {self._dim}")
        terms = self._search_keys(scope, query_keys(fts_terms(query.text)))
        seqs, batch = await self._call(self._cold(scope, qv, terms, limit, min_similarity))
        self._note(scope, seqs)
        return batch

    async def _cold(
        self, scope: Scope, qv: npt.NDArray[np.float32] | None, terms: list[str], limit: int, min_similarity: float
    ) -> tuple[list[int], MemoryBatch]:
        assert self._pool is not None
        org, agent = scope.organization_id, scope.agent_id
        vector = qv is not None and self._dim is not None
        if not vector and not terms:
            return [], rows_to_batch(scope, [], [], np.empty(0))
        async with self._pool.connection() as conn:
            in_scope = await self._scope_size(conn, scope)
            if in_scope == 0:
                return [], rows_to_batch(scope, [], [], np.empty(0))
            cap = int(max(FTS_PRUNE_MIN_DOCS, FTS_MAX_DOC_FRACTION * in_scope))
            # A large scope walks the HNSW index (iterative scans go on until `limit` rows of
            # the scope are found); a small one is scanned exactly off the scope index.
            # Row-level security's settings hide the scope's size from the planner, so the
            # store says which. Both statements go out at once (pipeline mode): the scope and
            # the plan settings, then the whole cold query, one round trip. Once the
            # statement is prepared on a connection (by `warm`, or by psycopg after five
            # runs), its generic plan is reused: planning it was ~0.8 ms of a ~3.5 ms statement, and the scope's
            # partition is chosen at run time.
            large = vector and in_scope >= (HNSW_MIN_SCOPE if self._iterative() else HNSW_MIN_SCOPE_NO_ITERATIVE)
            rows = await self._cold_rows(
                conn,
                org,
                agent,
                _vector_text(qv) if vector and qv is not None else None,
                large,
                terms,
                limit,
                min_similarity,
                cap,
                in_scope,
            )
        found = []
        counts: dict[str, int] = {}
        vector_stats: tuple[float, float] | None = None
        for row in rows:
            if row[COLD_SOURCE] is None:  # a search key's match count (at most cap + 1: a stop word)
                n = int(row[COLD_COUNT])
                counts[terms[int(row[COLD_KEY]) - 1]] = _STOP_WORD if n > cap else n
            elif row[COLD_SOURCE] == COLD_STATS:  # the cosine's mean and standard deviation over the scope
                vector_stats = (float(row[COLD_SIM]), float(row[COLD_SCORE] or 0.0))
            else:
                found.append(row)
        self._note_counts(scope, {**dict.fromkeys(terms, 0), **counts})
        origins = [MemoryOrigin.VECTOR if r[COLD_SOURCE] == COLD_VECTOR_HIT else MemoryOrigin.FULLTEXT for r in found]
        scores = [r[COLD_SCORE] for r in found]
        out = cold_batch(
            scope,
            found,
            origins,
            [r[COLD_SIM] for r in found],
            [None if x is None else max(0.0, float(x)) for x in scores],
            vector_stats=vector_stats,
            text_scores=[float(x) for x in scores if x is not None],
            in_scope=in_scope,
        )
        return [r[SEQ] for r in found], out

    def _iterative(self) -> bool:
        return self._pgvector >= ITERATIVE_SCAN_PGVECTOR

    async def _cold_rows(
        self,
        conn: psycopg.AsyncConnection[TupleRow],
        org: str,
        agent: str,
        q: str | None,
        large: bool,
        terms: list[str],
        limit: int,
        min_similarity: float,
        cap: int,
        in_scope: int,
        prepare: bool | None = None,
    ) -> list[TupleRow]:
        # hnsw.iterative_scan exists from pgvector 0.8 on (setting it before fails the
        # transaction); before, a large scope's walk takes the most candidates allowed.
        if self._iterative():
            ef, settings = str(max(_EF_SEARCH, limit)), stmt.COLD_SETTINGS_ITERATIVE
        else:
            ef, settings = (
                str(_EF_SEARCH_MAX if large else max(_EF_SEARCH, min(limit, _EF_SEARCH_MAX))),
                stmt.COLD_SETTINGS,
            )
        async with conn.pipeline(), conn.transaction():
            await conn.execute(settings, (org, agent, ef, "off" if large else "on", "off" if large else "on"))
            cur = await conn.execute(
                (stmt.COLD_VECTOR_INDEXED if large else stmt.COLD_VECTOR_EXACT)
                if q is not None
                else stmt.COLD_NO_VECTOR,
                {
                    "q": q,
                    "org": org,
                    "agent": agent,
                    "limit": limit,
                    "min": min_similarity,
                    "terms": terms,
                    "cap": cap,
                    "n": float(in_scope),
                    "nterms": FTS_QUERY_TERMS,
                },
                prepare=prepare,
            )
            return await cur.fetchall()

    def _search_keys(self, scope: Scope, keys: list[str]) -> list[str]:
        """The query's search keys worth sending, in query order: not the scope's known
        stop words; every key with no match noted (it may have some by now: the statement
        counts it); and of the keys with a count, only the FTS_QUERY_TERMS rarest. The
        statement then chooses the keys it would choose from all of them, without reading
        the matches of the others."""
        hit = self._key_counts.get(scope)
        if hit is None or time.monotonic() - hit[0] >= SCOPE_SIZE_SECONDS:
            return keys
        known = hit[1]
        live = [k for k in keys if known.get(k, 0) != _STOP_WORD]
        counted = [i for i, k in enumerate(live) if known.get(k, 0) > 0]
        if len(counted) <= FTS_QUERY_TERMS:
            return live
        dropped = set(sorted(counted, key=lambda i: (known[live[i]], i))[FTS_QUERY_TERMS:])
        return [k for i, k in enumerate(live) if i not in dropped]

    def _note_counts(self, scope: Scope, counts: dict[str, int]) -> None:
        # A key's count (and so whether it is a stop word) is reused while the scope's size
        # is (SCOPE_SIZE_SECONDS, or until a write through this store): later queries leave
        # stop words out and send only the rarest keys, without reading their matches again.
        hit = self._key_counts.get(scope)
        now = time.monotonic()
        if hit is not None and now - hit[0] < SCOPE_SIZE_SECONDS:
            hit[1].update(counts)
            return
        if len(self._key_counts) >= SCOPE_CACHE_ENTRIES:
            self._key_counts.clear()
        self._key_counts[scope] = (now, dict(counts))

    async def _scope_size(self, conn: psycopg.AsyncConnection[TupleRow], scope: Scope) -> int:
        # The scope's memory count sets the stop-word threshold and the vector plan; it is
        # re-read at most every SCOPE_SIZE_SECONDS (counting 10,000 rows costs more than a
        # whole cold query), and at once after a write through this store.
        hit = self._sizes.get(scope)
        now = time.monotonic()
        if hit is not None and now - hit[0] < SCOPE_SIZE_SECONDS:
            return hit[1]
        async with conn.transaction():
            await self._set_scope(conn, scope.organization_id, scope.agent_id)
            row = await _one(conn, stmt.SCOPE_SIZE, (scope.organization_id, scope.agent_id))
        n = int(row["n"]) if row else 0
        if n == 0:  # not remembered: another replica's first write there is seen at once
            return 0
        if len(self._sizes) >= SCOPE_CACHE_ENTRIES:
            self._sizes.clear()
        self._sizes[scope] = (now, n)
        return n

    # ---- accessed_at, batched --------------------------------------------------------------

    def _note(self, scope: Scope, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        if not self._reads.note(scope, seqs):
            return  # each was noted within the access resolution
        with self._accessed_lock:
            if self._flusher is None and not self._closed:
                self._loop.loop.call_soon_threadsafe(self._start_flusher)

    def _start_flusher(self) -> None:
        if self._flusher is None and not self._closed:
            self._flusher = self._loop.loop.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        try:
            self._flush_sleeping = True
            await asyncio.sleep(self._flush_every)
            self._flush_sleeping = False
            await self._flush()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.warning("could not record read times: %s", self._error("memory database error", exc))
        finally:
            if self._flusher is asyncio.current_task():
                self._flusher = None
                again = bool(self._reads) and not self._closed
                if again:  # what a failed flush kept, or reads noted while it ran
                    self._start_flusher()

    async def _flush(self) -> int:
        pending = self._reads.take()
        if not pending:
            return 0
        assert self._pool is not None
        n = 0
        scopes = sorted(pending, key=lambda sc: (sc.organization_id, sc.agent_id))
        try:
            async with self._pool.connection() as conn:
                for scope in scopes:
                    seqs = sorted(pending[scope].items())
                    # One transaction per scope, its rows in `seq` order (statements.WRITE_READ_TIMES).
                    async with conn.transaction():
                        await self._set_scope(conn, scope.organization_id, scope.agent_id)
                        cur = await conn.execute(
                            stmt.WRITE_READ_TIMES,
                            ([s for s, _ in seqs], [t for _, t in seqs], scope.organization_id, scope.agent_id),
                        )
                        n += cur.rowcount
                    del pending[scope]
        finally:
            if pending:  # not written (an error): kept for the next flush, never dropped
                self._requeue(pending)
        return n

    def _requeue(self, pending: dict[Scope, dict[int, float]]) -> None:
        self._reads.requeue(pending)
        with self._accessed_lock:
            if self._reads and self._flusher is None and not self._closed:
                self._loop.loop.call_soon_threadsafe(self._start_flusher)

    def flush_accesses(self) -> int:
        """Write the read times noted since the last flush as ``accessed_at`` (one
        statement per scope); returns how many memories were updated. Runs by itself every
        `access_flush_seconds` after a read, and at `close`."""
        if self._closed:
            return 0
        return self._run(self._flush())

    # ---- lifecycle ---------------------------------------------------------------------------

    def delete(self, scope: Scope, ids: Iterable[str]) -> int:
        """Delete the memories of `scope` with these ids; returns how many were deleted
        (ids of other scopes or unknown ones delete nothing). Their rows, embeddings and
        full-text entries are gone for every reader at commit (PostgreSQL's vacuum then
        reclaims the index space)."""
        self._check_open()
        check_scope(scope)
        wanted = check_ids(ids)
        if not wanted or _holds_nul(scope.organization_id, scope.agent_id):
            return 0
        return self._run(
            self._scoped_rowcount(
                scope.organization_id,
                scope.agent_id,
                stmt.DELETE_MEMORIES,
                (scope.organization_id, scope.agent_id, wanted),
            )
        )

    async def _scoped_rowcount(
        self, org: str, agent: str | None, statement: str, params: tuple[Any, ...], *, admin: str | None = None
    ) -> int:
        async with self._scoped(org, agent, admin=admin, writes=True) as conn:
            cur = await conn.execute(statement, params)
            return cur.rowcount

    def forget(self, organization_id: str, agent_id: str | None = None) -> ForgetReport:
        """Delete everything of an agent (or, with ``agent_id=None``, of the whole
        organization): memories (with their embeddings and full-text entries) and
        directives. Returns the counts."""
        self._check_open()
        check_owner(organization_id, agent_id, "forget")
        if _holds_nul(organization_id, agent_id):
            return ForgetReport(0, 0)
        report = self._run(self._forget(organization_id, agent_id))
        self._directives.invalidate()
        return report

    async def _forget(self, org: str, agent: str | None) -> ForgetReport:
        async with self._scoped(org, agent, writes=True) as conn:
            if agent is None:
                m = await conn.execute(stmt.DELETE_ORGANIZATION_MEMORIES, (org,))
                d = await conn.execute(stmt.DELETE_ORGANIZATION_DIRECTIVES, (org,))
            else:
                m = await conn.execute(stmt.DELETE_AGENT_MEMORIES, (org, agent))
                d = await conn.execute(stmt.DELETE_AGENT_DIRECTIVES, (org, agent))
            return ForgetReport(m.rowcount, d.rowcount)

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
        the embedder unless `embedding` is given; without either the stale embedding is
        dropped), confidence, importance or embedding. Returns False when `scope` has no
        such memory.

        Raises:
            InvalidMemory: a new value is invalid (named).
        """
        self._check_open()
        check_scope(scope)
        fields = _check_update(scope, memory_id, text, confidence, importance, embedding)
        if _holds_nul(scope.organization_id, scope.agent_id):
            return False
        new_vec: npt.NDArray[np.float32] | None = None
        sets: list[str] = []
        params: list[Any] = []
        if "embedding" in fields:
            new_vec = np.asarray(fields["embedding"], dtype=np.float32)
        elif "text" in fields and self._embedder is not None:
            new_vec = embed(self._embedder, fields["text"])
        if new_vec is not None and self._dim is None:
            self._run(self._read_recorded(now=True))
        if new_vec is not None and self._dim is not None and new_vec.size != self._dim:
            raise InvalidMemory(
                f"memory {memory_id!r}: embedding has {new_vec.size} dimensions, the store's have {self._dim}",
                -1,
                memory_id,
            )
        if "text" in fields:
            sets.append(stmt.SET_TEXT)
            params += [
                fields["text"],
                self._count([fields["text"]])[0],
                self._family,
                "exact" if self._exact else "estimate",
                exact_json([memory_id], [fields["text"]])[0],
            ]
        # A new text or embedding replaces the stored embedding (none: the stale one goes).
        vector: str | None | bool = False
        if "text" in fields or "embedding" in fields:
            vector = None if new_vec is None else _vector_text(new_vec)
        for name, assignment in (("confidence", stmt.SET_CONFIDENCE), ("importance", stmt.SET_IMPORTANCE)):
            if name in fields:
                sets.append(assignment)
                params.append(fields[name])
        if not sets and vector is False:
            return (
                self._run(
                    self._scoped_rowcount(
                        scope.organization_id,
                        scope.agent_id,
                        stmt.MEMORY_EXISTS,
                        (scope.organization_id, scope.agent_id, memory_id),
                    )
                )
                > 0
            )
        if new_vec is not None and self._dim is None:
            raise MemoryStoreError(
                f"{self._shown}: the embedding dimension is not set yet; add an embedded memory "
                "first or run `ctxcore memories init --dimensions N`"
            )
        # Only the embedding changes: the row is locked (not rewritten) and its seq read back.
        statement = stmt.UPDATE_MEMORY.format(sets=", ".join(sets)) if sets else stmt.LOCK_MEMORY
        return self._run(
            self._update(
                scope,
                statement,
                (*params, scope.organization_id, scope.agent_id, memory_id),
                doc_terms(fields["text"]) if "text" in fields else None,
                vector,
            )
        )

    async def _update(
        self, scope: Scope, statement: str, params: tuple[Any, ...], terms: list[str] | None, vector: str | None | bool
    ) -> bool:
        # `vector`: the new embedding (vector text), None to drop the stored one, False to keep it.
        org, agent = scope.organization_id, scope.agent_id
        async with self._scoped(org, agent) as conn:
            row = await _one(conn, statement, params)
            if row is None:
                return False
            seq = int(row["seq"])
            if vector is not False:
                await conn.execute(stmt.DELETE_VECTOR, (org, agent, seq))
                if vector is not None:
                    await conn.execute(stmt.INSERT_VECTOR, (org, agent, seq, vector))
            if terms is not None:  # a new text: its terms replace the old ones
                await conn.execute(stmt.DELETE_TERMS, (org, agent, seq))
                await insert_terms(conn, [(seq, org, agent, terms)])
            return True

    def expire(self, max_age_seconds: float, *, organization_id: str | None = None, now: float | None = None) -> int:
        """Retention by age: delete memories created more than `max_age_seconds` before
        `now` (default: the current time), of one organization or (as the schema owner)
        of all. Returns how many were deleted."""
        self._check_open()
        cutoff = expiry_cutoff(max_age_seconds, now)
        if organization_id is not None:
            check_owner(organization_id, None, "expire")
            if _holds_nul(organization_id):
                return 0
            return self._run(
                self._scoped_rowcount(organization_id, None, stmt.EXPIRE_ORGANIZATION, (organization_id, cutoff))
            )
        return self._run(self._scoped_rowcount("", None, stmt.EXPIRE_ALL, (cutoff,), admin="retention"))

    async def _as_admin(self, conn: psycopg.AsyncConnection[TupleRow], what: str) -> None:
        # Only the schema owner's admin policy reads across scopes; any other role would
        # silently see nothing, so it is told instead.
        row = await _one(conn, stmt.IS_SCHEMA_OWNER)
        if not row or not row["owner"]:
            raise MemoryStoreError(
                f"{what} across all organizations needs the schema owner's role (row-level security shows this role "
                f"one organization at a time): name an organization, or connect as the owner ({self._shown})"
            )
        await self._set_scope(conn, "", "", admin=True)

    def stats(self, organization_id: str | None = None) -> StoreStats:
        """Memories, embedded memories and stored tokens per scope, and the directive
        count: of one organization, or (as the schema owner, whose admin policy allows
        it) of the whole store.

        Raises:
            MemoryStoreError: whole-store statistics asked for by a role that is not the
                schema owner (row-level security would show it nothing).
        """
        self._check_open()
        if organization_id is not None:
            check_owner(organization_id, None, "stats")
            if _holds_nul(organization_id):
                return StoreStats((), 0)
        return self._run(self._stats(organization_id))

    async def _stats(self, org: str | None) -> StoreStats:
        async with self._scoped(org or "", None, admin="statistics" if org is None else None) as conn:
            mrows = await _all(conn, stmt.SCOPE_STATS)
            drow = await _one(conn, stmt.DIRECTIVE_COUNT)
        scopes = tuple(
            ScopeStats(
                r["organization_id"], r["agent_id"], int(r["memories"]), int(r["embedded"]), int(r["tokens"] or 0)
            )
            for r in mrows
        )
        return StoreStats(scopes, int(drow["n"]) if drow else 0)


def _check_update(
    scope: Scope,
    memory_id: str,
    text: str | None,
    confidence: float | None,
    importance: float | None,
    embedding: Sequence[float] | npt.NDArray[np.float32] | None,
) -> dict[str, Any]:
    """`check_update`'s changes, and a text PostgreSQL can hold."""
    fields = check_update(scope, memory_id, text, confidence, importance, embedding)
    if "\x00" in fields.get("text", ""):
        raise InvalidMemory(
            f"memory {memory_id!r}: text contains NUL (U+0000), which PostgreSQL text cannot hold", -1, memory_id
        )
    return fields
