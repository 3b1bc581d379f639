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

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .budget import Budget, BudgetPolicy, compute_budget
from .catalog import Catalog, default_catalog
from .errors import ConfigError, ContextOverflow
from .formatting import format_context, formatter_overhead
from .memory import MemoryRecord, Scope, Sources
from .packing import PackResult, pack_arrays
from .payloads import default_directive_role, price_rendering, render_anthropic, render_openai
from .request import AssemblyRequest, HistoryPolicy, Message, Rendering, Role
from .result import (
    Branch,
    BranchRecord,
    BranchStatus,
    HistoryDrop,
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
    compute_wall,
    retrieve,
)
from .tokens import TokenKind
from .scoring import DEFAULT_MIN_SIMILARITY, DEFAULT_RELEVANCE_FLOOR, ScoreWeights, ScoringConfig, score_candidates

__all__ = [
    "DEFAULT_PACKING_HEADROOM_MS",
    "RECENCY_HALF_LIFE_DAYS",
    "AssembledContext",
    "AssemblyConfig",
    "assemble",
]

#: Time kept after retrieval, under a caller deadline, for scoring, packing and formatting
#: (p99 ~3.5 ms for 1,000 candidates on a 2-core machine; bench/test_bench_assembly.py).
DEFAULT_PACKING_HEADROOM_MS = 5.0
#: Half-life of the recency component used by weighted scores: a memory a week old
#: counts half as recent as a new one.
RECENCY_HALF_LIFE_DAYS = 7.0

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


@dataclass(frozen=True, slots=True)
class TraceTable:
    """The trace as parallel columns, one row per memory candidate.

    Assembling builds these lists in bulk; `entries` turns them into `TraceEntry` objects
    only when someone reads the trace.
    """

    memory_id: list[str] = field(default_factory=list)
    reason: list[TraceReason] = field(default_factory=list)
    origin: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    relevance: list[float] = field(default_factory=list)
    recounted: list[bool] = field(default_factory=list)

    def add(self, memory_id: str, reason: TraceReason, origin: str, tokens: int = 0, score: float = 0.0,
            relevance: float = 0.0, recounted: bool = False) -> None:
        """Append one row."""
        self.memory_id.append(memory_id)
        self.reason.append(reason)
        self.origin.append(origin)
        self.tokens.append(tokens)
        self.score.append(score)
        self.relevance.append(relevance)
        self.recounted.append(recounted)

    def __len__(self) -> int:
        return len(self.memory_id)

    def entries(self) -> tuple[TraceEntry, ...]:
        """The rows as `TraceEntry` objects, in order."""
        return tuple(
            TraceEntry(*row)
            for row in zip(self.memory_id, self.reason, self.origin, self.tokens, self.score, self.relevance,
                           self.recounted)
        )


@dataclass(frozen=True, slots=True)
class AssembledContext:
    """The assembled context and the record of how it was made.

    Attributes:
        text: the context to send to the model.
        sections: each non-empty section's text, in order (each a substring of `text`).
        nonce: the per-assembly nonce on every memory element.
        model: the canonical model name.
        scope: the organization and agent the context is for.
        budget: the budget ledger (every term, `usable`, `constrained`), in the
            estimator's counts for the model's tokenizer family.
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
                }
                for mid, reason, origin, tokens, score, rel, rc in zip(
                    t.memory_id, t.reason, t.origin, t.tokens, t.score, t.relevance, t.recounted
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


# The packer's reasons (ctxcore.Reason, by its uint8 code) as trace reasons.
_PACK_REASONS = (
    TraceReason.SELECTED,
    TraceReason.PINNED,
    TraceReason.BUDGET_EXHAUSTED,
    TraceReason.BUDGET_EXHAUSTED,  # pinned, but no room left after the earlier pinned
    TraceReason.NON_POSITIVE_SCORE,
)


def _recency(mems: Sequence[MemoryRecord], now: float) -> np.ndarray | None:
    if not mems or any(m.created_at is None for m in mems):
        return None
    age_days = np.array([max(0.0, now - float(m.created_at or 0.0)) / 86400.0 for m in mems])
    return np.power(0.5, age_days / RECENCY_HALF_LIFE_DAYS)


def _overflow_message(budget: Budget) -> str:
    return (
        f"the request does not fit {budget.model}'s {budget.context_window}-token window: "
        f"directive {budget.directive_tokens} + messages {budget.messages_tokens} + tools "
        f"{budget.tool_schema_tokens} + formatting {budget.formatter_overhead_tokens} + response reserve "
        f"{budget.response_reserve} + safety buffer {budget.safety_buffer} exceed it by {budget.shortfall} tokens"
    )


async def assemble(
    request: AssemblyRequest,
    *,
    sources: Sources,
    catalog: Catalog | None = None,
    config: AssemblyConfig | None = None,
    deadline: float | None = None,
) -> AssembledContext:
    """Assemble the context for one request.

    Args:
        request: who, for which model, about what, with which recent messages and tools.
        sources: the directive, hot-memory and cold-memory branches (e.g.
            ``Sources.from_store(store)``); a branch left None is skipped.
        catalog: the capability catalog; the shipped one by default.
        config: service settings; `AssemblyConfig.from_env()` by default.
        deadline: the caller's deadline as an absolute `time.monotonic()` time: the
            retrieval wall is cut to the time left minus ``config.packing_headroom_ms``.

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
    if cap.estimate_kind is not TokenKind.ESTIMATE:
        # Every term is priced by the estimator (fast, conservative, subadditive over the
        # formatter's pieces), so the ledger is in estimate counts, with the family's
        # safety fraction for estimates: counts of different kinds are never mixed.
        cap = replace(
            cap,
            estimate_kind=TokenKind.ESTIMATE,
            safety_fraction=cat.policies[cap.tokenizer_family].safety_fraction(TokenKind.ESTIMATE),
        )
    opts = request.options
    scope = request.scope
    floor = opts.relevance_floor if opts.relevance_floor is not None else cfg.relevance_floor
    min_sim = opts.min_similarity if opts.min_similarity is not None else cfg.min_similarity
    scoring_config = ScoringConfig(relevance_floor=floor, min_similarity=min_sim)
    weights = ScoreWeights(**dict(opts.weights)) if opts.weights else None

    reasons: list[str] = []
    run_directive = opts.context_enabled
    run_memory = opts.context_enabled and not opts.skip_memory
    if not opts.context_enabled:
        reasons.append("context_disabled")
    elif opts.skip_memory:
        reasons.append("memory_skipped")
    elif sources.hot is None and sources.cold is None:
        reasons.append("no_memory_source")

    # ---- retrieval, under the shared wall (which started with the request)
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
        wall_start=t_start,
    )
    t_retrieved = time.perf_counter()
    for b in retrieved.branches:
        if b.status in (BranchStatus.TIMEOUT, BranchStatus.ERROR):
            reasons.append(f"{b.branch.value}_{b.status.value}")

    # ---- scoring, the gate, de-duplication, the per-request cap
    trace = TraceTable()
    for m in retrieved.out_of_scope:
        trace.add(m.id, TraceReason.OUT_OF_SCOPE, m.origin)
    mems = retrieved.memories
    scoring_record: dict[str, Any] = {}
    cand: list[int] = []  # indices into mems that go on to pricing and packing
    scores: list[float] = []
    relevance: list[float] = []
    if mems:
        sims = [m.similarity for m in mems]
        imp = [m.importance for m in mems]
        scored = score_candidates(
            [0.0 if v is None else v for v in sims],
            [m.confidence for m in mems],
            recency=_recency(mems, time.time()) if weights is not None else None,
            importance=None if weights is None or None in imp else imp,
            full_text=[v is None for v in sims],
            weights=weights,
            config=scoring_config,
        )
        scoring_record = scored.record()
        scores = scored.scores.tolist()
        relevance = scored.relevance.tolist()
        kept = scored.kept.tolist()
        best: dict[str, int] = {}
        for i, m in enumerate(mems):
            j = best.get(m.id)
            if j is None or scores[i] > scores[j]:
                best[m.id] = i
        for i, m in enumerate(mems):
            if best[m.id] != i:
                trace.add(m.id, TraceReason.DUPLICATE, m.origin, 0, scores[i], relevance[i])
            elif not kept[i]:
                trace.add(m.id, TraceReason.BELOW_RELEVANCE_FLOOR, m.origin, 0, scores[i], relevance[i])
            else:
                cand.append(i)
        if len(cand) > opts.max_memories:
            cand.sort(key=lambda i: (-scores[i], mems[i].id))
            for i in cand[opts.max_memories :]:
                trace.add(mems[i].id, TraceReason.OVER_MAX_MEMORIES, mems[i].origin, 0, scores[i], relevance[i])
            del cand[opts.max_memories :]
    t_scored = time.perf_counter()

    # ---- price everything, then the budget; trim history if the policy allows
    directive = retrieved.directive
    messages = list(request.messages)
    tools = [dict(t) for t in request.tools] or None
    # The score attribute is rounded so that the text carries no float noise.
    memory_items = [
        {"id": mems[i].id, "text": mems[i].text, "score": round(scores[i], 4), "source": mems[i].origin}
        for i in cand
    ]
    dropped: list[HistoryDrop] = []
    while True:
        overhead = formatter_overhead(
            memory_items,
            family=cap.tokenizer_family,
            directive=directive,
            history=[_message_item(m) for m in messages],
            tools=tools,
        )
        overhead, priced = price_rendering(
            overhead, opts.rendering, model=cap.name, family=cap.tokenizer_family,
            exact=cap.estimate_kind is TokenKind.EXACT, directive=directive, messages=messages, tools=request.tools,
        )
        budget = compute_budget(
            cap,
            directive_tokens=overhead.directive_tokens,
            messages_tokens=overhead.history_tokens,
            tool_schema_tokens=overhead.tools_tokens,
            formatter_overhead_tokens=overhead.fixed_tokens,
            policy=cfg.budget_policy,
        )
        if budget.shortfall == 0:
            break
        if opts.history_policy == HistoryPolicy.STRICT:
            raise ContextOverflow(_overflow_message(budget), budget)
        groups = _turn_groups(messages)
        last_user = max((i for i, m in enumerate(messages) if m.role == Role.USER), default=-1)
        droppable = [g for g in groups if not g[0] <= last_user < g[1]]
        if not droppable:
            raise ContextOverflow(_overflow_message(budget) + " (nothing left to trim)", budget)
        begin, end = droppable[0]
        gone = messages[begin:end]
        gone_tokens = formatter_overhead(
            (), family=cap.tokenizer_family, history=[_message_item(m) for m in gone]
        ).history_tokens
        offset = sum(d.count for d in dropped)
        dropped.append(HistoryDrop(begin + offset, end - begin, gone_tokens, tuple(m.role.value for m in gone)))
        # Groups go oldest first, so every earlier drop lay before this one in the
        # original list and `offset` maps the index back to it.
        del messages[begin:end]
    t_budgeted = time.perf_counter()

    # ---- pack
    pack_result: PackResult | None = None
    if cand:
        family, kind = cap.tokenizer_family, cap.estimate_kind.value
        costs = np.fromiter(overhead.memory_tokens, dtype=np.int64, count=len(cand))
        recounted = [False] * len(cand)
        for k, i in enumerate(cand):
            m = mems[i]
            if m.token_count is not None:
                if m.token_family == family and m.token_kind == kind:
                    # A matching stored count of the raw text plus the wrapper can only
                    # raise the cost: the larger is kept, never a mix of families or kinds.
                    costs[k] = max(int(costs[k]), m.token_count + overhead.wrapper_tokens)
                else:
                    recounted[k] = True
        pinned = None
        if opts.pinned_memory_ids:
            pinned = np.array([mems[i].id in opts.pinned_memory_ids for i in cand], dtype=bool)
        pack_result = pack_arrays(
            [mems[i].id for i in cand], costs, np.array([scores[i] for i in cand]), budget.usable, pinned=pinned
        )
        codes = pack_result.reasons.tolist()
        trace.memory_id.extend(mems[i].id for i in cand)
        trace.reason.extend(_PACK_REASONS[c] for c in codes)
        trace.origin.extend(mems[i].origin for i in cand)
        trace.tokens.extend(costs.tolist())
        trace.score.extend(scores[i] for i in cand)
        trace.relevance.extend(relevance[i] for i in cand)
        trace.recounted.extend(recounted)
    t_packed = time.perf_counter()

    # ---- format
    selected = pack_result.indices.tolist() if pack_result is not None else []
    formatted = format_context(
        directive=directive,
        history=[_message_item(m) for m in messages],
        memories=[memory_items[i] for i in selected],
        tools=tools,
        nonce=overhead.nonce,
    )
    t_end = time.perf_counter()
    timings = StageTimings(
        budget_ms=(t_budgeted - t_scored) * 1000.0,
        retrieval_ms=(t_retrieved - t_start) * 1000.0,
        scoring_ms=(t_scored - t_retrieved) * 1000.0,
        packing_ms=(t_packed - t_budgeted) * 1000.0,
        formatting_ms=(t_end - t_packed) * 1000.0,
        total_ms=(t_end - t_start) * 1000.0,
    )
    return AssembledContext(
        text=formatted.text,
        sections=formatted.sections,
        nonce=formatted.nonce,
        model=cap.name,
        scope=scope,
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
        replaced_chars=formatted.replaced_chars,
        scoring=scoring_record,
        directive=directive,
        messages=tuple(messages),
        tools=request.tools,
        rendering=opts.rendering,
        framing_tokens=priced.framing_tokens,
        stable_prefix_tokens=priced.stable_prefix_tokens,
    )
