"""Full-text retrieval in the SQLite store: how text becomes FTS5 terms and MATCH
expressions (user text only ever as quoted strings), which terms are worth searching
(document frequencies, cached), and the search itself.

Every word is indexed under its scope: the FTS5 table ``memory_words`` holds, for each
memory, its words each prefixed with the scope's tag (``s`` and 16 hex digits of a hash of
the scope), so a term's doclist is that scope's memories holding the word. A query looks
up only its own scope's tagged terms, never intersecting a term with a whole scope's
doclist (2-2.5 times cheaper per search on the 100k benchmark store), and the vocabulary
gives each term's count of memories in the scope.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ...memory import Scope
from ..text import (
    FTS_MAX_DOC_FRACTION,
    FTS_PRUNE_MIN_DOCS,
    FTS_QUERY_TERMS,
    fts_terms,
    normalize,
    search_words,
    strip_diacritics,
    words,
)

__all__ = [
    "FTS_TOKENIZER",
    "DocFrequencies",
    "Interruptible",
    "fts_body",
    "fts_match_expression",
    "scope_tag",
    "search",
]


class Interruptible(Protocol):
    """What the search needs of the reader's job (`ctxcore.stores.sqlite.readers.Job`):
    `check` raises once the job was cancelled, so a search stops between statements."""

    def check(self) -> None: ...


# Document-frequency cache: entries are re-read once their scope has grown by this
# factor, and the cache is emptied beyond this many terms.
_DF_CACHE_GROWTH = 1.1
_DF_CACHE_TERMS = 100_000
# Absent tokens are remembered for at most this many scopes at a time.
_DF_ABSENT_SCOPES = 4096


@functools.lru_cache(maxsize=4096)
def scope_tag(organization_id: str, agent_id: str) -> str:
    """The prefix of every indexed word of a scope: letters and digits only, so the tagged
    word is one FTS5 token wherever the word itself is. Two scopes sharing a tag (64
    bits) would only share ranking slots: the rows a search returns are read back
    within the scope."""
    digest = hashlib.sha256(f"{organization_id}\x00{agent_id}".encode()).hexdigest()
    return "s" + digest[:16]


def fts_body(organization_id: str, agent_id: str, text: str) -> str:
    """What `memory_words` indexes for a memory: its words in their searched form
    (`ctxcore.stores.text.search_word`: English words stemmed; every CJK character a word
    of its own, split where FTS5 splits them, see `_fts_words`), each prefixed with the
    scope's tag."""
    tag = scope_tag(organization_id, agent_id)
    return " ".join([tag + w for w in _fts_words(search_words(words(normalize(text))))])


#: The FTS5 tokenizer of `memory_words`.
FTS_TOKENIZER = "unicode61 remove_diacritics 2"
# Which non-ASCII characters (letters or digits to Python) FTS5's tokenizer separates:
# asked of FTS5 itself, once per character and process.
_SEPARATES: dict[str, bool] = {}
_PROBE_LOCK = threading.Lock()
_probe: list[sqlite3.Connection] = []


def _fts_separators(chars: set[str]) -> set[str]:
    """Those of `chars` that `FTS_TOKENIZER` treats as separators. Its Unicode tables
    (6.1) are older than Python's: some characters that are letters or digits to Python
    (New Tai Lue vowel signs, U+19B0-U+19C9, say, or letters of scripts added since) are
    separators to FTS5. Each is asked of an in-memory FTS5 table, as the middle of a
    three-character document: a separator leaves the first character a token of its own."""
    unknown = [c for c in chars if c not in _SEPARATES]
    if unknown:
        with _PROBE_LOCK:
            if not _probe:
                conn = sqlite3.connect(":memory:", check_same_thread=False)
                conn.execute(f"CREATE VIRTUAL TABLE probe USING fts5(x, tokenize = '{FTS_TOKENIZER}')")
                _probe.append(conn)
            conn = _probe[0]
            conn.executemany("INSERT INTO probe (rowid, x) VALUES (?, ?)", [(ord(c), f"a{c}b") for c in unknown])
            split = {chr(r[0]) for r in conn.execute("SELECT rowid FROM probe WHERE probe MATCH 'a'")}
            conn.execute("DELETE FROM probe")
            for c in unknown:
                _SEPARATES[c] = c in split
    return {c for c in chars if _SEPARATES[c]}


def _fts_words(ws: list[str]) -> list[str]:
    """`ws` split further where FTS5's tokenizer separates (`_fts_separators`), so that
    every word is one FTS5 token: a tagged word is then one token that starts with its
    own scope's tag, and a memory's text cannot put an entry under another scope's tag
    ("zz" + separator + another tag + "kettle" would otherwise index that tag's
    "kettle")."""
    wide = {c for w in ws if not w.isascii() for c in w if not c.isascii()}
    seps = _fts_separators(wide) if wide else set()
    if not seps:
        return ws
    out: list[str] = []
    for w in ws:
        if w.isascii() or seps.isdisjoint(w):
            out.append(w)
            continue
        piece: list[str] = []
        for ch in w:
            if ch in seps:
                if piece:
                    out.append("".join(piece))
                piece = []
            else:
                piece.append(ch)
        if piece:
            out.append("".join(piece))
    return out


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def _search_terms(text: str) -> list[tuple[str, ...]]:
    """`fts_terms` as this store indexes them: a word FTS5 would split is its pieces
    (`_fts_words`), each a term."""
    out: dict[tuple[str, ...], None] = {}
    for t in fts_terms(text):
        if len(t) == 1 and not t[0].isascii():
            for w in _fts_words([t[0]]):
                out.setdefault((w,), None)
        else:
            out.setdefault(t, None)
    return list(out)


def _tagged_phrase(tag: str, term: tuple[str, ...]) -> str:
    """One term as a quoted FTS5 string of its tokens, each with the scope's tag."""
    return _quote(" ".join(tag + tok for tok in term))


def _fts_expression(scope: Scope, terms: Sequence[tuple[str, ...]]) -> str:
    tag = scope_tag(scope.organization_id, scope.agent_id)
    return " OR ".join(_tagged_phrase(tag, t) for t in terms)


#: Query texts up to this long have their terms kept (`_query_terms`): the same questions
#: come back call after call, and a CJK question's terms took ~40 us to work out.
_TERMS_CACHE_CHARS = 512


def _terms_and_spellings(text: str) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    """`_search_terms(text)`, and each term's tokens as the vocabulary spells them
    (`strip_diacritics`)."""
    terms = tuple(_search_terms(text))
    return terms, tuple(tuple(strip_diacritics(tok) for tok in t) for t in terms)


_kept_terms = functools.lru_cache(maxsize=1024)(_terms_and_spellings)


def _query_terms(text: str) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    """`_terms_and_spellings(text)`, kept for texts up to `_TERMS_CACHE_CHARS` long."""
    return _kept_terms(text) if len(text) <= _TERMS_CACHE_CHARS else _terms_and_spellings(text)


def fts_match_expression(scope: Scope, text: str) -> str | None:
    """The FTS5 MATCH expression for a full-text query of `text` within `scope`, before
    the store leaves out its uninformative terms.

    Every word of `text`, in its searched form (English words stemmed), becomes a quoted
    FTS5 string (so no user text is ever read as FTS5 syntax: operators, column filters,
    prefixes and parentheses are just characters that the tokenizer drops) of the word
    prefixed with the scope's tag, so it can only match words of that scope's memories;
    the words are OR-ed. CJK runs become
    overlapping two-character phrases. At most `MAX_FTS_TERMS` distinct terms are used.
    None when `text` has no words.

    >>> tag = scope_tag("o", "a")
    >>> fts_match_expression(Scope("o", "a"), 'refund" OR body:x*').replace(tag, "<o/a>")
    '"<o/a>refund" OR "<o/a>or" OR "<o/a>bodi" OR "<o/a>x"'
    >>> fts_match_expression(Scope("o", "a"), "返金ポリ").replace(tag, "<o/a>")
    '"<o/a>返 <o/a>金" OR "<o/a>金 <o/a>ポ" OR "<o/a>ポ <o/a>リ"'
    >>> fts_match_expression(Scope("o", "a"), "?!") is None
    True
    """
    terms = fts_terms(text)
    return _fts_expression(scope, terms) if terms else None


class DocFrequencies:
    """How many memories of a scope hold each of its tagged tokens, read from the FTS5
    vocabulary of `memory_words`.

    Looking a token up in the vocabulary reads its doclist, so counts are cached until
    the token's scope has grown by a tenth since they were read. A token no memory of its
    scope holds is remembered as absent only until that scope is written again (its
    write counter moves: a write by any process), so a memory added later that holds it is
    searched for it at once; writes to other scopes leave it be. `clear` after deletes."""

    __slots__ = ("_cache", "_absent")

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, int]] = {}
        # Per scope tag: the scope's (memory count, write counter) when its absent tokens
        # were read, and those tokens.
        self._absent: dict[str, tuple[tuple[int, int], set[str]]] = {}

    def clear(self) -> None:
        self._cache.clear()
        self._absent.clear()

    def lookup(
        self, conn: sqlite3.Connection, tokens: set[str], size: int, state: tuple[str, int, int] | None = None
    ) -> dict[str, int]:
        """Each token's count of memories, the tokens' scope holding `size` memories;
        `state` (the scope's tag, memory count and write counter; None: unknown) keys the
        absent tokens."""

        def read(missing: list[str]) -> dict[str, int]:
            return dict(
                conn.execute(
                    "SELECT term, doc FROM memory_words_vocab WHERE term IN (SELECT value FROM json_each(?))",
                    (json.dumps(sorted(missing), ensure_ascii=False),),
                ).fetchall()
            )

        return self._counts(tokens, size, state, read)

    def phrases(
        self, conn: sqlite3.Connection, expressions: set[str], size: int, state: tuple[str, int, int] | None = None
    ) -> dict[str, int]:
        """Each phrase's count of memories (a phrase as its MATCH expression, one quoted
        string of tagged tokens: a CJK bigram), counted in the index (one scope's
        doclists, small), cached like `lookup`'s tokens."""

        def read(missing: list[str]) -> dict[str, int]:
            sql = " UNION ALL ".join("SELECT ?, count(*) FROM memory_words WHERE memory_words MATCH ?" for _ in missing)
            return dict(conn.execute(sql, [v for e in missing for v in (e, e)]).fetchall())

        return self._counts(expressions, size, state, read)

    def _counts(
        self,
        keys: set[str],
        size: int,
        state: tuple[str, int, int] | None,
        read: Callable[[list[str]], dict[str, int]],
    ) -> dict[str, int]:
        """The counts of `keys` from the cache, the rest from `read` (then cached)."""
        absent: set[str] = set()
        if state is not None:
            tag, now = state[0], (state[1], state[2])
            entry = self._absent.get(tag)
            if entry is None or entry[0] != now:
                if entry is None and len(self._absent) >= _DF_ABSENT_SCOPES:
                    self._absent.clear()
                entry = self._absent[tag] = (now, set())
            absent = entry[1]
        out: dict[str, int] = {}
        missing = []
        for key in keys:
            hit = self._cache.get(key)
            if hit is not None and size <= hit[1] * _DF_CACHE_GROWTH:
                out[key] = hit[0]
            elif key in absent:
                out[key] = 0
            else:
                missing.append(key)
        if missing:
            found = read(missing)
            if len(self._cache) + len(missing) > _DF_CACHE_TERMS:
                self._cache.clear()
            if len(absent) + len(missing) > _DF_CACHE_TERMS:
                absent.clear()
            for key in missing:
                out[key] = int(found.get(key, 0))
                if out[key]:
                    self._cache[key] = (out[key], size)
                elif state is not None:
                    absent.add(key)
        return out


def search(
    conn: sqlite3.Connection,
    job: Interruptible,
    scope: Scope,
    text: str,
    limit: int,
    df: DocFrequencies,
    counts: tuple[int, int],
) -> tuple[list[int], list[float]]:
    """The rowids of `scope`'s memories that match terms of `text`, best first by BM25
    (ties: newest first), at most `limit`, and their BM25 scores (>= 0). `counts`: the
    scope's (memories, write counter) as the caller just read them on `conn`."""
    terms, spelled = _query_terms(text)
    in_scope, version = counts
    if not terms or not in_scope:
        return [], []
    tag = scope_tag(scope.organization_id, scope.agent_id)
    state = (tag, in_scope, version)
    keys = {tok: tag + sp for t, st in zip(terms, spelled) for tok, sp in zip(t, st)}
    freq = df.lookup(conn, set(keys.values()), in_scope, state)
    # A phrase (a CJK bigram) is counted as a phrase: each of its characters may be common
    # in the scope while the pair is rare. One with a token no memory holds is not counted.
    phrases = {
        k: _tagged_phrase(tag, t) for k, t in enumerate(terms) if len(t) > 1 and all(freq[keys[tok]] for tok in t)
    }
    pfreq = df.phrases(conn, set(phrases.values()), in_scope, state) if phrases else {}

    def count(k: int, term: tuple[str, ...]) -> int:
        if len(term) == 1:
            return freq[keys[term[0]]]
        return pfreq[phrases[k]] if k in phrases else 0

    cap = max(FTS_PRUNE_MIN_DOCS, FTS_MAX_DOC_FRACTION * in_scope)
    by_rarity = sorted((count(k, t), k) for k, t in enumerate(terms))
    # Terms no memory holds are skipped: they would only take the place of one that finds
    # something.
    chosen = [(d, k) for d, k in by_rarity if 0 < d <= cap][:FTS_QUERY_TERMS]
    if not chosen:
        return [], []
    # One statement: the chosen terms OR-ed, ranked by FTS5's Okapi BM25 (k1 = 1.2,
    # b = 0.75) inside SQLite, so only the `limit` best rows cross into Python, as one row
    # of two lists (each row fetched re-takes the GIL). bm25() is negative, better lower:
    # the score returned is its negation. Ties: newest first.
    job.check()
    expression = " OR ".join(phrases.get(k) or _tagged_phrase(tag, terms[k]) for _, k in chosen)
    sql = (
        "SELECT group_concat(r), group_concat(s) FROM (SELECT rowid AS r, -bm25(memory_words) AS s "
        "FROM memory_words WHERE memory_words MATCH ? ORDER BY s DESC, r DESC LIMIT ?)"
    )
    got = conn.execute(sql, (expression, limit)).fetchone()
    if got is None or got[0] is None:
        return [], []
    rowids = [int(v) for v in got[0].split(",")]
    scores = [max(0.0, float(v)) for v in got[1].split(",")]
    order = sorted(range(len(rowids)), key=lambda i: (-scores[i], -rowids[i]))
    return [rowids[i] for i in order], [scores[i] for i in order]
