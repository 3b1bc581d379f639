"""A caller's token budget: a hard cap on the whole assembled payload, independent of the
model's window, honoured in exact tokens in every rendering; history makes room for it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from payload_support import check_anthropic, check_openai

import ctxcore
from ctxcore import AssemblyOptions, AssemblyRequest, MemoryRecord, Query, Sources, compute_budget
from ctxcore.payloads import count_anthropic, count_openai
from ctxcore.request import HistoryPolicy

ORG, AGENT = "org-1", "agent-1"
ROOMY = ctxcore.AssemblyConfig(
    client_timeout_ms=5000,
    server_deadline_ms=5000,
    directive_timeout_ms=5000,
    hot_timeout_ms=5000,
    cold_timeout_ms=5000,
)
TOPICS = [
    "refunds take five business days",
    "the customer prefers email over phone calls",
    "the order shipped from the Lyon warehouse",
    "a replacement kettle was promised on 3 March",
    "the invoice address changed to 12 Rue de la Paix",
    "the warranty covers the heating element",
]


def memories(n: int) -> list[MemoryRecord]:
    return [
        MemoryRecord(
            f"mem-{i:04d}",
            ORG,
            AGENT,
            f"Note {i}: {TOPICS[i % len(TOPICS)]} (ticket {1000 + 7 * i}).",
            similarity=0.95 - 0.0005 * i,
        )
        for i in range(n)
    ]


def conversation(turns: int) -> list[dict[str, Any]]:
    """User/assistant turns with one tool call and its result in the middle."""
    out: list[dict[str, Any]] = []
    for t in range(turns):
        out.append({"role": "user", "content": f"Question {t}: where is my refund for order {4000 + t}? " * 3})
        if t == turns // 2:
            out.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "call-1", "name": "lookup_order", "arguments": json.dumps({"order": 4000 + t})}
                    ],
                }
            )
            out.append({"role": "tool", "tool_call_id": "call-1", "content": "status: refunded on Monday " * 4})
        out.append({"role": "assistant", "content": f"Answer {t}: the refund is on its way, allow five days. " * 3})
    out.append({"role": "user", "content": "And the replacement kettle?"})
    return out


TOOLS = [
    {
        "name": "lookup_order",
        "description": "Look an order up by its number.",
        "parameters": {"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]},
    }
]


def assemble(
    model: str,
    token_budget: int | None,
    *,
    rendering: str = "text",
    mems: Sequence[MemoryRecord] = (),
    messages: Sequence[Any] = (),
    policy: HistoryPolicy = HistoryPolicy.STRICT,
) -> ctxcore.AssembledContext:
    async def hot(scope: Any, query: Any, limit: int) -> list[MemoryRecord]:
        return list(mems)[:limit]

    async def directive(scope: Any) -> str:
        return "You are the support agent of Acme. Answer briefly."

    tools = TOOLS if rendering != "text" else []
    req = AssemblyRequest(
        ORG,
        AGENT,
        model,
        Query("refund kettle"),
        messages=messages,
        tools=tools,
        options=AssemblyOptions(rendering=rendering, history_policy=policy),
        token_budget=token_budget,
    )
    return asyncio.run(ctxcore.assemble(req, sources=Sources(directive=directive, hot=hot), config=ROOMY))


def exact_payload_tokens(ctx: ctxcore.AssembledContext, rendering: str) -> int:
    """The payload's tokens counted exactly (the provider's rule for the chat framing)."""
    family = ctx.budget.tokenizer_family
    count = lambda t: ctxcore.count_tokens(t, family).value  # noqa: E731
    if rendering == "text":
        return count(ctx.text)
    if rendering == "openai":
        payload = ctx.to_openai()
        check_openai(payload)
        return count_openai(payload, count, model=ctx.model).total
    payload = ctx.to_anthropic()
    check_anthropic(payload)
    return count_anthropic(payload, count, model=ctx.model).total


# ---- the budget ---------------------------------------------------------------------------------


def test_a_token_budget_below_the_window_caps_the_payload_and_its_safety_buffer() -> None:
    window = compute_budget("gpt-4o", directive_tokens=100)
    capped = compute_budget("gpt-4o", directive_tokens=100, token_budget=2000)
    assert capped.token_budget == 2000 and window.token_budget is None
    # The safety buffer is the policy's share of what is spent, the terms are paid from the cap.
    assert capped.safety_buffer == -(-2000 * capped.safety_fraction // 1)
    assert capped.usable == 2000 - capped.safety_buffer - 100
    assert capped.response_reserve == window.response_reserve
    assert capped.record()["token_budget"] == 2000


def test_a_token_budget_above_the_window_changes_nothing() -> None:
    window = compute_budget("gpt-4", messages_tokens=500)
    big = compute_budget("gpt-4", messages_tokens=500, token_budget=10**9)
    assert (big.usable, big.safety_buffer, big.shortfall) == (window.usable, window.safety_buffer, window.shortfall)


def test_a_token_budget_smaller_than_the_fixed_parts_is_a_shortfall() -> None:
    b = compute_budget("gpt-4o", directive_tokens=300, messages_tokens=400, token_budget=500)
    assert b.usable == 0 and b.shortfall == 300 + 400 + b.safety_buffer - 500


@pytest.mark.parametrize(
    "bad,error", [(0, ValueError), (-5, ValueError), (True, TypeError), (1.5, TypeError), ("100", TypeError)]
)
def test_a_bad_token_budget_is_refused_naming_it(bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="token_budget"):
        compute_budget("gpt-4o", token_budget=bad)
    with pytest.raises(error, match="token_budget"):
        AssemblyRequest(ORG, AGENT, "gpt-4o", "hi", token_budget=bad)


# ---- the payload -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["gpt-4", "gpt-4o"])
@pytest.mark.parametrize("rendering", ["text", "openai", "anthropic"])
@pytest.mark.parametrize("token_budget", [500, 777, 2048, 5000])
def test_the_payloads_exact_count_never_exceeds_the_token_budget(model: str, rendering: str, token_budget: int) -> None:
    if rendering == "anthropic":
        token_budget += 1000  # its tool-use system prompt alone is about 550 tokens
    ctx = assemble(model, token_budget, rendering=rendering, mems=memories(400), messages=conversation(2))
    got = exact_payload_tokens(ctx, rendering)
    assert ctx.prompt_tokens is not None and got <= ctx.prompt_tokens.value <= token_budget
    assert ctx.pack is not None and ctx.pack.ids
    # Plentiful memories fill it: at most the safety buffer and about one memory short.
    assert got >= token_budget - ctx.budget.safety_buffer - 80


def test_a_family_without_a_tokenizer_is_held_to_its_conservative_estimate() -> None:
    ctx = assemble("claude-sonnet-4-5", 1500, rendering="anthropic", mems=memories(400), messages=conversation(2))
    assert ctx.budget.estimate_kind is ctxcore.TokenKind.ESTIMATE
    assert ctx.prompt_tokens is not None and ctx.prompt_tokens.value <= 1500
    check_anthropic(ctx.to_anthropic())


def test_without_a_token_budget_the_window_decides() -> None:
    ctx = assemble("gpt-4", None, mems=memories(400))
    assert ctx.budget.token_budget is None
    assert ctx.prompt_tokens is not None and ctx.prompt_tokens.value > 5000  # gpt-4: an 8k window


# ---- history makes room ------------------------------------------------------------------------


@pytest.mark.parametrize("rendering", ["text", "openai", "anthropic"])
def test_history_is_trimmed_oldest_first_for_the_token_budget_even_when_strict(rendering: str) -> None:
    msgs = conversation(12)
    ctx = assemble("gpt-4o", 900, rendering=rendering, mems=memories(50), messages=msgs)
    assert ctx.history_dropped, "the conversation alone is over the token budget"
    assert exact_payload_tokens(ctx, rendering) <= 900
    firsts = [d.first_index for d in ctx.history_dropped]
    assert firsts == sorted(firsts) and firsts[0] == 0  # oldest first
    # The latest user turn stays, and a tool call never goes without its result.
    kept = [m for m in ctx.messages]
    assert kept[-1].content == "And the replacement kettle?"
    calls = {c.id for m in kept for c in m.tool_calls}
    results = {m.tool_call_id for m in kept if m.tool_call_id}
    assert calls == results
    dropped_roles = [r for d in ctx.history_dropped for r in d.roles]
    assert dropped_roles.count("assistant") >= 1


def test_the_window_still_refuses_a_strict_request_it_cannot_hold() -> None:
    huge = [
        {"role": "user", "content": "word " * 9000},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and?"},
    ]
    with pytest.raises(ctxcore.ContextOverflow):
        assemble("gpt-4", 1000, messages=huge)


def test_a_token_budget_the_latest_turn_cannot_fit_is_refused_with_the_numbers() -> None:
    msgs = [{"role": "user", "content": "please look at this " * 200}]
    with pytest.raises(
        ctxcore.ContextOverflow,
        match=r"token budget of 300: .* \(nothing left to trim: no message before the latest user turn can go\)$",
    ):
        assemble("gpt-4o", 300, messages=msgs)


# ---- the service and the CLI -------------------------------------------------------------------


def test_the_token_budget_crosses_the_wire() -> None:
    from ctxcore.service.convert import request_from_proto
    from ctxcore.service.errors import ServiceError
    from ctxcore.service.wire import budget_from_proto, budget_to_proto, request_to_proto

    req = AssemblyRequest(ORG, AGENT, "gpt-4o", "refund", token_budget=1234)
    msg = request_to_proto(req)
    assert msg.HasField("token_budget") and request_from_proto(msg).token_budget == 1234
    assert not request_to_proto(AssemblyRequest(ORG, AGENT, "gpt-4o", "refund")).HasField("token_budget")
    assert request_from_proto(request_to_proto(AssemblyRequest(ORG, AGENT, "gpt-4o", "x"))).token_budget is None
    msg.token_budget = 0
    with pytest.raises(ServiceError, match="token_budget"):
        request_from_proto(msg)
    b = compute_budget("gpt-4o", token_budget=999)
    assert budget_from_proto(budget_to_proto(b)) == b
    assert budget_from_proto(budget_to_proto(compute_budget("gpt-4o"))).token_budget is None


def test_the_cli_takes_a_token_budget() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ctxcore", "demo", "--token-budget", "700", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["budget"]["token_budget"] == 700
    assert ctxcore.count_tokens(doc["text"], "o200k_base").value <= doc["prompt_tokens"] <= 700
    bad = subprocess.run(
        [sys.executable, "-m", "ctxcore", "demo", "--token-budget", "0"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "token-budget" in bad.stderr


# ---- per-section caps --------------------------------------------------------------------------


def _with_sections(
    section_budgets: dict[str, int],
    *,
    token_budget: int | None = None,
    policy: HistoryPolicy = HistoryPolicy.STRICT,
    n: int = 200,
) -> ctxcore.AssembledContext:
    async def hot(scope: Any, query: Any, limit: int) -> list[MemoryRecord]:
        return memories(n)[:limit]

    req = AssemblyRequest(
        ORG,
        AGENT,
        "gpt-4o",
        Query("refund"),
        messages=conversation(12),
        options=AssemblyOptions(history_policy=policy),
        token_budget=token_budget,
        section_budgets=section_budgets,
    )
    return asyncio.run(ctxcore.assemble(req, sources=Sources(hot=hot), config=ROOMY))


@pytest.mark.parametrize("policy", [HistoryPolicy.STRICT, HistoryPolicy.TRIM_OLDEST])
def test_a_history_cap_trims_the_oldest_turns_and_keeps_the_latest_user_turn(policy: HistoryPolicy) -> None:
    full = _with_sections({})
    assert not full.history_dropped
    cap = full.budget.messages_tokens // 3
    ctx = _with_sections({"history": cap}, policy=policy)
    assert ctx.budget.messages_tokens <= cap < full.budget.messages_tokens
    assert ctx.history_dropped and {d.reason for d in ctx.history_dropped} == {"history_budget"}
    assert ctx.history_dropped[0].first_index == 0  # oldest first
    assert ctx.messages[-1] == full.messages[-1]
    # A tool call and its result go together or stay together.
    kept_roles = [m.role.value for m in ctx.messages]
    if "tool" in kept_roles:
        assert kept_roles[kept_roles.index("tool") - 1] == "assistant"
    assert ctx.record()["history_dropped"][0]["reason"] == "history_budget"
    # Under a cap of 0 only the latest user turn is left, and the turn does not fail.
    bare = _with_sections({"history": 0})
    assert [m.content for m in bare.messages] == ["And the replacement kettle?"]


def test_a_memory_cap_bounds_the_memory_elements() -> None:
    full = _with_sections({})
    used = full.pack.tokens_used  # type: ignore[union-attr]
    ctx = _with_sections({"memories": used // 4})
    assert ctx.pack is not None and 0 < ctx.pack.tokens_used <= used // 4
    assert len(ctx.selected_ids) < len(full.selected_ids)
    assert _with_sections({"memories": 0}).selected_ids == ()


def test_drops_for_the_budget_and_for_the_cap_are_told_apart() -> None:
    full = _with_sections({})
    # A token budget that needs a few turns gone, and a tighter history cap than that.
    budget = full.prompt_tokens.value - full.pack.tokens_used - full.budget.messages_tokens // 4  # type: ignore[union-attr]
    ctx = _with_sections(
        {"history": full.budget.messages_tokens // 5}, token_budget=budget, policy=HistoryPolicy.TRIM_OLDEST
    )
    reasons = [d.reason for d in ctx.history_dropped]
    assert reasons[0] == "budget" and reasons[-1] == "history_budget"
    assert reasons == sorted(reasons)  # the budget's drops are the oldest
    exact = ctxcore.count_tokens(ctx.text, "o200k_base").value
    assert exact <= budget


@pytest.mark.parametrize(
    "bad,error,match",
    [
        ({"tools": 5}, ValueError, "unknown section 'tools'"),
        ({"history": -1}, ValueError, r"section_budgets\['history'\] must be an int >= 0"),
        ({"memories": 2.5}, TypeError, r"section_budgets\['memories'\] must be an int"),
        ([("history", 1)], TypeError, "section_budgets must be a mapping"),
    ],
)
def test_bad_section_budgets_are_typed_errors(bad: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), section_budgets=bad)
