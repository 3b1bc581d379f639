"""Memories and the sources that retrieve them: the data retrieval hands to scoring.

A `MemoryRecord` is one retrieved memory with its scope (organization and agent), its
text, the retrieval-time signals (similarity, confidence, importance, times, rank) and,
when the store counted it at insert, its token count tagged with tokenizer family and
kind. `Sources` bundles the three retrieval branches of an assembly: directive, hot
memory and cold memory, each an async callable that receives the request's `Scope`.
Stores (`ctxcore.stores`) implement `MemoryStore` and give their branches with
`Sources.from_store`.
"""

from __future__ import annotations

import bisect
import enum
import functools
import itertools
import json
import math
import numbers
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol, cast, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from . import _core
from ._numbers import as_int, as_real

__all__ = [
    "FULLTEXT_RELEVANCE_SENTINEL",
    "MAX_MEMORY_TOKENS",
    "MAX_RETRIEVAL_LIMIT",
    "LATER",
    "ForgetReport",
    "Later",
    "MemoryBatch",
    "MemoryLifecycle",
    "MemoryOrigin",
    "MemoryRecord",
    "MemoryStore",
    "NowOrLater",
    "Query",
    "Scope",
    "ScopeStats",
    "Sources",
    "StoreStats",
]

#: The most tokens a memory's stored count may give: the packer's bound on an item
#: (``_core.MAX_TOKENS``, 2**40; a count beyond it is not a count of any text).
MAX_MEMORY_TOKENS: int = _core.MAX_TOKENS

#: The most memories a retrieval may ask a source for (``limit``; an assembly's
#: ``max_memories``).
MAX_RETRIEVAL_LIMIT = (1 << 31) - 1

#: Relevance given to full-text hits that carry no cosine score. From the ranking design:
#: "full-text hits use a fixed relevance sentinel of 0.5 when they have no cosine score";
#: the relevance floor must stay below it.
FULLTEXT_RELEVANCE_SENTINEL = 0.5


class MemoryOrigin(enum.StrEnum):
    """Which retrieval path produced a memory."""

    HOT = "hot"  #: the agent's most recent memories
    VECTOR = "vector"  #: cosine similarity over stored embeddings (cold)
    FULLTEXT = "fulltext"  #: full-text match (cold), relevance = the sentinel
    REMOTE = "remote"  #: a memory service over HTTP


@dataclass(frozen=True, slots=True)
class Scope:
    """Who an assembly is for. Every memory used must carry exactly this scope.

    >>> Scope("org-1", "agent-7")
    Scope(organization_id='org-1', agent_id='agent-7')
    """

    organization_id: str
    agent_id: str

    def __post_init__(self) -> None:
        for name in ("organization_id", "agent_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, got {value!r}")
            if not is_valid_unicode(value):
                raise ValueError(f"{name} holds a lone surrogate (not valid Unicode text): {value!r:.80}")


@dataclass(frozen=True, slots=True)
class Query:
    """What the request is about: its text and, optionally, its embedding.

    >>> Query("refund policy", (0.1, 0.2)).embedding
    (0.1, 0.2)
    """

    text: str
    embedding: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"query text must be str, got {type(self.text).__name__}")
        if self.embedding is not None:
            if isinstance(self.embedding, (str, bytes)):
                raise TypeError(f"query embedding must be a sequence of numbers, got {type(self.embedding).__name__}")
            values = list(self.embedding)
            bad = next((x for x in values if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real)), None)
            if bad is not None:
                raise TypeError(f"query embedding must hold real numbers, got a {type(bad).__name__}")
            try:
                emb = tuple(float(x) for x in values)
            except OverflowError:  # an int beyond any float
                emb = (math.inf,)
            if not emb or not all(math.isfinite(x) for x in emb):
                raise ValueError("query embedding must be a non-empty sequence of finite floats")
            object.__setattr__(self, "embedding", emb)


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One retrieved memory.

    Attributes:
        id: unique id of the memory in its store.
        organization_id: owning organization.
        agent_id: owning agent.
        text: the memory's content (untrusted data: it is escaped when formatted).
        origin: which retrieval path found it.
        similarity: cosine similarity to the query, in [-1, 1], when vector-ranked; None
            otherwise.
        confidence: the store's confidence in the memory, in [0, 1].
        importance: optional importance in [0, 1].
        created_at: creation time, seconds since the epoch, if known.
        accessed_at: last access time, seconds since the epoch, if known.
        rank: the source's own rank (0 = best), if it gave one.
        token_count: tokens of `text`, counted by the store, if it did (at most
            `MAX_MEMORY_TOKENS`, as is every count in `exact_tokens`).
        token_family: tokenizer family of `token_count` (e.g. ``"cl100k_base"``).
        token_kind: ``"exact"`` or ``"estimate"``: how `token_count` was obtained.
        exact_tokens: tokenizer family -> the exact tokens of this memory's own part of its
            formatted element (its escaped id attribute and its escaped body with the
            closing tag, ``ctxcore.stores.counting.count_memory_tokens``), as counted by the
            store at ingest; None when the store has none. An assembly for one of these
            families prices the memory from it without tokenizing.
        fulltext_score: the full-text ranker's score for the query (BM25 or the store's
            own ranker: >= 0, higher is better) when the full-text path found the memory;
            None otherwise. A memory both paths found carries its `similarity` and this.

    >>> MemoryRecord("m1", "org", "agent", "likes tea", similarity=0.8).relevance
    0.8
    >>> MemoryRecord("m2", "org", "agent", "tea", origin=MemoryOrigin.FULLTEXT).relevance
    0.5
    """

    id: str
    organization_id: str
    agent_id: str
    text: str
    origin: MemoryOrigin = MemoryOrigin.VECTOR
    similarity: float | None = None
    confidence: float = 1.0
    importance: float | None = None
    created_at: float | None = None
    accessed_at: float | None = None
    rank: int | None = None
    token_count: int | None = None
    token_family: str | None = None
    token_kind: str | None = None
    exact_tokens: Mapping[str, int] | None = field(default=None, hash=False)
    fulltext_score: float | None = None

    def __post_init__(self) -> None:
        # Checked once here, where a source builds the record, so that the assembly's hot
        # path only needs `type(m) is MemoryRecord`. Stores build thousands of records a
        # second: the common shapes (str fields, floats or None, a dict of int counts, an
        # origin already a MemoryOrigin) pass one expression; anything else takes the full
        # check, which names what is wrong. (x - x == 0.0 holds exactly for finite floats;
        # a range test fails for NaN.)
        s, c, i, ca, aa, n = (
            self.similarity,
            self.confidence,
            self.importance,
            self.created_at,
            self.accessed_at,
            self.token_count,
        )
        if not (
            type(self.id) is str
            and self.id
            and type(self.organization_id) is str
            and self.organization_id
            and type(self.agent_id) is str
            and self.agent_id
            and type(self.text) is str
            and (self.id.isascii() or is_valid_unicode(self.id))
            and (self.organization_id.isascii() or is_valid_unicode(self.organization_id))
            and (self.agent_id.isascii() or is_valid_unicode(self.agent_id))
            and type(c) is float
            and 0.0 <= c <= 1.0
            and (s is None or (type(s) is float and -1.0 <= s <= 1.0))
            and (i is None or (type(i) is float and 0.0 <= i <= 1.0))
            and (ca is None or (type(ca) is float and ca - ca == 0.0))
            and (aa is None or (type(aa) is float and aa - aa == 0.0))
            and (n is None or (type(n) is int and 0 <= n <= MAX_MEMORY_TOKENS))
            and (
                self.fulltext_score is None
                or (type(self.fulltext_score) is float and 0.0 <= self.fulltext_score < math.inf)
            )
        ):
            self._check_fields()
        counts = self.exact_tokens
        if counts is not None and not (
            type(counts) is dict
            and all(type(f) is str and f and type(k) is int and 0 <= k <= MAX_MEMORY_TOKENS for f, k in counts.items())
        ):
            self._check_counts()
        if type(self.origin) is not MemoryOrigin:
            object.__setattr__(self, "origin", MemoryOrigin(self.origin))

    def _check_fields(self) -> None:
        for name in ("id", "organization_id", "agent_id"):
            v = getattr(self, name)
            if type(v) is not str or not v:
                raise ValueError(f"memory {name} must be a non-empty str, got {v!r:.80}")
            if not is_valid_unicode(v):
                raise ValueError(f"memory {name} holds a lone surrogate (not valid Unicode text): {v!r:.80}")
        if type(self.text) is not str:
            raise TypeError(f"memory {self.id!r}: text must be str, got {type(self.text).__name__}")
        for name, low, high in _RANGES:
            v = getattr(self, name)
            if v is None and name != "confidence":
                continue
            # A number of any type (numpy's: a similarity computed in float32) is kept as
            # a plain int or float; bools are refused.
            x = as_real(v)
            if x is None or not is_finite_number(x):
                raise ValueError(f"memory {self.id!r}: {name} must be a finite number, got {v!r:.80}")
            if not low <= x <= high:
                raise ValueError(f"memory {self.id!r}: {name} must be in [{low:g}, {high:g}], got {v!r:.80}")
            object.__setattr__(self, name, x)
        if self.token_count is not None:
            n = as_int(self.token_count)
            if n is None or not 0 <= n <= MAX_MEMORY_TOKENS:
                raise ValueError(
                    f"memory {self.id!r}: token_count must be an int in [0, 2**40], got {self.token_count!r:.80}"
                )
            object.__setattr__(self, "token_count", n)

    def _check_counts(self) -> None:
        if not isinstance(self.exact_tokens, Mapping):
            raise TypeError(
                f"memory {self.id!r}: exact_tokens must be a mapping of family to count, "
                f"got {type(self.exact_tokens).__name__}"
            )
        counts: dict[str, int] = {}
        for fam, n in self.exact_tokens.items():
            k = as_int(n)
            if type(fam) is not str or not fam or k is None or not 0 <= k <= MAX_MEMORY_TOKENS:
                raise ValueError(
                    f"memory {self.id!r}: exact_tokens must map non-empty family names to ints in [0, 2**40], "
                    f"got {fam!r:.40}: {n!r:.40}"
                )
            counts[fam] = k
        if any(type(n) is not int for n in self.exact_tokens.values()):
            object.__setattr__(self, "exact_tokens", counts)  # numpy counts as plain ints

    @property
    def relevance(self) -> float:
        """The relevance the gate compares with the floor: the cosine similarity, or the
        full-text sentinel for hits without one."""
        return self.similarity if self.similarity is not None else FULLTEXT_RELEVANCE_SENTINEL

    @property
    def scope(self) -> Scope:
        """The memory's (organization, agent)."""
        return Scope(self.organization_id, self.agent_id)


#: The range of each number of a `MemoryRecord` (times only need to be finite).
_RANGES = (
    ("similarity", -1.0, 1.0),
    ("confidence", 0.0, 1.0),
    ("importance", 0.0, 1.0),
    ("created_at", -math.inf, math.inf),
    ("accessed_at", -math.inf, math.inf),
    ("fulltext_score", 0.0, math.inf),
)


def is_valid_unicode(text: str) -> bool:
    """Whether `text` is valid Unicode text: no lone surrogate (it can be encoded)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_finite_number(value: int | float) -> bool:
    """Whether `value` is a finite float, or an int that one can hold."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


@functools.lru_cache(maxsize=1 << 16)
def _parse_counts(text: str) -> Mapping[str, int]:
    """A stored ``exact_tokens`` JSON object, parsed once per distinct text (read-only: the
    parsed mapping is shared by the records that carry the same text)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"exact_tokens must be a JSON object, got {text[:80]!r}")
    return MappingProxyType(value)


#: family -> stored ``exact_tokens`` text -> that family's count (-1: none), for
#: `MemoryBatch.counts`; each family's map is emptied when it would pass the limit.
_FAMILY_COUNTS: dict[str, dict[Any, int]] = {}  # keys: texts, and None (-1)
_FAMILY_COUNTS_LIMIT = 1 << 16


def _stored_count(text: str, family: str) -> int:
    """`family`'s count in a stored ``exact_tokens`` JSON text, -1 when it has none (the
    texts repeat: counts are small numbers, so one parse serves many memories)."""
    try:
        got = _parse_counts(text).get(family)
    except json.JSONDecodeError as exc:
        raise ValueError(f"exact_tokens is not JSON ({exc})") from None
    if got is None:
        return -1
    if type(got) is not int or not 0 <= got <= MAX_MEMORY_TOKENS:
        raise ValueError(f"exact_tokens[{family!r}] must be an int in [0, 2**40], got {got!r:.40}")
    return got


def _nan_or(
    values: Sequence[float | None] | npt.NDArray[np.float64] | None, n: int, name: str
) -> npt.NDArray[np.float64]:
    if values is None:
        return np.full(n, np.nan)
    if isinstance(values, np.ndarray):
        arr = values.astype(np.float64, copy=False)
    elif type(values) is tuple or type(values) is list:
        arr = np.array(values, dtype=np.float64)  # None -> NaN, as float(...) of each other value
    else:
        arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"MemoryBatch: {name} has {arr.size} values for {n} memories")
    arr = np.ascontiguousarray(arr)
    k = _core.first_outside(arr, -math.inf, math.inf)
    if k >= 0:
        raise ValueError(f"MemoryBatch: {name} of memory {k} is not finite ({arr[k]})")
    return arr


def check_scope(scope: object) -> None:
    """Raise TypeError unless `scope` is a `Scope` (a source's ``scope`` argument)."""
    if not isinstance(scope, Scope):
        raise TypeError(f"scope must be a ctxcore Scope, got {type(scope).__name__}")


def check_query(query: object) -> None:
    """Raise TypeError unless `query` is a `Query` (a source's ``query`` argument)."""
    if not isinstance(query, Query):
        raise TypeError(f"query must be a ctxcore Query, got {type(query).__name__}")


def check_limit(limit: object) -> None:
    """Raise ValueError unless `limit` is an int in [0, `MAX_RETRIEVAL_LIMIT`] (a source's
    ``limit`` argument)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_RETRIEVAL_LIMIT:
        raise ValueError(f"limit must be an int in [0, 2**31 - 1], got {limit!r:.40}")


def check_min_similarity(min_similarity: object) -> float:
    """`min_similarity` as a float; ValueError unless it is a number in [-1, 1] (a cold
    source's ANN cutoff)."""
    if (
        isinstance(min_similarity, bool)
        or not isinstance(min_similarity, (int, float))
        or not (-1.0 <= min_similarity <= 1.0)
    ):
        raise ValueError(f"min_similarity must be a number in [-1, 1], got {min_similarity!r:.40}")
    return float(min_similarity)


def _in_range(arr: npt.NDArray[np.float64], low: float, name: str) -> npt.NDArray[np.float64]:
    """`arr` once every value is NaN (None) or in [`low`, 1]."""
    k = _core.first_outside(arr, low, 1.0)
    if k >= 0:
        raise ValueError(f"MemoryBatch: {name} of memory {k} must be in [{low:g}, 1], got {arr[k]}")
    return arr


def _same_records(records: Sequence[MemoryRecord], other: Any) -> bool:
    """``==`` of a sequence of records with any other sequence: the same records in order."""
    if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
        return len(records) == len(other) and all(a == b for a, b in zip(records, other))
    return NotImplemented  # type: ignore[no-any-return]


#: The columns `MemoryBatch.with_similarity` copies (lists and arrays).
_COPIED_COLUMNS = (
    "ids",
    "texts",
    "origins",
    "confidence",
    "importance",
    "created_at",
    "accessed_at",
    "rank",
    "token_count",
    "token_family",
    "token_kind",
    "exact_tokens",
    "fulltext_score",
)


class MemoryBatch(Sequence[MemoryRecord]):
    """Memories of one scope as columns: what a store returns from a query.

    A `Sequence` of `MemoryRecord` (a record is built the first time it is read), and
    also the columns themselves, which the assembly gates, prices and packs as arrays
    without building one object per memory. Numbers are float arrays in which NaN
    stands for None; ``exact_tokens`` holds per memory a mapping, the JSON object text a
    store keeps, or None. Every memory is of (`organization_id`, `agent_id`).

    >>> b = MemoryBatch("org", "agent", ids=["m1", "m2"], texts=["likes tea", "vegan"],
    ...                 origins=[MemoryOrigin.HOT] * 2, similarity=[0.8, None],
    ...                 exact_tokens=['{"cl100k_base": 9}', None])
    >>> len(b), b[1].similarity, b[0].exact_tokens["cl100k_base"], b.counts("cl100k_base").tolist()
    (2, None, 9, [9, -1])

    Raises:
        ValueError: columns of different lengths, an empty id, an infinite number
            (NaN is None; confidence may not be missing), an unknown origin.
        TypeError: a text that is not a str.
    """

    __slots__ = (
        "organization_id",
        "agent_id",
        "ids",
        "texts",
        "origins",
        "similarity",
        "confidence",
        "importance",
        "created_at",
        "accessed_at",
        "rank",
        "token_count",
        "token_family",
        "token_kind",
        "exact_tokens",
        "fulltext_score",
        "reference",
        "_records",
    )

    def __init__(
        self,
        organization_id: str,
        agent_id: str,
        *,
        ids: Sequence[str],
        texts: Sequence[str],
        origins: Sequence[MemoryOrigin | str],
        similarity: Sequence[float | None] | npt.NDArray[np.float64] | None = None,
        confidence: Sequence[float] | npt.NDArray[np.float64] | None = None,
        importance: Sequence[float | None] | npt.NDArray[np.float64] | None = None,
        created_at: Sequence[float | None] | npt.NDArray[np.float64] | None = None,
        accessed_at: Sequence[float | None] | npt.NDArray[np.float64] | None = None,
        rank: Sequence[int | None] | None = None,
        token_count: Sequence[int | None] | None = None,
        token_family: Sequence[str | None] | None = None,
        token_kind: Sequence[str | None] | None = None,
        exact_tokens: Sequence[Mapping[str, int] | str | None] | None = None,
        fulltext_score: Sequence[float | None] | npt.NDArray[np.float64] | None = None,
    ) -> None:
        n = len(ids)
        self.organization_id = organization_id
        self.agent_id = agent_id
        self.ids = list(ids)
        self.texts = list(texts)
        self.origins = [o if type(o) is MemoryOrigin else MemoryOrigin(o) for o in origins]
        if len(self.texts) != n or len(self.origins) != n:
            raise ValueError(f"MemoryBatch: {n} ids, {len(self.texts)} texts, {len(self.origins)} origins")
        if not all(type(i) is str and i and (i.isascii() or is_valid_unicode(i)) for i in self.ids):
            k = next(k for k, i in enumerate(self.ids) if type(i) is not str or not i or not is_valid_unicode(i))
            raise ValueError(
                f"MemoryBatch: memory {k}: id must be a non-empty str of valid Unicode text (no lone "
                f"surrogate), got {self.ids[k]!r:.80}"
            )
        if not all(type(t) is str for t in self.texts):
            k = next(k for k, t in enumerate(self.texts) if type(t) is not str)
            raise TypeError(
                f"MemoryBatch: memory {self.ids[k]!r}: text must be str, got {type(self.texts[k]).__name__}"
            )
        self.similarity = _in_range(_nan_or(similarity, n, "similarity"), -1.0, "similarity")
        self.confidence = (
            np.ones(n) if confidence is None else _in_range(_nan_or(confidence, n, "confidence"), 0.0, "confidence")
        )
        if _core.first_outside(self.confidence, -math.inf, math.inf, allow_nan=False) >= 0:
            raise ValueError("MemoryBatch: confidence may not be missing")
        self.importance = _in_range(_nan_or(importance, n, "importance"), 0.0, "importance")
        self.created_at = _nan_or(created_at, n, "created_at")
        self.accessed_at = _nan_or(accessed_at, n, "accessed_at")
        self.fulltext_score = _nan_or(fulltext_score, n, "fulltext_score")
        k = _core.first_outside(self.fulltext_score, 0.0, math.inf)
        if k >= 0:
            raise ValueError(f"MemoryBatch: fulltext_score of memory {k} must be >= 0, got {self.fulltext_score[k]}")
        self.rank = list(rank) if rank is not None else [None] * n
        self.token_count = list(token_count) if token_count is not None else [None] * n
        self.token_family = list(token_family) if token_family is not None else [None] * n
        self.token_kind = list(token_kind) if token_kind is not None else [None] * n
        self.exact_tokens: list[Mapping[str, int] | str | None] = (
            list(exact_tokens) if exact_tokens is not None else [None] * n
        )
        for name in ("rank", "token_count", "token_family", "token_kind", "exact_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"MemoryBatch: {name} has {len(getattr(self, name))} values for {n} memories")
        if not all(c is None or (type(c) is int and 0 <= c <= MAX_MEMORY_TOKENS) for c in self.token_count):
            # Counts of any integer type (numpy's too) are kept as plain ints.
            counts = [None if c is None else as_int(c) for c in self.token_count]
            for k, n_k in enumerate(counts):
                if self.token_count[k] is not None and (n_k is None or not 0 <= n_k <= MAX_MEMORY_TOKENS):
                    raise ValueError(
                        f"MemoryBatch: memory {self.ids[k]!r}: token_count must be an int in [0, 2**40] or "
                        f"None, got {self.token_count[k]!r:.40}"
                    )
            self.token_count = counts
        for k, c in enumerate(self.exact_tokens):
            # A store's JSON texts are read (and checked) when counted; mappings here.
            if (
                c is None
                or isinstance(c, str)
                or (
                    isinstance(c, Mapping)
                    and all(
                        type(f) is str and f and type(v) is int and 0 <= v <= MAX_MEMORY_TOKENS for f, v in c.items()
                    )
                )
            ):
                continue
            plain = {f: as_int(v) for f, v in c.items()} if isinstance(c, Mapping) else None
            if plain is None or not all(
                type(f) is str and f and v is not None and 0 <= v <= MAX_MEMORY_TOKENS for f, v in plain.items()
            ):
                raise ValueError(
                    f"MemoryBatch: memory {self.ids[k]!r}: exact_tokens must be None, a JSON object "
                    f"text or a mapping of family names to ints in [0, 2**40], got {c!r:.60}"
                )
            self.exact_tokens[k] = cast(dict[str, int], plain)  # numpy counts as plain ints
        self._records: list[MemoryRecord | None] = [None] * n
        #: Per signal (``"vector"``, ``"fulltext"``), the (mean, standard deviation) of its
        #: score over every memory of the scope for this query, when the store knows them
        #: (the fused value model standardizes each signal by them).
        self.reference: dict[str, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def _record(self, i: int) -> MemoryRecord:
        rec = self._records[i]
        if rec is None:

            def num(a: npt.NDArray[np.float64]) -> float | None:
                v = float(a[i])
                return None if v != v else v

            counts = self.exact_tokens[i]
            rec = MemoryRecord(
                self.ids[i],
                self.organization_id,
                self.agent_id,
                self.texts[i],
                origin=self.origins[i],
                similarity=num(self.similarity),
                confidence=float(self.confidence[i]),
                importance=num(self.importance),
                created_at=num(self.created_at),
                accessed_at=num(self.accessed_at),
                rank=self.rank[i],
                token_count=self.token_count[i],
                token_family=self.token_family[i],
                token_kind=self.token_kind[i],
                exact_tokens=_parse_counts(counts) if isinstance(counts, str) else counts,
                fulltext_score=num(self.fulltext_score),
            )
            self._records[i] = rec
        return rec

    @overload
    def __getitem__(self, i: int) -> MemoryRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[MemoryRecord]: ...
    def __getitem__(self, i: int | slice) -> MemoryRecord | list[MemoryRecord]:
        if isinstance(i, slice):
            return [self._record(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("MemoryBatch index out of range")
        return self._record(i % n)

    def __iter__(self) -> Iterator[MemoryRecord]:
        return (self._record(k) for k in range(len(self)))

    def counts(self, family: str) -> npt.NDArray[np.int64]:
        """Each memory's stored exact count of `family`, -1 where it has none."""
        # A store's batch: every memory's counts as the JSON text it keeps. Each distinct
        # text is read once per family into `_FAMILY_COUNTS` and then only looked up.
        known = _FAMILY_COUNTS.get(family)
        if known is None:
            known = _FAMILY_COUNTS.setdefault(family, {})
        try:
            return np.fromiter(map(known.__getitem__, self.exact_tokens), dtype=np.int64, count=len(self))
        except KeyError:
            try:
                new = {
                    c: -1 if c is None else _stored_count(cast(str, c), family)
                    for c in set(self.exact_tokens).difference(known)
                }
                if len(known) + len(new) > _FAMILY_COUNTS_LIMIT:
                    known.clear()
                known.update(new)
                return np.fromiter(map(known.__getitem__, self.exact_tokens), dtype=np.int64, count=len(self))
            except (TypeError, ValueError, AttributeError, KeyError):
                pass  # a mapping, or a bad count: item by item, naming the memory
        except TypeError:
            pass  # a mapping among them
        out = np.full(len(self), -1, dtype=np.int64)
        k = 0
        try:
            for k, c in enumerate(self.exact_tokens):
                if c is None:
                    continue
                if isinstance(c, str):
                    out[k] = _stored_count(c, family)
                    continue
                got = c.get(family)
                if got is not None:
                    if type(got) is not int or not 0 <= got <= MAX_MEMORY_TOKENS:
                        raise ValueError(f"exact_tokens[{family!r}] must be an int in [0, 2**40], got {got!r:.40}")
                    out[k] = got
        except ValueError as exc:
            raise ValueError(f"memory {self.ids[k]!r}: {exc}") from None
        return out

    def with_similarity(self, similarity: Sequence[float | None] | npt.NDArray[np.float64]) -> MemoryBatch:
        """The same memories with `similarity` in place of this batch's (a store's kept
        batch scored for another query): the other columns, already checked, are copied
        as they are.

        >>> b = MemoryBatch("o", "a", ids=["m1", "m2"], texts=["x", "y"], origins=["hot", "hot"])
        >>> [r.similarity for r in b.with_similarity([0.5, None])], b[0].similarity
        ([0.5, None], None)

        Raises:
            ValueError: `similarity` has another length, or an infinite value.
        """
        out = MemoryBatch.__new__(MemoryBatch)
        out.organization_id = self.organization_id
        out.agent_id = self.agent_id
        out.similarity = _in_range(_nan_or(similarity, len(self.ids), "similarity"), -1.0, "similarity")
        for name in _COPIED_COLUMNS:
            setattr(out, name, getattr(self, name).copy())
        out._records = [None] * len(self.ids)
        out.reference = dict(self.reference)
        return out

    def __eq__(self, other: Any) -> bool:
        """Equal to any sequence of the same records (a list a store returned before, say)."""
        return _same_records(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MemoryBatch({self.organization_id!r}, {self.agent_id!r}, {len(self)} memories)"


class Chain(Sequence[MemoryRecord]):
    """Sequences of records one after another (the hot and cold results), not copied:
    a `MemoryBatch` among them stays columns until a record is read."""

    __slots__ = ("parts", "_offsets")

    def __init__(self, parts: Sequence[Sequence[MemoryRecord]]) -> None:
        self.parts = tuple(parts)
        self._offsets = list(itertools.accumulate((len(p) for p in self.parts), initial=0))

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @overload
    def __getitem__(self, i: int) -> MemoryRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[MemoryRecord]: ...
    def __getitem__(self, i: int | slice) -> MemoryRecord | list[MemoryRecord]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("index out of range")
        i %= n
        part = bisect.bisect_right(self._offsets, i) - 1
        rec: MemoryRecord = self.parts[part][i - self._offsets[part]]
        return rec

    def __iter__(self) -> Iterator[MemoryRecord]:
        for p in self.parts:
            yield from p

    def __eq__(self, other: Any) -> bool:
        return _same_records(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self))


DirectiveFn = Callable[[Scope], Awaitable[str | None]]
HotFn = Callable[[Scope, Query, int], Awaitable[Sequence[MemoryRecord]]]
ColdFn = Callable[[Scope, Query, int, float], Awaitable[Sequence[MemoryRecord]]]


@runtime_checkable
class MemoryStore(Protocol):
    """What a store offers the three retrieval branches. Every method is scoped: it must
    only ever return data of `scope`."""

    async def directive(self, scope: Scope) -> str | None:
        """The operator directive (system instructions) for this organization and agent."""
        ...

    async def hot(self, scope: Scope, query: Query, limit: int) -> Sequence[MemoryRecord]:
        """The agent's most recent memories, newest first, at most `limit`."""
        ...

    async def cold(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> Sequence[MemoryRecord]:
        """Memories relevant to `query`: vector hits with similarity >= `min_similarity`
        (the ANN cutoff, applied before hydration) and full-text hits, at most `limit`."""
        ...


class Later(enum.Enum):
    """The type of `LATER`."""

    LATER = "later"


#: What a branch's `now` function returns when its answer needs a wait (see `NowOrLater`).
LATER: Final = Later.LATER


class NowOrLater:
    """A branch that can often answer at once: called, it is the coroutine function `fn`;
    its `now` takes the same arguments and returns the answer at once, or `LATER` when the
    answer needs a wait (a read off the event loop's thread, a network call). Retrieval
    calls `now` first and runs `fn` only for `LATER`: an answer at hand (a cached
    directive, rows kept in memory) then costs no task and no pass of the event loop.
    `now` must not block: it answers from what is at hand or says `LATER`. What it raises
    is the branch's error, as if `fn` had raised it.

    >>> import asyncio
    >>> async def hot(scope, query, limit): return []
    >>> branch = NowOrLater(hot, lambda scope, query, limit: LATER)
    >>> branch.now(Scope("o", "a"), Query("q"), 4) is LATER, asyncio.run(branch(Scope("o", "a"), Query("q"), 4))
    (True, [])
    """

    __slots__ = ("_fn", "now")

    def __init__(self, fn: Callable[..., Awaitable[Any]], now: Callable[..., Any]) -> None:
        if not callable(fn) or not callable(now):
            raise TypeError("NowOrLater: fn and now must be callable")
        self._fn = fn
        self.now = now

    def __call__(self, *args: Any) -> Awaitable[Any]:
        return self._fn(*args)

    def __repr__(self) -> str:
        return f"NowOrLater({self._fn!r})"


#: The branches of `Sources`, with the arguments each is called with.
_BRANCH_SIGNATURES = {
    "directive": "(scope)",
    "hot": "(scope, query, limit)",
    "cold": "(scope, query, limit, min_similarity)",
}


@dataclass(frozen=True, slots=True)
class Sources:
    """The three retrieval branches of an assembly; a branch left as None is skipped. A
    branch may be a `NowOrLater`: retrieval asks its `now` first.

    >>> Sources().directive is None
    True
    """

    directive: DirectiveFn | None = None
    hot: HotFn | None = None
    cold: ColdFn | None = None

    def __post_init__(self) -> None:
        # A branch that cannot be called would fail every assembly as a branch error.
        for name, signature in _BRANCH_SIGNATURES.items():
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"Sources: {name} must be an async function {signature} or None, got {type(fn).__name__}"
                )

    @classmethod
    def from_store(cls, store: MemoryStore) -> Sources:
        """All three branches served by one store; a branch whose store also has a
        ``directive_now`` / ``hot_now`` / ``cold_now`` method (same arguments, the answer
        or `LATER`) is a `NowOrLater`.

        >>> import tempfile, os
        >>> from ctxcore.stores import SqliteMemoryStore
        >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as store:
        ...     type(Sources.from_store(store).hot).__name__
        'NowOrLater'
        """
        missing = [name for name in _BRANCH_SIGNATURES if not callable(getattr(store, name, None))]
        if missing:
            raise TypeError(
                f"Sources.from_store: a store has the methods directive, hot and cold (the MemoryStore protocol); "
                f"{type(store).__name__} has no {', '.join(missing)}"
            )
        branches: dict[str, Any] = {}
        for name in _BRANCH_SIGNATURES:
            fn = getattr(store, name)
            now = getattr(store, f"{name}_now", None)
            branches[name] = fn if now is None else NowOrLater(fn, now)
        return cls(**branches)


# ---- the memory lifecycle ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForgetReport:
    """What a forget removed.

    >>> ForgetReport(memories=3, directives=1).memories
    3
    """

    memories: int
    directives: int


@dataclass(frozen=True, slots=True)
class ScopeStats:
    """One scope's memories: how many, how many with an embedding, their stored tokens.

    >>> ScopeStats("org", "agent", 10, 8, 420).embedded
    8
    """

    organization_id: str
    agent_id: str
    memories: int
    embedded: int
    tokens: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A store's contents, per scope, and its directive count.

    >>> StoreStats((ScopeStats("o", "a", 2, 2, 9), ScopeStats("o", "b", 1, 0, 4)), 1).memories
    3
    """

    scopes: tuple[ScopeStats, ...]
    directives: int

    @property
    def memories(self) -> int:
        """Memories in all the scopes."""
        return sum(s.memories for s in self.scopes)

    @property
    def embedded(self) -> int:
        """Memories with an embedding, in all the scopes."""
        return sum(s.embedded for s in self.scopes)


@runtime_checkable
class MemoryLifecycle(Protocol):
    """What a store offers to manage its memories after ingest. Every change names its
    scope (organization and agent, or a whole organization): an id of another scope is
    never touched. Blocking methods (call them from async code through
    ``asyncio.to_thread``)."""

    def delete(self, scope: Scope, ids: Iterable[str]) -> int:
        """Delete the memories of `scope` with these ids; returns how many were deleted."""
        ...

    def forget(self, organization_id: str, agent_id: str | None = None) -> ForgetReport:
        """Delete every memory and directive of an agent, or of the whole organization."""
        ...

    def update(
        self,
        scope: Scope,
        memory_id: str,
        *,
        text: str | None = None,
        confidence: float | None = None,
        importance: float | None = None,
        embedding: Sequence[float] | None = None,
    ) -> bool:
        """Change a memory's text (re-counted, re-embedded), confidence, importance or
        embedding; False when `scope` has no such memory."""
        ...

    def expire(self, max_age_seconds: float, *, organization_id: str | None = None, now: float | None = None) -> int:
        """Delete memories older than `max_age_seconds`; returns how many."""
        ...

    def stats(self, organization_id: str | None = None) -> StoreStats:
        """Counts per scope (of one organization, or of the whole store)."""
        ...

    def flush_accesses(self) -> int:
        """Write the read times noted since the last flush as ``accessed_at``."""
        ...
