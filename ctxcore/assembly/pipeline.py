"""`assemble`: request -> budget -> retrieval -> gate -> price -> pack -> format -> result."""

from __future__ import annotations

import asyncio
import functools
import math
import numbers
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .. import _core
from ..budget.plan import Plan, make_plan, settle
from ..catalog import Catalog, default_catalog
from ..degradation import Degradation
from ..formatting import SECTIONS, Sections, new_nonce
from ..memory import Sources
from ..packing import PackResult, pack_arrays
from ..pricing.candidates import attribute_mask, created_column, price_candidates
from ..redundancy import TextKeys, groups_from_keys, has_duplicates
from ..request import AssemblyRequest
from ..rerank import Reranker, RerankRecord, rerank
from ..result import StageTimings, TraceReason
from ..retrieval import (
    Retrieved,
    compute_wall,
    retrieve,
)
from ..scoring import ScoreWeights, ScoringConfig, ValueModel
from ..scoring.gate import Columns, gate
from ..tokens import TokenCount
from ..trace import PACK_REASON_CODES, REASON_CODE, TraceRows, TraceTable
from .config import AssemblyConfig
from .context import AssembledContext

_PINNED = "pinned"
_PINNED_CODE = int(REASON_CODE[TraceReason.PINNED])

_T = TypeVar("_T")
#: The normalized texts of retrieved memories, kept across requests (near-duplicates).
_TEXT_KEYS = TextKeys()


async def _in(executor: Executor | None, fn: Callable[..., _T], *args: Any) -> _T:
    if executor is None:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))


def _check_arguments(
    request: object,
    sources: object,
    catalog: object,
    config: object,
    deadline: object,
    executor: object,
    reranker: object,
) -> None:
    """Raise TypeError or ValueError naming the first argument of `assemble` of the wrong
    kind: each is checked here, before any work, rather than failing deep in a stage."""
    expected: tuple[tuple[str, object, type, str], ...] = (
        ("request", request, AssemblyRequest, "a ctxcore.AssemblyRequest"),
        ("sources", sources, Sources, "ctxcore.Sources (e.g. Sources.from_store(store))"),
    )
    for name, value, kind, what in expected:
        if not isinstance(value, kind):
            raise TypeError(f"assemble: {name} must be {what}, got {type(value).__name__}")
    optional: tuple[tuple[str, object, type, str], ...] = (
        ("catalog", catalog, Catalog, "a ctxcore.Catalog or None"),
        ("config", config, AssemblyConfig, "a ctxcore.AssemblyConfig or None"),
        ("executor", executor, Executor, "a concurrent.futures.Executor or None"),
    )
    for name, value, kind, what in optional:
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"assemble: {name} must be {what}, got {type(value).__name__}")
    if reranker is not None and not callable(reranker):
        raise TypeError(
            f"assemble: reranker must be a callable (query, texts) -> scores or None, got {type(reranker).__name__}"
        )
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, numbers.Real):
            raise TypeError(
                f"assemble: deadline must be an absolute time.monotonic() time (seconds) or None, "
                f"got {type(deadline).__name__}"
            )
        try:
            finite = math.isfinite(float(deadline))
        except OverflowError:  # an int beyond any float
            finite = False
        if not finite:
            raise ValueError(f"assemble: deadline must be a finite time.monotonic() time, got {deadline!r:.40}")


async def assemble(
    request: AssemblyRequest,
    *,
    sources: Sources,
    catalog: Catalog | None = None,
    config: AssemblyConfig | None = None,
    deadline: float | None = None,
    executor: Executor | None = None,
    reranker: Reranker | None = None,
) -> AssembledContext:
    """Assemble the context for one request.

    For a model whose tokenizer family has an exact tokenizer installed
    (`ctxcore.exact_families()`), every term of the ledger is in that family's exact
    tokens: directive, messages, tools, the formatter's fixed text and each memory element
    (from the store's stored count, no tokenizing, see ``ctxcore.pricing.units``; a memory
    without one is counted only if the packing can select it, and the count is kept for
    later requests). Other families are priced with the estimator. Messages and tools
    are priced, and the
    overflow and trimming decisions made, before any store is queried.

    The deadline is checked between stages: before pricing (a history that cannot be
    counted exactly in half the time left is priced with the estimator, the whole ledger
    then in estimate counts), at retrieval (the wall), and before each batch of memories
    without stored counts is counted (else the batch is estimated, as the trace records).

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
        reranker: an optional rerank stage (`ctxcore.rerank`): it reorders the
            ``config.rerank_pool`` best candidates, in a worker thread, for at most
            ``config.rerank_timeout_ms``; late or failing, it is skipped and the result's
            ``rerank`` record and degradation reasons say so.

    Returns:
        The `AssembledContext`. Slow or failing sources degrade it; they never raise.

    Raises:
        TypeError: an argument of the wrong kind (a request that is no `AssemblyRequest`,
            sources that are no `Sources`, a deadline that is no number, ...), named.
        ValueError: a deadline that is not finite.
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
    _check_arguments(request, sources, catalog, config, deadline, executor, reranker)
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
    plan = await _in(executor, make_plan, request, cat, cap, cfg.budget_policy, deadline)

    degradation = Degradation.of_request(
        context_enabled=opts.context_enabled,
        skip_memory=opts.skip_memory,
        has_memory_source=sources.hot is not None or sources.cold is not None,
    )
    run_directive = opts.context_enabled
    run_memory = opts.context_enabled and not opts.skip_memory

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
        limit=opts.pool,
        min_similarity=min_sim,
        run_directive=run_directive,
        run_memory=run_memory,
        wall_start=plan.t_priced,
    )
    t_retrieved = time.perf_counter()
    degradation.branches((b.branch, b.status) for b in retrieved.branches)
    scored: _Scored | None = None
    record: RerankRecord | None = None
    if reranker is not None:
        scored = await _in(executor, _score, request, retrieved, plan, scoring_config, weights)
        record = await _rerank(reranker, request, scored, cfg, deadline)
        degradation.rerank(record.status)
    return await _in(
        executor,
        _finish,
        request,
        plan,
        retrieved,
        cfg,
        scoring_config,
        weights,
        degradation,
        deadline,
        t_start,
        t_retrieved,
        scored,
        record,
    )


@dataclass(slots=True)
class _Scored:
    """The candidates once scored and gated: columns, the candidate rows, the trace so far."""

    trace: TraceTable
    cols: Columns
    cand: npt.NDArray[np.intp]
    scoring_record: dict[str, Any]
    signals: list[str]
    model: ValueModel | None
    t_scored: float


def _value_model(request: AssemblyRequest) -> ValueModel | None:
    """The request's value model, with the request's relevance floor, when it sets one, as
    the model's absolute floor; None for the interim formula."""
    opts = request.options
    if not isinstance(opts.value_model, ValueModel):  # "interim"
        return None
    if opts.relevance_floor is None:
        return opts.value_model
    return replace(opts.value_model, absolute_floor=float(opts.relevance_floor))


def _score(
    request: AssemblyRequest,
    retrieved: Retrieved,
    plan: Plan,
    scoring_config: ScoringConfig,
    weights: ScoreWeights | None,
) -> _Scored:
    """Scoring, the gate, de-duplication and the per-request cap, over columns."""
    opts = request.options
    trace = TraceTable()
    for m in retrieved.out_of_scope:
        trace.add(m.id, TraceReason.OUT_OF_SCOPE, m.origin)
    cols = Columns.of(retrieved.memories, plan.cap.tokenizer_family)
    model = _value_model(request)
    cand, scoring_record, signals = gate(
        cols, weights, scoring_config, opts.max_memories, trace, model, opts.pinned_memory_ids, _TEXT_KEYS.keys
    )
    return _Scored(trace, cols, cand, scoring_record, signals, model, time.perf_counter())


async def _rerank(
    reranker: Reranker, request: AssemblyRequest, scored: _Scored, cfg: AssemblyConfig, deadline: float | None
) -> RerankRecord:
    """The rerank stage over the best candidates by value: it reorders them, and they take
    the pool's values again in its order (the value scale stays the value model's)."""
    cols, cand = scored.cols, scored.cand
    values = cols.scores[cand]
    top = np.argsort(-values, kind="stable")[: cfg.rerank_pool]
    rows = cand[top]
    order, record = await rerank(
        reranker,
        request.query.text,
        [cols.texts[i] for i in rows.tolist()],
        timeout_ms=cfg.rerank_timeout_ms,
        deadline=deadline,
        headroom_ms=cfg.packing_headroom_ms,
    )
    if order is not None:
        cols.scores[rows[order]] = values[top]  # values[top] is sorted best first
    return record


def _packer(
    cols: Columns,
    cand: npt.NDArray[np.intp],
    usable: int,
    pins: frozenset[str] | Sequence[str] | None,
    rank_tolerance: float,
) -> tuple[Callable[[npt.NDArray[np.int64]], PackResult], npt.NDArray[np.bool_] | None]:
    """The knapsack over the candidates' scores (pinned ones first), as a function of
    their priced costs, keeping the rank-order packing within `rank_tolerance` of it
    (`ValueModel`); and which candidates are pinned."""
    rows = cand.tolist()
    pinned = None
    if pins:
        pinned = np.fromiter((cols.ids[i] in pins for i in rows), dtype=bool, count=len(rows))
    ids = list(map(cols.ids.__getitem__, rows))
    scores = cols.scores[cand]
    groups: list[npt.NDArray[np.int64] | None] = [None]

    def pack(costs: npt.NDArray[np.int64]) -> PackResult:
        # Near-duplicates (one normalized text) take room once: the selection is checked,
        # and only a selection holding two of them is packed again with the candidates'
        # groups (at most one member each), which then hold for the request's later rounds.
        result = pack_arrays(ids, costs, scores, usable, pinned=pinned, rank_tolerance=rank_tolerance, groups=groups[0])
        if groups[0] is None and result.indices.size > 1:
            if has_duplicates(_TEXT_KEYS.keys([cols.texts[rows[k]] for k in result.indices.tolist()])):
                groups[0] = groups_from_keys(_TEXT_KEYS.keys(list(map(cols.texts.__getitem__, rows))))
                result = pack_arrays(
                    ids, costs, scores, usable, pinned=pinned, rank_tolerance=rank_tolerance, groups=groups[0]
                )
        return result

    return pack, pinned


def _finish(
    request: AssemblyRequest,
    plan: Plan,
    retrieved: Retrieved,
    cfg: AssemblyConfig,
    scoring_config: ScoringConfig,
    weights: ScoreWeights | None,
    degradation: Degradation,
    deadline: float | None,
    t_start: float,
    t_retrieved: float,
    scored: _Scored | None = None,
    rerank_record: RerankRecord | None = None,
) -> AssembledContext:
    """The stages after retrieval, synchronous: scoring and the gate (unless done before a
    rerank), the directive's share and history trimming, pricing, packing, formatting.
    Runs on the executor when given."""
    opts = request.options
    cap = plan.cap

    # ---- scoring, the gate, de-duplication, the per-request cap, over columns
    if scored is None:
        scored = _score(request, retrieved, plan, scoring_config, weights)
    trace, cols, cand, model = scored.trace, scored.cols, scored.cand, scored.model
    scoring_record, signals, t_scored = scored.scoring_record, scored.signals, scored.t_scored

    # ---- the directive's share, then the trimming already planned (one prefix-sum search)
    directive = retrieved.directive
    budget, kept_idx, dropped, directive_tokens, directive_framing = settle(plan, directive, request, cfg.budget_policy)
    history = plan.history if not dropped else [plan.history[i] for i in kept_idx]
    t_budgeted = time.perf_counter()

    # ---- price the candidates, pack
    compact = opts.memory_format == "compact"
    nonce = new_nonce(opts.memory_format)
    pack_result: PackResult | None = None
    memory_total = 0
    selected = np.empty(0, dtype=np.intp)
    if cand.size:
        room = budget.usable
        if "memories" in request.section_budgets:
            room = min(room, request.section_budgets["memories"])
        pack, pinned = _packer(
            cols, cand, room, opts.pinned_memory_ids, model.rank_tolerance if model is not None else 0.0
        )
        costs, pricing, recounted, pack_result = price_candidates(
            cols,
            retrieved.memories,
            cand,
            plan.ledger,
            nonce,
            deadline,
            cfg.packing_headroom_ms / 2,
            pack,
            pinned,
            opts.memory_attributes,
        )
        memory_total = int(pack_result.tokens_used)
        pack_reasons = PACK_REASON_CODES[pack_result.reasons]
        rows = cand.tolist()
        signal = list(map(signals.__getitem__, rows))
        if pinned is not None:
            for k in np.flatnonzero(pack_reasons == _PINNED_CODE).tolist():
                signal[k] = _PINNED
        trace.add_rows(
            TraceRows(
                cols.ids,
                cols.origins,
                cand,
                pack_reasons,
                cols.scores[cand],
                cols.relevance[cand],
                costs,
                recounted,
                pricing,
                signal=signal,
            )
        )
        selected = cand[pack_result.indices]
    t_packed = time.perf_counter()

    # ---- format
    mask = attribute_mask(opts.memory_attributes) if compact else 3
    text, spans, replaced, _ = _core.format_columns(
        directive,
        history,
        cols.ids,
        cols.texts,
        cols.scores if cols.n else np.empty(0),
        cols.origins,
        selected.astype(np.int64, copy=False),
        plan.tools_json,
        nonce,
        False,
        False,
        plan.ledger.format_code,
        mask,
        compact,
        created_column(cols, selected) if mask & 4 else None,
    )
    handles = {f"m{k + 1}": cols.ids[i] for k, i in enumerate(selected.tolist())} if compact else {}
    sections = Sections(text, {str(SECTIONS[k]): (begin, end) for k, begin, end in spans})
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
        budget.directive_tokens
        + budget.messages_tokens
        + budget.tool_schema_tokens
        + budget.formatter_overhead_tokens
        + memory_total
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
        degraded=degradation.degraded,
        degradation_reasons=degradation.reasons,
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
        memory_format=opts.memory_format,
        handles=handles,
        rerank=rerank_record,
    )
