"""Budget before work: what is settled before retrieval (messages and tools priced, the
overflow and trimming decisions), and the budget once the directive is known.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..catalog import Catalog, ModelCapability
from ..errors import ContextOverflow
from ..formatting import PIECE_MESSAGE, PIECE_TOOLS, tools_json_text
from ..payloads import RenderingCosts, rendering_costs
from ..pricing.ledger import (
    EXACT_COUNT_BYTES_PER_MS,
    PRICING_NONCE,
    Ledger,
    can_count_exactly,
    ledger_capability,
    split_pieces,
    time_left_ms,
    uncached_bytes,
)
from ..request import AssemblyRequest, HistoryPolicy, Rendering, Role
from ..result import HistoryDrop
from .compute import Budget, BudgetPolicy, compute_budget
from .history import message_item, overflow_message, trim, turn_groups


@dataclass(slots=True)
class Plan:
    """What is settled before retrieval: the ledger, the messages and tools priced, and
    how much history can go."""

    cap: ModelCapability
    ledger: Ledger
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


def _untrimmable(shortfall: int, most: int) -> str:
    """What trimming the history could not do, for an overflow message: the ledger above
    it counts the whole history, this says how much of it could go."""
    if most == 0:
        return " (nothing left to trim: no message before the latest user turn can go)"
    return (
        f" (nothing left to trim: dropping every message before the latest user turn frees {most} "
        f"of them, {shortfall - most} too many remain)"
    )


def make_plan(
    request: AssemblyRequest,
    cat: Catalog,
    cap: ModelCapability,
    policy: BudgetPolicy,
    deadline: float | None,
) -> Plan:
    """Budget before work: price messages and tools and decide what history must go (up to
    the directive's share) before any store is queried; a request that cannot fit is
    refused here."""
    history = [message_item(m) for m in request.messages]
    tools = [dict(t) for t in request.tools] or None
    tools_json = tools_json_text(tools)
    family = cap.tokenizer_family
    exact = can_count_exactly(cat, cap, deadline)
    text, _, _, pieces = _core.format_context(None, history, (), tools_json, PRICING_NONCE, False, True)
    kinds, texts = split_pieces(text, pieces)
    if exact and deadline is not None:
        # Exact counting of what is not cached must fit in half the time left; a very long
        # history on a short deadline is priced with the estimator instead (the ledger then
        # is in estimate counts, never a mix).
        uncached = uncached_bytes(texts, family)
        exact = uncached <= 0.5 * time_left_ms(deadline) * EXACT_COUNT_BYTES_PER_MS
    memory_format = request.options.memory_format
    ledger = Ledger(family, exact, memory_format)
    lcap = ledger_capability(cat, cap, exact)
    rendering = request.options.rendering
    payload: RenderingCosts | None = None
    if rendering is Rendering.TEXT:
        costs = ledger.costs(text, pieces, texts)
        message_costs = np.array([c for k, c in zip(kinds, costs) if k == PIECE_MESSAGE], dtype=np.int64)
        tools_tokens = sum(c for k, c in zip(kinds, costs) if k == PIECE_TOOLS)
    else:
        # A payload: each message costs its content and its framing by the provider's rule
        # (additive over messages, so trimming takes a group's framing off with it).
        payload = rendering_costs(
            rendering,
            model=cap.name,
            family=family,
            exact=exact,
            directive=None,
            messages=request.messages,
            tools=request.tools,
            memory_format=memory_format,
        )
        message_costs = np.array(payload.message_tokens, dtype=np.int64)
        tools_tokens = payload.tools_tokens
    groups = turn_groups(request.messages)
    last_user = max((i for i, m in enumerate(request.messages) if m.role == Role.USER), default=-1)
    droppable = [g for g in groups if not g[0] <= last_user < g[1]]
    if payload is None:
        fixed = ledger.frame_and_directive(None, bool(history), tools_json is not None)[0]
    else:
        fixed = payload.fixed_tokens
    of = functools.partial(
        compute_budget,
        lcap,
        messages_tokens=int(message_costs.sum()),
        tool_schema_tokens=tools_tokens,
        formatter_overhead_tokens=fixed,
        policy=policy,
    )
    budget = of(token_budget=request.token_budget)
    strict = _strict(request, of)
    if strict and "history" not in request.section_budgets:
        droppable = []  # nothing is trimmed: an overflow refuses the request
    prefix = np.cumsum(np.array([message_costs[b:e].sum() for b, e in droppable], dtype=np.int64))
    most = int(prefix[-1]) if prefix.size else 0
    if budget.shortfall > 0 and strict:
        raise ContextOverflow(overflow_message(budget), budget)
    if budget.shortfall > most:
        raise ContextOverflow(overflow_message(budget) + _untrimmable(budget.shortfall, most), budget)
    return Plan(
        lcap,
        ledger,
        history,
        message_costs,
        droppable,
        prefix,
        tools,
        tools_json,
        tools_tokens,
        time.perf_counter(),
        payload,
    )


def _strict(request: AssemblyRequest, window_only: Callable[[], Budget]) -> bool:
    """Whether an overflow refuses the request instead of trimming history: under the
    strict policy, unless only the caller's token budget (not the window) is exceeded --
    a turn never fails for its token budget, history makes room for it."""
    if request.options.history_policy != HistoryPolicy.STRICT:
        return False
    return request.token_budget is None or window_only().shortfall > 0


def _directive_share(plan: Plan, directive: str | None, model: str) -> tuple[int, int, int]:
    """(fixed, directive, directive framing) tokens once the directive is known."""
    if plan.payload is None:
        fixed, dcost = plan.ledger.frame_and_directive(directive, bool(plan.history), plan.tools_json is not None)
        return fixed, dcost, 0
    # The directive alone: no messages or tools to price again.
    d = rendering_costs(
        plan.payload.rendering,
        model=model,
        family=plan.ledger.family,
        exact=plan.ledger.exact,
        directive=directive,
        messages=(),
        tools=(),
        memory_format=plan.ledger.memory_format,
    )
    return plan.payload.fixed_tokens + d.directive_framing, d.directive_tokens, d.directive_framing


def settle(
    plan: Plan, directive: str | None, request: AssemblyRequest, policy: BudgetPolicy
) -> tuple[Budget, list[int], list[HistoryDrop], int, int]:
    """The budget once the directive is known: its share, then the trimming already
    planned (one prefix-sum search). Returns the budget, the kept message indices, the
    drops, and the directive's tokens and framing. Raises `ContextOverflow` as `make_plan`."""
    fixed, directive_tokens, directive_framing = _directive_share(plan, directive, plan.cap.name)
    messages_tokens = int(plan.message_costs.sum())
    of = functools.partial(
        compute_budget,
        plan.cap,
        directive_tokens=directive_tokens,
        messages_tokens=messages_tokens,
        tool_schema_tokens=plan.tools_tokens,
        formatter_overhead_tokens=fixed,
        policy=policy,
    )
    budget = of(token_budget=request.token_budget)
    kept_idx: list[int] = list(range(len(plan.history)))
    dropped: list[HistoryDrop] = []
    most = int(plan.group_prefix[-1]) if plan.group_prefix.size else 0
    if budget.shortfall > 0:
        if _strict(request, of):
            raise ContextOverflow(overflow_message(budget), budget)
        if budget.shortfall > most:
            raise ContextOverflow(overflow_message(budget) + _untrimmable(budget.shortfall, most), budget)
    cap = request.section_budgets.get("history")
    # The history cap trims what it can: the latest user turn stays whatever it costs.
    over = min(messages_tokens - cap, most) if cap is not None else 0
    if budget.shortfall > 0 or over > 0:
        kept_idx, dropped = trim(
            plan.groups, plan.group_prefix, plan.message_costs, request.messages, max(budget.shortfall, over)
        )
        if over > budget.shortfall:
            # The oldest groups freed the budget's shortfall; the ones after them, the cap's.
            for_budget = (
                int(np.searchsorted(plan.group_prefix, budget.shortfall, side="left")) + 1
                if budget.shortfall > 0
                else 0
            )
            dropped = dropped[:for_budget] + [replace(d, reason="history_budget") for d in dropped[for_budget:]]
        budget = compute_budget(
            plan.cap,
            directive_tokens=directive_tokens,
            messages_tokens=messages_tokens - sum(d.tokens for d in dropped),
            tool_schema_tokens=plan.tools_tokens,
            formatter_overhead_tokens=fixed,
            policy=policy,
            token_budget=request.token_budget,
        )
    return budget, kept_idx, dropped, directive_tokens, directive_framing
