"""The SQL text of the store's reads: the columns a memory is read back with, the cold
query (vector and full-text hits merged in one statement) and the hot query."""

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
# out; of the rest, the FTS_QUERY_TERMS rarest are kept and a memory scores the IDF of each
# it holds, in millionths (integers: a sum that does not depend on the order it is taken
# in), more and rarer words first, then newest; each key's count is returned as well. The two paths are taken in turn (the
# k-th vector hit, then the k-th text hit; a text hit the vector path found is not repeated),
# at most `limit` entries, and only those rows are read back.
_COLD_TEXT = """
hits AS MATERIALIZED (
    SELECT t.k, m.seq FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, k) CROSS JOIN LATERAL (
        SELECT seq FROM memory_terms WHERE organization_id = %(org)s AND agent_id = %(agent)s AND term = t.term
        ORDER BY seq DESC LIMIT %(cap)s + 1) m),
counts AS (SELECT k, count(*) AS n FROM hits GROUP BY k),
chosen AS (
    SELECT k, ln(1.0 + %(n)s::float8 / (n + 1)::float8) AS idf FROM counts WHERE n <= %(cap)s
    ORDER BY n, k LIMIT %(nterms)s),
weights AS (
    SELECT array_agg(coalesce(round(c.idf * 1e6)::integer, 0) ORDER BY g.k) AS w
    FROM generate_series(1, cardinality(%(terms)s::text[])) AS g(k) LEFT JOIN chosen c ON c.k = g.k),
txt AS (
    SELECT h.seq, row_number() OVER (ORDER BY sum(w.w[h.k]) DESC, h.seq DESC) AS r
    FROM hits h CROSS JOIN weights w WHERE w.w[h.k] > 0 GROUP BY h.seq),
picked AS (
    SELECT seq, sim, r, 0 AS src FROM vec
    UNION ALL
    SELECT seq, NULL, r, 1 FROM txt WHERE r <= %(limit)s AND seq NOT IN (SELECT seq FROM vec)
    ORDER BY r, src LIMIT %(limit)s)
SELECT * FROM (
    SELECT """ + _COLUMNS + """, p.sim, NULL::bigint AS stop, p.r, p.src
    FROM picked p JOIN memories m ON m.seq = p.seq WHERE m.organization_id = %(org)s AND m.agent_id = %(agent)s
    UNION ALL
    SELECT """ + ", ".join(["NULL"] * (_COLUMN_COUNT + 1)) + """, k, n, NULL FROM counts) o
ORDER BY r NULLS LAST, src"""
_COLD_VECTOR = """WITH nearest AS MATERIALIZED (
    SELECT seq, embedding <=> %(q)s::vector AS d FROM memory_vectors
    WHERE organization_id = %(org)s AND agent_id = %(agent)s ORDER BY {order} LIMIT %(limit)s),
vec AS (SELECT seq, 1 - d AS sim, row_number() OVER (ORDER BY d, seq) AS r FROM nearest WHERE 1 - d >= %(min)s),
""" + _COLD_TEXT
# A large scope walks the HNSW index (ordered by the distance operator itself); a small
# one is scanned exactly off the scope index: ordered by an expression no index serves,
# since otherwise the planner, which cannot see the scope's size through row-level
# security, walks the HNSW index for a scope of 1% of the table (~200 ms at 100,000).
_COLD_VECTOR_INDEXED = _COLD_VECTOR.replace("{order}", "embedding <=> %(q)s::vector")
_COLD_VECTOR_EXACT = _COLD_VECTOR.replace("{order}", "(embedding <=> %(q)s::vector) + 0")
# The hot query: the scope's newest rows, each with the similarity of its embedding (looked
# up by key in the scope's own partition) to the query's.
_HOT = (f"SELECT {_COLUMNS}, 1 - ((SELECT v.embedding FROM memory_vectors v WHERE "
        "v.organization_id = %(org)s AND v.agent_id = %(agent)s AND v.seq = m.seq) <=> %(q)s::vector) "
        "FROM memories m WHERE m.organization_id = %(org)s AND m.agent_id = %(agent)s "
        "ORDER BY m.created_at DESC, m.seq DESC LIMIT %(limit)s")
#: The scope the pool's connections are warmed in (statements run with `limit` 0: nothing
#: is read back, nothing noted).
_WARM_SCOPE = "ctxcore-warm"
_COLD_NO_VECTOR = """WITH vec AS (SELECT NULL::bigint AS seq, NULL::float8 AS sim, NULL::bigint AS r WHERE false),
""" + _COLD_TEXT
