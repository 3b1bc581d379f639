"""Assembly: the whole pipeline for one request, end to end.

request -> budget -> retrieval -> scoring/gate -> pack -> format -> result. `assemble`
looks the model up in the capability catalog, runs the three retrieval branches under one
shared wall, gates and scores what came back, prices every candidate as the tokens of its
escaped, wrapped form, packs them into what the budget leaves, formats the context, and
returns it with the full record: the budget ledger, the pack record, one trace entry per
candidate, one record per branch, the wall, and whether and why it degraded. A failing
or slow source degrades the context (directive-only or history-only) and never widens
what the request may see.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from . import _core
from .budget import Budget, BudgetPolicy, compute_budget
from .catalog import Catalog, ModelCapability, default_catalog
from .counting import boundary_allowance, count_exact_batch, memory_units
from . import tokens
from .errors import ConfigError, ContextOverflow, TokenizerUnavailable
from .formatting import _SECTIONS, NONCE_BYTES, _Sections, _tools_json, format_context, formatter_overhead
from .memory import MemoryRecord, Scope, Sources
from .packing import PackResult, pack_arrays
from .payloads import RenderingCosts, default_directive_role, render_anthropic, render_openai, rendering_costs
from .request import AssemblyRequest, HistoryPolicy, Message, Rendering, Role
from .result import (
    Branch,
    BranchRecord,
    BranchStatus,
    HistoryDrop,
    Pricing,
    StageTimings,
    TraceEntry,
    TraceReason,
    Wall,
)
from .retrieval import (
    DEFAULT_CLIENT_TIMEOUT_MS,
    DEFAULT_COLD_TIMEOUT_MS,
    DEFAULT_DIRECTIVE_TIMEOUT_MS,
    DEFAULT_HOT_TIMEOUT_MS,
    DEFAULT_SERVER_DEADLINE_MS,
    BranchTimeouts,
    Retrieved,
    compute_wall,
    retrieve,
)
from .tokens import TokenCount, TokenKind, _estimator_for, estimate_tokens_batch, exact_families
from .scoring import DEFAULT_MIN_SIMILARITY, DEFAULT_RELEVANCE_FLOOR, ScoreWeights, ScoringConfig, score_candidates

__all__ = [
    "COUNT_CACHE_ENTRIES",
    "DEFAULT_PACKING_HEADROOM_MS",
    "DIRECTIVE_BOUNDARY_ALLOWANCE",
    "EXACT_COUNT_BYTES_PER_MS",
    "RECENCY_HALF_LIFE_DAYS",
    "AssembledContext",
    "AssemblyConfig",
    "assemble",
    "warm_tokenizers",
]

#: Time kept after retrieval, under a caller deadline, for scoring, packing and formatting
#: (p99 ~3.5 ms for 1,000 candidates on a 2-core machine; bench/test_bench_assembly.py).
DEFAULT_PACKING_HEADROOM_MS = 5.0
#: Half-life of the recency component used by weighted scores: a memory a week old
#: counts half as recent as a new one.
RECENCY_HALF_LIFE_DAYS = 7.0

_T = TypeVar("_T")

_ENV = {
    "client_timeout_ms": "CTXCORE_CONTEXT_TIMEOUT_MS",
    "server_deadline_ms": "CTXCORE_CONTEXT_DEADLINE_MS",
    "directive_timeout_ms": "CTXCORE_DIRECTIVE_TIMEOUT_MS",
    "hot_timeout_ms": "CTXCORE_HOT_TIMEOUT_MS",
    "cold_timeout_ms": "CTXCORE_COLD_TIMEOUT_MS",
    "packing_headroom_ms": "CTXCORE_PACKING_HEADROOM_MS",
    "relevance_floor": "CTXCORE_RELEVANCE_FLOOR",
    "min_similarity": "CTXCORE_MIN_SIMILARITY",
}


@dataclass(frozen=True, slots=True)
class AssemblyConfig:
    """Service-wide assembly settings (per-request knobs live in `AssemblyOptions`).

    Every field can come from the environment (`from_env`); a setting that makes no sense
    (a negative timeout, a relevance floor at or above the full-text sentinel 0.5) is
    rejected when the config is built, i.e. at start-up.

    >>> AssemblyConfig().wall_ms
    40.0
    >>> AssemblyConfig(relevance_floor=0.6)
    Traceback (most recent call last):
    ...
    ctxcore.ConfigError: relevance_floor must be in [0, 0.5): full-text hits carry the fixed relevance 0.5 and a floor at or above it drops every one of them (got 0.6)
    """

    client_timeout_ms: float = DEFAULT_CLIENT_TIMEOUT_MS
    server_deadline_ms: float = DEFAULT_SERVER_DEADLINE_MS
    directive_timeout_ms: float = DEFAULT_DIRECTIVE_TIMEOUT_MS
    hot_timeout_ms: float = DEFAULT_HOT_TIMEOUT_MS
    cold_timeout_ms: float = DEFAULT_COLD_TIMEOUT_MS
    packing_headroom_ms: float = DEFAULT_PACKING_HEADROOM_MS
    relevance_floor: float = DEFAULT_RELEVANCE_FLOOR
    min_similarity: float = DEFAULT_MIN_SIMILARITY
    budget_policy: BudgetPolicy = field(default_factory=BudgetPolicy)

    def __post_init__(self) -> None:
        for name in _ENV:
            if name in ("relevance_floor", "min_similarity"):
                continue
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a finite number of milliseconds >= 0, got {v!r}")
        ScoringConfig(relevance_floor=self.relevance_floor, min_similarity=self.min_similarity)

    @property
    def wall_ms(self) -> float:
        """The retrieval wall without a caller deadline: min(client timeout, server deadline)."""
        return min(self.client_timeout_ms, self.server_deadline_ms)

    @property
    def branch_timeouts(self) -> BranchTimeouts:
        """The per-branch timeouts."""
        return BranchTimeouts(self.directive_timeout_ms, self.hot_timeout_ms, self.cold_timeout_ms)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AssemblyConfig:
        """Settings from ``CTXCORE_*`` environment variables, then `overrides`, then defaults.

        >>> AssemblyConfig.from_env({"CTXCORE_CONTEXT_DEADLINE_MS": "30"}).wall_ms
        30.0
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, var in _ENV.items():
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[name] = float(raw)
            except ValueError:
                raise ConfigError(f"{var} must be a number, got {raw!r}") from None
        values.update(overrides)
        return cls(**values)


_TRACE_REASONS: tuple[TraceReason, ...] = tuple(TraceReason)
_REASON_CODE = {r: np.uint8(k) for k, r in enumerate(_TRACE_REASONS)}
_PRICINGS: tuple[str, ...] = ("", *(p.value for p in Pricing))
_PRICING_CODE = {p: np.uint8(k) for k, p in enumerate(_PRICINGS)}


@dataclass(frozen=True, slots=True)
class _TraceRows:
    """Rows of the trace that share their columns with the assembly's arrays: row k is
    candidate ``at[k]`` of the ``ids``/``origins`` columns; numbers are arrays aligned with
    ``at`` (None: zeros / not priced)."""

    ids: Sequence[str]
    origins: Sequence[str]
    at: npt.NDArray[np.intp]
    reason: npt.NDArray[np.uint8]
    score: npt.NDArray[np.float64] | None = None
    relevance: npt.NDArray[np.float64] | None = None
    tokens: npt.NDArray[np.int64] | None = None
    recounted: npt.NDArray[np.bool_] | None = None
    pricing: npt.NDArray[np.uint8] | None = None


class TraceTable:
    """The trace as parallel columns, one row per memory candidate.

    Assembling adds rows in blocks that share the pipeline's arrays (no per-row work);
    the columns (`memory_id`, `reason`, `origin`, `tokens`, `score`, `relevance`,
    `recounted`, `pricing`, each a list) are joined on first read, and `entries` turns
    them into `TraceEntry` objects.

    >>> t = TraceTable()
    >>> t.add("m1", TraceReason.OUT_OF_SCOPE, "hot")
    >>> (len(t), t.reason, t.entries()[0].memory_id)
    (1, [<TraceReason.OUT_OF_SCOPE: 'out_of_scope'>], 'm1')
    """

    __slots__ = ("_blocks", "_columns")

    _FIELDS = ("memory_id", "reason", "origin", "tokens", "score", "relevance", "recounted", "pricing")

    def __init__(self) -> None:
        self._blocks: list[_TraceRows | tuple[Any, ...]] = []
        self._columns: dict[str, list[Any]] | None = None

    def add(self, memory_id: str, reason: TraceReason, origin: str, tokens: int = 0, score: float = 0.0,
            relevance: float = 0.0, recounted: bool = False, pricing: str = "") -> None:
        """Append one row."""
        self._blocks.append((memory_id, reason, origin, tokens, score, relevance, recounted, pricing))
        self._columns = None

    def add_rows(self, rows: _TraceRows) -> None:
        """Append a block of rows (the assembly's columnar path)."""
        if rows.at.size:
            self._blocks.append(rows)
            self._columns = None

    def __len__(self) -> int:
        return sum(b.at.size if isinstance(b, _TraceRows) else 1 for b in self._blocks)

    def _joined(self) -> dict[str, list[Any]]:
        if self._columns is not None:
            return self._columns
        cols: dict[str, list[Any]] = {f: [] for f in self._FIELDS}
        for b in self._blocks:
            if not isinstance(b, _TraceRows):
                for f, v in zip(self._FIELDS, b):
                    cols[f].append(v)
                continue
            at = b.at.tolist()
            n = len(at)
            cols["memory_id"].extend(map(b.ids.__getitem__, at))
            cols["origin"].extend(map(b.origins.__getitem__, at))
            cols["reason"].extend(map(_TRACE_REASONS.__getitem__, b.reason.tolist()))
            for name, arr, zero in (("tokens", b.tokens, 0), ("score", b.score, 0.0),
                                    ("relevance", b.relevance, 0.0), ("recounted", b.recounted, False)):
                cols[name].extend(arr.tolist() if arr is not None else [zero] * n)
            cols["pricing"].extend(map(_PRICINGS.__getitem__, b.pricing.tolist()) if b.pricing is not None
                                   else [""] * n)
        self._columns = cols
        return cols

    @property
    def memory_id(self) -> list[str]:
        """Each row's memory id."""
        return self._joined()["memory_id"]

    @property
    def reason(self) -> list[TraceReason]:
        """Each row's `TraceReason`."""
        return self._joined()["reason"]

    @property
    def origin(self) -> list[str]:
        """Each row's origin (the retrieval path)."""
        return self._joined()["origin"]

    @property
    def tokens(self) -> list[int]:
        """Each row's priced cost (0 when it never reached pricing)."""
        return self._joined()["tokens"]

    @property
    def score(self) -> list[float]:
        """Each row's score."""
        return self._joined()["score"]

    @property
    def relevance(self) -> list[float]:
        """Each row's relevance, as the gate saw it."""
        return self._joined()["relevance"]

    @property
    def recounted(self) -> list[bool]:
        """Each row's recount flag."""
        return self._joined()["recounted"]

    @property
    def pricing(self) -> list[str]:
        """How each row's cost was obtained (a `Pricing` value, or empty)."""
        return self._joined()["pricing"]

    def entries(self) -> tuple[TraceEntry, ...]:
        """The rows as `TraceEntry` objects, in order."""
        c = self._joined()
        return tuple(map(TraceEntry, *(c[f] for f in self._FIELDS)))


@dataclass(frozen=True, slots=True)
class AssembledContext:
    """The assembled context and the record of how it was made.

    Attributes:
        text: the context to send to the model.
        sections: each non-empty section's text, in order (each a substring of `text`).
        nonce: the per-assembly nonce on every memory element.
        model: the canonical model name.
        scope: the organization and agent the context is for.
        budget: the budget ledger (every term, `usable`, `constrained`), in the model's
            tokenizer family: exact counts where the family's tokenizer is installed
            (``budget.estimate_kind``), else the estimator's.
        pack: the pack record, or None when there was nothing to pack.
        trace_table: the trace as columns (cheap to build); `trace` gives it as entries.
        branches: the directive, hot and cold branch records.
        wall: the retrieval wall that applied.
        degraded: True when context was disabled, skipped, or a branch failed or timed out.
        degradation_reasons: why, e.g. ``("hot_timeout", "cold_error")``.
        constrained: the usable budget is below the policy's threshold (256 by default).
        history_dropped: groups of turns dropped by ``trim_oldest``.
        timings: milliseconds per stage.
        replaced_chars: characters XML 1.0 cannot carry, replaced by U+FFFD.
        scoring: which score formula ran, with which weights.
        prompt_tokens: the priced size of `text`: directive, messages, tools, fixed text
            and the selected memories, in the ledger's family and kind. For an exact ledger
            it is an upper bound on the exact count of `text` (the tests measure how tight).
        directive: the directive as retrieved (None when there was none).
        messages: the history as kept, after any trimming (`history_dropped` says what went).
        tools: the tool schemas as given.
        rendering: the rendering the budget was priced for (`AssemblyOptions.rendering`).
        framing_tokens: the provider's chat framing in the ledger (0 for ``text``).
        stable_prefix_tokens: tokens of the part that stays the same between turns of a
            conversation (tools, directive, history), which prompt caches can reuse.
    """

    text: str
    sections: Mapping[str, str]
    nonce: str
    model: str
    scope: Scope
    budget: Budget
    pack: PackResult | None
    trace_table: TraceTable = field(repr=False)
    branches: tuple[BranchRecord, ...]
    wall: Wall
    degraded: bool
    degradation_reasons: tuple[str, ...]
    constrained: bool
    history_dropped: tuple[HistoryDrop, ...]
    timings: StageTimings
    replaced_chars: int
    scoring: Mapping[str, Any] = field(default_factory=dict)
    prompt_tokens: TokenCount | None = None
    directive: str | None = None
    messages: tuple[Message, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    rendering: Rendering = Rendering.TEXT
    framing_tokens: int = 0
    stable_prefix_tokens: int = 0

    def to_openai(self, *, directive_role: str | None = None) -> dict[str, Any]:
        """The context as a Chat Completions request body: ``{"messages", "tools"}``.

        The directive is the system message (``developer`` for reasoning models, or as
        `directive_role` says), the kept history follows as real messages with native
        ``tool_calls`` / ``tool`` results, and the memories section (nonce-tagged,
        escaped, with its safety sentence) is the last message. ``tools`` is present when
        the request had tools. Unpack it into the SDK call:
        ``client.chat.completions.create(model=..., **ctx.to_openai())``. The budget
        holds for it when the request asked for ``rendering="openai"``.

        >>> import asyncio, ctxcore
        >>> req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", "hi", messages=[{"role": "user", "content": "hi"}])
        >>> asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())).to_openai()
        {'messages': [{'role': 'user', 'content': 'hi'}]}
        """
        return render_openai(
            directive=self.directive,
            messages=self.messages,
            tools=self.tools,
            memory_block=self.sections.get("memories"),
            directive_role=directive_role or default_directive_role(self.model),
        )

    def to_anthropic(self, *, cache_breakpoint: bool = True) -> dict[str, Any]:
        """The context as a Messages request body: ``{"system", "messages", "tools"}``.

        ``tool_use`` / ``tool_result`` blocks, alternating roles, the memories section as
        a text block after the latest user turn; ``system`` and ``tools`` are present
        when non-empty. With `cache_breakpoint` the last block before the memories
        carries ``cache_control``, so the stable prefix is cached from turn to turn.
        ``client.messages.create(model=..., max_tokens=..., **ctx.to_anthropic())``.

        >>> import asyncio, ctxcore
        >>> req = ctxcore.AssemblyRequest("org", "agent", "claude-sonnet-4", "hi", messages=[{"role": "user", "content": "hi"}])
        >>> asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())).to_anthropic()["messages"]
        [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi', 'cache_control': {'type': 'ephemeral'}}]}]
        """
        return render_anthropic(
            directive=self.directive,
            messages=self.messages,
            tools=self.tools,
            memory_block=self.sections.get("memories"),
            cache_breakpoint=cache_breakpoint,
        )

    @property
    def trace(self) -> tuple[TraceEntry, ...]:
        """One `TraceEntry` per memory candidate (why it is in or out), built on access."""
        return self.trace_table.entries()

    @property
    def selected_ids(self) -> tuple[str, ...]:
        """Ids of the memories in the context, in the order they appear."""
        return self.pack.ids if self.pack is not None else ()

    def record(self) -> dict[str, Any]:
        """Everything but the text, as JSON-ready values: budget ledger, pack record,
        branch records, trace, wall, degradation, timings (memory text never included).

        >>> import asyncio, ctxcore
        >>> req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", ctxcore.Query("hi"))
        >>> rec = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())).record()
        >>> rec["degradation_reasons"], rec["branches"][1]["status"]
        (['no_memory_source'], 'skipped')
        """
        t = self.trace_table
        return {
            "model": self.model,
            "organization_id": self.scope.organization_id,
            "agent_id": self.scope.agent_id,
            "nonce": self.nonce,
            "sections": list(self.sections),
            "budget": self.budget.record(),
            "pack": self.pack.record() if self.pack is not None else None,
            "selected": list(self.selected_ids),
            "branches": [
                {
                    "branch": b.branch.value,
                    "status": b.status.value,
                    "latency_ms": round(b.latency_ms, 3),
                    "items": b.items,
                    "dropped_out_of_scope": b.dropped_out_of_scope,
                    "error": b.error,
                }
                for b in self.branches
            ],
            "trace": [
                {
                    "memory_id": mid,
                    "reason": reason.value,
                    "origin": origin,
                    "tokens": tokens,
                    "score": score,
                    "relevance": rel,
                    "recounted": rc,
                    "pricing": how,
                }
                for mid, reason, origin, tokens, score, rel, rc, how in zip(
                    t.memory_id, t.reason, t.origin, t.tokens, t.score, t.relevance, t.recounted, t.pricing
                )
            ],
            "wall": {"limit_ms": self.wall.limit_ms, "source": self.wall.source.value},
            "degraded": self.degraded,
            "degradation_reasons": list(self.degradation_reasons),
            "constrained": self.constrained,
            "history_dropped": [
                {"first_index": d.first_index, "count": d.count, "tokens": d.tokens, "roles": list(d.roles)}
                for d in self.history_dropped
            ],
            "scoring": dict(self.scoring),
            "timings_ms": {
                "retrieval": self.timings.retrieval_ms,
                "scoring": self.timings.scoring_ms,
                "budget": self.timings.budget_ms,
                "packing": self.timings.packing_ms,
                "formatting": self.timings.formatting_ms,
                "total": self.timings.total_ms,
            },
            "replaced_chars": self.replaced_chars,
            "prompt_tokens": None if self.prompt_tokens is None else self.prompt_tokens.value,
            "rendering": self.rendering.value,
            "framing_tokens": self.framing_tokens,
            "stable_prefix_tokens": self.stable_prefix_tokens,
        }


# ---- history --------------------------------------------------------------------------


def _message_item(m: Message) -> dict[str, str]:
    """A message as the formatter takes it. Tool calls and tool results are part of the
    conversation the model sees, so they are written into the content (and counted)."""
    content = m.content
    if m.tool_calls:
        calls = "\n".join(f"[tool call {c.id}] {c.name}({c.arguments})" for c in m.tool_calls)
        content = f"{content}\n{calls}" if content else calls
    if m.role == Role.TOOL:
        content = f"[tool result {m.tool_call_id}] {content}"
    return {"role": m.role.value, "content": content}


def _turn_groups(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """Split messages into atomic groups [begin, end): an assistant message with tool
    calls and the tool results that answer it go together; anything else stands alone."""
    groups: list[tuple[int, int]] = []
    i = 0
    while i < len(messages):
        j = i + 1
        if messages[i].role == Role.ASSISTANT and messages[i].tool_calls:
            ids = {c.id for c in messages[i].tool_calls}
            while j < len(messages) and messages[j].role == Role.TOOL and messages[j].tool_call_id in ids:
                j += 1
        groups.append((i, j))
        i = j
    return groups


# ---- the pipeline ---------------------------------------------------------------------


# The packer's reasons (ctxcore.Reason, by its uint8 code) as trace reason codes.
_PACK_REASON_CODES = np.array([_REASON_CODE[r] for r in (
    TraceReason.SELECTED,
    TraceReason.PINNED,
    TraceReason.BUDGET_EXHAUSTED,
    TraceReason.BUDGET_EXHAUSTED,  # pinned, but no room left after the earlier pinned
    TraceReason.NON_POSITIVE_SCORE,
)], dtype=np.uint8)


@dataclass(slots=True)
class _Columns:
    """The retrieved memories as columns (one C-level pass over the records): str fields
    as lists, numbers as arrays (NaN for None; -1 for no stored count of the family)."""

    ids: list[str]
    texts: list[str]
    origins: list[str]
    similarity: npt.NDArray[np.float64]
    confidence: npt.NDArray[np.float64]
    importance: npt.NDArray[np.float64]
    created_at: npt.NDArray[np.float64]
    stored: npt.NDArray[np.int64]
    distinct_origins: list[str]
    origin_code: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0))
    relevance: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0))

    @property
    def n(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, mems: Sequence[MemoryRecord], family: str) -> _Columns:
        return cls(*_core.memory_columns(mems, MemoryRecord, family))


def _best_of_each_id(ids: list[str], scores: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_] | None:
    """Which rows are the best-scored of their id (the first among equals); None when
    every id is distinct (the common case, settled by one dict build)."""
    if len(dict.fromkeys(ids)) == len(ids):
        return None
    best: dict[str, int] = {}
    sc = scores.tolist()
    for i, mid in enumerate(ids):
        j = best.get(mid)
        if j is None or sc[i] > sc[j]:
            best[mid] = i
    first = np.zeros(len(ids), dtype=bool)
    first[list(best.values())] = True
    return first


#: Exact counting speed assumed when deciding whether a count can be had before the
#: deadline (UTF-8 bytes per millisecond; tiktoken counts ~3-10 MB/s on this machine, the
#: figure is the slow end so that a count started is a count finished).
EXACT_COUNT_BYTES_PER_MS = 2000.0
#: Tokens added to the directive's exact count: the directive is the one piece whose last
#: character is caller text, and BPE may merge it with the newline of the frame after it
#: (the property tests in tests/test_pricing.py measure the largest such effect).
DIRECTIVE_BOUNDARY_ALLOWANCE = 1


def _recency(created_at: npt.NDArray[np.float64], now: float) -> npt.NDArray[np.float64] | None:
    if not created_at.size or np.isnan(created_at).any():
        return None
    age_days = np.maximum(0.0, now - created_at) / 86400.0
    return np.power(0.5, age_days / RECENCY_HALF_LIFE_DAYS)


def _overflow_message(budget: Budget) -> str:
    return (
        f"the request does not fit {budget.model}'s {budget.context_window}-token window: "
        f"directive {budget.directive_tokens} + messages {budget.messages_tokens} + tools "
        f"{budget.tool_schema_tokens} + formatting {budget.formatter_overhead_tokens} + response reserve "
        f"{budget.response_reserve} + safety buffer {budget.safety_buffer} exceed it by {budget.shortfall} tokens"
    )


class _CountCache:
    """Exact counts of pieces that repeat across calls (directives, tool schemas, frames,
    messages of a conversation, score/source shapes), keyed by family and content: the
    text itself when short, else its BLAKE2b digest. Bounded; least recently used first out.
    Thread-safe (assemblies may run on an executor's threads)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._data: OrderedDict[tuple[str, object], int] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(family: str, text: str) -> tuple[str, object]:
        if len(text) <= 128:
            return (family, text)
        return (family, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())

    def get_many(self, keys: Sequence[tuple[str, object]]) -> list[int | None]:
        with self._lock:
            out = [self._data.get(k) for k in keys]
            for k, v in zip(keys, out):
                if v is not None:
                    self._data.move_to_end(k)
        return out

    def put_many(self, items: Sequence[tuple[tuple[str, object], int]]) -> None:
        with self._lock:
            for k, v in items:
                self._data[k] = v
                self._data.move_to_end(k)
            while len(self._data) > self._capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


#: Entries kept by the exact-count cache (all families together).
COUNT_CACHE_ENTRIES = 1 << 16
_COUNTS = _CountCache(COUNT_CACHE_ENTRIES)


class _ShapeCache:
    """Exact counts of the score/source unit ``M`` per family and source, by the score's
    four-decimal key ``k = rint(score * 1e4)``: a dense table over k in 0..10000 (the
    scores' range), looked up as arrays; other keys (a weighted score outside [0, 1]) in a
    bounded dict. Counted on first sight, in one batch per call. Thread-safe: a table
    entry is written once with the one value it can have."""

    SPAN = 10_001

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._tables: dict[tuple[str, str], npt.NDArray[np.int32]] = {}
        self._other: dict[tuple[str, float, str], int] = {}
        self._lock = threading.Lock()

    def _table(self, family: str, source: str) -> npt.NDArray[np.int32]:
        t = self._tables.get((family, source))
        if t is None:
            with self._lock:
                if len(self._tables) >= 256:  # sources are few; a flood of new ones resets
                    self._tables.clear()
                t = self._tables.setdefault((family, source), np.full(self.SPAN, -1, dtype=np.int32))
        return t

    def costs(self, family: str, keys: npt.NDArray[np.float64], sources: Sequence[str],
              source_code: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``M`` of each (key, ``sources[source_code]``) pair."""
        out = np.empty(keys.size, dtype=np.int64)
        if len(sources) == 1:
            groups = [(sources[0], np.arange(keys.size))]
        else:
            groups = [(src, np.flatnonzero(source_code == k)) for k, src in enumerate(sources)]
        for source, rows in groups:
            k = keys[rows]
            dense = (k >= 0) & (k < self.SPAN)
            if dense.all():
                out[rows] = self._dense(family, source, k.astype(np.intp))
                continue
            out[rows[dense]] = self._dense(family, source, k[dense].astype(np.intp))
            out[rows[~dense]] = self._sparse(family, source, k[~dense].tolist())
        return out

    def _dense(self, family: str, source: str, k: npt.NDArray[np.intp]) -> npt.NDArray[np.int32]:
        table = self._table(family, source)
        got = table[k]
        if (got < 0).any():
            new = np.unique(k[got < 0])
            counted = _exact(_shape_texts([(v / 1e4, source) for v in new.tolist()]), family)
            table[new] = counted
            got = table[k]
        return got

    def _sparse(self, family: str, source: str, keys: list[float]) -> list[int]:
        other = self._other
        new = [v for v in dict.fromkeys(keys) if (family, v, source) not in other]
        if new:
            counted = _exact(_shape_texts([(v / 1e4, source) for v in new]), family)
            with self._lock:
                if len(other) + len(new) > self._capacity:
                    other.clear()
                other.update({(family, v, source): c for v, c in zip(new, counted)})
            lookup = {**other, **{(family, v, source): c for v, c in zip(new, counted)}}
        else:
            lookup = other
        return [lookup[(family, v, source)] for v in keys]

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._other.clear()


_SHAPES = _ShapeCache(COUNT_CACHE_ENTRIES)


def _uncached_bytes(texts: Sequence[str], family: str) -> int:
    keys = [_CountCache.key(family, t) for t in texts]
    return sum(len(t) for t, v in zip(texts, _COUNTS.get_many(keys)) if v is None)


def _exact(texts: Sequence[str], family: str, *, cache: bool = True) -> list[int]:
    """Exact counts of `texts`, from the cache where it has them, the rest in one batch
    (texts that never repeat, such as those holding a nonce, pass ``cache=False``)."""
    if not cache:
        return [int(v) for v in count_exact_batch(texts, family).tolist()]
    keys = [_CountCache.key(family, t) for t in texts]
    got = _COUNTS.get_many(keys)
    missing = [i for i, v in enumerate(got) if v is None]
    if missing:
        counted = count_exact_batch([texts[i] for i in missing], family).tolist()
        _COUNTS.put_many([(keys[i], n) for i, n in zip(missing, counted)])
        for i, n in zip(missing, counted):
            got[i] = n
    return [int(v) for v in got]  # type: ignore[arg-type]


def _split(text: str, pieces: Sequence[tuple[int, int]]) -> tuple[list[int], list[str]]:
    kinds: list[int] = []
    texts: list[str] = []
    begin = 0
    for kind, end in pieces:
        kinds.append(kind)
        texts.append(text[begin:end])
        begin = end
    return kinds, texts


@dataclass(slots=True)
class _Ledger:
    """Prices the formatter's pieces in one family, exactly or with the estimator."""

    family: str
    exact: bool

    def costs(self, text: str, pieces: Sequence[tuple[int, int]], texts: Sequence[str]) -> list[int]:
        """Each piece's cost: its exact count on its own, or the estimator's price of it
        behind the character that precedes it (a message or the tools JSON always follows
        a ``>``, so either is the same wherever the piece stands)."""
        if self.exact:
            if boundary_allowance(self.family) == 0:
                # A message always follows a ``>`` (``<history>`` or the message before it),
                # and for the built-in families that ``>`` and the message's newline are one
                # chunk: a message costs what it adds behind the ``>``, as the whole text counts.
                is_message = [k == _PIECE_MESSAGE for k, _ in pieces]
                counted = _exact([">" + t if m else t for t, m in zip(texts, is_message)], self.family)
                gt = _exact([">"], self.family)[0]
                return [c - gt if m else c for c, m in zip(counted, is_message)]
            return _exact(texts, self.family)
        ends = np.array([e for _, e in pieces], dtype=np.int64)
        priced = _estimator_for(self.family).price_pieces(text, ends, np.zeros(len(pieces), dtype=bool), ">", ">")
        return list(priced.tolist())

    def price(self, directive: str | None, history: Sequence[Mapping[str, str]], tools_json: str | None,
              frame: bool) -> tuple[list[int], list[int]]:
        """(kinds, costs) of every piece of the context formatted without memories."""
        text, _, _, pieces = _core.format_context(directive, history, (), tools_json, _PRICING_NONCE, frame, True)
        kinds, texts = _split(text, pieces)
        return kinds, self.costs(text, pieces, texts)

    def frame_and_directive(self, directive: str | None, has_history: bool, has_tools: bool) -> tuple[int, int]:
        """The formatter's fixed text (with the memories section) and the directive's cost.
        Placeholders stand in for the messages and tools: the frame around them is the same."""
        kinds, costs = self.price(
            directive, _PLACEHOLDER_HISTORY if has_history else (), "[0]" if has_tools else None, True
        )
        fixed = sum(c for k, c in zip(kinds, costs) if k == _PIECE_FRAME)
        dcost = sum(c for k, c in zip(kinds, costs) if k == _PIECE_DIRECTIVE)
        if self.exact and directive:
            dcost += DIRECTIVE_BOUNDARY_ALLOWANCE
        return fixed, dcost


_PRICING_NONCE = "0" * 32
_PLACEHOLDER_HISTORY = ({"role": "user", "content": ""},)
_PIECE_FRAME, _PIECE_DIRECTIVE, _PIECE_MESSAGE, _PIECE_MEMORY, _PIECE_TOOLS = range(5)


@dataclass(slots=True)
class _Plan:
    """What is settled before retrieval: the ledger, the messages and tools priced, and
    how much history can go."""

    cap: ModelCapability
    ledger: _Ledger
    history: list[dict[str, str]]
    message_costs: npt.NDArray[np.int64]
    groups: list[tuple[int, int]]  # droppable groups, oldest first
    group_prefix: npt.NDArray[np.int64]  # prefix sums of the droppable groups' costs
    tools: list[dict[str, Any]] | None
    tools_json: str | None
    tools_tokens: int
    t_priced: float
    # A payload rendering's prices, without the directive (None for the text rendering).
    payload: RenderingCosts | None = None


def _ledger_capability(cat: Catalog, cap: ModelCapability, exact: bool) -> ModelCapability:
    kind = TokenKind.EXACT if exact else TokenKind.ESTIMATE
    if cap.estimate_kind is kind:
        return cap
    return replace(cap, estimate_kind=kind, safety_fraction=cat.policies[cap.tokenizer_family].safety_fraction(kind))


_loading: set[str] = set()
_loading_lock = threading.Lock()


def _tokenizer_ready(family: str) -> bool:
    """Whether `family`'s exact tokenizer is loaded (or registered), without loading it."""
    return family in tokens._registry or family in tokens._encodings


def _load_in_background(family: str) -> None:
    with _loading_lock:
        if family in _loading:
            return
        _loading.add(family)

    def load() -> None:
        try:
            tokens.count_tokens("", family)
        except TokenizerUnavailable:
            pass

    threading.Thread(target=load, name=f"ctxcore-load-{family}", daemon=True).start()


def warm_tokenizers() -> tuple[str, ...]:
    """Load every installed exact tokenizer now (a service calls this at start-up, so that
    no request pays for loading a vocabulary); returns `ctxcore.exact_families()`.

    >>> "cl100k_base" in warm_tokenizers()
    True
    """
    return exact_families()


def _can_count_exactly(cat: Catalog, cap: ModelCapability, deadline: float | None) -> bool:
    # The catalog says which kind of count the model is budgeted in; exact needs the
    # family's tokenizer installed (or registered) too. A vocabulary not loaded yet takes
    # a second or more to load: under a deadline it loads in the background and this
    # request is priced with the estimator.
    family = cap.tokenizer_family
    if cap.estimate_kind is not TokenKind.EXACT:
        return False
    if deadline is not None and not _tokenizer_ready(family):
        _load_in_background(family)
        return False
    if family not in exact_families():
        return False
    policy = cat.policies.get(family)
    return policy is not None and TokenKind.EXACT in policy.safety_fractions


def _time_left_ms(deadline: float | None) -> float:
    return math.inf if deadline is None else (deadline - time.monotonic()) * 1000.0


def _plan(request: AssemblyRequest, cat: Catalog, cap: ModelCapability, cfg: AssemblyConfig,
          deadline: float | None) -> _Plan:
    """Budget before work: price messages and tools and decide what history must go (up to
    the directive's share) before any store is queried; a request that cannot fit is
    refused here."""
    history = [_message_item(m) for m in request.messages]
    tools = [dict(t) for t in request.tools] or None
    tools_json = _tools_json(tools)
    family = cap.tokenizer_family
    exact = _can_count_exactly(cat, cap, deadline)
    text, _, _, pieces = _core.format_context(None, history, (), tools_json, _PRICING_NONCE, False, True)
    kinds, texts = _split(text, pieces)
    if exact and deadline is not None:
        # Exact counting of what is not cached must fit in half the time left; a very long
        # history on a short deadline is priced with the estimator instead (the ledger then
        # is in estimate counts, never a mix).
        uncached = _uncached_bytes(texts, family)
        exact = uncached <= 0.5 * _time_left_ms(deadline) * EXACT_COUNT_BYTES_PER_MS
    ledger = _Ledger(family, exact)
    lcap = _ledger_capability(cat, cap, exact)
    rendering = request.options.rendering
    payload: RenderingCosts | None = None
    if rendering is Rendering.TEXT:
        costs = ledger.costs(text, pieces, texts)
        message_costs = np.array([c for k, c in zip(kinds, costs) if k == _PIECE_MESSAGE], dtype=np.int64)
        tools_tokens = sum(c for k, c in zip(kinds, costs) if k == _PIECE_TOOLS)
    else:
        # A payload: each message costs its content and its framing by the provider's rule
        # (additive over messages, so trimming takes a group's framing off with it).
        payload = rendering_costs(rendering, model=cap.name, family=family, exact=exact, directive=None,
                                  messages=request.messages, tools=request.tools)
        message_costs = np.array(payload.message_tokens, dtype=np.int64)
        tools_tokens = payload.tools_tokens
    groups = _turn_groups(request.messages)
    last_user = max((i for i, m in enumerate(request.messages) if m.role == Role.USER), default=-1)
    droppable = [g for g in groups if not g[0] <= last_user < g[1]]
    if request.options.history_policy == HistoryPolicy.STRICT:
        droppable = []
    prefix = np.cumsum(np.array([message_costs[b:e].sum() for b, e in droppable], dtype=np.int64))
    if payload is None:
        fixed = ledger.frame_and_directive(None, bool(history), tools_json is not None)[0]
    else:
        fixed = payload.fixed_tokens
    budget = compute_budget(
        lcap,
        messages_tokens=int(message_costs.sum()),
        tool_schema_tokens=tools_tokens,
        formatter_overhead_tokens=fixed,
        policy=cfg.budget_policy,
    )
    most = int(prefix[-1]) if prefix.size else 0
    if budget.shortfall > most:
        if request.options.history_policy == HistoryPolicy.STRICT:
            raise ContextOverflow(_overflow_message(budget), budget)
        raise ContextOverflow(_overflow_message(budget) + " (nothing left to trim)", budget)
    return _Plan(lcap, ledger, history, message_costs, droppable, prefix, tools, tools_json, tools_tokens,
                 time.perf_counter(), payload)


def _directive_share(plan: _Plan, directive: str | None, model: str) -> tuple[int, int, int]:
    """(fixed, directive, directive framing) tokens once the directive is known."""
    if plan.payload is None:
        fixed, dcost = plan.ledger.frame_and_directive(directive, bool(plan.history), plan.tools_json is not None)
        return fixed, dcost, 0
    # The directive alone: no messages or tools to price again.
    d = rendering_costs(plan.payload.rendering, model=model, family=plan.ledger.family, exact=plan.ledger.exact,
                        directive=directive, messages=(), tools=())
    return plan.payload.fixed_tokens + d.directive_framing, d.directive_tokens, d.directive_framing


def _trim(plan: _Plan, messages: Sequence[Message], shortfall: int) -> tuple[list[int], list[HistoryDrop]]:
    """Drop the oldest droppable groups until `shortfall` tokens are freed: one search over
    the prefix sums of the groups' costs. Returns the kept message indices and the drops."""
    if shortfall <= 0:
        return list(range(len(messages))), []
    k = int(np.searchsorted(plan.group_prefix, shortfall, side="left")) + 1
    gone = plan.groups[:k]
    keep = np.ones(len(messages), dtype=bool)
    drops: list[HistoryDrop] = []
    for begin, end in gone:
        keep[begin:end] = False
        drops.append(
            HistoryDrop(begin, end - begin, int(plan.message_costs[begin:end].sum()),
                        tuple(messages[i].role.value for i in range(begin, end)))
        )
    return np.flatnonzero(keep).tolist(), drops


def _head_cost(family: str, nonce: str) -> int:
    """``P``: the element's head with this assembly's nonce. An element always follows a
    ``>`` (the element before it) or the ``.`` of the safety sentence, and for the built-in
    families that character and the head's newline are one chunk: the head's cost is what
    it adds behind either (the larger), as the whole text is counted."""
    allow = boundary_allowance(family)
    p_text = f'\n<memory nonce="{nonce}"'
    if allow == 0:
        a, b = _exact([">", "."], family)
        pa, pb = _exact([">" + p_text, "." + p_text], family, cache=False)
        return max(pa - a, pb - b)
    return _exact([p_text], family, cache=False)[0] + allow


def _memory_costs_exact(
    family: str,
    cols: _Columns,
    cand: npt.NDArray[np.intp],
    nonce: str,
    deadline: float | None,
    headroom_ms: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each candidate's exact cost ``P + (I + B) + M`` (see ``ctxcore.counting``), with
    how it was priced (`Pricing` codes) and whether it was recounted: ``I + B`` from the
    store's count, else counted in one batch when the time left allows, else estimated;
    ``P`` once per assembly, ``M`` from the score/source shape table."""
    allow = boundary_allowance(family)
    costs = cols.stored[cand]
    pricing = np.full(cand.size, _PRICING_CODE[Pricing.STORED.value], dtype=np.uint8)
    recounted = np.zeros(cand.size, dtype=bool)
    missing = np.flatnonzero(costs < 0)
    if missing.size:
        rows = cand[missing].tolist()
        units = memory_units([cols.ids[k] for k in rows], [cols.texts[k] for k in rows])
        nbytes = sum(len(u) for u in units)
        if nbytes <= (_time_left_ms(deadline) - headroom_ms) * EXACT_COUNT_BYTES_PER_MS:
            per_unit = count_exact_batch(units, family)
            how = Pricing.COUNTED.value
        else:
            per_unit = estimate_tokens_batch(units, family)
            how = Pricing.ESTIMATED.value
        costs[missing] = per_unit[0::2] + per_unit[1::2]
        pricing[missing] = _PRICING_CODE[how]
        recounted[missing] = True
    costs += _head_cost(family, nonce) + allow
    costs += _SHAPES.costs(family, np.rint(cols.scores[cand] * 1e4), cols.distinct_origins, cols.origin_code[cand])
    costs += allow
    return costs, pricing, recounted


def _memory_costs_estimated(
    family: str, cols: _Columns, mems: Sequence[MemoryRecord], cand: npt.NDArray[np.intp], nonce: str
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each candidate's estimated cost: the estimator's price of its escaped, wrapped
    element; a store's matching estimate of the raw text plus the wrapper can only raise
    it (the larger is kept, never a mix of families or kinds)."""
    rows = cand.tolist()
    items = [
        {"id": cols.ids[i], "text": cols.texts[i], "score": float(v), "source": cols.origins[i]}
        for i, v in zip(rows, (np.rint(cols.scores[cand] * 1e4) / 1e4).tolist())
    ]
    overhead = formatter_overhead(items, family=family, nonce=nonce)
    costs = np.fromiter(overhead.memory_tokens, dtype=np.int64, count=len(rows))
    recounted = np.zeros(len(rows), dtype=bool)
    kind = TokenKind.ESTIMATE.value
    for k, i in enumerate(rows):
        m = mems[i]
        if m.token_count is not None:
            if m.token_family == family and m.token_kind == kind:
                costs[k] = max(int(costs[k]), m.token_count + overhead.wrapper_tokens)
            else:
                recounted[k] = True
    return costs, np.full(len(rows), _PRICING_CODE[Pricing.ESTIMATED.value], dtype=np.uint8), recounted


def _shape_texts(shapes: Sequence[tuple[float, str]]) -> list[str]:
    """The ``M`` unit of each (score, source) as the serializer writes it."""
    if not shapes:
        return []
    text, _, _, pieces = _core.format_context(
        None, (), [{"id": "m", "text": "", "score": s, "source": src} for s, src in shapes], None,
        _PRICING_NONCE, False, True,
    )
    head = len(f'\n<memory nonce="{_PRICING_NONCE}" id="m"')
    tail = len('"></memory>')
    out = []
    begin = 0
    for kind, end in pieces:
        if kind == _PIECE_MEMORY:
            out.append(text[begin + head : end - tail])
        begin = end
    return out


async def _in(executor: Executor | None, fn: Callable[..., _T], *args: Any) -> _T:
    if executor is None:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))


async def assemble(
    request: AssemblyRequest,
    *,
    sources: Sources,
    catalog: Catalog | None = None,
    config: AssemblyConfig | None = None,
    deadline: float | None = None,
    executor: Executor | None = None,
) -> AssembledContext:
    """Assemble the context for one request.

    For a model whose tokenizer family has an exact tokenizer installed
    (`ctxcore.exact_families()`), every term of the ledger is in that family's exact
    tokens: directive, messages, tools, the formatter's fixed text and each memory element
    (from the store's stored count, no tokenizing, see ``ctxcore.counting``). Other
    families are priced with the estimator. Messages and tools are priced, and the
    overflow and trimming decisions made, before any store is queried.

    The deadline is checked between stages: before pricing (a history that cannot be
    counted exactly in half the time left is priced with the estimator, the whole ledger
    then in estimate counts), at retrieval (the wall), and before memories without stored
    counts are counted (else they are estimated, per candidate, as the trace records).

    Args:
        request: who, for which model, about what, with which recent messages and tools.
        sources: the directive, hot-memory and cold-memory branches (e.g.
            ``Sources.from_store(store)``); a branch left None is skipped.
        catalog: the capability catalog; the shipped one by default.
        config: service settings; `AssemblyConfig.from_env()` by default.
        deadline: the caller's deadline as an absolute `time.monotonic()` time: the
            retrieval wall is cut to the time left minus ``config.packing_headroom_ms``;
            exact counts that would not finish in time are replaced by estimates.
        executor: where the CPU-heavy stages (pricing, trimming, scoring, packing,
            formatting) run; None runs them inline on the calling thread (the event loop).
            The compiled core releases the GIL, so a bounded thread pool keeps the event
            loop free while a large request is priced and packed.

    Returns:
        The `AssembledContext`. Slow or failing sources degrade it; they never raise.

    Raises:
        UnknownModel: the model is not in the catalog.
        ContextOverflow: directive + messages + tools alone exceed the window and the
            history policy is ``strict`` (or nothing more can be trimmed).

    >>> import asyncio, ctxcore
    >>> from ctxcore import AssemblyRequest, MemoryRecord, Query, Sources
    >>> async def hot(scope, query, limit):
    ...     return [MemoryRecord("m1", "org", "agent", "Prefers email over phone.", similarity=0.8)]
    >>> req = AssemblyRequest("org", "agent", "gpt-4o", Query("how to contact?"))
    >>> ctx = asyncio.run(ctxcore.assemble(req, sources=Sources(hot=hot)))
    >>> (ctx.selected_ids, ctx.degraded)
    (('m1',), False)
    """
    t_start = time.perf_counter()
    cfg = config if config is not None else AssemblyConfig.from_env()
    cat = catalog if catalog is not None else default_catalog()
    cap = cat.get_model(request.model)
    opts = request.options
    scope = request.scope
    floor = opts.relevance_floor if opts.relevance_floor is not None else cfg.relevance_floor
    min_sim = opts.min_similarity if opts.min_similarity is not None else cfg.min_similarity
    scoring_config = ScoringConfig(relevance_floor=floor, min_similarity=min_sim)
    weights = ScoreWeights(**dict(opts.weights)) if opts.weights else None

    # ---- budget before work: messages and tools priced, the request refused if it cannot fit
    plan = await _in(executor, _plan, request, cat, cap, cfg, deadline)

    reasons: list[str] = []
    run_directive = opts.context_enabled
    run_memory = opts.context_enabled and not opts.skip_memory
    if not opts.context_enabled:
        reasons.append("context_disabled")
    elif opts.skip_memory:
        reasons.append("memory_skipped")
    elif sources.hot is None and sources.cold is None:
        reasons.append("no_memory_source")

    # ---- retrieval, under the shared wall. It starts once the request is priced, as it did
    # when pricing came after retrieval (a caller deadline still bounds the whole call).
    wall = compute_wall(
        cfg.client_timeout_ms, cfg.server_deadline_ms, deadline=deadline, headroom_ms=cfg.packing_headroom_ms
    )
    retrieved = await retrieve(
        scope,
        request.query,
        sources,
        wall=wall,
        timeouts=cfg.branch_timeouts,
        limit=opts.max_memories,
        min_similarity=min_sim,
        run_directive=run_directive,
        run_memory=run_memory,
        wall_start=plan.t_priced,
    )
    t_retrieved = time.perf_counter()
    for b in retrieved.branches:
        if b.status in (BranchStatus.TIMEOUT, BranchStatus.ERROR):
            reasons.append(f"{b.branch.value}_{b.status.value}")
    return await _in(
        executor, _finish, request, plan, retrieved, cfg, scoring_config, weights, reasons, deadline,
        t_start, t_retrieved,
    )


def _finish(
    request: AssemblyRequest,
    plan: _Plan,
    retrieved: Retrieved,
    cfg: AssemblyConfig,
    scoring_config: ScoringConfig,
    weights: ScoreWeights | None,
    reasons: list[str],
    deadline: float | None,
    t_start: float,
    t_retrieved: float,
) -> AssembledContext:
    """The stages after retrieval, synchronous: scoring and the gate, the directive's share
    and history trimming, pricing, packing, formatting. Runs on the executor when given."""
    opts = request.options
    cap = plan.cap
    ledger = plan.ledger

    # ---- scoring, the gate, de-duplication, the per-request cap, over columns
    trace = TraceTable()
    for m in retrieved.out_of_scope:
        trace.add(m.id, TraceReason.OUT_OF_SCOPE, m.origin)
    mems = retrieved.memories
    family = cap.tokenizer_family
    scoring_record: dict[str, Any] = {}
    cols = _Columns.of(mems, family)
    cand = np.empty(0, dtype=np.intp)  # rows of `cols` that go on to pricing and packing
    if cols.n:
        full_text = np.isnan(cols.similarity)
        imp = cols.importance
        scored = score_candidates(
            np.where(full_text, 0.0, cols.similarity),
            cols.confidence,
            recency=_recency(cols.created_at, time.time()) if weights is not None else None,
            importance=None if weights is None or np.isnan(imp).any() else imp,
            full_text=full_text,
            weights=weights,
            config=scoring_config,
        )
        scoring_record = scored.record()
        cols.scores = scored.scores
        cols.relevance = scored.relevance
        first = _best_of_each_id(cols.ids, cols.scores)
        keep = scored.kept.copy()
        reason = np.full(cols.n, _REASON_CODE[TraceReason.BELOW_RELEVANCE_FLOOR], dtype=np.uint8)
        if first is not None:
            keep &= first
            reason[~first] = _REASON_CODE[TraceReason.DUPLICATE]
        out = np.flatnonzero(~keep)
        trace.add_rows(_TraceRows(cols.ids, cols.origins, out, reason[out], cols.scores[out], cols.relevance[out]))
        cand = np.flatnonzero(keep)
        if cand.size > opts.max_memories:
            ids, sc = cols.ids, cols.scores
            ranked = np.array(sorted(cand.tolist(), key=lambda i: (-sc[i], ids[i])), dtype=np.intp)
            over = ranked[opts.max_memories :]
            trace.add_rows(_TraceRows(cols.ids, cols.origins, over,
                                      np.full(over.size, _REASON_CODE[TraceReason.OVER_MAX_MEMORIES], np.uint8),
                                      cols.scores[over], cols.relevance[over]))
            cand = ranked[: opts.max_memories]
    t_scored = time.perf_counter()

    # ---- the directive's share, then the trimming already planned (one prefix-sum search)
    directive = retrieved.directive
    fixed, directive_tokens, directive_framing = _directive_share(plan, directive, cap.name)
    messages_tokens = int(plan.message_costs.sum())
    budget = compute_budget(
        cap,
        directive_tokens=directive_tokens,
        messages_tokens=messages_tokens,
        tool_schema_tokens=plan.tools_tokens,
        formatter_overhead_tokens=fixed,
        policy=cfg.budget_policy,
    )
    kept_idx: list[int] = list(range(len(plan.history)))
    dropped: list[HistoryDrop] = []
    if budget.shortfall > 0:
        most = int(plan.group_prefix[-1]) if plan.group_prefix.size else 0
        if opts.history_policy == HistoryPolicy.STRICT:
            raise ContextOverflow(_overflow_message(budget), budget)
        if budget.shortfall > most:
            raise ContextOverflow(_overflow_message(budget) + " (nothing left to trim)", budget)
        kept_idx, dropped = _trim(plan, request.messages, budget.shortfall)
        budget = compute_budget(
            cap,
            directive_tokens=directive_tokens,
            messages_tokens=messages_tokens - sum(d.tokens for d in dropped),
            tool_schema_tokens=plan.tools_tokens,
            formatter_overhead_tokens=fixed,
            policy=cfg.budget_policy,
        )
    history = plan.history if not dropped else [plan.history[i] for i in kept_idx]
    t_budgeted = time.perf_counter()

    # ---- price the candidates, pack
    nonce = secrets.token_hex(NONCE_BYTES)
    pack_result: PackResult | None = None
    memory_total = 0
    selected = np.empty(0, dtype=np.intp)
    if cand.size:
        scores = cols.scores[cand]
        if ledger.exact:
            costs, pricing, recounted = _memory_costs_exact(family, cols, cand, nonce, deadline,
                                                            cfg.packing_headroom_ms / 2)
        else:
            costs, pricing, recounted = _memory_costs_estimated(family, cols, mems, cand, nonce)
        pinned = None
        if opts.pinned_memory_ids:
            pins = opts.pinned_memory_ids
            pinned = np.fromiter((cols.ids[i] in pins for i in cand.tolist()), dtype=bool, count=cand.size)
        cand_ids = list(map(cols.ids.__getitem__, cand.tolist()))
        pack_result = pack_arrays(cand_ids, costs, scores, budget.usable, pinned=pinned)
        memory_total = int(pack_result.tokens_used)
        trace.add_rows(_TraceRows(cols.ids, cols.origins, cand, _PACK_REASON_CODES[pack_result.reasons], scores,
                                  cols.relevance[cand], costs, recounted, pricing))
        selected = cand[pack_result.indices]
    t_packed = time.perf_counter()

    # ---- format
    text, spans, replaced = _core.format_columns(
        directive, history, cols.ids, cols.texts, cols.scores if cols.n else np.empty(0), cols.origins,
        selected.astype(np.int64, copy=False), plan.tools_json, nonce,
    )
    sections = _Sections(text, {str(_SECTIONS[k]): (begin, end) for k, begin, end in spans})
    t_end = time.perf_counter()
    timings = StageTimings(
        budget_ms=(t_budgeted - t_scored + plan.t_priced - t_start) * 1000.0,
        retrieval_ms=(t_retrieved - plan.t_priced) * 1000.0,
        scoring_ms=(t_scored - t_retrieved) * 1000.0,
        packing_ms=(t_packed - t_budgeted) * 1000.0,
        formatting_ms=(t_end - t_packed) * 1000.0,
        total_ms=(t_end - t_start) * 1000.0,
    )
    prompt = (
        budget.directive_tokens + budget.messages_tokens + budget.tool_schema_tokens
        + budget.formatter_overhead_tokens + memory_total
    )
    kept_messages = request.messages if not dropped else tuple(request.messages[i] for i in kept_idx)
    if plan.payload is None:
        framing = 0
        # The text rendering: directive, then history, then the per-assembly parts.
        stable = budget.directive_tokens + budget.messages_tokens
    else:
        framing = plan.payload.framing_tokens(kept_idx) + directive_framing
        # A payload: tools, directive and history come before the memory message.
        stable = plan.payload.stable_prefix_tokens(kept_idx) + directive_tokens + directive_framing
    return AssembledContext(
        text=text,
        sections=sections,
        nonce=nonce,
        model=cap.name,
        scope=request.scope,
        budget=budget,
        pack=pack_result,
        trace_table=trace,
        branches=retrieved.branches,
        wall=retrieved.wall,
        degraded=bool(reasons),
        degradation_reasons=tuple(reasons),
        constrained=budget.constrained,
        history_dropped=tuple(dropped),
        timings=timings,
        replaced_chars=replaced,
        scoring=scoring_record,
        prompt_tokens=TokenCount(prompt, cap.tokenizer_family, cap.estimate_kind),
        directive=directive,
        messages=tuple(kept_messages),
        tools=request.tools,
        rendering=opts.rendering,
        framing_tokens=framing,
        stable_prefix_tokens=stable,
    )
