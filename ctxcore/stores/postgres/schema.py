"""The database layout as versioned, idempotent migrations (`MIGRATIONS`): tables, row-level
security policies on the organization and agent, grants for the app role, the term
table's backfill and the embeddings partitioned by scope with an HNSW index each."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from .terms import doc_terms

# ---- the schema, as versioned migrations ------------------------------------------------

# Every policy reads the scope a transaction set with set_config(..., true). An unset
# setting reads as NULL (or '' once set earlier on the connection), which matches no
# row: a transaction that forgot its scope sees nothing.
_SCOPE_ORG = "current_setting('ctxcore.organization_id', true)"
_SCOPE_AGENT = "current_setting('ctxcore.agent_id', true)"
_ALL_AGENTS = "current_setting('ctxcore.all_agents', true) = 'on'"
_ADMIN = "current_setting('ctxcore.admin', true) = 'on'"

# A migration step that is not one SQL statement (it computes in Python).
_Step = Callable[[psycopg.AsyncConnection[TupleRow]], Awaitable[None]]
# Memories read back per statement while the terms of an existing database are filled in.
_BACKFILL_CHUNK = 2_000


async def _backfill_terms(conn: psycopg.AsyncConnection[TupleRow]) -> None:
    """Migration 2: fill `memory_terms` from the memories already stored (their terms are
    computed here, by the same code as at ingest), and give every role that may write
    ``memories`` the same rights on the new table."""
    await conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
    await _fill_terms(conn)
    await _grant_as_on_memories(conn, "memory_terms")
    await conn.execute("SELECT set_config('ctxcore.admin', 'off', true)")


async def _fill_terms(conn: psycopg.AsyncConnection[TupleRow]) -> None:
    """Insert the terms of every stored memory, computed by the same code as at ingest, a
    chunk of memories per statement (the caller has set the admin flag)."""
    last = 0
    while True:
        cur = await conn.execute(
            "SELECT seq, organization_id, agent_id, text FROM memories WHERE seq > %s ORDER BY seq LIMIT %s",
            (last, _BACKFILL_CHUNK),
        )
        rows = await cur.fetchall()
        if not rows:
            break
        await insert_terms(conn, [(int(s), o, a, doc_terms(t)) for s, o, a, t in rows])
        last = int(rows[-1][0])


async def _restem_terms(conn: psycopg.AsyncConnection[TupleRow]) -> None:
    """Migration 5: the term table again from the stored memories, their words in the
    searched form (`ctxcore.stores.text.search_word`: English words stemmed), so that
    stored memories and new queries meet on the same keys."""
    await conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
    await conn.execute("DELETE FROM memory_terms")
    await _fill_terms(conn)
    await conn.execute("SELECT set_config('ctxcore.admin', 'off', true)")


async def _grant_as_on_memories(conn: psycopg.AsyncConnection[TupleRow], table: str) -> None:
    """Give every role that may write ``memories`` the same rights on a new `table`."""
    cur = await conn.execute(
        "SELECT DISTINCT grantee FROM information_schema.role_table_grants WHERE table_schema = current_schema() "
        "AND table_name = 'memories' AND privilege_type = 'INSERT' AND grantee <> current_user"
    )
    for (role,) in await cur.fetchall():
        await conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                sql.Identifier(table), sql.Identifier(role)
            )
        )


async def _grant_reads(conn: psycopg.AsyncConnection[TupleRow]) -> None:
    """Migration 3: the app roles of an existing database get rights on `memory_reads`."""
    await _grant_as_on_memories(conn, "memory_reads")


async def insert_terms(
    conn: psycopg.AsyncConnection[TupleRow], docs: Sequence[tuple[int, str, str, Sequence[str]]]
) -> None:
    """Insert the terms of memories, given as (seq, organization_id, agent_id, terms), in
    one statement (COPY is not allowed into a table under row-level security)."""
    orgs: list[str] = []
    agents: list[str] = []
    terms: list[str] = []
    seqs: list[int] = []
    for seq, org, agent, ts in docs:
        orgs += [org] * len(ts)
        agents += [agent] * len(ts)
        terms += ts
        seqs += [seq] * len(ts)
    if terms:
        await conn.execute(
            "INSERT INTO memory_terms (organization_id, agent_id, term, seq) "
            "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[])",
            (orgs, agents, terms, seqs),
        )


#: Partitions of `memory_vectors` (hash of organization and agent), each with its own HNSW
#: index. A vector search walks one partition's graph, filtered to the scope: the fewer
#: other scopes' rows share it, the fewer it passes over (at 100,000 memories in 100 scopes,
#: a 10,000-memory scope's nearest 64 took ~7 ms in one graph and ~1.2 ms in its partition).
#: Fixed when the table is created.
VECTOR_PARTITIONS = 16
# The HNSW index (cosine), created on every partition once the dimension is fixed.
VECTOR_INDEX = (
    "CREATE INDEX IF NOT EXISTS memory_vectors_embedding ON memory_vectors USING hnsw (embedding vector_cosine_ops)"
)


async def _partition_vectors(conn: psycopg.AsyncConnection[TupleRow]) -> None:
    """Migration 4: embeddings move out of `memories` into `memory_vectors`, partitioned by
    scope (VECTOR_PARTITIONS hash partitions of organization and agent), under the same
    policies; the stored ones are copied over, then indexed, then the old column and its
    index dropped. The app roles get the same rights on it as on `memories` (on the
    partitioned table only: the partitions themselves grant nothing to anyone but the
    owner, so row-level security cannot be walked around through them)."""
    cur = await conn.execute("SELECT value FROM ctxcore_meta WHERE key = 'embedding_dim'")
    row = await cur.fetchone()
    dim = None if row is None else int(row[0])
    vector = sql.SQL("vector") if dim is None else sql.SQL("vector({})").format(sql.Literal(dim))
    await conn.execute(
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS memory_vectors (
            organization_id text NOT NULL,
            agent_id text NOT NULL,
            seq bigint NOT NULL REFERENCES memories (seq) ON DELETE CASCADE,
            embedding {} NOT NULL,
            PRIMARY KEY (organization_id, agent_id, seq)
        ) PARTITION BY HASH (organization_id, agent_id)"""
        ).format(vector)
    )
    for k in range(VECTOR_PARTITIONS):
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF memory_vectors FOR VALUES WITH (MODULUS {}, REMAINDER {})"
            ).format(sql.Identifier(f"memory_vectors_{k:02d}"), sql.Literal(VECTOR_PARTITIONS), sql.Literal(k))
        )
    for statement in (
        # The cascade of a delete finds a memory's embedding by this index.
        "CREATE INDEX IF NOT EXISTS memory_vectors_seq ON memory_vectors (seq)",
        "ALTER TABLE memory_vectors ENABLE ROW LEVEL SECURITY",
        "ALTER TABLE memory_vectors FORCE ROW LEVEL SECURITY",
        "DROP POLICY IF EXISTS memory_vectors_scope ON memory_vectors",
        f"CREATE POLICY memory_vectors_scope ON memory_vectors USING ((organization_id = {_SCOPE_ORG} "
        f"AND (agent_id = {_SCOPE_AGENT} OR {_ALL_AGENTS})) IS TRUE)",
        "DROP POLICY IF EXISTS memory_vectors_admin ON memory_vectors",
        f"CREATE POLICY memory_vectors_admin ON memory_vectors TO CURRENT_USER USING ({_ADMIN})",
        "SELECT set_config('ctxcore.admin', 'on', true)",
        "INSERT INTO memory_vectors (organization_id, agent_id, seq, embedding) "
        "SELECT organization_id, agent_id, seq, embedding FROM memories WHERE embedding IS NOT NULL",
        "SELECT set_config('ctxcore.admin', 'off', true)",
        "DROP INDEX IF EXISTS memories_embedding",
        "ALTER TABLE memories DROP COLUMN IF EXISTS embedding",
    ):
        await conn.execute(statement)  # constant DDL: no user input
    if dim is not None:
        await conn.execute(VECTOR_INDEX)
    await _grant_as_on_memories(conn, "memory_vectors")


_BACKFILL_TERMS: _Step = _backfill_terms
_GRANT_READS: _Step = _grant_reads
_PARTITION_VECTORS: _Step = _partition_vectors
_RESTEM_TERMS: _Step = _restem_terms

MIGRATIONS: tuple[tuple[int, str, tuple[str | _Step, ...]], ...] = (
    (
        1,
        "memories, directives, full-text and vector indexes, row-level security",
        (
            "CREATE TABLE IF NOT EXISTS ctxcore_meta (key text PRIMARY KEY, value text NOT NULL)",
            """CREATE TABLE IF NOT EXISTS memories (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                id text NOT NULL UNIQUE,
                organization_id text NOT NULL CHECK (organization_id <> ''),
                agent_id text NOT NULL CHECK (agent_id <> ''),
                text text NOT NULL,
                embedding vector,
                fts tsvector NOT NULL,
                confidence double precision NOT NULL CHECK (confidence BETWEEN 0 AND 1),
                importance double precision CHECK (importance BETWEEN 0 AND 1),
                created_at double precision NOT NULL,
                accessed_at double precision,
                token_count integer NOT NULL CHECK (token_count >= 0),
                token_family text NOT NULL,
                token_kind text NOT NULL CHECK (token_kind IN ('exact', 'estimate')),
                exact_tokens jsonb
            )""",
            "CREATE INDEX IF NOT EXISTS memories_recent ON memories "
            "(organization_id, agent_id, created_at DESC, seq DESC)",
            "CREATE INDEX IF NOT EXISTS memories_fts ON memories USING gin (fts)",
            """CREATE TABLE IF NOT EXISTS directives (
                organization_id text NOT NULL CHECK (organization_id <> ''),
                agent_id text NOT NULL,
                text text NOT NULL,
                updated_at double precision NOT NULL,
                PRIMARY KEY (organization_id, agent_id)
            )""",
            "ALTER TABLE memories ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE memories FORCE ROW LEVEL SECURITY",
            "ALTER TABLE directives ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE directives FORCE ROW LEVEL SECURITY",
            "DROP POLICY IF EXISTS memories_scope ON memories",
            # IS TRUE: the same rows, but not an index condition, so the planner indexes the
            # statements' own (equal) scope filters and the full-text search can be kept on GIN.
            f"CREATE POLICY memories_scope ON memories USING ((organization_id = {_SCOPE_ORG} "
            f"AND (agent_id = {_SCOPE_AGENT} OR {_ALL_AGENTS})) IS TRUE)",
            "DROP POLICY IF EXISTS directives_scope ON directives",
            f"CREATE POLICY directives_scope ON directives USING (organization_id = {_SCOPE_ORG} "
            f"AND (agent_id = {_SCOPE_AGENT} OR agent_id = '' OR {_ALL_AGENTS})) "
            f"WITH CHECK (organization_id = {_SCOPE_ORG} AND (agent_id = {_SCOPE_AGENT} OR {_ALL_AGENTS}))",
            # The schema owner (the role that ran the migrations) may read across scopes
            # when it says so (stats, retention): no other role can, whatever it sets.
            "DROP POLICY IF EXISTS memories_admin ON memories",
            f"CREATE POLICY memories_admin ON memories TO CURRENT_USER USING ({_ADMIN})",
            "DROP POLICY IF EXISTS directives_admin ON directives",
            f"CREATE POLICY directives_admin ON directives TO CURRENT_USER USING ({_ADMIN})",
        ),
    ),
    (
        2,
        "full text on a term table (b-tree, usable under row-level security) in place of tsvector/GIN",
        (
            # One row per distinct search key of a memory (its words, and its pairs of
            # adjacent CJK characters): `term = $1` is a b-tree condition with a leakproof
            # operator, so PostgreSQL uses the index under row-level security, where the
            # tsvector match (not leakproof) could only filter a scan of the whole scope.
            """CREATE TABLE IF NOT EXISTS memory_terms (
                organization_id text NOT NULL,
                agent_id text NOT NULL,
                term text NOT NULL,
                seq bigint NOT NULL REFERENCES memories (seq) ON DELETE CASCADE,
                PRIMARY KEY (organization_id, agent_id, term, seq)
            )""",
            # The cascade of a delete finds a memory's terms by this index.
            "CREATE INDEX IF NOT EXISTS memory_terms_seq ON memory_terms (seq)",
            "ALTER TABLE memory_terms ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE memory_terms FORCE ROW LEVEL SECURITY",
            "DROP POLICY IF EXISTS memory_terms_scope ON memory_terms",
            f"CREATE POLICY memory_terms_scope ON memory_terms USING ((organization_id = {_SCOPE_ORG} "
            f"AND (agent_id = {_SCOPE_AGENT} OR {_ALL_AGENTS})) IS TRUE)",
            "DROP POLICY IF EXISTS memory_terms_admin ON memory_terms",
            f"CREATE POLICY memory_terms_admin ON memory_terms TO CURRENT_USER USING ({_ADMIN})",
            _BACKFILL_TERMS,
            "DROP INDEX IF EXISTS memories_fts",
            "ALTER TABLE memories DROP COLUMN IF EXISTS fts",
        ),
    ),
    (
        3,
        "read times in their own table: writing them never makes a new version of a memory's row",
        (
            # An UPDATE of `memories` that finds no room on the row's page writes the new
            # version elsewhere and inserts it into every index, the HNSW index included
            # (milliseconds per row, and dead entries every vector search then walks past).
            # Read times change on every read, so they live in a narrow table of their own;
            # `memories.accessed_at` keeps the time given at ingest, and a read returns the
            # later of the two.
            """CREATE TABLE IF NOT EXISTS memory_reads (
                seq bigint PRIMARY KEY REFERENCES memories (seq) ON DELETE CASCADE,
                organization_id text NOT NULL,
                agent_id text NOT NULL,
                accessed_at double precision NOT NULL
            )""",
            "ALTER TABLE memory_reads ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE memory_reads FORCE ROW LEVEL SECURITY",
            "DROP POLICY IF EXISTS memory_reads_scope ON memory_reads",
            f"CREATE POLICY memory_reads_scope ON memory_reads USING ((organization_id = {_SCOPE_ORG} "
            f"AND (agent_id = {_SCOPE_AGENT} OR {_ALL_AGENTS})) IS TRUE)",
            "DROP POLICY IF EXISTS memory_reads_admin ON memory_reads",
            f"CREATE POLICY memory_reads_admin ON memory_reads TO CURRENT_USER USING ({_ADMIN})",
            _GRANT_READS,
        ),
    ),
    (
        4,
        "embeddings in a table partitioned by scope, an HNSW index per partition",
        (_PARTITION_VECTORS,),
    ),
    (
        5,
        "full-text terms in their searched form: English words stemmed",
        (_RESTEM_TERMS,),
    ),
)
#: Version of the database layout this code writes (the highest migration).
PG_SCHEMA_VERSION = MIGRATIONS[-1][0]
# Any 64-bit constant: migrations of one database run one at a time.
MIGRATION_LOCK = 0x63747863_6F726531
