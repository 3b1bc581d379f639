"""Full-text retrieval in the SQLite store: how text becomes FTS5 terms and MATCH
expressions (user text only ever as quoted strings), which terms are worth searching
(document frequencies, cached), and the search itself."""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import unicodedata
from collections.abc import Sequence

from ...memory import Scope
from .._text import CJK_RUN, cjk_spaced, normalize, raw_words
from .readers import Job

__all__ = [
    "FTS_MAX_DOC_FRACTION",
    "FTS_PRUNE_MIN_DOCS",
    "FTS_QUERY_TERMS",
    "MAX_FTS_TERMS",
    "DocFrequencies",
    "fts_match_expression",
    "search",
]

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
# A term's IDF weight in the ranking, in these units (integers sum exactly).
_IDF_UNITS = 1_000_000


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
        for piece in CJK_RUN.split(run):
            if not piece:
                continue
            if CJK_RUN.fullmatch(piece):
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


class DocFrequencies:
    """How many memories (all scopes) hold each token, read from the FTS5 vocabulary.

    Looking a token up in the vocabulary reads its whole doclist (~1 ms for a stop word at
    100k memories), so counts are cached until the store has grown by a tenth since they
    were read. A token no memory holds is remembered as absent only until the store is
    written again (any scope's write counter moves, or the memory count changes), so a
    memory added later that holds it is searched for it at once. `clear` after deletes."""

    __slots__ = ("_cache", "_absent", "_absent_state")

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, int]] = {}
        self._absent: set[str] = set()
        self._absent_state: tuple[int, int] | None = None

    def clear(self) -> None:
        self._cache.clear()
        self._absent.clear()
        self._absent_state = None

    def lookup(self, conn: sqlite3.Connection, tokens: set[str], total: int, writes: int | None = None) -> dict[str, int]:
        """Each token's count of memories, `total` memories in the store; `writes` (the
        sum of the scopes' write counters, None: unknown) keys the absent tokens."""
        state = None if writes is None else (total, writes)
        if state is None or state != self._absent_state:
            self._absent = set()
            self._absent_state = state
        absent = self._absent
        out: dict[str, int] = {}
        missing = []
        for tok in tokens:
            hit = self._cache.get(tok)
            if hit is not None and total <= hit[1] * _DF_CACHE_GROWTH:
                out[tok] = hit[0]
            elif tok in absent:
                out[tok] = 0
            else:
                missing.append(tok)
        if missing:
            found = dict(
                conn.execute(
                    "SELECT term, doc FROM memories_vocab WHERE term IN (SELECT value FROM json_each(?))",
                    (json.dumps(sorted(missing), ensure_ascii=False),),
                ).fetchall()
            )
            if len(self._cache) + len(missing) > _DF_CACHE_TERMS:
                self._cache.clear()
            if len(absent) + len(missing) > _DF_CACHE_TERMS:
                absent.clear()
            for tok in missing:
                out[tok] = int(found.get(tok, 0))
                if out[tok]:
                    self._cache[tok] = (out[tok], total)
                elif state is not None:
                    absent.add(tok)
        return out


def search(
    conn: sqlite3.Connection, job: Job, scope: Scope, text: str, limit: int, df: DocFrequencies
) -> list[int]:
    """The rowids of `scope`'s memories that hold more and rarer terms of `text`, best
    first (ties: newest first), at most `limit`."""
    terms = _fts_terms(text)
    if not terms:
        return []
    counts = conn.execute(
        "SELECT (SELECT memories FROM scopes WHERE organization_id = ? AND agent_id = ?), "
        "sum(memories), sum(version) FROM scopes",
        (scope.organization_id, scope.agent_id),
    ).fetchone()
    in_scope, total, writes = int(counts[0] or 0), int(counts[1] or 0), int(counts[2] or 0)
    if in_scope == 0:
        return []
    keys = {tok: _strip_diacritics(tok) for t in terms for tok in t}
    freq = df.lookup(conn, set(keys.values()), total, writes)
    cap = max(FTS_PRUNE_MIN_DOCS, FTS_MAX_DOC_FRACTION * total)
    # A phrase is in no more memories than its rarest token.
    by_rarity = sorted((min(freq[keys[tok]] for tok in t), k) for k, t in enumerate(terms))
    # Terms no memory holds are skipped: they would only take the place of one that finds
    # something.
    chosen = [(d, terms[k]) for d, k in by_rarity if 0 < d <= cap][:FTS_QUERY_TERMS]
    if not chosen:
        return []
    # One statement: per term, its newest `limit` matches (FTS5 stops after `limit` rows,
    # where a single OR query ranked by bm25 would score every match of every term in the
    # whole table first), each carrying its term's IDF; a memory scores the IDFs of the
    # chosen terms it holds. The ranking runs inside SQLite, so only the `limit` rows
    # returned cross into Python (each row fetched re-takes the GIL, which under load
    # waits behind the other threads). The IDFs are summed as integers (micro-units), so
    # the order the rows are added in cannot change a sum or break a tie differently.
    job.check()
    hits = " UNION ALL ".join(
        "SELECT * FROM (SELECT rowid AS r, ? AS w FROM memories_fts WHERE memories_fts MATCH ? "
        "ORDER BY rowid DESC LIMIT ?)"
        for _ in chosen
    )
    args: list[object] = []
    for d, term in chosen:
        args += [round(_IDF_UNITS * math.log(1.0 + total / (d + 1.0))), _fts_expression(scope, [term]), limit]
    sql = f"SELECT r FROM ({hits}) GROUP BY r ORDER BY sum(w) DESC, r DESC LIMIT ?"
    return [r for (r,) in conn.execute(sql, [*args, limit]).fetchall()]
