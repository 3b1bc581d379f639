"""What goes into a store: validated memories and directives for ingest.

`NewMemory` is one memory to store (its id, scope, text and optional embedding and
signals); `Directive` is the operator directive of an organization (all its agents) or of
one agent. Both validate on construction and name the bad record; `from_mapping` reads
the JSON form used by ``ctxcore memories add FILE.jsonl`` and the shipped demo dataset.
Retrieval hands back `ctxcore.memory.MemoryBatch`es (`rows_to_batch`), never these.
Both stores check what they are given here: a batch to add (`check_batch`), the ids of a
delete (`check_ids`), the fields of an update (`check_update`), the owner of a forget or
an expiry (`check_owner`, `expiry_cutoff`).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from ..memory import MemoryBatch, MemoryOrigin, Scope, is_finite_number, is_valid_unicode
from .embedding import unit
from .errors import InvalidMemory

__all__ = [
    "SEQ",
    "STORED_COLUMNS",
    "Directive",
    "NewMemory",
    "check_batch",
    "check_ids",
    "check_owner",
    "check_update",
    "created_times",
    "expiry_cutoff",
    "fulltext_stats",
    "rows_to_batch",
]

#: Memories stored without a creation time in one batch are created `now` plus this many
#: seconds per place in the batch: their creation order is the order given (a
#: conversation's turns stay in order for the value model's context signal and for the
#: newest-first hot path) without a visible change to any time.
CREATED_AT_STEP_S = 1e-6

#: The columns both stores read a memory back as, in this order (a store's statement may
#: add its own after them).
STORED_COLUMNS = (
    "seq",
    "id",
    "organization_id",
    "agent_id",
    "text",
    "confidence",
    "importance",
    "created_at",
    "accessed_at",
    "token_count",
    "token_family",
    "token_kind",
    "exact_tokens",
)
#: Where a stored row holds its sequence number (the store's own key for the memory).
SEQ = STORED_COLUMNS.index("seq")

_MEMORY_KEYS = frozenset(
    {"id", "organization_id", "agent_id", "text", "embedding", "confidence", "importance", "created_at", "accessed_at"}
)
_DIRECTIVE_KEYS = frozenset({"organization_id", "agent_id", "text"})


def _where(memory_id: object, index: int) -> str:
    at = f" (index {index})" if index >= 0 else ""
    return f"memory {memory_id!r}{at}" if isinstance(memory_id, str) and memory_id else f"memory{at or ''}"


def _time(value: object, field: str, label: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"{label}: {field} must be seconds since the epoch or an ISO 8601 time, got {value!r}"
            ) from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        value = dt.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not is_finite_number(value) or value < 0:
        raise ValueError(f"{label}: {field} must be a finite time >= 0, got {value!r:.80}")
    return float(value)


def _text_problem(name: str, value: object) -> str | None:
    """What is wrong with `value` as a required text field (None: nothing): it must be a
    non-empty str of valid Unicode text (no lone surrogate)."""
    if not isinstance(value, str) or not value:
        return f"{name} must be a non-empty str, got {value!r:.80}"
    if not is_valid_unicode(value):
        return f"{name} contains a lone surrogate (not valid Unicode text)"
    return None


def _id_problem(name: str, value: object) -> str | None:
    """What is wrong with `value` as a memory id (None: nothing): `_text_problem`'s rules,
    and no NUL (U+0000), which neither store can look an id up by (SQLite's JSON
    functions end a string there; PostgreSQL text cannot hold it).

    >>> _id_problem("id", "m" + chr(0))
    'id contains NUL (U+0000), which no store can look a memory up by'
    """
    problem = _text_problem(name, value)
    if problem is None and "\x00" in str(value):
        return f"{name} contains NUL (U+0000), which no store can look a memory up by"
    return problem


def check_owner(organization_id: object, agent_id: object, what: str) -> None:
    """Raise `InvalidMemory` naming `what` (the operation) unless `organization_id` is a
    non-empty str and `agent_id` one or None, both valid Unicode text.

    >>> check_owner("", None, "forget")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ctxcore.stores.InvalidMemory: forget: organization_id must be a non-empty str, got ''
    """
    for name, value in (("organization_id", organization_id), ("agent_id", agent_id)):
        problem = None if value is None and name == "agent_id" else _text_problem(name, value)
        if problem:
            raise InvalidMemory(f"{what}: {problem}")


def expiry_cutoff(max_age_seconds: object, now: object) -> float:
    """The creation time before which `expire` deletes: `now` (None: the current time)
    less `max_age_seconds`, both finite numbers (the age >= 0); ValueError otherwise.

    >>> expiry_cutoff(500, 1000)
    500.0
    """
    if (
        isinstance(max_age_seconds, bool)
        or not isinstance(max_age_seconds, (int, float))
        or not (is_finite_number(max_age_seconds) and max_age_seconds >= 0)
    ):
        raise ValueError(f"max_age_seconds must be a finite number >= 0, got {max_age_seconds!r:.40}")
    if now is None:
        return time.time() - float(max_age_seconds)
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not is_finite_number(now):
        raise ValueError(f"now must be a finite time in seconds since the epoch, got {now!r:.40}")
    return float(now) - float(max_age_seconds)


def _unit(value: object, field: str, label: str, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value <= 1.0):
        raise ValueError(f"{label}: {field} must be a number in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True, eq=False)
class NewMemory:
    """One memory to store.

    Attributes:
        id: unique in the store, non-empty.
        organization_id: owning organization, non-empty.
        agent_id: owning agent, non-empty.
        text: the memory's content, non-empty.
        embedding: optional vector (any dimension, the same for the whole store; finite,
            not all zero). Stored L2-normalized as float32. Without one, a store with an
            embedder computes it; otherwise the memory is found by hot and full-text
            retrieval only.
        confidence: the store's confidence in the memory, in [0, 1].
        importance: optional importance in [0, 1].
        created_at: seconds since the epoch; None means "now" at insert.
        accessed_at: seconds since the epoch, if known.

    Raises:
        InvalidMemory: a field is missing or wrong; the message names the memory.

    >>> NewMemory("m1", "org", "agent", "prefers email", confidence=0.9).confidence
    0.9
    >>> NewMemory("m2", "org", "agent", "")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ctxcore.stores.InvalidMemory: memory 'm2': text must be a non-empty str...
    """

    id: str
    organization_id: str
    agent_id: str
    text: str
    embedding: npt.NDArray[np.float32] | Sequence[float] | None = None
    confidence: float = 1.0
    importance: float | None = None
    created_at: float | None = None
    accessed_at: float | None = None

    def __post_init__(self) -> None:
        label = _where(self.id, -1)
        try:
            for name in ("id", "organization_id", "agent_id", "text"):
                problem = (_id_problem if name == "id" else _text_problem)(name, getattr(self, name))
                if problem:
                    raise ValueError(f"{label}: {problem}")
            object.__setattr__(self, "confidence", _unit(self.confidence, "confidence", label, False))
            object.__setattr__(self, "importance", _unit(self.importance, "importance", label, True))
            object.__setattr__(self, "created_at", _time(self.created_at, "created_at", label))
            object.__setattr__(self, "accessed_at", _time(self.accessed_at, "accessed_at", label))
            if self.embedding is not None:
                object.__setattr__(self, "embedding", _embedding(self.embedding, label))
        except ValueError as exc:
            raise InvalidMemory(str(exc), -1, self.id if isinstance(self.id, str) else None) from None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> NewMemory:
        """A memory from its JSON form: the field names above; times may be ISO 8601.

        >>> NewMemory.from_mapping({"id": "m1", "organization_id": "o", "agent_id": "a",
        ...     "text": "t", "created_at": "2026-01-01T00:00:00Z"}).created_at
        1767225600.0
        """
        if not isinstance(m, Mapping):
            raise InvalidMemory(f"a memory must be a JSON object, got {type(m).__name__}")
        label = _where(m.get("id"), -1)
        unknown = sorted(set(m) - _MEMORY_KEYS)
        if unknown:
            raise InvalidMemory(
                f"{label}: unknown field(s) {', '.join(map(repr, unknown))}; "
                f"a memory has {', '.join(sorted(_MEMORY_KEYS))}",
                memory_id=m.get("id") if isinstance(m.get("id"), str) else None,
            )
        missing = [k for k in ("id", "organization_id", "agent_id", "text") if k not in m]
        if missing:
            raise InvalidMemory(
                f"{label}: missing field(s) {', '.join(map(repr, missing))}",
                memory_id=m.get("id") if isinstance(m.get("id"), str) else None,
            )
        return cls(**{k: m[k] for k in m})


def _embedding(value: object, label: str) -> npt.NDArray[np.float32]:
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{label}: embedding must be a sequence of numbers, got {type(value).__name__}")
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError):
        raise ValueError(f"{label}: embedding must be a sequence of numbers") from None
    # Numbers only: numpy would read ["1", "2"] or [True, False] as a vector.
    if raw.dtype.kind not in "iuf" and not (
        raw.dtype.kind == "O"
        and raw.ndim == 1
        and all(isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) for x in raw.tolist())
    ):
        raise ValueError(f"{label}: embedding must be a sequence of numbers (not strings or booleans)")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except OverflowError:
        raise ValueError(f"{label}: embedding has non-finite values (an int beyond any float)") from None
    except (TypeError, ValueError):
        raise ValueError(f"{label}: embedding must be a sequence of numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{label}: embedding must be a non-empty 1-D sequence of numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{label}: embedding has non-finite values")
    out = unit(arr)
    if out is None:
        raise ValueError(f"{label}: embedding is all zeros (no direction to compare)")
    out.setflags(write=False)
    return out


@dataclass(frozen=True, slots=True)
class Directive:
    """The operator directive of an organization (``agent_id=None``: all its agents) or of
    one agent. A scope's directive is the organization's followed by the agent's.

    >>> Directive("org", None, "Answer in the customer's language.").agent_id is None
    True
    """

    organization_id: str
    agent_id: str | None
    text: str

    def __post_init__(self) -> None:
        label = f"directive for {self.organization_id!r}/{self.agent_id if self.agent_id is not None else '*'!r}"
        if not isinstance(self.organization_id, str) or not self.organization_id:
            raise InvalidMemory(f"directive: organization_id must be a non-empty str, got {self.organization_id!r:.80}")
        if self.agent_id is not None and (not isinstance(self.agent_id, str) or not self.agent_id):
            raise InvalidMemory(f"{label}: agent_id must be a non-empty str or None, got {self.agent_id!r:.80}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise InvalidMemory(f"{label}: text must be a non-empty str, got {self.text!r:.80}")
        for value in (self.organization_id, self.agent_id or "", self.text):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidMemory(f"{label}: contains a lone surrogate (not valid Unicode text)") from None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> Directive:
        """A directive from its JSON form (``organization_id``, optional ``agent_id``, ``text``).

        >>> Directive.from_mapping({"organization_id": "o", "text": "Be brief."}).text
        'Be brief.'
        """
        if not isinstance(m, Mapping):
            raise InvalidMemory(f"a directive must be a JSON object, got {type(m).__name__}")
        unknown = sorted(set(m) - _DIRECTIVE_KEYS)
        if unknown:
            raise InvalidMemory(
                f"directive: unknown field(s) {', '.join(map(repr, unknown))}; "
                f"a directive has {', '.join(sorted(_DIRECTIVE_KEYS))}"
            )
        missing = [k for k in ("organization_id", "text") if k not in m]
        if missing:
            raise InvalidMemory(f"directive: missing field(s) {', '.join(map(repr, missing))}")
        return cls(m["organization_id"], m.get("agent_id"), m["text"])


def rows_to_batch(
    scope: Scope,
    rows: Sequence[Sequence[Any]],
    origins: Sequence[MemoryOrigin],
    similarity: npt.NDArray[np.float64],
    fulltext_score: npt.NDArray[np.float64] | None = None,
) -> MemoryBatch:
    """Rows of `STORED_COLUMNS` as the columns the assembly reads (records are built only
    if a caller reads them), with each row's cosine and full-text score (NaN: none). Every
    row is of `scope`: the stores' queries filter on it."""
    cols = list(zip(*rows)) if rows else [()] * len(STORED_COLUMNS)
    return MemoryBatch(
        scope.organization_id,
        scope.agent_id,
        ids=cols[1],
        texts=cols[4],
        origins=origins,
        similarity=similarity,
        confidence=cols[5],
        importance=cols[6],
        created_at=cols[7],
        accessed_at=cols[8],
        rank=range(len(rows)),
        token_count=cols[9],
        token_family=cols[10],
        token_kind=cols[11],
        exact_tokens=cols[12],
        fulltext_score=fulltext_score,
    )


def fulltext_stats(scores: Sequence[float], in_scope: int) -> tuple[float, float]:
    """The mean and standard deviation of the full-text score over the `in_scope`
    memories of a scope, from the best `scores` (every memory not among them scores
    about 0: it matched no term, or too few to be among the best).

    >>> fulltext_stats([3.0, 1.0], 4)
    (1.0, 1.224744871391589)
    """
    n = max(in_scope, len(scores), 1)
    total = math.fsum(scores)
    mean = total / n
    var = max(0.0, math.fsum(x * x for x in scores) / n - mean * mean)
    return mean, math.sqrt(var)


def created_times(batch: Sequence[NewMemory], now: float) -> list[float]:
    """Each memory's creation time: its own, or for the k-th memory of the batch without
    one, ``now + k * CREATED_AT_STEP_S``.

    >>> [round(t - 100.0, 6) for t in created_times(
    ...     [NewMemory("a", "o", "x", "t"), NewMemory("b", "o", "x", "t", created_at=5.0), NewMemory("c", "o", "x", "t")],
    ...     100.0)]
    [0.0, -95.0, 1e-06]
    """
    out: list[float] = []
    k = 0
    for m in batch:
        if m.created_at is None:
            out.append(now + k * CREATED_AT_STEP_S)
            k += 1
        else:
            out.append(m.created_at)
    return out


def check_batch(
    memories: Iterable[NewMemory | Mapping[str, Any]],
    check: Callable[[NewMemory, int], None] | None = None,
) -> tuple[list[NewMemory], dict[str, int]]:
    """The memories as `NewMemory` records and each id's index; `InvalidMemory` names the
    first bad one (its index and id), an id used twice included. `check(memory, index)`
    adds a store's own rule, raising `InvalidMemory` for a memory it refuses."""
    if isinstance(memories, (str, bytes, Mapping, NewMemory)):
        raise TypeError("add_many takes an iterable of memories; use add for one")
    batch: list[NewMemory] = []
    seen: dict[str, int] = {}
    for i, m in enumerate(memories):
        try:
            mem = m if isinstance(m, NewMemory) else NewMemory.from_mapping(m)
        except InvalidMemory as exc:
            raise InvalidMemory(_at_index(str(exc), i), i, exc.memory_id) from None
        if mem.id in seen:
            raise InvalidMemory(f"memory {mem.id!r} (index {i}): id {mem.id!r} is used twice in this batch", i, mem.id)
        seen[mem.id] = i
        if check is not None:
            check(mem, i)
        batch.append(mem)
    return batch, seen


def _at_index(message: str, index: int) -> str:
    # "memory 'x': ..." -> "memory 'x' (index 3): ..."
    head, sep, tail = message.partition(": ")
    if sep and head.startswith("memory") and "(index" not in head:
        return f"{head} (index {index}): {tail}"
    return f"memory (index {index}): {message}"


def check_ids(ids: Iterable[str]) -> list[str]:
    """The memory ids of a delete, as a list: an iterable of non-empty str (`TypeError`
    for one str, `ValueError` naming a bad id).

    >>> check_ids(iter(["m1", "m2"]))
    ['m1', 'm2']
    """
    if isinstance(ids, (str, bytes)):
        raise TypeError("ids must be an iterable of ids, not one str")
    out = list(ids)
    for i in out:
        if not isinstance(i, str) or not i:
            raise ValueError(f"memory ids must be non-empty str, got {i!r:.80}")
        if "\x00" in i:
            raise ValueError(f"memory id {i!r:.80} contains NUL (U+0000), which no store can look a memory up by")
    return out


def check_update(
    scope: Scope,
    memory_id: str,
    text: str | None,
    confidence: float | None,
    importance: float | None,
    embedding: Sequence[float] | npt.NDArray[np.float32] | None,
) -> dict[str, Any]:
    """The changes an update asks for (only the fields given), validated by `NewMemory`'s
    own rules: `InvalidMemory` names the memory and the field.

    >>> check_update(Scope("o", "a"), "m1", None, 0.5, None, None)
    {'confidence': 0.5}
    """
    if not isinstance(memory_id, str) or not memory_id:
        raise ValueError(f"memory_id must be a non-empty str, got {memory_id!r:.80}")
    probe = NewMemory(
        memory_id,
        scope.organization_id,
        scope.agent_id,
        "-" if text is None else text,
        embedding=embedding,
        confidence=1.0 if confidence is None else confidence,
        importance=importance,
    )
    out: dict[str, Any] = {}
    if text is not None:
        out["text"] = probe.text
    if confidence is not None:
        out["confidence"] = probe.confidence
    if importance is not None:
        out["importance"] = probe.importance
    if embedding is not None:
        out["embedding"] = probe.embedding
    return out
