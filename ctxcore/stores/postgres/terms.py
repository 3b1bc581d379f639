"""The full-text search keys of the term table: a memory's words as the SQLite store's
FTS5 index holds them (and pairs of adjacent CJK characters), a query's terms in the
same form, long ones as digests."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..text import CJK_CHAR, normalize, search_words, strip_diacritics, words

#: A search key longer than this many UTF-8 bytes is stored as a digest (a b-tree entry
#: holds at most ~2.7 kB; no real word comes near).
TERM_MAX_BYTES = 256


def term_key(term: str) -> str:
    # Words are letters and digits only, so neither the "#" of a digest nor the space of
    # a character pair can make two different terms one key.
    raw = term.encode()
    return term if len(raw) <= TERM_MAX_BYTES else "#" + hashlib.sha256(raw).hexdigest()


def doc_terms(text: str) -> list[str]:
    """The search keys of a memory's text: its distinct words as the SQLite store's FTS5
    index holds them (NFKC, case folded, diacritics removed, English words stemmed, every
    CJK character a word),
    and each pair of adjacent CJK characters (a query's CJK run is searched as its
    character pairs, as the FTS5 phrase "c1 c2" finds them).

    >>> doc_terms("Rückgabe: 返金は30日以内")
    ['30', 'ruckgab', 'は', '以', '以 内', '内', '日', '日 以', '返', '返 金', '金', '金 は']
    """
    ws = words(normalize(text))
    keys = {strip_diacritics(w) for w in search_words(ws)}
    for a, b in zip(ws, ws[1:]):
        if CJK_CHAR.fullmatch(a) and CJK_CHAR.fullmatch(b):
            keys.add(strip_diacritics(a) + " " + strip_diacritics(b))
    keys.discard("")
    return sorted(term_key(k) for k in keys)


def query_keys(terms: Sequence[tuple[str, ...]]) -> list[str]:
    """The search keys of a query's full-text terms (`fts_terms`: a word, or two adjacent
    CJK characters), in the same form as `doc_terms`; bound as parameters, never parsed.

    >>> query_keys([("returns",), ("返", "金"), ("it's",)])
    ['returns', '返 金', "it's"]
    """
    out: list[str] = []
    for t in terms:
        key = " ".join(strip_diacritics(tok) for tok in t)
        if key.strip():
            out.append(term_key(key))
    return out
