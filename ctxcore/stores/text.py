"""Text shared by both stores and the hashing embedder: Unicode normalization, word
segmentation that also works for scripts written without spaces, the form a word is
searched under (English words stemmed), a query's full-text terms, and the thresholds both
stores' full-text search applies to them.

Chinese, Japanese and Korean text has no spaces between words, so a word tokenizer sees
a whole sentence as one token. Both the FTS5 index and the embedder therefore treat each
CJK character as a word of its own; a multi-character query word then matches as a
phrase of consecutive characters.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from typing import Any

import Stemmer  # type: ignore[import-not-found,import-untyped,unused-ignore]

__all__ = [
    "CJK_CHAR",
    "CJK_RUN",
    "FTS_MAX_DOC_FRACTION",
    "FTS_PRUNE_MIN_DOCS",
    "FTS_QUERY_TERMS",
    "MAX_FTS_TERMS",
    "cjk_spaced",
    "fts_terms",
    "normalize",
    "FTS_STEMMER",
    "raw_words",
    "search_word",
    "search_words",
    "strip_diacritics",
    "words",
]

# Han (URO, extension A, compatibility, the supplementary planes), kana, half-width kana,
# Hangul syllables and jamo, bopomofo.
_CJK = (
    "\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
)
#: One CJK character (captured).
CJK_CHAR = re.compile(f"([{_CJK}])")
#: A run of CJK characters (captured, so ``CJK_RUN.split`` keeps the runs).
CJK_RUN = re.compile(f"([{_CJK}]+)")
# A word: a run of letters and digits (``\w`` without the underscore).
_WORD = re.compile(r"[^\W_]+")


def normalize(text: str) -> str:
    """NFKC and case folding, so that full-width, ligature and case variants compare equal."""
    return unicodedata.normalize("NFKC", text).casefold()


def cjk_spaced(text: str) -> str:
    """`text` with a space either side of every CJK character."""
    return CJK_CHAR.sub(r" \1 ", text)


def raw_words(text: str) -> list[str]:
    """The letter/digit runs of `text`, CJK runs kept whole."""
    return _WORD.findall(text)


def words(text: str) -> list[str]:
    """The words of `text`, every CJK character a word of its own."""
    return _WORD.findall(cjk_spaced(text))


#: At most this many distinct query terms go into a full-text query, so a long query text
#: cannot make one arbitrarily expensive.
MAX_FTS_TERMS = 32
#: A query term found in more than this fraction of the scope's memories says little
#: about any of them (function words: "to", "the", "der", "的") and is left out of the
#: full-text query, which bounds the rows BM25 scores. 10% removes the function words of
#: conversational and support corpora while keeping names and topic words a
#: conversation returns to. Both stores count within the scope.
FTS_MAX_DOC_FRACTION = 0.10
#: Terms are pruned only when they are in more than this many of the scope's memories, so
#: a small scope keeps its terms.
FTS_PRUNE_MIN_DOCS = 8
#: Full-text retrieval searches the query's rarest this-many informative terms. Each is
#: one indexed query that stops after `limit` rows (~0.1-0.5 ms), so this bounds the cost.
FTS_QUERY_TERMS = 8


class _Marks(dict[int, "int | None"]):
    """A `str.translate` table that deletes combining marks (a non-zero canonical
    combining class) and keeps every other character, filled as characters are met; past
    `_MARKS_KEPT` entries a character is looked up each time instead of kept."""

    def __missing__(self, cp: int) -> int | None:
        kept = None if unicodedata.combining(chr(cp)) else cp
        if len(self) < _MARKS_KEPT:
            self[cp] = kept
        return kept


_MARKS_KEPT = 1 << 16
_MARKS = _Marks()


def strip_diacritics(token: str) -> str:
    """`token` without its combining marks: what FTS5's unicode61 tokenizer's
    remove_diacritics does, near enough to look a term up in an index of words (a miss
    only costs the pruning of that one term).

    >>> strip_diacritics("Crème brûlée, Ὀδυσσεύς")
    'Creme brulee, Οδυσσευς'
    """
    if token.isascii():
        return token  # nothing to decompose
    return unicodedata.normalize("NFKD", token).translate(_MARKS)


#: The Snowball stemmer (PyStemmer) that full-text search applies to words of Latin
#: letters: a memory that says "painted" or "paintings" is found by a question about
#: "painting", in both stores, and a word of another script is searched as written.
#: Measured on conversational memory, stemming the index and the query adds 4-8% evidence
#: recall at equal spend (docs/quality.md).
FTS_STEMMER = "english"
_ASCII_WORD = re.compile(r"[a-z]+")
_local = threading.local()


def _stemmer() -> Any:
    # One per thread: a PyStemmer object keeps a cache of its own and is not meant to be
    # shared between threads.
    s = getattr(_local, "stemmer", None)
    if s is None:
        s = _local.stemmer = Stemmer.Stemmer(FTS_STEMMER)
    return s


def search_word(word: str) -> str:
    """The form a normalized word (`words`) is indexed and searched under: a word of
    Latin letters without its diacritics, stemmed (`FTS_STEMMER`); any other word as it
    is.

    >>> [search_word(w) for w in ("painted", "paintings", "café", "2023", "返")]
    ['paint', 'paint', 'cafe', '2023', '返']
    """
    bare = word if word.isascii() else strip_diacritics(word)
    return str(_stemmer().stemWord(bare)) if _ASCII_WORD.fullmatch(bare) else word


def search_words(ws: list[str]) -> list[str]:
    """`search_word` of each of `ws`, in one call to the stemmer.

    >>> search_words(["walked", "over", "bridges"])
    ['walk', 'over', 'bridg']
    """
    out = list(ws)
    at = []
    for i, w in enumerate(ws):
        bare = w if w.isascii() else strip_diacritics(w)
        if _ASCII_WORD.fullmatch(bare):
            out[i] = bare
            at.append(i)
    if at:
        for i, stem in zip(at, _stemmer().stemWords([out[i] for i in at])):
            out[i] = str(stem)
    return out


def fts_terms(text: str) -> list[tuple[str, ...]]:
    """The distinct full-text terms of `text` (at most `MAX_FTS_TERMS`), each as the
    tokens of one phrase: a word in its searched form (`search_word`), or two consecutive
    CJK characters.

    >>> fts_terms("Who painted the bridges? Painting 返金")
    [('who',), ('paint',), ('the',), ('bridg',), ('返', '金')]
    """
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
                terms.setdefault((search_word(piece),), None)
            if len(terms) >= MAX_FTS_TERMS:
                return list(terms)
    return list(terms)
