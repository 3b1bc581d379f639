"""Redundancy: which candidates are near-duplicates of each other, as packer groups.

Sits between scoring and packing. Near-duplicate memories (the same fact stored twice, a
re-ingested document, a copy with other capitalization or punctuation) should not both
take room in the context; `near_duplicate_groups` labels them, and the packer
(`ctxcore.pack_arrays(..., groups=...)`) then selects at most one member of each group,
the one the knapsack finds best, and records the others as `Reason.REDUNDANT`.

Two candidates are in one group when their normalised texts are equal (NFKC, case
folded, diacritics stripped, whitespace and punctuation collapsed: the normalisation of
`ctxcore.stores.text`), or, given embedding vectors, when their cosine similarity is at
least the threshold; groups are the connected components of those pairs (union-find), so
a chain of near-duplicates is one group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._numbers import as_real
from .errors import invalid

__all__ = [
    "DEFAULT_DUPLICATE_THRESHOLD",
    "TextKeys",
    "groups_from_keys",
    "has_duplicates",
    "near_duplicate_groups",
    "normalized_text_key",
]

#: Cosine similarity at or above which two embeddings are near-duplicates. 0.95 keeps
#: rewordings of one sentence together (paraphrases of one fact score ~0.9-0.97 on
#: sentence embedders) while two memories about one topic (~0.6-0.85) stay apart.
DEFAULT_DUPLICATE_THRESHOLD = 0.95
#: Rows of the similarity matrix computed at once: bounds the memory to
#: ``_BLOCK_ROWS x n`` doubles (2 MiB at 1,000 candidates) whatever n is.
_BLOCK_ROWS = 256
#: Float slack on the threshold: a vector's cosine with a copy of itself is 1 only up to
#: rounding, and threshold 1.0 must still group exact copies.
_COSINE_SLACK = 1e-9


def normalized_text_key(text: str) -> str:
    """The text as near-duplicate detection compares it.

    NFKC and case folding, combining marks (diacritics) removed, and every run of
    whitespace, punctuation and symbols collapsed to one space (letters and digits kept,
    CJK characters included). Empty when the text has no letter or digit.

    >>> normalized_text_key("  Café -- CLOSED on Mondays!! ")
    'cafe closed on mondays'
    """
    # Imported here: ctxcore.stores is loaded on first use, not with the package.
    from .stores.text import normalize, raw_words, strip_diacritics

    return " ".join(raw_words(strip_diacritics(normalize(text))))


def _vectors_array(vectors: npt.ArrayLike, n: int) -> npt.NDArray[np.float64]:
    if isinstance(vectors, np.ma.MaskedArray):
        # numpy drops the mask on conversion: masked entries would be compared as data.
        raise invalid(
            "vectors must not be a masked array (np.ma.MaskedArray): its mask would be ignored; "
            "leave the masked rows out, or pass .filled(value)"
        )
    arr = np.asarray(vectors)
    if arr.ndim != 2:
        raise invalid(f"vectors must be a 2-D array (one row per text), got {arr.ndim} dimensions")
    if arr.shape[0] != n:
        raise invalid(f"mismatched lengths: {n} texts, {arr.shape[0]} vectors")
    if arr.dtype.kind not in "iuf":
        raise invalid(f"vectors must be real numbers, got an array of dtype {arr.dtype}")
    out = arr.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
    if bad.size:
        i = int(bad[0])
        raise invalid(f"candidate at index {i}: vector must be finite, got a NaN or an infinity", i)
    return out


def _similar_pairs(vectors: npt.NDArray[np.float64], threshold: float) -> tuple[npt.NDArray[np.intp], ...]:
    """The pairs (i < j) whose cosine is at least `threshold`, block by block."""
    # Rows scaled to unit length; a zero vector has no direction and is close to nothing.
    # Each row is first divided by its largest magnitude, so the sum of squares neither
    # overflows (1e200) nor vanishes (1e-200) for any finite vector.
    top = np.max(np.abs(vectors), axis=1) if vectors.shape[1] else np.zeros(vectors.shape[0])
    scaled = np.divide(vectors, top[:, None], out=np.zeros_like(vectors), where=top[:, None] > 0)
    norms = np.linalg.norm(scaled, axis=1)
    unit = np.divide(scaled, norms[:, None], out=np.zeros_like(scaled), where=norms[:, None] > 0)
    firsts: list[npt.NDArray[np.intp]] = []
    seconds: list[npt.NDArray[np.intp]] = []
    n = unit.shape[0]
    for start in range(0, n, _BLOCK_ROWS):
        stop = min(n, start + _BLOCK_ROWS)
        sims = unit[start:stop] @ unit[start:].T  # columns from `start`: the upper triangle
        rows, cols = np.nonzero(sims >= threshold - _COSINE_SLACK)
        cols = cols + start
        rows = rows + start
        keep = cols > rows
        firsts.append(rows[keep])
        seconds.append(cols[keep])
    if not firsts:
        empty = np.zeros(0, np.intp)
        return empty, empty
    return np.concatenate(firsts), np.concatenate(seconds)


def _components(n: int, a: npt.NDArray[np.intp], b: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """Each position's smallest connected position over the edges (a[k], b[k]).

    Union-find in numpy: every edge hooks the larger of its two roots under the smaller,
    then pointer jumping flattens the trees; repeated until no edge joins two roots.
    Each round costs O(edges) and the number of rounds grows with the log of the
    components' sizes.
    """
    parent = np.arange(n)
    while a.size:
        ra, rb = parent[a], parent[b]
        joined = ra != rb
        if not joined.any():
            break
        lo, hi = np.minimum(ra, rb)[joined], np.maximum(ra, rb)[joined]
        np.minimum.at(parent, hi, lo)
        while True:
            up = parent[parent]
            if np.array_equal(up, parent):
                break
            parent = up
        a, b = a[joined], b[joined]
    return parent


def near_duplicate_groups(
    texts: Sequence[str],
    vectors: npt.ArrayLike | None = None,
    *,
    threshold: float = DEFAULT_DUPLICATE_THRESHOLD,
) -> npt.NDArray[np.int64]:
    """Group labels for the packer: near-duplicates share a label, the rest get -1.

    Two texts are near-duplicates when their `normalized_text_key` is equal and not
    empty, or, with `vectors`, when the cosine similarity of their vectors is at least
    `threshold`; a group is a connected set of such pairs. Its label is the input
    position of its first member, so equal inputs give equal labels.

    Args:
        texts: the candidates' texts, in the order of the arrays given to the packer.
        vectors: optional embeddings, one row per text (2-D, finite). Zero rows are
            similar to nothing.
        threshold: cosine similarity at or above which two vectors are near-duplicates,
            in (0, 1].

    Returns:
        int64 labels, one per text: -1 for a text with no near-duplicate, else the
        smallest position in its group. Pass them as ``groups=`` to `ctxcore.pack_arrays`.

    Raises:
        InvalidCandidate: a text that is not a str, vectors of the wrong shape, masked
            (`numpy.ma.MaskedArray`) or with a NaN or infinity, mismatched lengths (naming
            the candidate where one is at fault).
        ValueError: a threshold outside (0, 1].

    Cost: the texts are normalised once each; the vectors take one matrix product in
    blocks of rows (~2 ms for 1,000 vectors of 384 dimensions) and memory of
    ``256 x len(texts)`` doubles.

    >>> near_duplicate_groups(["The cafe opens at 9.", "the Café opens at 9", "Closed on Mondays."]).tolist()
    [0, 0, -1]
    >>> near_duplicate_groups(["a", "b", "c"], [[1.0, 0.0], [0.99, 0.05], [0.0, 1.0]]).tolist()
    [0, 0, -1]
    """
    cutoff = as_real(threshold)  # any real number, numpy's too; None for anything else
    if cutoff is None or not 0.0 < cutoff <= 1.0:  # NaN and ints past float range fail too
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r:.40}")
    if isinstance(texts, str):
        raise invalid("texts must be a sequence of str, not a single str")
    text_list = list(texts)
    n = len(text_list)
    vec = None if vectors is None else _vectors_array(vectors, n)
    firsts: list[npt.NDArray[np.intp]] = []
    seconds: list[npt.NDArray[np.intp]] = []
    seen: dict[str, int] = {}
    same_a: list[int] = []
    same_b: list[int] = []
    for i, text in enumerate(text_list):
        if not isinstance(text, str):
            raise invalid(f"candidate at index {i}: text must be str, got {type(text).__name__}", i)
        key = normalized_text_key(text)
        if not key:
            continue
        first = seen.setdefault(key, i)
        if first != i:
            same_a.append(first)
            same_b.append(i)
    firsts.append(np.array(same_a, np.intp))
    seconds.append(np.array(same_b, np.intp))
    if vec is not None and n > 1:
        a, b = _similar_pairs(vec, float(cutoff))
        firsts.append(a)
        seconds.append(b)
    root = _components(n, np.concatenate(firsts), np.concatenate(seconds))
    sizes = np.bincount(root, minlength=n)
    return np.where(sizes[root] > 1, root, -1).astype(np.int64)


class TextKeys:
    """`normalized_text_key` of texts, kept across calls (the same memories come back
    request after request): what the assembly checks its selection with.

    Bounded without forgetting everything at once: the keys live in two generations of at
    most `capacity` texts each; a full young generation becomes the old one (the previous
    old one is dropped), and a text found in the old one moves back. A working set of up
    to `capacity` texts is therefore never recomputed, and one of twice as many mostly not.

    >>> keys = TextKeys(capacity=2)
    >>> keys.keys(["A b!", "c", "d"])
    ['a b', 'c', 'd']
    >>> keys.keys(["A b!"])
    ['a b']
    """

    def __init__(self, capacity: int = 1 << 17) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self._capacity = capacity
        self._young: dict[str, str] = {}
        self._old: dict[str, str] = {}

    def keys(self, texts: Sequence[str]) -> list[str]:
        """The key of each text."""
        young = self._young
        out = [young.get(t) for t in texts]
        missing = [k for k, v in enumerate(out) if v is None]
        if not missing:
            return out  # type: ignore[return-value]
        old = self._old
        for k in missing:
            text = texts[k]
            key = old.get(text)
            if key is None:
                key = normalized_text_key(text)
            if len(young) >= self._capacity:
                # Readers on other threads hold their own references: a swap races nobody.
                self._old, young = young, {}
                self._young = young
                old = self._old
            out[k] = young.setdefault(text, key)
        return out  # type: ignore[return-value]

    def clear(self) -> None:
        self._young = {}
        self._old = {}


def groups_from_keys(keys: Sequence[str]) -> npt.NDArray[np.int64]:
    """Packer groups from text keys: candidates with one non-empty key share a group,
    labelled by its first position; -1 for a key no other candidate has (or an empty one).

    >>> groups_from_keys(["a b", "c", "a b", ""]).tolist()
    [0, -1, 0, -1]
    """
    first: dict[str, int] = {}
    out = np.full(len(keys), -1, dtype=np.int64)
    seen_twice: set[str] = set()
    for k, key in enumerate(keys):
        if not key:
            continue
        if key in first:
            seen_twice.add(key)
        else:
            first[key] = k
    for k, key in enumerate(keys):
        if key in seen_twice:
            out[k] = first[key]
    return out


def has_duplicates(keys: Sequence[str]) -> bool:
    """Whether two of the non-empty `keys` are equal."""
    nonempty = [k for k in keys if k]
    return len(set(nonempty)) < len(nonempty)
