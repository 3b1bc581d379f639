"""Memory stores: where the hot and cold retrieval branches get their memories.

`SqliteMemoryStore` is the embedded default (one SQLite file, WAL, FTS5, cosine over
stored embeddings with the ANN cutoff applied before hydration); `HttpMemorySource` is a
client for a memory service speaking the JSON wire of ``docs/memory-service-wire.md``.
Both implement `ctxcore.memory.MemoryStore`, so ``Sources.from_store(store)`` gives an
assembly its three branches. `HashingEmbedder` provides offline lexical embeddings (any
model wrapped as an `Embedder` can take its place);
`load_demo` builds the demo database from the dataset shipped in the package.
`HttpMemorySource` loads on first use and needs the ``http`` extra (httpx), so SQLite-only
users never import it.
`PostgresMemoryStore` (``ctxcore.stores.postgres``) is the store many machines share:
PostgreSQL with pgvector, full-text search and row-level security; it needs the
``postgres`` extra (psycopg 3), imported only when first used. `open_store` opens either
store from a ``--db`` value (a SQLite path or a ``postgresql://`` URL).

Both stores sit on one shared layer and never import each other (pyproject.toml's
import contracts): `records` (what goes in, and the checks of a batch, a delete, an
update), `text` (normalisation, full-text terms and thresholds), `embedding` and
`embedders` (the embedder contract, `embed`), `query_vectors`, `fusion` (how a cold read
merges its vector and full-text paths), `directives` (the directive cache), `reads`
(read times written as ``accessed_at``), `counting` (stored token counts) and `errors`.

>>> import asyncio, tempfile, os
>>> from ctxcore.memory import Query, Scope
>>> store = SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db"), embedder=HashingEmbedder())
>>> store.add_many([
...     {"id": "m1", "organization_id": "acme", "agent_id": "support", "text": "Refunds are accepted within 30 days."},
...     {"id": "m2", "organization_id": "other", "agent_id": "support", "text": "Refunds within 90 days."},
... ])
['m1', 'm2']
>>> [(r.id, r.origin.value) for r in asyncio.run(store.cold(Scope("acme", "support"), Query("refunds"), 5, 0.7))]
[('m1', 'fulltext')]
>>> store.close()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .counting import DEFAULT_TOKEN_FAMILY
from .directives import DIRECTIVE_CACHE_SECONDS
from .embedders import (
    EmbedderError,
    OnnxMiniLMEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    WordLlamaEmbedder,
    default_embedder,
    embedder_from_name,
)
from .embedding import DEFAULT_EMBEDDING_DIM, Embedder, HashingEmbedder
from .errors import InvalidMemory, MemoryServiceError, MemoryStoreError
from .ingest import DEMO_DATASET, IngestReport, ingest_jsonl, load_demo, read_jsonl
from .records import Directive, NewMemory
from .sqlite import DEFAULT_CACHE_BYTES, DEFAULT_READERS, SCHEMA_VERSION, SqliteMemoryStore, fts_match_expression
from .text import MAX_FTS_TERMS
from .urls import is_postgres_url

if TYPE_CHECKING:
    from .http import HttpMemorySource
    from .postgres import PostgresMemoryStore

__all__ = [
    "PostgresMemoryStore",
    "is_postgres_url",
    "open_store",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_EMBEDDING_DIM",
    "DEFAULT_READERS",
    "DEFAULT_TOKEN_FAMILY",
    "DEMO_DATASET",
    "DIRECTIVE_CACHE_SECONDS",
    "MAX_FTS_TERMS",
    "SCHEMA_VERSION",
    "Directive",
    "Embedder",
    "EmbedderError",
    "HashingEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "WordLlamaEmbedder",
    "OnnxMiniLMEmbedder",
    "default_embedder",
    "embedder_from_name",
    "HttpMemorySource",
    "IngestReport",
    "InvalidMemory",
    "MemoryServiceError",
    "MemoryStoreError",
    "NewMemory",
    "SqliteMemoryStore",
    "fts_match_expression",
    "ingest_jsonl",
    "load_demo",
    "read_jsonl",
]


def __getattr__(name: str) -> Any:
    # HttpMemorySource needs httpx (the `http` extra), PostgresMemoryStore psycopg (the
    # `postgres` extra): each is imported on first use only, so SQLite-only users need neither.
    from .._extras import require

    if name == "HttpMemorySource":
        require("http", "ctxcore.stores.HttpMemorySource")
        from .http import HttpMemorySource

        globals()[name] = HttpMemorySource
        return HttpMemorySource
    if name == "PostgresMemoryStore":
        require("postgres", "ctxcore.stores.PostgresMemoryStore")
        from .postgres import PostgresMemoryStore

        globals()[name] = PostgresMemoryStore
        return PostgresMemoryStore
    raise AttributeError(f"module 'ctxcore.stores' has no attribute {name!r}")


def open_store(db: str, **kwargs: Any) -> SqliteMemoryStore | PostgresMemoryStore:
    """The memory store `db` names: a `PostgresMemoryStore` for a ``postgresql://`` URL,
    else a `SqliteMemoryStore` at that path. `kwargs` go to the store's constructor.

    >>> import tempfile, os
    >>> with open_store(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
    ...     type(s).__name__
    'SqliteMemoryStore'
    """
    if is_postgres_url(db):
        cls = __getattr__("PostgresMemoryStore")
        return cls(db, **kwargs)  # type: ignore[no-any-return]
    return SqliteMemoryStore(db, **kwargs)
