"""The SQLite store's database layout: the tables, the migrations from older files, and
how a connection is opened and the schema checked or created on it."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from ...memory import Scope
from ..embedders import embedder_from_name
from ..embedding import Embedder
from ..errors import MemoryStoreError
from .fulltext import FTS_TOKENIZER, fts_body

__all__ = [
    "ACCESSED_AT_SQL",
    "BUSY_TIMEOUT_MS",
    "EMBEDDING_GENERATION",
    "MEMORY_COLUMNS",
    "MEMORY_FROM",
    "SCHEMA_VERSION",
    "check_not_foreign",
    "connect",
    "embedding_generation",
    "init_schema",
    "scope_version",
    "stored_dim",
]

#: Version of the database layout this code writes (``PRAGMA user_version``). Version 2
#: added ``memories.exact_tokens``: the exact token counts of each memory as the formatter
#: emits it, per tokenizer family (JSON object); a version 1 file is migrated when opened
#: (the column is added, empty) and ``ctxcore memories recount --db PATH`` fills it.
#: The read times the store writes are kept in ``memory_reads``, one narrow row per memory
#: id, so a read time costs a few bytes of write instead of a rewrite of the memory's row
#: (text and embedding); a memory's ``accessed_at`` is the later of its own (given at
#: ingest) and its read row's. The table is created when a file is opened: older versions
#: of ctxcore still open the file (they read and write ``memories.accessed_at`` only).
#: Version 3 indexes every word under its scope (``memory_words``: each word prefixed with
#: the scope's tag; ctxcore.stores.sqlite.fulltext) in place of ``memories_fts``, which
#: indexed words and scopes apart; a version 2 file is re-indexed when opened (~7 s per
#: 100,000 memories, once) and older versions of ctxcore refuse a version 3 file.
#: Version 4 indexes words in their searched form (English words stemmed,
#: `ctxcore.stores.text.search_word`); a version 3 file is re-indexed when opened.
SCHEMA_VERSION = 4
#: How long a writer waits for another writer's lock before giving up (ms).
BUSY_TIMEOUT_MS = 5000
# How long opening a file waits for another process that holds the write lock to set up or
# migrate the schema (re-indexing a million memories takes about a minute and a half).
_SCHEMA_WAIT_MS = 300_000

_log = logging.getLogger("ctxcore.stores.sqlite")

_READS_TABLE = """CREATE TABLE IF NOT EXISTS memory_reads (
    id TEXT PRIMARY KEY,
    accessed_at REAL NOT NULL
) WITHOUT ROWID"""

_WORDS_TABLE = f"""CREATE VIRTUAL TABLE IF NOT EXISTS memory_words USING fts5(
    body, tokenize = '{FTS_TOKENIZER}', columnsize = 0
)"""
_WORDS_VOCAB = "CREATE VIRTUAL TABLE IF NOT EXISTS memory_words_vocab USING fts5vocab(memory_words, 'row')"

_SCHEMA = f"""
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
{_READS_TABLE};
{_WORDS_TABLE};
{_WORDS_VOCAB};
"""

#: A memory's ``accessed_at``: the later of the ingest-time value and the read row's.
ACCESSED_AT_SQL = (
    "coalesce(max(memories.accessed_at, memory_reads.accessed_at), memories.accessed_at, memory_reads.accessed_at)"
)
#: The memories with their read rows: what `MEMORY_COLUMNS` reads from.
MEMORY_FROM = "memories LEFT JOIN memory_reads ON memory_reads.id = memories.id"
#: A memory as read back, in the order of `ctxcore.stores.records.STORED_COLUMNS`.
MEMORY_COLUMNS = (
    "memories.rowid, memories.id, organization_id, agent_id, text, confidence, importance, created_at, "
    f"{ACCESSED_AT_SQL}, token_count, token_family, token_kind, exact_tokens"
)


def _index_words(conn: sqlite3.Connection) -> None:
    """Version 2 to 3: every memory's words indexed under its scope (`memory_words`), and
    the table that indexed words and scopes apart dropped."""
    (n,) = conn.execute("SELECT count(*) FROM memories").fetchone()
    _log.info("indexing the words of %d memories under their scopes (schema version 2 -> 3)", n)
    conn.execute(_WORDS_TABLE)
    conn.execute(_WORDS_VOCAB)
    cur = conn.execute("SELECT rowid, organization_id, agent_id, text FROM memories")
    while rows := cur.fetchmany(4096):
        conn.executemany(
            "INSERT INTO memory_words (rowid, body) VALUES (?, ?)",
            [(rowid, fts_body(org, agent, text)) for rowid, org, agent, text in rows],
        )
    conn.execute("DROP TABLE IF EXISTS memories_vocab")
    conn.execute("DROP TABLE IF EXISTS memories_fts")


def _restem_words(conn: sqlite3.Connection) -> None:
    """Version 3 to 4: every memory's words indexed again in their searched form."""
    (n,) = conn.execute("SELECT count(*) FROM memories").fetchone()
    _log.info("indexing the words of %d memories in their searched form (schema version 3 -> 4)", n)
    conn.execute("DELETE FROM memory_words")
    cur = conn.execute("SELECT rowid, organization_id, agent_id, text FROM memories")
    while rows := cur.fetchmany(4096):
        conn.executemany(
            "INSERT INTO memory_words (rowid, body) VALUES (?, ?)",
            [(rowid, fts_body(org, agent, text)) for rowid, org, agent, text in rows],
        )


# Migrations from each older version to the next, run in the same transaction as the check:
# SQL statements, or a function of the connection.
_MIGRATIONS: dict[int, tuple[str | Callable[[sqlite3.Connection], None], ...]] = {
    1: ("ALTER TABLE memories ADD COLUMN exact_tokens TEXT",),
    2: (_index_words,),
    3: (_restem_words,),
}


def connect(path: str) -> sqlite3.Connection:
    """A connection to the database file `path`, with no implicit transactions."""
    # isolation_level=None: no implicit transactions; writes say BEGIN themselves.
    # check_same_thread=False: `close` and `Job.cancel` touch connections from another
    # thread; each connection still runs statements on one thread at a time.
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise MemoryStoreError(f"cannot open memory database {path!r}: {exc}") from exc
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def check_not_foreign(conn: sqlite3.Connection, path: str) -> None:
    """Raise `MemoryStoreError` when the file at `path` is a SQLite database of something
    else: tables, and no ctxcore schema version. Checked before anything is written to it
    (its journal mode included), so another application's database is never changed."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version:
        return
    row = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name LIMIT 1").fetchone()
    if row is not None:
        raise MemoryStoreError(
            f"{path} is a SQLite database but not a ctxcore memory store (it holds other tables, such as "
            f"{row[0]!r}); it is left as it is: choose another path"
        )


def init_schema(conn: sqlite3.Connection, path: str, embedder: Embedder | None) -> tuple[Embedder | None, str | None]:
    """Create the schema in a new file, migrate an older one, and check the embedder
    against the one the file was built with (the caller holds the write lock). Returns
    the embedder the store uses (`embedder`, or the recorded one when `embedder` is None
    and the file names one ctxcore can rebuild) and the name the file records (None: no
    embedder recorded)."""
    # Another process may be setting up or migrating the file: wait for it (the check
    # below then finds the file current).
    conn.execute(f"PRAGMA busy_timeout = {_SCHEMA_WAIT_MS}")
    try:
        conn.execute("BEGIN IMMEDIATE")
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise MemoryStoreError(
                f"{path}: database schema version {version} is newer than this ctxcore "
                f"understands ({SCHEMA_VERSION}); upgrade ctxcore"
            )
        if version == 0:
            # One statement at a time: executescript would commit the transaction.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        while 0 < version < SCHEMA_VERSION:
            for step in _MIGRATIONS[version]:
                if isinstance(step, str):
                    conn.execute(step)
                else:
                    step(conn)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(_READS_TABLE)
        row = conn.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
        recorded = None if row is None else str(row[0])
        if embedder is None and row is not None:
            # Opened without an embedder: use the one the database was built with,
            # when it is one ctxcore can rebuild (queries then get embeddings too).
            embedder = embedder_from_name(row[0])
        elif embedder is not None:
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('embedder', ?)", (embedder.name,))
                recorded = embedder.name
            elif row[0] != embedder.name:
                raise MemoryStoreError(
                    f"{path} was built with the embedder {row[0]!r}, not {embedder.name!r}: "
                    "their embeddings cannot be compared"
                )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return embedder, recorded


def stored_dim(conn: sqlite3.Connection) -> int | None:
    """The dimension of the stored embeddings, None before the first one."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'embedding_dim'").fetchone()
    return None if row is None else int(row[0])


#: The ``meta`` key counting the store's re-embeddings (`SqliteMemoryStore.reembed`): every
#: stored vector changes at one without a memory added or removed, so a kept embedding
#: matrix of another count is read again whole.
EMBEDDING_GENERATION = "embedding_generation"


def embedding_generation(conn: sqlite3.Connection) -> int:
    """How many times the store's memories were re-embedded (0: never)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (EMBEDDING_GENERATION,)).fetchone()
    return 0 if row is None else int(row[0])


def scope_version(conn: sqlite3.Connection, scope: Scope) -> int | None:
    """`scope`'s write counter (moved by every write of its memories, in any process),
    None when nothing was ever written to it. Rows read after it are at least as new."""
    row = conn.execute(
        "SELECT version FROM scopes WHERE organization_id = ? AND agent_id = ?",
        (scope.organization_id, scope.agent_id),
    ).fetchone()
    return None if row is None else int(row[0])
