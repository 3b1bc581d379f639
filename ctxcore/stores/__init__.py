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

from .embedding import DEFAULT_EMBEDDING_DIM, Embedder, HashingEmbedder
from .errors import InvalidMemory, MemoryServiceError, MemoryStoreError
from .ingest import DEMO_DATASET, IngestReport, ingest_jsonl, load_demo, read_jsonl
from .records import Directive, NewMemory
from .sqlite import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_READERS,
    DEFAULT_TOKEN_FAMILY,
    DIRECTIVE_CACHE_SECONDS,
    MAX_FTS_TERMS,
    SCHEMA_VERSION,
    SqliteMemoryStore,
    fts_match_expression,
)

if TYPE_CHECKING:
    from .http import HttpMemorySource

__all__ = [
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
    "HashingEmbedder",
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
    # HttpMemorySource needs httpx (the `http` extra): imported on first use only.
    if name == "HttpMemorySource":
        from .._extras import require

        require("http", "ctxcore.stores.HttpMemorySource")
        from .http import HttpMemorySource

        globals()[name] = HttpMemorySource
        return HttpMemorySource
    raise AttributeError(f"module 'ctxcore.stores' has no attribute {name!r}")
