"""The memory store many machines share: PostgreSQL with pgvector and full-text search.

`PostgresMemoryStore` implements `ctxcore.memory.MemoryStore` (and the lifecycle of
`ctxcore.memory.MemoryLifecycle`) with the same semantics as `SqliteMemoryStore`, on one
database that any number of ``ctxcore serve`` replicas read and write:

- cold retrieval merges pgvector hits (cosine distance, an HNSW index; the ANN cutoff
  ``min_similarity`` is applied in SQL to the scope's nearest rows before any row is
  hydrated) with full-text hits (a term table on a b-tree holding the same normalized
  words as the SQLite store's FTS5 index, CJK characters one word each, and pairs of
  adjacent CJK characters; relevance = the 0.5 full-text sentinel), in one statement.
  A b-tree on text equality, unlike a ``tsvector`` match on GIN, stays usable under
  row-level security (its operator is leakproof). User text only reaches the database as
  bound parameters, never as query syntax;
- hot retrieval is the agent's newest memories off an index;
- directives per organization and agent, with the same short in-memory cache;
- every statement is parameterized and filtered by organization *and* agent, and the
  tables carry row-level security policies on the organization and agent as a second
  wall: every transaction sets its scope (``set_config(..., true)``), so even a query
  that forgot its ``WHERE`` cannot read another tenant. ``FORCE ROW LEVEL SECURITY``
  makes the policies bind the table owner too;
- versioned, idempotent migrations (``ctxcore_migrations``), applied under an advisory
  lock by `migrate` (``ctxcore memories init --db postgresql://...``) or on first open.

Connections come from psycopg 3's `AsyncConnectionPool`, run on the store's own event
loop thread, so the store serves any caller's loop (and ``asyncio.run`` called many
times) and its blocking ingest methods work from plain threads. Credentials come from the
URL, the ``PG*`` environment variables or a password file (libpq's own rules); they are
never logged: `redact_dsn` removes them from every repr, log line and error message.

psycopg is an optional dependency (``pip install 'ctxcore-llm[postgres]'``); SQLite-only users
never import it.

The package is split by concern: `statements` (the SQL text of every statement the store
runs), `schema` (the versioned migrations, row-level security, grants, the vectors'
partitions), `terms` (the term table's search keys), `dsn` (connection strings and their
redaction), `loop` (the store's own event loop thread) and `store`
(`PostgresMemoryStore`). What it shares with the SQLite store comes from the shared
modules of `ctxcore.stores`; it never imports the SQLite store.
"""

from __future__ import annotations

try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "PostgresMemoryStore needs psycopg 3 and psycopg_pool: pip install 'ctxcore-llm[postgres]'"
    ) from _exc

from ..reads import ACCESS_FLUSH_SECONDS
from ..urls import is_postgres_url
from .dsn import redact_dsn
from .schema import MIGRATIONS, PG_SCHEMA_VERSION, VECTOR_PARTITIONS
from .store import (
    DEFAULT_POOL_SIZE,
    DIMENSION_RECHECK_SECONDS,
    HNSW_MIN_SCOPE,
    HNSW_MIN_SCOPE_NO_ITERATIVE,
    ITERATIVE_SCAN_PGVECTOR,
    MAX_DIMENSIONS,
    MIN_PGVECTOR,
    SCOPE_SIZE_SECONDS,
    PostgresMemoryStore,
    UnsupportedPgvector,
)
from .terms import TERM_MAX_BYTES

__all__ = [
    "ACCESS_FLUSH_SECONDS",
    "DEFAULT_POOL_SIZE",
    "DIMENSION_RECHECK_SECONDS",
    "HNSW_MIN_SCOPE",
    "HNSW_MIN_SCOPE_NO_ITERATIVE",
    "ITERATIVE_SCAN_PGVECTOR",
    "MAX_DIMENSIONS",
    "MIGRATIONS",
    "MIN_PGVECTOR",
    "PG_SCHEMA_VERSION",
    "SCOPE_SIZE_SECONDS",
    "TERM_MAX_BYTES",
    "VECTOR_PARTITIONS",
    "PostgresMemoryStore",
    "UnsupportedPgvector",
    "is_postgres_url",
    "redact_dsn",
]
