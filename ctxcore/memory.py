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

import enum
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "FULLTEXT_RELEVANCE_SENTINEL",
    "ForgetReport",
    "MemoryLifecycle",
    "MemoryOrigin",
    "MemoryRecord",
    "MemoryStore",
    "Query",
    "Scope",
    "ScopeStats",
    "Sources",
    "StoreStats",
]

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
            emb = tuple(float(x) for x in self.embedding)
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
        similarity: cosine similarity to the query, when vector-ranked; None otherwise.
        confidence: the store's confidence in the memory, in [0, 1].
        importance: optional importance in [0, 1].
        created_at: creation time, seconds since the epoch, if known.
        accessed_at: last access time, seconds since the epoch, if known.
        rank: the source's own rank (0 = best), if it gave one.
        token_count: tokens of `text`, counted by the store, if it did.
        token_family: tokenizer family of `token_count` (e.g. ``"cl100k_base"``).
        token_kind: ``"exact"`` or ``"estimate"``: how `token_count` was obtained.
        exact_tokens: tokenizer family -> the exact tokens of this memory's own part of its
            formatted element (its escaped id attribute and its escaped body with the
            closing tag, ``ctxcore.stores.counting.count_memory_tokens``), as counted by the
            store at ingest; None when the store has none. An assembly for one of these
            families prices the memory from it without tokenizing.

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

    def __post_init__(self) -> None:
        # Checked once here, where a source builds the record, so that the assembly's hot
        # path only needs `type(m) is MemoryRecord`.
        for name in ("id", "organization_id", "agent_id"):
            v = getattr(self, name)
            if type(v) is not str or not v:
                raise ValueError(f"memory {name} must be a non-empty str, got {v!r:.80}")
        if type(self.text) is not str:
            raise TypeError(f"memory {self.id!r}: text must be str, got {type(self.text).__name__}")
        for name in ("similarity", "confidence", "importance", "created_at", "accessed_at"):
            v = getattr(self, name)
            if v is None and name != "confidence":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"memory {self.id!r}: {name} must be a finite number, got {v!r:.80}")
        if self.token_count is not None and (
            isinstance(self.token_count, bool) or not isinstance(self.token_count, int) or self.token_count < 0
        ):
            raise ValueError(f"memory {self.id!r}: token_count must be an int >= 0, got {self.token_count!r:.80}")
        if self.exact_tokens is not None:
            if not isinstance(self.exact_tokens, Mapping):
                raise TypeError(
                    f"memory {self.id!r}: exact_tokens must be a mapping of family to count, "
                    f"got {type(self.exact_tokens).__name__}"
                )
            for fam, n in self.exact_tokens.items():
                if type(fam) is not str or not fam or type(n) is not int or n < 0:
                    raise ValueError(
                        f"memory {self.id!r}: exact_tokens must map non-empty family names to ints >= 0, "
                        f"got {fam!r:.40}: {n!r:.40}"
                    )
        object.__setattr__(self, "origin", MemoryOrigin(self.origin))

    @property
    def relevance(self) -> float:
        """The relevance the gate compares with the floor: the cosine similarity, or the
        full-text sentinel for hits without one."""
        return self.similarity if self.similarity is not None else FULLTEXT_RELEVANCE_SENTINEL

    @property
    def scope(self) -> Scope:
        """The memory's (organization, agent)."""
        return Scope(self.organization_id, self.agent_id)


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

    async def cold(
        self, scope: Scope, query: Query, limit: int, min_similarity: float
    ) -> Sequence[MemoryRecord]:
        """Memories relevant to `query`: vector hits with similarity >= `min_similarity`
        (the ANN cutoff, applied before hydration) and full-text hits, at most `limit`."""
        ...


@dataclass(frozen=True, slots=True)
class Sources:
    """The three retrieval branches of an assembly; a branch left as None is skipped.

    >>> Sources().directive is None
    True
    """

    directive: DirectiveFn | None = None
    hot: HotFn | None = None
    cold: ColdFn | None = None

    @classmethod
    def from_store(cls, store: MemoryStore) -> Sources:
        """All three branches served by one store."""
        return cls(directive=store.directive, hot=store.hot, cold=store.cold)


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
