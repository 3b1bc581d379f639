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
_COLD_TEXT = """
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
    SELECT """ + _COLUMNS + """, p.sim, p.score::float8 / 1e6, NULL::bigint AS stop, p.r, p.src
    FROM picked p JOIN memories m ON m.seq = p.seq WHERE m.organization_id = %(org)s AND m.agent_id = %(agent)s
    UNION ALL
    SELECT """ + ", ".join(["NULL"] * (_COLUMN_COUNT + 2)) + """, k, n, NULL FROM counts
    UNION ALL
    SELECT """ + ", ".join(["NULL"] * _COLUMN_COUNT) + """, mean, std, NULL, NULL, 2 FROM vstats) o
ORDER BY src NULLS LAST, r"""
# A full-text hit's cosine, by key in the scope's own partition.
_TEXT_SIM = ("1 - ((SELECT e.embedding FROM memory_vectors e WHERE e.organization_id = %(org)s "
             "AND e.agent_id = %(agent)s AND e.seq = t.seq) <=> %(q)s::vector)")
_COLD_VECTOR = """WITH nearest AS MATERIALIZED (
    SELECT seq, embedding <=> %(q)s::vector AS d FROM memory_vectors
    WHERE organization_id = %(org)s AND agent_id = %(agent)s ORDER BY {order} LIMIT %(limit)s),
vec AS (SELECT seq, 1 - d AS sim, row_number() OVER (ORDER BY d, seq) AS r FROM nearest WHERE 1 - d >= %(min)s),
vstats AS (
    SELECT avg(1 - d) AS mean, stddev_pop(1 - d) AS std FROM (
        SELECT embedding <=> %(q)s::vector AS d FROM memory_vectors
        WHERE organization_id = %(org)s AND agent_id = %(agent)s ORDER BY seq DESC LIMIT """ + str(_STATS_SAMPLE) + """) s
    HAVING count(*) > 0),
""" + _COLD_TEXT.replace("{textsim}", _TEXT_SIM)
# A large scope walks the HNSW index (ordered by the distance operator itself); a small
# one is scanned exactly off the scope index: ordered by an expression no index serves,
# since otherwise the planner, which cannot see the scope's size through row-level
# security, walks the HNSW index for a scope of 1% of the table (~200 ms at 100,000).
COLD_VECTOR_INDEXED = _COLD_VECTOR.replace("{order}", "embedding <=> %(q)s::vector")
COLD_VECTOR_EXACT = _COLD_VECTOR.replace("{order}", "(embedding <=> %(q)s::vector) + 0")
# The hot query: the scope's newest rows, each with the similarity of its embedding (looked
# up by key in the scope's own partition) to the query's.
HOT = (f"SELECT {_COLUMNS}, 1 - ((SELECT v.embedding FROM memory_vectors v WHERE "
        "v.organization_id = %(org)s AND v.agent_id = %(agent)s AND v.seq = m.seq) <=> %(q)s::vector) "
        "FROM memories m WHERE m.organization_id = %(org)s AND m.agent_id = %(agent)s "
        "ORDER BY m.created_at DESC, m.seq DESC LIMIT %(limit)s")
#: The scope the pool's connections are warmed in (statements run with `limit` 0: nothing
#: is read back, nothing noted).
WARM_SCOPE = "ctxcore-warm"
COLD_NO_VECTOR = """WITH vec AS (SELECT NULL::bigint AS seq, NULL::float8 AS sim, NULL::bigint AS r WHERE false),
vstats AS (SELECT NULL::float8 AS mean, NULL::float8 AS std WHERE false),
""" + _COLD_TEXT.replace("{textsim}", "NULL::float8")
