"""The embedded default memory store: one SQLite file (stdlib ``sqlite3``, WAL).

`SqliteMemoryStore` serves the three retrieval branches of an assembly (directive, hot
memory, cold memory) from one database file and takes memories in through `add`,
`add_many` and `set_directive`. Hot retrieval is the agent's most recent memories off an
index. Cold retrieval is two paths merged: cosine similarity over the scope's stored
embeddings, computed with numpy on an in-memory float32 matrix per scope (kept up to date
incrementally, checked against a per-scope write counter in the database, so writes by
other processes are seen too), with the ANN cutoff ``min_similarity`` applied *before*
any row is read back; and FTS5 full-text hits, which carry no cosine score (relevance =
the full-text sentinel 0.5). User text reaches FTS5 only as quoted terms, so it can never
become query syntax. Every statement is parameterized and every read is restricted to one
organization *and* agent. Queries run on a small pool of reader threads, one connection
each; a cancelled query is interrupted (``Connection.interrupt``), not left to finish.

The package is split by concern: `schema` (layout, migrations, connections), `fulltext`
(FTS5 terms, MATCH expressions, document frequencies, the search), `vectors` (the
per-scope embedding matrices and the cosine search), `readers` (the reader threads),
`hot` (the caches of recent rows), `directives` (directive reads and writes), `ingest`
(inserting and removing memories) and `store` (`SqliteMemoryStore`). What it shares with
the PostgreSQL store (records and their checks, text and full-text terms, the embedder
contract, query vectors, the fusion of the cold paths, the directive cache, read times)
comes from the shared modules of `ctxcore.stores`; it never imports the PostgreSQL store.
"""

from __future__ import annotations

# The settings both stores share are defined once, in the shared layer
# (`ctxcore.stores.text`, `.directives`, `.reads`, `.counting`), and named here too.
from ..counting import DEFAULT_TOKEN_FAMILY
from ..directives import DIRECTIVE_CACHE_SECONDS
from ..reads import ACCESS_FLUSH_SECONDS
from ..text import FTS_MAX_DOC_FRACTION, FTS_PRUNE_MIN_DOCS, FTS_QUERY_TERMS, MAX_FTS_TERMS
from .fulltext import fts_match_expression
from .ingest import OnConflict
from .readers import DEFAULT_READERS
from .schema import SCHEMA_VERSION
from .store import SqliteMemoryStore
from .vectors import DEFAULT_CACHE_BYTES

__all__ = [
    "ACCESS_FLUSH_SECONDS",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_READERS",
    "DEFAULT_TOKEN_FAMILY",
    "DIRECTIVE_CACHE_SECONDS",
    "FTS_MAX_DOC_FRACTION",
    "FTS_PRUNE_MIN_DOCS",
    "FTS_QUERY_TERMS",
    "MAX_FTS_TERMS",
    "OnConflict",
    "SCHEMA_VERSION",
    "SqliteMemoryStore",
    "fts_match_expression",
]
