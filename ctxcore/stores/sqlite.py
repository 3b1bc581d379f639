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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import sqlite3
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from ..memory import ForgetReport, MemoryOrigin, MemoryRecord, Query, Scope, ScopeStats, StoreStats
from ..tokens import count_tokens, estimate_tokens, estimate_tokens_batch, estimator_families, exact_families
from ._text import cjk_spaced, normalize, raw_words
from .embedding import Embedder, HashingEmbedder
from .counting import count_memory_tokens
from .errors import InvalidMemory, MemoryStoreError
from .records import Directive, NewMemory

#: What `SqliteMemoryStore.add_many` does with an id that is already stored.
OnConflict = Literal["error", "skip", "replace"]

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_READERS",
    "DEFAULT_TOKEN_FAMILY",
    "DIRECTIVE_CACHE_SECONDS",
    "FTS_MAX_DOC_FRACTION",
    "FTS_PRUNE_MIN_DOCS",
    "FTS_QUERY_TERMS",
    "MAX_FTS_TERMS",
    "SCHEMA_VERSION",
    "SqliteMemoryStore",
    "fts_match_expression",
]

#: Version of the database layout this code writes (``PRAGMA user_version``). Version 2
#: added ``memories.exact_tokens``: the exact token counts of each memory as the formatter
#: emits it, per tokenizer family (JSON object); a version 1 file is migrated when opened
#: (the column is added, empty) and ``ctxcore memories recount --db PATH`` fills it.
SCHEMA_VERSION = 2
#: Tokenizer family memories are counted in when the store is not told otherwise: the one
#: with an exact tokenizer shipped offline (``ctxcore.exact_families()``).
DEFAULT_TOKEN_FAMILY = "cl100k_base"
#: Reader threads (and connections). Two of the three retrieval branches read the store
#: at once per assembly; four leaves room for a second assembly in flight.
DEFAULT_READERS = 4
#: Upper bound on the in-memory embedding matrices, all scopes together: 1 GiB holds
#: ~700k memories of 384 float32 dimensions. Least recently used scopes go first.
DEFAULT_CACHE_BYTES = 1 << 30
#: At most this many distinct query terms go into a full-text query, so a long query text
#: cannot make one arbitrarily expensive.
MAX_FTS_TERMS = 32
#: A query term found in more than this fraction of all memories says little about any of
#: them (function words: "to", "the", "der", "的") and is left out of the full-text query;
#: every hit it alone would bring carries the 0.5 relevance sentinel, which passes the
#: relevance floor. 3% removes the function words of the shipped demo dataset (258
#: memories, seven languages) and of the 100k benchmark corpus while keeping topic words
#: such as "refund" (2.3% of the benchmark corpus).
FTS_MAX_DOC_FRACTION = 0.03
#: Terms are pruned only when they are in more than this many memories, so a small store
#: keeps its terms.
FTS_PRUNE_MIN_DOCS = 8
#: Full-text retrieval searches the query's rarest this-many informative terms. Each is
#: one indexed query that stops after `limit` rows (~0.1-0.5 ms), so this bounds the cost.
FTS_QUERY_TERMS = 8
# Document-frequency cache: entries are re-read once the store has grown by this factor,
# and the cache is emptied beyond this many terms.
_DF_CACHE_GROWTH = 1.1
_DF_CACHE_TERMS = 100_000
#: Reads note the memories they return; their ``accessed_at`` is written in one batch at
#: most this long after (never a write per request on the hot path).
ACCESS_FLUSH_SECONDS = 1.0
#: Seconds a directive read from the database is served from memory. The directive branch
#: has 5 ms (the design's default) and directives change rarely: a cached one costs no
#: thread hop. Directives set through this store are seen at once; set by another
#: process, within this time.
DIRECTIVE_CACHE_SECONDS = 1.0
# Directive cache entries kept before the cache is emptied.
_DIRECTIVE_CACHE_SCOPES = 100_000
# How long a writer waits for another writer's lock before giving up (ms).
_BUSY_TIMEOUT_MS = 5000
# Key of an organization-wide directive: Scope forbids empty agent ids, so no agent's own
# directive can collide with it.
_ORG_WIDE = ""

_CJK_SPLIT = re.compile(
    "([\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]+)"
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS memories (
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    organization_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    text TEXT NOT NULL,
    embedding BLOB,
    confidence REAL NOT NULL CHECK (confidence BETWEEN 0 AND 1),
    importance REAL CHECK (importance BETWEEN 0 AND 1),
    created_at REAL NOT NULL,
    accessed_at REAL,
    token_count INTEGER NOT NULL CHECK (token_count >= 0),
    token_family TEXT NOT NULL,
    token_kind TEXT NOT NULL CHECK (token_kind IN ('exact', 'estimate')),
    exact_tokens TEXT
);
CREATE INDEX IF NOT EXISTS memories_scope ON memories (organization_id, agent_id);
CREATE INDEX IF NOT EXISTS memories_recent ON memories (organization_id, agent_id, created_at);
CREATE TABLE IF NOT EXISTS scopes (
    organization_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    memories INTEGER NOT NULL,
    embedded INTEGER NOT NULL,
    PRIMARY KEY (organization_id, agent_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS directives (
    organization_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    text TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (organization_id, agent_id)
) WITHOUT ROWID;
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
    scope, body, tokenize = 'unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE IF NOT EXISTS memories_vocab USING fts5vocab(memories_fts, 'row');
"""

_COLUMNS = (
    "rowid, id, organization_id, agent_id, text, confidence, importance, created_at, accessed_at, "
    "token_count, token_family, token_kind, exact_tokens"
)

# Migrations from each older version to the next, run in the same transaction as the check.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE memories ADD COLUMN exact_tokens TEXT",),
}

_T = TypeVar("_T")


def _scope_token(organization_id: str, agent_id: str) -> str:
    # One FTS5 token per scope (hex: letters and digits only), so a full-text query is
    # intersected with its scope inside the index instead of ranking every scope's hits.
    digest = hashlib.sha256(f"{organization_id}\x00{agent_id}".encode()).hexdigest()
    return "s" + digest[:40]


def _fts_body(text: str) -> str:
    return cjk_spaced(normalize(text))


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def _strip_diacritics(token: str) -> str:
    # What the unicode61 tokenizer's remove_diacritics does, near enough to look a term
    # up in the FTS5 vocabulary (a miss only costs the pruning of that one term).
    return "".join(c for c in unicodedata.normalize("NFKD", token) if not unicodedata.combining(c))


def _fts_terms(text: str) -> list[tuple[str, ...]]:
    """The distinct full-text terms of `text` (at most `MAX_FTS_TERMS`), each as the
    tokens of one phrase: a word, or two consecutive CJK characters."""
    terms: dict[tuple[str, ...], None] = {}
    for run in raw_words(normalize(text)):
        for piece in _CJK_SPLIT.split(run):
            if not piece:
                continue
            if _CJK_SPLIT.fullmatch(piece):
                grams = [(piece,)] if len(piece) == 1 else [(piece[i], piece[i + 1]) for i in range(len(piece) - 1)]
                for g in grams:
                    terms.setdefault(g, None)
            else:
                terms.setdefault((piece,), None)
            if len(terms) >= MAX_FTS_TERMS:
                return list(terms)
    return list(terms)


def _fts_expression(scope: Scope, terms: Sequence[tuple[str, ...]]) -> str:
    body = " OR ".join(_quote(" ".join(t)) for t in terms)
    return f"scope : {_quote(_scope_token(scope.organization_id, scope.agent_id))} AND body : ({body})"


def fts_match_expression(scope: Scope, text: str) -> str | None:
    """The FTS5 MATCH expression for a full-text query of `text` within `scope`, before
    the store leaves out its uninformative terms.

    Every word of `text` becomes a quoted FTS5 string (so no user text is ever read as
    FTS5 syntax: operators, column filters, prefixes and parentheses are just characters
    that the tokenizer drops), the words are OR-ed, and the expression is intersected
    with the scope's token. CJK runs become overlapping two-character phrases. At most
    `MAX_FTS_TERMS` distinct terms are used. None when `text` has no words.

    >>> fts_match_expression(Scope("o", "a"), 'refund" OR body:x*').split(" AND ")[1]
    'body : ("refund" OR "or" OR "body" OR "x")'
    >>> fts_match_expression(Scope("o", "a"), "返金ポリシー").split(" AND ")[1]
    'body : ("返 金" OR "金 ポ" OR "ポ リ" OR "リ シ" OR "シ ー")'
    >>> fts_match_expression(Scope("o", "a"), "?!") is None
    True
    """
    terms = _fts_terms(text)
    return _fts_expression(scope, terms) if terms else None


@dataclass(frozen=True, slots=True)
class _Matrix:
    """A scope's embeddings as of `version`: the first `n` rows of the buffers are valid
    and never written again (appends go past `n`, or into new buffers)."""

    version: int
    n: int
    rowids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]

    @property
    def nbytes(self) -> int:
        return int(self.rowids.nbytes + self.vectors.nbytes)


class _Cancelled(Exception):
    pass


class _Job:
    """One query on a reader thread; `cancel` interrupts it from the event loop's thread."""

    __slots__ = ("cancelled", "conn", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: sqlite3.Connection | None = None
        self.cancelled = False

    def check(self) -> None:
        if self.cancelled:
            raise _Cancelled

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


class SqliteMemoryStore:
    """A memory store in one SQLite database file; implements `ctxcore.memory.MemoryStore`.

    Args:
        path: the database file; created (with its directory entry) if missing.
        embedder: computes embeddings for memories stored without one and for queries
            without one (e.g. `HashingEmbedder`). Its `name` is recorded in the database,
            and opening it later with a different embedder raises `MemoryStoreError`;
            opening it with None uses the recorded `HashingEmbedder`, if that is one.
        token_family: the tokenizer family memory token counts are taken in: exact where
            ``ctxcore.count_tokens`` has that family, else ``ctxcore.estimate_tokens``;
            every count is stored with its family and kind.
        readers: reader threads (one connection each) that async queries run on.
        cache_bytes: bound on the in-memory embedding matrices (least recently used
            scopes are dropped first).
        directive_cache_seconds: how long a directive is served from memory (0: always
            read); directives set through this store are seen at once regardless.

    The ingest methods (`add`, `add_many`, `set_directive`) block; from async code call
    them through ``asyncio.to_thread``. `close` (or ``with``) releases the threads and
    connections.

    >>> import asyncio, tempfile, os
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
    ) -> None:
        self._path = os.fspath(path)
        if self._path in ("", ":memory:") or self._path.startswith("file:"):
            raise ValueError(f"SqliteMemoryStore needs a database file path, got {self._path!r}")
        if not isinstance(token_family, str) or token_family not in estimator_families():
            raise ValueError(
                f"unknown token_family {token_family!r}; known: {', '.join(estimator_families())}"
            )
        if isinstance(readers, bool) or not isinstance(readers, int) or readers < 1:
            raise ValueError(f"readers must be an int >= 1, got {readers!r}")
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be an int >= 0, got {cache_bytes!r}")
        if (
            isinstance(directive_cache_seconds, bool)
            or not isinstance(directive_cache_seconds, (int, float))
            or not 0 <= directive_cache_seconds < float("inf")
        ):
            raise ValueError(f"directive_cache_seconds must be a number >= 0, got {directive_cache_seconds!r}")
        self._directive_ttl = float(directive_cache_seconds)
        self._directives: dict[Scope, tuple[float, str | None]] = {}
        self._directive_generation = 0
        if embedder is not None and not isinstance(embedder, Embedder):
            raise TypeError(f"embedder must have a name and an embed(text) method, got {type(embedder).__name__}")
        self._embedder: Embedder | None = embedder
        self._family = token_family
        self._exact = token_family in exact_families()
        self._cache_bytes = cache_bytes
        self._cache: OrderedDict[Scope, _Matrix] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._build_locks: dict[Scope, threading.Lock] = {}
        self._interrupted = 0
        self._df_cache: dict[str, tuple[int, int]] = {}
        self._closed = False
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._writer = self._connect()
        try:
            self._writer.execute("PRAGMA journal_mode = WAL")
            self._writer.execute("PRAGMA synchronous = NORMAL")
            self._init_schema()
        except sqlite3.Error as exc:
            self._writer.close()
            raise MemoryStoreError(f"{self._path} is not a usable memory database: {exc}") from exc
        except BaseException:
            self._writer.close()
            raise
        self._executor = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="ctxcore-sqlite")
        try:
            self._open_readers(readers)
        except BaseException:
            self.close()
            raise

    def _open_readers(self, readers: int) -> None:
        # Start every reader thread with its connection now, so that the first queries
        # (under a 5 ms directive timeout) do not pay for threads and connections.
        barrier = threading.Barrier(readers)

        def start() -> None:
            self._reader()
            barrier.wait(timeout=10)

        for f in [self._executor.submit(start) for _ in range(readers)]:
            f.result()

    # ---- connections and schema --------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; writes say BEGIN themselves.
        # check_same_thread=False: `close` and `Job.cancel` touch connections from another
        # thread; each connection still runs statements on one thread at a time.
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise MemoryStoreError(f"cannot open memory database {self._path!r}: {exc}") from exc
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        return conn

    def _init_schema(self) -> None:
        conn = self._writer
        with self._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                (version,) = conn.execute("PRAGMA user_version").fetchone()
                if version > SCHEMA_VERSION:
                    raise MemoryStoreError(
                        f"{self._path}: database schema version {version} is newer than this ctxcore "
                        f"understands ({SCHEMA_VERSION}); upgrade ctxcore"
                    )
                if version == 0:
                    # One statement at a time: executescript would commit the transaction.
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                while 0 < version < SCHEMA_VERSION:
                    for statement in _MIGRATIONS[version]:
                        conn.execute(statement)
                    version += 1
                    conn.execute(f"PRAGMA user_version = {version}")
                row = conn.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
                if self._embedder is None and row is not None:
                    # Opened without an embedder: use the one the database was built with,
                    # when it is one ctxcore can rebuild (queries then get embeddings too).
                    self._embedder = HashingEmbedder.from_name(row[0])
                elif self._embedder is not None:
                    if row is None:
                        conn.execute("INSERT INTO meta VALUES ('embedder', ?)", (self._embedder.name,))
                    elif row[0] != self._embedder.name:
                        raise MemoryStoreError(
                            f"{self._path} was built with the embedder {row[0]!r}, not {self._embedder.name!r}: "
                            "their embeddings cannot be compared"
                        )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only = ON")  # readers never write, whatever they run
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    @property
    def embedder(self) -> Embedder | None:
        """The embedder for memories and queries that come without an embedding."""
        return self._embedder

    @property
    def token_family(self) -> str:
        """The tokenizer family memory token counts are taken in."""
        return self._family

    @property
    def interrupted_queries(self) -> int:
        """How many running queries were interrupted because their caller cancelled."""
        return self._interrupted

    def warm(self, scopes: Iterable[Scope] | None = None) -> int:
        """Load the embedding matrices of `scopes` (default: every scope with embeddings,
        as far as the cache holds them) so that no cold query pays for it; returns how
        many scopes were loaded. Blocks.

        >>> import tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.warm()
        0
        """
        self._check_open()
        conn = self._reader()
        if scopes is None:
            rows = conn.execute("SELECT organization_id, agent_id FROM scopes WHERE embedded > 0").fetchall()
            targets = [Scope(o, a) for o, a in rows]
        else:
            targets = list(scopes)
            for sc in targets:
                _check_scope(sc)
        loaded = 0
        for sc in targets:
            if self._matrix(conn, _Job(), sc) is not None:
                loaded += 1
        return loaded

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
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
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
        if isinstance(memories, (str, bytes, Mapping, NewMemory)):
            raise TypeError("add_many takes an iterable of memories; use add for one")
        batch: list[NewMemory] = []
        seen: dict[str, int] = {}
        for i, m in enumerate(memories):
            try:
                mem = m if isinstance(m, NewMemory) else NewMemory.from_mapping(m)
            except InvalidMemory as exc:
                raise InvalidMemory(_at_index(str(exc), i), i, exc.memory_id) from None
            if mem.id in seen:
                raise InvalidMemory(f"memory {mem.id!r} (index {i}): id {mem.id!r} is used twice in this batch", i, mem.id)
            seen[mem.id] = i
            batch.append(mem)
        if not all(isinstance(d, Directive) for d in directives):
            raise TypeError("directives must be Directive records")
        if on_conflict not in ("error", "skip", "replace"):
            raise ValueError(f"on_conflict must be 'error', 'skip' or 'replace', got {on_conflict!r}")
        if not batch and not directives:
            return []
        counts: list[int] = []
        exact: list[str | None] = []
        vectors: list[npt.NDArray[np.float32] | None] = []
        for lo in range(0, len(batch), _PROGRESS_CHUNK):
            part = batch[lo : lo + _PROGRESS_CHUNK]
            texts = [m.text for m in part]
            counts += self._count(texts)
            exact += _exact_json([m.id for m in part], texts)
            vectors += self._vectors(part)
            if progress is not None:
                progress(len(part))
        now = time.time()
        with self._write_lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                taken = conn.execute(
                    "SELECT id FROM memories WHERE id IN (SELECT value FROM json_each(?))",
                    (json.dumps(list(seen)),),
                ).fetchall()
                if taken and on_conflict == "error":
                    first = min(seen[r[0]] for r in taken)
                    mid = batch[first].id
                    raise InvalidMemory(f"memory {mid!r} (index {first}): id {mid!r} is already stored", first, mid)
                if taken and on_conflict == "skip":
                    keep = [i for i, m in enumerate(batch) if m.id not in {r[0] for r in taken}]
                    batch, counts, vectors = [batch[i] for i in keep], [counts[i] for i in keep], [vectors[i] for i in keep]
                    exact = [exact[i] for i in keep]
                elif taken:
                    _delete_memories(conn, [r[0] for r in taken])
                dim = _stored_dim(conn)
                for i, v in enumerate(vectors):
                    if v is None:
                        continue
                    if dim is None:
                        dim = v.size
                        conn.execute("INSERT INTO meta VALUES ('embedding_dim', ?)", (str(dim),))
                    elif v.size != dim:
                        mid = batch[i].id
                        raise InvalidMemory(
                            f"memory {mid!r} (index {i}): embedding has {v.size} dimensions, "
                            f"the store's have {dim}", i, mid)
                kind = "exact" if self._exact else "estimate"
                bumps: dict[tuple[str, str], list[int]] = {}
                for m, n_tokens, v, ex in zip(batch, counts, vectors, exact):
                    cur = conn.execute(
                        "INSERT INTO memories (id, organization_id, agent_id, text, embedding, confidence, "
                        "importance, created_at, accessed_at, token_count, token_family, token_kind, exact_tokens) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (m.id, m.organization_id, m.agent_id, m.text, None if v is None else v.tobytes(),
                         m.confidence, m.importance, now if m.created_at is None else m.created_at,
                         m.accessed_at, n_tokens, self._family, kind, ex),
                    )
                    conn.execute(
                        "INSERT INTO memories_fts (rowid, scope, body) VALUES (?, ?, ?)",
                        (cur.lastrowid, _scope_token(m.organization_id, m.agent_id), _fts_body(m.text)),
                    )
                    b = bumps.setdefault((m.organization_id, m.agent_id), [0, 0])
                    b[0] += 1
                    b[1] += v is not None
                conn.executemany(
                    "INSERT INTO scopes (organization_id, agent_id, version, memories, embedded) "
                    "VALUES (?, ?, 1, ?, ?) ON CONFLICT (organization_id, agent_id) DO UPDATE SET "
                    "version = version + 1, memories = memories + excluded.memories, "
                    "embedded = embedded + excluded.embedded",
                    [(o, a, n, e) for (o, a), (n, e) in bumps.items()],
                )
                for d in directives:
                    self._write_directive(d.organization_id, d.agent_id, d.text)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                if directives:  # written or rolled back: either way no cached read stays valid
                    self._directive_generation += 1
                    self._directives.clear()
        return [m.id for m in batch]

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
            self._write_directive(organization_id, agent_id, text)
            # After the write: a read that began before it will not be cached (its
            # generation is older), and every read from now on sees the new text.
            self._directive_generation += 1
            self._directives.clear()

    def _write_directive(self, organization_id: str, agent_id: str | None, text: str | None) -> None:
        """Write one directive on the writer connection (the write lock held)."""
        key = (organization_id, _ORG_WIDE if agent_id is None else agent_id)
        if text is None:
            self._writer.execute("DELETE FROM directives WHERE organization_id = ? AND agent_id = ?", key)
        else:
            self._writer.execute(
                "INSERT INTO directives VALUES (?, ?, ?, ?) ON CONFLICT (organization_id, agent_id) "
                "DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
                (*key, text, time.time()),
            )

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
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            updated += len(params)

    def _count(self, texts: list[str]) -> list[int]:
        if self._exact:
            return [count_tokens(t, self._family).value for t in texts]
        return [int(x) for x in estimate_tokens_batch(texts, self._family).tolist()]

    def _vectors(self, batch: Sequence[NewMemory]) -> list[npt.NDArray[np.float32] | None]:
        out: list[npt.NDArray[np.float32] | None] = []
        for m in batch:
            if m.embedding is not None:
                out.append(np.asarray(m.embedding, dtype=np.float32))
            elif self._embedder is not None:
                out.append(self._embed(m.text))  # None for a featureless text: no direction
            else:
                out.append(None)
        return out

    def _embed(self, text: str) -> npt.NDArray[np.float32] | None:
        assert self._embedder is not None
        v = np.asarray(self._embedder.embed(text), dtype=np.float64)
        if v.ndim != 1 or v.size == 0 or not np.isfinite(v).all():
            raise MemoryStoreError(
                f"embedder {self._embedder.name!r} returned {v.shape} values, not a 1-D vector of finite numbers"
            )
        norm = float(np.sqrt(v @ v))
        return None if norm == 0.0 else (v / norm).astype(np.float32)

    def _check_open(self) -> None:
        if self._closed:
            raise MemoryStoreError(f"the memory store {self._path!r} is closed")

    # ---- retrieval (the MemoryStore protocol) --------------------------------------------

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        self._check_open()
        job = _Job()
        fut = asyncio.get_running_loop().run_in_executor(self._executor, self._in_thread, job, fn, args)
        try:
            return await fut
        except asyncio.CancelledError:
            if job.cancel():
                self._interrupted += 1
            raise

    def _in_thread(self, job: _Job, fn: Callable[..., _T], args: tuple[Any, ...]) -> _T:
        conn = self._reader()
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

    async def directive(self, scope: Scope) -> str | None:
        """The organization's directive followed by the agent's (a blank line between),
        or whichever exists, or None.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     s.set_directive("acme", "support", "Be brief.")
        ...     asyncio.run(s.directive(Scope("acme", "support"))), asyncio.run(s.directive(Scope("acme", "sales")))
        ('Be brief.', None)
        """
        _check_scope(scope)
        now = time.monotonic()
        hit = self._directives.get(scope)
        if hit is not None and now - hit[0] < self._directive_ttl:
            return hit[1]
        generation = self._directive_generation
        value = await self._run(self._directive_job, scope)
        if generation == self._directive_generation:  # no set_directive meanwhile
            if len(self._directives) >= _DIRECTIVE_CACHE_SCOPES:
                self._directives.clear()
            self._directives[scope] = (now, value)
        return value

    async def hot(self, scope: Scope, query: Query, limit: int) -> Sequence[MemoryRecord]:
        """The agent's most recent memories, newest first, at most `limit`. Each carries
        its cosine similarity to the query when both have an embedding, else None.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add_many([NewMemory(f"m{k}", "o", "a", f"note {k}", created_at=k) for k in range(5)])
        ...     [r.id for r in asyncio.run(s.hot(Scope("o", "a"), Query(""), 2))]
        ['m4', 'm3']
        """
        _check_scope(scope)
        _check_limit(limit)
        _check_query(query)
        out = await self._run(self._hot_job, scope, query, limit)
        self._note_access(scope, out)
        return out

    async def cold(
        self, scope: Scope, query: Query, limit: int, min_similarity: float
    ) -> Sequence[MemoryRecord]:
        """Vector hits (cosine >= `min_similarity`, best first) and full-text hits
        (similarity None; memories holding more and rarer query words first, then newest
        first), taken in turn from each path, one entry per memory, at most `limit`. The
        `rank` of each record is its position in the result.

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
        _check_scope(scope)
        _check_limit(limit)
        if isinstance(min_similarity, bool) or not isinstance(min_similarity, (int, float)) or not (
            -1.0 <= min_similarity <= 1.0
        ):
            raise ValueError(f"min_similarity must be a number in [-1, 1], got {min_similarity!r}")
        _check_query(query)
        out = await self._run(self._cold_job, scope, query, limit, float(min_similarity))
        self._note_access(scope, out)
        return out

    def _query_vector(self, query: Query) -> npt.NDArray[np.float32] | None:
        if query.embedding is not None:
            v = np.asarray(query.embedding, dtype=np.float64)
            norm = float(np.sqrt(v @ v))
            return None if norm == 0.0 else (v / norm).astype(np.float32)
        if self._embedder is not None and query.text:
            return self._embed(query.text)
        return None

    def _directive_job(self, conn: sqlite3.Connection, job: _Job, scope: Scope) -> str | None:
        rows = conn.execute(
            "SELECT text FROM directives WHERE organization_id = ? AND agent_id IN (?, ?) "
            "ORDER BY agent_id",  # '' (the organization's) sorts first
            (scope.organization_id, _ORG_WIDE, scope.agent_id),
        ).fetchall()
        return "\n\n".join(r[0] for r in rows) if rows else None

    def _hot_job(self, conn: sqlite3.Connection, job: _Job, scope: Scope, query: Query, limit: int) -> list[MemoryRecord]:
        if limit == 0:
            return []
        rows = conn.execute(
            f"SELECT {_COLUMNS}, embedding FROM memories WHERE organization_id = ? AND agent_id = ? "
            "ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (scope.organization_id, scope.agent_id, limit),
        ).fetchall()
        qv = self._query_vector(query)
        out: list[MemoryRecord] = []
        for rank, row in enumerate(rows):
            sim = None
            blob = row[-1]
            if qv is not None and blob is not None:
                v = np.frombuffer(blob, dtype=np.float32)
                if v.size == qv.size:
                    sim = _clip(float(v @ qv))
            out.append(_record(row, MemoryOrigin.HOT, sim, rank))
        return out

    def _cold_job(
        self,
        conn: sqlite3.Connection,
        job: _Job,
        scope: Scope,
        query: Query,
        limit: int,
        min_similarity: float,
    ) -> list[MemoryRecord]:
        if limit == 0:
            return []
        qv = self._query_vector(query)
        vector_hits: list[tuple[int, float]] = []
        if qv is not None:
            mat = self._matrix(conn, job, scope)
            if mat is not None and mat.n:
                if mat.vectors.shape[1] != qv.size:
                    raise MemoryStoreError(
                        f"query embedding has {qv.size} dimensions, the store's have {mat.vectors.shape[1]}"
                    )
                # The ANN cutoff, before anything is read back from the database. einsum,
                # not `@`: BLAS splits a matrix-vector product over threads, and on a
                # busy machine waking them costs more than the product (measured 12 ms
                # against 0.4 ms for 10k x 256 with two loaded cores).
                sims = np.einsum("ij,j->i", mat.vectors[: mat.n], qv)
                idx = np.flatnonzero(sims >= min_similarity)
                if idx.size > limit:
                    idx = idx[np.argpartition(-sims[idx], limit - 1)[:limit]]
                rowids = mat.rowids[idx]
                order = np.lexsort((rowids, -sims[idx]))
                vector_hits = [(int(rowids[k]), float(sims[idx[k]])) for k in order]
        job.check()
        text_hits = self._fulltext(conn, job, scope, query.text, limit)
        # Take from each path in turn so neither starves the other; a memory found by both
        # keeps its vector entry (it has a real similarity).
        merged: list[tuple[int, float | None]] = []
        seen: set[int] = set()
        vector_ids = {rid for rid, _ in vector_hits}
        for k in range(max(len(vector_hits), len(text_hits))):
            for rid, sim in (
                (vector_hits[k] if k < len(vector_hits) else (None, None)),
                ((text_hits[k], None) if k < len(text_hits) else (None, None)),
            ):
                if rid is None or rid in seen or (sim is None and rid in vector_ids):
                    continue
                seen.add(rid)
                merged.append((rid, sim))
        merged = merged[:limit]
        if not merged:
            return []
        job.check()
        rows = {
            row[0]: row
            for row in conn.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE rowid IN (SELECT value FROM json_each(?)) "
                "AND organization_id = ? AND agent_id = ?",
                (json.dumps([rid for rid, _ in merged]), scope.organization_id, scope.agent_id),
            ).fetchall()
        }
        out: list[MemoryRecord] = []
        for rid, sim in merged:
            row = rows.get(rid)
            if row is None:  # not of this scope (never expected) or gone since: not returned
                continue
            origin = MemoryOrigin.FULLTEXT if sim is None else MemoryOrigin.VECTOR
            out.append(_record(row, origin, None if sim is None else _clip(sim), len(out)))
        return out

    def _fulltext(self, conn: sqlite3.Connection, job: _Job, scope: Scope, text: str, limit: int) -> list[int]:
        terms = _fts_terms(text)
        if not terms:
            return []
        counts = conn.execute(
            "SELECT (SELECT memories FROM scopes WHERE organization_id = ? AND agent_id = ?), "
            "(SELECT sum(memories) FROM scopes)",
            (scope.organization_id, scope.agent_id),
        ).fetchone()
        in_scope, total = int(counts[0] or 0), int(counts[1] or 0)
        if in_scope == 0:
            return []
        keys = {tok: _strip_diacritics(tok) for t in terms for tok in t}
        df = self._doc_frequencies(conn, set(keys.values()), total)
        cap = max(FTS_PRUNE_MIN_DOCS, FTS_MAX_DOC_FRACTION * total)
        # A phrase is in no more memories than its rarest token.
        by_rarity = sorted((min(df[keys[tok]] for tok in t), k) for k, t in enumerate(terms))
        # Terms no memory holds are skipped: they would only take the place of one that finds
        # something.
        chosen = [(d, terms[k]) for d, k in by_rarity if 0 < d <= cap][:FTS_QUERY_TERMS]
        # One query per term, newest matches first: FTS5 stops after `limit` rows, where a
        # single OR query ranked by bm25 would score every match of every term in the whole
        # table first. A memory scores the IDF of each chosen term it holds.
        scores: dict[int, float] = {}
        for d, term in chosen:
            job.check()
            idf = math.log(1.0 + total / (d + 1.0))
            for (rowid,) in conn.execute(
                "SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? ORDER BY rowid DESC LIMIT ?",
                (_fts_expression(scope, [term]), limit),
            ).fetchall():
                scores[rowid] = scores.get(rowid, 0.0) + idf
        return sorted(scores, key=lambda r: (-scores[r], -r))[:limit]

    def _doc_frequencies(self, conn: sqlite3.Connection, tokens: set[str], total: int) -> dict[str, int]:
        # How many memories (all scopes) hold each token. Looking a token up in the FTS5
        # vocabulary reads its whole doclist (~1 ms for a stop word at 100k memories), so
        # counts are cached until the store has grown by a tenth since they were read.
        # Absent tokens are not cached (a miss is a cheap probe, and a memory added later
        # may hold the token).
        out: dict[str, int] = {}
        missing = []
        for tok in tokens:
            hit = self._df_cache.get(tok)
            if hit is not None and total <= hit[1] * _DF_CACHE_GROWTH:
                out[tok] = hit[0]
            else:
                missing.append(tok)
        if missing:
            found = dict(
                conn.execute(
                    "SELECT term, doc FROM memories_vocab WHERE term IN (SELECT value FROM json_each(?))",
                    (json.dumps(sorted(missing), ensure_ascii=False),),
                ).fetchall()
            )
            if len(self._df_cache) + len(missing) > _DF_CACHE_TERMS:
                self._df_cache.clear()
            for tok in missing:
                out[tok] = int(found.get(tok, 0))
                if out[tok]:
                    self._df_cache[tok] = (out[tok], total)
        return out

    def _matrix(self, conn: sqlite3.Connection, job: _Job, scope: Scope) -> _Matrix | None:
        with self._cache_lock:
            cached = self._cache.get(scope)
            lock = self._build_locks.setdefault(scope, threading.Lock())
        with lock:
            # One read transaction: the write counter and the rows are one snapshot.
            conn.execute("BEGIN")
            try:
                row = conn.execute(
                    "SELECT version, embedded FROM scopes WHERE organization_id = ? AND agent_id = ?",
                    (scope.organization_id, scope.agent_id),
                ).fetchone()
                if row is None:
                    return None
                version, embedded = int(row[0]), int(row[1])
                with self._cache_lock:
                    cached = self._cache.get(scope)
                if cached is not None and cached.version == version:
                    with self._cache_lock:
                        if scope in self._cache:
                            self._cache.move_to_end(scope)
                    return cached
                job.check()
                since = int(cached.rowids[cached.n - 1]) if cached is not None and cached.n else 0
                fresh = _load(conn, scope, since)
                if cached is not None and cached.n + len(fresh[0]) == embedded:
                    mat = _append(cached, version, *fresh)
                else:  # not a pure append (or nothing cached): rebuild the scope
                    rowids, blobs = fresh if cached is None else _load(conn, scope, 0)
                    mat = _append(None, version, rowids, blobs)
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")
            with self._cache_lock:
                self._cache[scope] = mat
                self._cache.move_to_end(scope)
                total = sum(m.nbytes for m in self._cache.values())
                while total > self._cache_bytes and len(self._cache) > 1:
                    _, dropped = self._cache.popitem(last=False)
                    total -= dropped.nbytes
                if total > self._cache_bytes:
                    self._cache.clear()
            return mat

    # ---- lifecycle (ctxcore.memory.MemoryLifecycle) ----------------------------------------

    def _access_state(self) -> tuple[threading.Lock, dict[Scope, dict[str, float]]]:
        state: tuple[threading.Lock, dict[Scope, dict[str, float]]] | None = self.__dict__.get("_access")
        if state is None:
            with self._cache_lock:
                state = self.__dict__.setdefault("_access", (threading.Lock(), {}))
        return state

    def _note_access(self, scope: Scope, found: Sequence[MemoryRecord]) -> None:
        # Reads only note what they returned; `flush_accesses` writes the times in one
        # statement per scope, from a timer thread, at most every ACCESS_FLUSH_SECONDS.
        if not found:
            return
        lock, pending = self._access_state()
        now = time.time()
        with lock:
            mine = pending.setdefault(scope, {})
            for r in found:
                mine[r.id] = now
            if self.__dict__.get("_access_timer") is None and not self._closed:
                timer = threading.Timer(ACCESS_FLUSH_SECONDS, self._flush_from_timer)
                timer.daemon = True
                self.__dict__["_access_timer"] = timer
                timer.start()

    def _flush_from_timer(self) -> None:
        lock, _ = self._access_state()
        with lock:
            self.__dict__["_access_timer"] = None
        try:
            self.flush_accesses()
        except (sqlite3.Error, MemoryStoreError):
            pass  # the database is busy or closing: the times are lost, nothing else

    def _flush_at_close(self) -> None:
        lock, _ = self._access_state()
        with lock:
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
        statement per scope); returns how many memories were updated. Runs by itself at
        most `ACCESS_FLUSH_SECONDS` after a read, and at `close`.

        >>> import asyncio, tempfile, os
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
        ...     _ = s.add(NewMemory("m1", "o", "a", "tea"))
        ...     _ = asyncio.run(s.hot(Scope("o", "a"), Query(""), 5))
        ...     s.flush_accesses(), asyncio.run(s.hot(Scope("o", "a"), Query(""), 5))[0].accessed_at is not None
        (1, True)
        """
        if self._closed:
            return 0
        lock, pending = self._access_state()
        with lock:
            batch = dict(pending)
            pending.clear()
        if not batch:
            return 0
        n = 0
        with self._write_lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                for scope, times in batch.items():
                    cur = conn.executemany(
                        "UPDATE memories SET accessed_at = max(coalesce(accessed_at, 0), ?) "
                        "WHERE id = ? AND organization_id = ? AND agent_id = ?",
                        [(at, mid, scope.organization_id, scope.agent_id) for mid, at in times.items()],
                    )
                    n += cur.rowcount
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return n

    def _remove_rows(self, conn: sqlite3.Connection, rows: Sequence[tuple[int, str, str, int]]) -> None:
        # rows: (rowid, organization_id, agent_id, has_embedding). The scope's write counter
        # moves and its counts drop, so every process's embedding matrix of the scope is
        # rebuilt (its cached rows + new rows no longer add up to the stored count).
        ids = json.dumps([r[0] for r in rows])
        conn.execute("DELETE FROM memories_fts WHERE rowid IN (SELECT value FROM json_each(?))", (ids,))
        conn.execute("DELETE FROM memories WHERE rowid IN (SELECT value FROM json_each(?))", (ids,))
        drops: dict[tuple[str, str], list[int]] = {}
        for _, org, agent, emb in rows:
            d = drops.setdefault((org, agent), [0, 0])
            d[0] += 1
            d[1] += bool(emb)
        conn.executemany(
            "UPDATE scopes SET version = version + 1, memories = memories - ?, embedded = embedded - ? "
            "WHERE organization_id = ? AND agent_id = ?",
            [(n, e, o, a) for (o, a), (n, e) in drops.items()],
        )

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        self._check_open()
        with self._write_lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        with self._cache_lock:
            self._df_cache.clear()
        return out

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
        _check_scope(scope)
        if isinstance(ids, (str, bytes)):
            raise TypeError("ids must be an iterable of ids, not one str")
        wanted = list(ids)
        for i in wanted:
            if not isinstance(i, str) or not i:
                raise ValueError(f"memory ids must be non-empty str, got {i!r:.80}")
        if not wanted:
            return 0

        def run(conn: sqlite3.Connection) -> int:
            rows = conn.execute(
                "SELECT rowid, organization_id, agent_id, embedding IS NOT NULL FROM memories "
                "WHERE id IN (SELECT value FROM json_each(?)) AND organization_id = ? AND agent_id = ?",
                (json.dumps(wanted), scope.organization_id, scope.agent_id),
            ).fetchall()
            self._remove_rows(conn, rows)
            return len(rows)

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
        Directive(organization_id, agent_id, "-")  # validates the ids

        def run(conn: sqlite3.Connection) -> ForgetReport:
            args: tuple[str, ...]
            if agent_id is None:
                where, args = "organization_id = ?", (organization_id,)
            else:
                where, args = "organization_id = ? AND agent_id = ?", (organization_id, agent_id)
            rows = conn.execute(
                f"SELECT rowid, organization_id, agent_id, embedding IS NOT NULL FROM memories WHERE {where}", args
            ).fetchall()
            self._remove_rows(conn, rows)
            d = conn.execute(f"DELETE FROM directives WHERE {where}", args).rowcount
            return ForgetReport(len(rows), d)

        report = self._write(run)
        self._directive_generation += 1
        self._directives.clear()
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
        _check_scope(scope)
        if not isinstance(memory_id, str) or not memory_id:
            raise ValueError(f"memory_id must be a non-empty str, got {memory_id!r:.80}")
        probe = NewMemory(memory_id, scope.organization_id, scope.agent_id, "-" if text is None else text,
                          embedding=embedding, confidence=1.0 if confidence is None else confidence,
                          importance=importance)
        new_vec: npt.NDArray[np.float32] | None = None
        if embedding is not None:
            new_vec = np.asarray(probe.embedding, dtype=np.float32)
        elif text is not None and self._embedder is not None:
            new_vec = self._embed(text)
        n_tokens = self._count([text])[0] if text is not None else None
        new_exact = _exact_json([memory_id], [text])[0] if text is not None else None

        def run(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT rowid, text, embedding, confidence, importance, created_at, accessed_at, token_count, "
                "token_family, token_kind, exact_tokens FROM memories "
                "WHERE id = ? AND organization_id = ? AND agent_id = ?",
                (memory_id, scope.organization_id, scope.agent_id),
            ).fetchone()
            if row is None:
                return False
            rowid, old_text, blob, conf, imp, created, accessed, tokens, family, kind, exact_json = row
            if new_vec is not None:
                dim = _stored_dim(conn)
                if dim is not None and new_vec.size != dim:
                    raise InvalidMemory(f"memory {memory_id!r}: embedding has {new_vec.size} dimensions, the store's "
                                        f"have {dim}", -1, memory_id)
                if dim is None:
                    conn.execute("INSERT INTO meta VALUES ('embedding_dim', ?)", (str(new_vec.size),))
            if text is not None or embedding is not None:
                blob = None if new_vec is None else new_vec.tobytes()
            if text is not None:
                old_text, tokens, family, kind = text, n_tokens, self._family, "exact" if self._exact else "estimate"
                exact_json = new_exact
            if confidence is not None:
                conf = probe.confidence
            if importance is not None:
                imp = probe.importance
            # A new rowid: the row leaves every cached embedding matrix of the scope (they
            # are rebuilt), and its new vector is read like any new memory's.
            self._remove_rows(conn, [(rowid, scope.organization_id, scope.agent_id, row[2] is not None)])
            cur = conn.execute(
                "INSERT INTO memories (id, organization_id, agent_id, text, embedding, confidence, importance, "
                "created_at, accessed_at, token_count, token_family, token_kind, exact_tokens) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (memory_id, scope.organization_id, scope.agent_id, old_text, blob, conf, imp, created, accessed,
                 tokens, family, kind, exact_json),
            )
            conn.execute(
                "INSERT INTO memories_fts (rowid, scope, body) VALUES (?, ?, ?)",
                (cur.lastrowid, _scope_token(scope.organization_id, scope.agent_id), _fts_body(old_text)),
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
        if isinstance(max_age_seconds, bool) or not isinstance(max_age_seconds, (int, float)) or not (
            0 <= max_age_seconds < float("inf")
        ):
            raise ValueError(f"max_age_seconds must be a finite number >= 0, got {max_age_seconds!r}")
        if organization_id is not None:
            Directive(organization_id, None, "-")
        cutoff = (time.time() if now is None else float(now)) - float(max_age_seconds)

        def run(conn: sqlite3.Connection) -> int:
            args: tuple[float | str, ...]
            if organization_id is None:
                where, args = "created_at < ?", (cutoff,)
            else:
                where, args = "created_at < ? AND organization_id = ?", (cutoff, organization_id)
            rows = conn.execute(
                f"SELECT rowid, organization_id, agent_id, embedding IS NOT NULL FROM memories WHERE {where}", args
            ).fetchall()
            self._remove_rows(conn, rows)
            return len(rows)

        return self._write(run)

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
            Directive(organization_id, None, "-")
        where, args = ("", ()) if organization_id is None else ("WHERE organization_id = ?", (organization_id,))
        conn = self._reader()
        rows = conn.execute(
            "SELECT organization_id, agent_id, count(*), count(embedding), sum(token_count) FROM memories "
            f"{where} GROUP BY organization_id, agent_id ORDER BY organization_id, agent_id", args
        ).fetchall()
        (directives,) = conn.execute(f"SELECT count(*) FROM directives {where}", args).fetchone()
        return StoreStats(tuple(ScopeStats(o, a, int(n), int(e), int(t or 0)) for o, a, n, e, t in rows),
                          int(directives))


def _load(conn: sqlite3.Connection, scope: Scope, since: int) -> tuple[list[int], list[bytes]]:
    rows = conn.execute(
        "SELECT rowid, embedding FROM memories WHERE organization_id = ? AND agent_id = ? AND rowid > ? "
        "AND embedding IS NOT NULL ORDER BY rowid",
        (scope.organization_id, scope.agent_id, since),
    ).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


def _append(base: _Matrix | None, version: int, rowids: list[int], blobs: list[bytes]) -> _Matrix:
    k = len(rowids)
    if k == 0 and base is not None:
        return _Matrix(version, base.n, base.rowids, base.vectors)
    if base is not None and base.n == 0:
        base = None  # an empty matrix (e.g. after a forget) has no dimension to append to
    dim = len(blobs[0]) // 4 if k else 0
    new_vecs = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(k, dim)
    n = base.n if base is not None else 0
    if base is not None and n + k <= base.rowids.size:
        # Room left: write past row n, which no published snapshot reads.
        base.rowids[n : n + k] = rowids
        base.vectors[n : n + k] = new_vecs
        return _Matrix(version, n + k, base.rowids, base.vectors)
    capacity = max(n + k, 2 * n)  # doubling: appending one memory at a time stays linear
    ids = np.empty(capacity, dtype=np.int64)
    vecs = np.empty((capacity, dim), dtype=np.float32)
    if base is not None:
        ids[:n] = base.rowids[:n]
        vecs[:n] = base.vectors[:n]
    ids[n : n + k] = rowids
    vecs[n : n + k] = new_vecs
    return _Matrix(version, n + k, ids, vecs)


def _stored_dim(conn: sqlite3.Connection) -> int | None:
    row = conn.execute("SELECT value FROM meta WHERE key = 'embedding_dim'").fetchone()
    return None if row is None else int(row[0])


def _exact_json(ids: list[str], texts: list[str]) -> list[str | None]:
    """Each memory's exact counts in every installed exact family, as the JSON stored in
    ``memories.exact_tokens`` (None when no exact family is installed)."""
    fams = exact_families()
    if not fams:
        return [None] * len(ids)
    counts = {f: c.tolist() for f, c in count_memory_tokens(ids, texts, fams).items()}
    return [
        json.dumps({f: counts[f][k] for f in fams}, separators=(",", ":"), sort_keys=True) for k in range(len(ids))
    ]


def _record(row: Sequence[Any], origin: MemoryOrigin, similarity: float | None, rank: int) -> MemoryRecord:
    return MemoryRecord(
        id=row[1],
        organization_id=row[2],
        agent_id=row[3],
        text=row[4],
        origin=origin,
        similarity=similarity,
        confidence=row[5],
        importance=row[6],
        created_at=row[7],
        accessed_at=row[8],
        rank=rank,
        token_count=row[9],
        token_family=row[10],
        token_kind=row[11],
        exact_tokens=json.loads(row[12]) if row[12] else None,
    )


def _clip(x: float) -> float:
    # float32 rounding can put a unit vector's cosine with itself a hair past 1.
    return min(1.0, max(-1.0, x))


def _check_scope(scope: object) -> None:
    if not isinstance(scope, Scope):
        raise TypeError(f"scope must be a ctxcore Scope, got {type(scope).__name__}")


def _check_query(query: object) -> None:
    if not isinstance(query, Query):
        raise TypeError(f"query must be a ctxcore Query, got {type(query).__name__}")


def _check_limit(limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int >= 0, got {limit!r}")


def _at_index(message: str, index: int) -> str:
    # "memory 'x': ..." -> "memory 'x' (index 3): ..."
    head, sep, tail = message.partition(": ")
    if sep and head.startswith("memory") and "(index" not in head:
        return f"{head} (index {index}): {tail}"
    return f"memory (index {index}): {message}"


#: Memories prepared (counted, embedded) between two progress reports of `add_many`.
_PROGRESS_CHUNK = 512


def _delete_memories(conn: sqlite3.Connection, ids: Sequence[str]) -> None:
    """Delete stored memories (inside the caller's transaction), their full-text rows and
    their share of the scope counters; the scope version moves so caches reload."""
    rows = conn.execute(
        "SELECT rowid, organization_id, agent_id, embedding IS NOT NULL FROM memories "
        "WHERE id IN (SELECT value FROM json_each(?))",
        (json.dumps(list(ids)),),
    ).fetchall()
    conn.executemany("DELETE FROM memories_fts WHERE rowid = ?", [(r[0],) for r in rows])
    conn.executemany("DELETE FROM memories WHERE rowid = ?", [(r[0],) for r in rows])
    conn.executemany(
        "UPDATE scopes SET version = version + 1, memories = memories - 1, embedded = embedded - ? "
        "WHERE organization_id = ? AND agent_id = ?",
        [(int(r[3]), r[1], r[2]) for r in rows],
    )
