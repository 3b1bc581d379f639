"""The SQL text of the PostgreSQL store, every statement it runs outside its migrations
(`schema`): the columns a memory is read back with, the cold query (vector and full-text
hits merged in one statement), the hot query, the scope settings every transaction
starts with, the checks made at open, the writes and the statistics. Parameters are
always bound, never formatted in; the few ``{}`` fields are filled with psycopg's
`sql.Literal` or `sql.Identifier`, or with other constants of this module."""

from __future__ import annotations

# A memory as read back from its `memories` row `m`; the read time is the later of the one
# given at ingest and the last read written (`memory_reads`, one key lookup per row read
# back: a join would let the planner hash the whole scope).
_COLUMNS = (
    "m.seq, m.id, m.organization_id, m.agent_id, m.text, m.confidence, m.importance, m.created_at, "
    "greatest(m.accessed_at, (SELECT r.accessed_at FROM memory_reads r WHERE r.seq = m.seq)), "
    "m.token_count, m.token_family, m.token_kind, m.exact_tokens::text"
)
_COLUMN_COUNT = 13

# ---- the cold query, one statement ----------------------------------------------------------
#
# Vector path: the scope's `limit` nearest rows, then the ANN cutoff, before any row is
# hydrated. Full-text path: each search key's newest matches in the scope off the term
# table's b-tree (text equality is leakproof, so row-level security leaves the index
# usable), at most cap + 1 of them: a key with more is a stop word of this scope and left
# out; of the rest, the FTS_QUERY_TERMS rarest are kept and a memory scores Okapi BM25
# (k1 = 1.2, b = 0.75, as FTS5's bm25()): the IDF of each it holds (ln(1 + (N - n + 0.5) /
# (n + 0.5)); the term table keeps a memory's distinct terms, so each counts once), summed
# in millionths (integers: a sum that does not depend on the order it is taken in), times
# (k1 + 1) / (1 + k1 (1 - b + b dl / avgdl)), dl a memory's count of distinct terms (off
# the seq index) and avgdl the mean over the matched memories; best first, then newest;
# each key's count is returned as well. Both
# paths' lists come back, each memory once with both signals: the vector hits (best
# first), then the `limit` best text hits the vector path did not return, each with its
# cosine where it has an embedding (looked up by key). The last row carries the mean and
# standard deviation of the cosine over the scope (`_STATS_SAMPLE` newest embeddings of
# a larger one).
_STATS_SAMPLE = 2_000
_COLD_TEXT = (
    """
hits AS MATERIALIZED (
    SELECT t.k, m.seq FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, k) CROSS JOIN LATERAL (
        SELECT seq FROM memory_terms WHERE organization_id = %(org)s AND agent_id = %(agent)s AND term = t.term
        ORDER BY seq DESC LIMIT %(cap)s + 1) m),
counts AS (SELECT k, count(*) AS n FROM hits GROUP BY k),
chosen AS (
    SELECT k, ln(1.0 + (%(n)s::float8 - n::float8 + 0.5) / (n::float8 + 0.5)) AS idf FROM counts WHERE n <= %(cap)s
    ORDER BY n, k LIMIT %(nterms)s),
weights AS (
    SELECT array_agg(coalesce(round(c.idf * 1e6)::integer, 0) ORDER BY g.k) AS w
    FROM generate_series(1, cardinality(%(terms)s::text[])) AS g(k) LEFT JOIN chosen c ON c.k = g.k),
matched AS MATERIALIZED (
    SELECT h.seq, sum(w.w[h.k]) AS idf, (SELECT count(*) FROM memory_terms d WHERE d.seq = h.seq
        AND d.organization_id = %(org)s AND d.agent_id = %(agent)s)::float8 AS dl
    FROM hits h CROSS JOIN weights w WHERE w.w[h.k] > 0 GROUP BY h.seq),
scored AS (
    SELECT seq, round(idf * 2.2 / (1 + 1.2 * (0.25 + 0.75 * dl / greatest(avg(dl) OVER (), 1))))::bigint AS score
    FROM matched),
txt AS (SELECT seq, score, row_number() OVER (ORDER BY score DESC, seq DESC) AS r FROM scored),
besttxt AS MATERIALIZED (SELECT seq, score, r FROM txt WHERE r <= %(limit)s),
picked AS (
    SELECT v.seq, v.sim, t.score, v.r, 0 AS src FROM vec v LEFT JOIN besttxt t ON t.seq = v.seq
    UNION ALL
    SELECT t.seq, {textsim}, t.score, t.r, 1 FROM besttxt t WHERE t.seq NOT IN (SELECT seq FROM vec))
SELECT * FROM (
    SELECT """
    + _COLUMNS
    + """, p.sim, p.score::float8 / 1e6, NULL::bigint AS stop, p.r, p.src
    FROM picked p JOIN memories m ON m.seq = p.seq WHERE m.organization_id = %(org)s AND m.agent_id = %(agent)s
    UNION ALL
    SELECT """
    + ", ".join(["NULL"] * (_COLUMN_COUNT + 2))
    + """, k, n, NULL FROM counts
    UNION ALL
    SELECT """
    + ", ".join(["NULL"] * _COLUMN_COUNT)
    + """, mean, std, NULL, NULL, 2 FROM vstats) o
ORDER BY src NULLS LAST, r"""
)
# A full-text hit's cosine, by key in the scope's own partition.
_TEXT_SIM = (
    "1 - ((SELECT e.embedding FROM memory_vectors e WHERE e.organization_id = %(org)s "
    "AND e.agent_id = %(agent)s AND e.seq = t.seq) <=> %(q)s::vector)"
)
_COLD_VECTOR = (
    """WITH nearest AS MATERIALIZED (
    SELECT seq, embedding <=> %(q)s::vector AS d FROM memory_vectors
    WHERE organization_id = %(org)s AND agent_id = %(agent)s ORDER BY {order} LIMIT %(limit)s),
vec AS (SELECT seq, 1 - d AS sim, row_number() OVER (ORDER BY d, seq) AS r FROM nearest WHERE 1 - d >= %(min)s),
vstats AS (
    SELECT avg(1 - d) AS mean, stddev_pop(1 - d) AS std FROM (
        SELECT embedding <=> %(q)s::vector AS d FROM memory_vectors
        WHERE organization_id = %(org)s AND agent_id = %(agent)s ORDER BY seq DESC LIMIT """
    + str(_STATS_SAMPLE)
    + """) s
    HAVING count(*) > 0),
"""
    + _COLD_TEXT.replace("{textsim}", _TEXT_SIM)
)
# A large scope walks the HNSW index (ordered by the distance operator itself); a small
# one is scanned exactly off the scope index: ordered by an expression no index serves,
# since otherwise the planner, which cannot see the scope's size through row-level
# security, walks the HNSW index for a scope of 1% of the table (~200 ms at 100,000).
COLD_VECTOR_INDEXED = _COLD_VECTOR.replace("{order}", "embedding <=> %(q)s::vector")
COLD_VECTOR_EXACT = _COLD_VECTOR.replace("{order}", "(embedding <=> %(q)s::vector) + 0")
# The hot query: the scope's newest rows, each with the similarity of its embedding (looked
# up by key in the scope's own partition) to the query's.
HOT = (
    f"SELECT {_COLUMNS}, 1 - ((SELECT v.embedding FROM memory_vectors v WHERE "
    "v.organization_id = %(org)s AND v.agent_id = %(agent)s AND v.seq = m.seq) <=> %(q)s::vector) "
    "FROM memories m WHERE m.organization_id = %(org)s AND m.agent_id = %(agent)s "
    "ORDER BY m.created_at DESC, m.seq DESC LIMIT %(limit)s"
)
# Every memory of a scope, oldest first (ties: first stored first): what an evaluation ranks
# its baselines over.
SCOPE_MEMORIES = (
    f"SELECT {_COLUMNS} FROM memories m WHERE m.organization_id = %(org)s AND m.agent_id = %(agent)s "
    "ORDER BY m.created_at, m.seq"
)
#: The scope the pool's connections are warmed in (statements run with `limit` 0: nothing
#: is read back, nothing noted).
WARM_SCOPE = "ctxcore-warm"
COLD_NO_VECTOR = """WITH vec AS (SELECT NULL::bigint AS seq, NULL::float8 AS sim, NULL::bigint AS r WHERE false),
vstats AS (SELECT NULL::float8 AS mean, NULL::float8 AS std WHERE false),
""" + _COLD_TEXT.replace("{textsim}", "NULL::float8")
# Where a cold row's own columns are, counted from its end (the stored columns come
# first). A memory's row: its cosine (COLD_SIM), its BM25 score (COLD_SCORE), its rank and
# its path (COLD_SOURCE: 0 vector, 1 full text). A search key's row (COLD_SOURCE NULL):
# the key's 1-based position in the terms (COLD_KEY) and its match count (COLD_COUNT). The
# statistics row (COLD_SOURCE 2): the cosine's mean (COLD_SIM) and standard deviation
# (COLD_SCORE) over the scope.
COLD_SIM, COLD_SCORE, COLD_KEY, COLD_COUNT, COLD_SOURCE = -5, -4, -3, -2, -1
COLD_VECTOR_HIT, COLD_STATS = 0, 2
# A hot row's cosine: its last column.
HOT_SIM = -1

# ---- the cold query's settings, the scope of a transaction -----------------------------------
#
# Every transaction sets its scope first (transaction-local, is_local = true: the next
# transaction on a pooled connection starts with no scope, so it sees nothing until it
# sets its own): organization, agent (empty with all_agents on: the organization's every
# agent), and the schema owner's admin policy on or off.
SET_SCOPE = (
    "SELECT set_config('ctxcore.organization_id', %s, true), set_config('ctxcore.agent_id', %s, true), "
    "set_config('ctxcore.all_agents', %s, true), set_config('ctxcore.admin', %s, true)"
)
# The cold query's transaction: its scope and its plan settings in one statement
# (parameters: organization, agent, hnsw.ef_search, enable_sort, enable_seqscan). With
# pgvector 0.8 or later, a filtered HNSW scan goes on until it has `limit` rows of the
# scope (setting hnsw.iterative_scan before 0.8 fails the transaction).
_COLD_SETTINGS = (
    "SELECT set_config('ctxcore.organization_id', %s, true), set_config('ctxcore.agent_id', %s, true), "
    "set_config('ctxcore.all_agents', 'off', true), set_config('ctxcore.admin', 'off', true), "
    "set_config('hnsw.ef_search', %s, true){scan}, "
    "set_config('enable_sort', %s, true), set_config('enable_seqscan', %s, true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
)
COLD_SETTINGS = _COLD_SETTINGS.replace("{scan}", "")
COLD_SETTINGS_ITERATIVE = _COLD_SETTINGS.replace("{scan}", ", set_config('hnsw.iterative_scan', 'relaxed_order', true)")
# The scope's memory count (the stop-word threshold and the vector plan).
SCOPE_SIZE = "SELECT count(*) AS n FROM memories WHERE organization_id = %s AND agent_id = %s"

# ---- opening: pgvector, the schema's version, its metadata ------------------------------------

# The installed pgvector version and the one the server could install (either NULL).
PGVECTOR_VERSIONS = (
    "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS installed, "
    "(SELECT default_version FROM pg_available_extensions WHERE name = 'vector') AS available"
)
CREATE_PGVECTOR = "CREATE EXTENSION IF NOT EXISTS vector"
HAS_MIGRATIONS = "SELECT to_regclass('ctxcore_migrations') IS NOT NULL AS present"
APPLIED_VERSION = "SELECT coalesce(max(version), 0) AS version FROM ctxcore_migrations"
# Held until the transaction ends (parameter: the schema's lock key, schema.MIGRATION_LOCK).
TAKE_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(%s)"
CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS ctxcore_migrations (version integer PRIMARY KEY, "
    "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
)
RECORD_MIGRATION = "INSERT INTO ctxcore_migrations (version, description) VALUES (%s, %s)"
READ_META = "SELECT value FROM ctxcore_meta WHERE key = %s"
RECORD_DIMENSIONS = "INSERT INTO ctxcore_meta VALUES ('embedding_dim', %s) ON CONFLICT (key) DO NOTHING"
RECORD_EMBEDDER = "INSERT INTO ctxcore_meta VALUES ('embedder', %s) ON CONFLICT (key) DO NOTHING"
# Fixing the dimension makes the column indexable ({} is an int, formatted as a literal).
SET_DIMENSIONS = "ALTER TABLE memory_vectors ALTER COLUMN embedding TYPE vector({})"
# The app role's privileges ({} is the role, formatted as an identifier).
GRANT_TABLES = (
    "GRANT SELECT, INSERT, UPDATE, DELETE ON memories, directives, memory_terms, memory_reads, memory_vectors TO {}"
)
GRANT_META = "GRANT SELECT ON ctxcore_meta, ctxcore_migrations TO {}"
# Whether this role owns the schema (only the owner's admin policy reads across scopes).
IS_SCHEMA_OWNER = (
    "SELECT pg_has_role(current_user, relowner, 'USAGE') AS owner FROM pg_class WHERE oid = 'memories'::regclass"
)

# ---- writes -----------------------------------------------------------------------------------

# One scope's new memories as arrays, inserted in batch order (so `seq` follows it); a
# taken id is skipped (ON CONFLICT) and reported by the caller. Parameters: one array per
# column of INSERT_COLUMNS, in that order.
INSERT_COLUMNS = (
    "id",
    "organization_id",
    "agent_id",
    "text",
    "confidence",
    "importance",
    "created_at",
    "accessed_at",
    "token_count",
    "token_family",
    "token_kind",
    "exact_tokens",
)
INSERT_MEMORIES = (
    "INSERT INTO memories (" + ", ".join(INSERT_COLUMNS) + ") "
    "SELECT id, o, a, t, c, i, ca, aa, n, f, k, x::jsonb FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::float8[], %s::float8[], "
    "%s::float8[], %s::float8[], %s::int[], %s::text[], %s::text[], %s::text[]) "
    "WITH ORDINALITY AS r(id, o, a, t, c, i, ca, aa, n, f, k, x, ord) ORDER BY ord "
    "ON CONFLICT (id) DO NOTHING RETURNING id, seq"
)
# One scope's embeddings (parameters: organization, agent, the seqs, the vectors' text).
INSERT_VECTORS = (
    "INSERT INTO memory_vectors (organization_id, agent_id, seq, embedding) "
    "SELECT %s, %s, s, e::vector FROM unnest(%s::bigint[], %s::text[]) AS r(s, e)"
)
INSERT_VECTOR = "INSERT INTO memory_vectors (organization_id, agent_id, seq, embedding) VALUES (%s, %s, %s, %s::vector)"
DELETE_VECTOR = "DELETE FROM memory_vectors WHERE organization_id = %s AND agent_id = %s AND seq = %s"
DELETE_TERMS = "DELETE FROM memory_terms WHERE organization_id = %s AND agent_id = %s AND seq = %s"
# An update's changes ({sets}: SET_TEXT, SET_CONFIDENCE, SET_IMPORTANCE joined by commas;
# then the organization, agent and id).
UPDATE_MEMORY = "UPDATE memories SET {sets} WHERE organization_id = %s AND agent_id = %s AND id = %s RETURNING seq"
SET_TEXT = "text = %s, token_count = %s, token_family = %s, token_kind = %s, exact_tokens = %s::jsonb"
SET_CONFIDENCE = "confidence = %s"
SET_IMPORTANCE = "importance = %s"
# Only the embedding changes: the row is locked (not rewritten) and its seq read back.
LOCK_MEMORY = "SELECT seq FROM memories WHERE organization_id = %s AND agent_id = %s AND id = %s FOR UPDATE"
MEMORY_EXISTS = "SELECT 1 FROM memories WHERE organization_id = %s AND agent_id = %s AND id = %s"
DELETE_MEMORIES = "DELETE FROM memories WHERE organization_id = %s AND agent_id = %s AND id = ANY(%s)"
DELETE_AGENT_MEMORIES = "DELETE FROM memories WHERE organization_id = %s AND agent_id = %s"
DELETE_AGENT_DIRECTIVES = "DELETE FROM directives WHERE organization_id = %s AND agent_id = %s"
DELETE_ORGANIZATION_MEMORIES = "DELETE FROM memories WHERE organization_id = %s"
DELETE_ORGANIZATION_DIRECTIVES = "DELETE FROM directives WHERE organization_id = %s"
EXPIRE_ORGANIZATION = "DELETE FROM memories WHERE organization_id = %s AND created_at < %s"
EXPIRE_ALL = "DELETE FROM memories WHERE created_at < %s"
# A directive (parameters: organization, agent or ORG_WIDE, text, updated_at).
UPSERT_DIRECTIVE = (
    "INSERT INTO directives VALUES (%s, %s, %s, %s) ON CONFLICT (organization_id, agent_id) "
    "DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at"
)
# The organization's directive and the agent's (ORG_WIDE, '', sorts first).
READ_DIRECTIVES = "SELECT text FROM directives WHERE organization_id = %s AND agent_id IN (%s, %s) ORDER BY agent_id"
# Read times of one scope (parameters: the seqs, their times, organization, agent), its
# rows taken in `seq` order: flushes of several replicas (or a flush and `close`) that
# meet on the same rows wait for each other instead of deadlocking. Each row read is
# looked up by key (memories deleted since are left out); a join let the planner hash the
# whole scope (10,000 rows: 6.6 ms of a 30 ms flush of 945).
WRITE_READ_TIMES = (
    "INSERT INTO memory_reads AS r (seq, organization_id, agent_id, accessed_at) "
    "SELECT m.seq, m.organization_id, m.agent_id, a.at "
    "FROM unnest(%s::bigint[], %s::float8[]) AS a(seq, at) CROSS JOIN LATERAL ("
    "SELECT seq, organization_id, agent_id FROM memories "
    "WHERE seq = a.seq AND organization_id = %s AND agent_id = %s LIMIT 1) m ORDER BY m.seq "
    "ON CONFLICT (seq) DO UPDATE SET accessed_at = greatest(r.accessed_at, excluded.accessed_at)"
)

# ---- statistics ---------------------------------------------------------------------------------

SCOPE_STATS = (
    "SELECT m.organization_id, m.agent_id, m.n AS memories, coalesce(v.n, 0) AS embedded, m.t AS tokens FROM ("
    "SELECT organization_id, agent_id, count(*) AS n, sum(token_count) AS t FROM memories "
    "GROUP BY organization_id, agent_id) m LEFT JOIN ("
    "SELECT organization_id, agent_id, count(*) AS n FROM memory_vectors "
    "GROUP BY organization_id, agent_id) v USING (organization_id, agent_id) "
    "ORDER BY m.organization_id, m.agent_id"
)
DIRECTIVE_COUNT = "SELECT count(*) AS n FROM directives"
