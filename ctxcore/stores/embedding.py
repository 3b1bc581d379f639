"""Offline embeddings for the stores: a lexical feature-hashing embedder.

`HashingEmbedder` gives the SQLite store and the demo embeddings without downloading a
model. It is not a neural model: it maps a text's normalized word unigrams, word bigrams
and character trigrams into a fixed number of signed buckets (the "hashing trick") and
L2-normalizes the result, so the cosine of two embeddings measures shared words and
spellings, not meaning. Paraphrases without shared words score near 0, and a short query
against a long memory scores lower than a neural model would (every feature of the
memory that the query lacks dilutes the cosine), so pair it with a lower ANN cutoff than
the 0.70 meant for neural embeddings. It is deterministic across processes and platforms
(CRC-32 and SplitMix64, never Python's salted ``hash``) and written with numpy alone, so
the package needs no scipy or scikit-learn for it. Stores accept any embeddings a user
supplies instead.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .text import cjk_spaced, normalize, raw_words

__all__ = ["DEFAULT_EMBEDDING_DIM", "Embedder", "HashingEmbedder", "unit"]

#: Default dimension. Signed hashing leaves unrelated texts a cosine of about
#: ±1/sqrt(dim) from bucket collisions: ±0.06 at 256, far below any useful cutoff, at two
#: thirds of the scan cost of a 384-dimensional model (the cold path reads every vector of
#: the scope per query).
DEFAULT_EMBEDDING_DIM = 256

# Feature weights: whole words carry the meaning; trigrams add robustness to inflection
# and typos, at half weight so they do not drown the words out.
_WORD_WEIGHT = 1.0
_BIGRAM_WEIGHT = 1.0
_TRIGRAM_WEIGHT = 0.5

# SplitMix64 constants (Steele, Lea, Flood 2014), and one salt per feature namespace so a
# word and a trigram with the same key do not land in the same bucket.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SALT_WORD, _SALT_BIGRAM, _SALT_TRIGRAM = (np.uint64((k * 0x632BE59BD9B4E019) % 2**64) for k in (1, 2, 3))
_SPACE = np.uint64(32)
_NAME = re.compile(r"hashing-v1/dim=([1-9][0-9]*)/seed=(0|[1-9][0-9]*)")


def unit(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float32] | None:
    """`v` (finite) scaled to length 1, as float32; None for the zero vector (no
    direction). Scaled by its largest magnitude first, so that the squares of very large
    or very small values (1e200, 1e-200) neither overflow nor vanish.

    >>> [round(x, 6) for x in unit(np.array([1e200, 1e200])).tolist()]
    [0.707107, 0.707107]
    >>> unit(np.array([1e-200, 1e-200])).tolist() == unit(np.array([3.0, 3.0])).tolist()
    True
    """
    top = float(np.max(np.abs(v))) if v.size else 0.0
    if top == 0.0:
        return None
    v = v / top
    return (v / float(np.sqrt(v @ v))).astype(np.float32)


@runtime_checkable
class Embedder(Protocol):
    """What a store needs to embed texts itself (any model can be wrapped in this): a
    `name` for the embedding space, recorded in the database so that a store is never
    opened with an incompatible model, and `embed`.

    >>> isinstance(HashingEmbedder(), Embedder)
    True
    """

    @property
    def name(self) -> str:
        """Names the embedding space: equal names give comparable embeddings."""
        ...

    def embed(self, text: str) -> npt.NDArray[np.float32]:
        """The embedding of `text`: a 1-D array of finite numbers (any scale)."""
        ...


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    # Arrays wrap modulo 2**64 silently, which is what the mix wants.
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    out: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return out


class HashingEmbedder:
    """A deterministic lexical embedder: feature hashing of word unigrams, word bigrams and
    character trigrams into `dim` signed buckets, L2-normalized, float32.

    Text is NFKC-normalized and case-folded first; every CJK character counts as a word,
    and character trigrams run over whole letter runs (so CJK runs give character
    trigrams too). A text without letters, digits or three characters gives the zero
    vector.

    Args:
        dim: the embedding dimension, >= 16.
        seed: varies the hash functions; embeddings of different seeds are unrelated.

    >>> e = HashingEmbedder(64)
    >>> v = e.embed("Refunds within 30 days")
    >>> v.shape, round(float(v @ v), 5)
    ((64,), 1.0)
    >>> bool(v @ e.embed("refunds within 30 days") > 0.999)
    True
    """

    __slots__ = ("_dim", "_salt", "_seed")

    def __init__(self, dim: int = DEFAULT_EMBEDDING_DIM, *, seed: int = 0) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 16:
            raise ValueError(f"dim must be an int >= 16, got {dim!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
        self._dim = dim
        self._seed = seed
        self._salt = _splitmix64(np.array([seed], dtype=np.uint64))[0]

    @property
    def dim(self) -> int:
        """The embedding dimension."""
        return self._dim

    @property
    def name(self) -> str:
        """Names the embedding space: equal names give comparable embeddings.

        >>> HashingEmbedder(128, seed=3).name
        'hashing-v1/dim=128/seed=3'
        """
        return f"hashing-v1/dim={self._dim}/seed={self._seed}"

    @classmethod
    def from_name(cls, name: str) -> HashingEmbedder | None:
        """The embedder a `name` describes, or None if it names no hashing embedder.

        >>> HashingEmbedder.from_name("hashing-v1/dim=128/seed=3")
        HashingEmbedder(dim=128, seed=3)
        >>> HashingEmbedder.from_name("text-embedding-3-small") is None
        True
        >>> HashingEmbedder.from_name("hashing-v1/dim=8/seed=0") is None  # no dimension it takes
        True
        """
        m = _NAME.fullmatch(name) if isinstance(name, str) and len(name) <= 64 else None
        if m is None:
            return None
        try:
            return cls(int(m.group(1)), seed=int(m.group(2)))
        except ValueError:  # a dimension or seed out of range: no embedder of this class
            return None

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self._dim}, seed={self._seed})"

    def embed(self, text: str) -> npt.NDArray[np.float32]:
        """The embedding of one text: shape ``(dim,)``, float32, unit length (or zero).

        >>> bool(HashingEmbedder(32).embed("").any())
        False
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        keys, weights = self._features(normalize(text))
        if keys.size == 0:
            return np.zeros(self._dim, dtype=np.float32)
        h = _splitmix64(keys ^ self._salt)
        buckets = (h % np.uint64(self._dim)).astype(np.intp)
        signs = np.where((h >> np.uint64(63)) == 1, -1.0, 1.0)
        v = np.bincount(buckets, weights=signs * weights, minlength=self._dim)
        norm = float(np.sqrt(v @ v))
        if norm == 0.0:  # every feature cancelled out: as featureless as empty text
            return np.zeros(self._dim, dtype=np.float32)
        return (v / norm).astype(np.float32)

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embeddings of several texts: shape ``(len(texts), dim)``, float32.

        >>> HashingEmbedder(32).embed_many(["a b c", "d e f"]).shape
        (2, 32)
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of str, not a str")
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = self.embed(t)
        return out

    @staticmethod
    def _features(text: str) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float64]]:
        runs = raw_words(text)
        tokens = raw_words(cjk_spaced(" ".join(runs)))
        word_h = np.array([zlib.crc32(w.encode("utf-8")) for w in tokens], dtype=np.uint64)
        parts = [word_h + _SALT_WORD]
        weights = [np.full(word_h.size, _WORD_WEIGHT)]
        if word_h.size > 1:
            parts.append(((word_h[:-1] << np.uint64(32)) | word_h[1:]) + _SALT_BIGRAM)
            weights.append(np.full(word_h.size - 1, _BIGRAM_WEIGHT))
        if runs:
            # Code points of " w1 w2 ... ": a trigram whose middle is a space spans two
            # words and is left out; 21 bits per code point pack a trigram exactly.
            cps = np.frombuffer((" " + " ".join(runs) + " ").encode("utf-32-le"), dtype=np.uint32)
            c = cps.astype(np.uint64)
            keep = c[1:-1] != _SPACE
            tri = ((c[:-2] << np.uint64(42)) | (c[1:-1] << np.uint64(21)) | c[2:])[keep]
            parts.append(tri + _SALT_TRIGRAM)
            weights.append(np.full(tri.size, _TRIGRAM_WEIGHT))
        return np.concatenate(parts), np.concatenate(weights)
