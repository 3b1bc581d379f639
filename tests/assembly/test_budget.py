"""The budget ledger: every term paid from the window, usable clamped at 0, constrained < 256."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ctxcore
from ctxcore import Budget, BudgetPolicy, ModelCapability, TokenCount, TokenKind, compute_budget


def cap(
    window: int, max_out: int, safety: float = 0.0, family: str = "cl100k_base", kind: TokenKind = TokenKind.ESTIMATE
) -> ModelCapability:
    return ModelCapability("test-model", "test", window, max_out, family, kind, safety)


# (window, max_output, safety fraction, directive, messages, tools, overhead,
#  expected reserve, expected safety buffer, expected usable, expected constrained)
CASES = [
    # small window: 15% is 300, below the 500 floor
    pytest.param(2000, 2000, 0.0, 0, 0, 0, 0, 500, 0, 1500, False, id="reserve-hits-500"),
    # 15% of 3333 is 499.95 -> ceil 500: exactly the floor
    pytest.param(3333, 3333, 0.0, 0, 0, 0, 0, 500, 0, 2833, False, id="ceil-to-the-floor"),
    # 15% of 4000 = 600: inside the bounds
    pytest.param(4000, 4000, 0.0, 0, 0, 0, 0, 600, 0, 3400, False, id="reserve-is-15-percent"),
    # huge window: 15% would be 150k, capped at 4096
    pytest.param(1_000_000, 65_536, 0.0, 0, 0, 0, 0, 4096, 0, 995_904, False, id="reserve-hits-4096"),
    # max output below the reserve: the model cannot use more
    pytest.param(128_000, 1024, 0.0, 0, 0, 0, 0, 1024, 0, 126_976, False, id="max-output-below-reserve"),
    pytest.param(2000, 300, 0.0, 0, 0, 0, 0, 300, 0, 1700, False, id="max-output-below-the-floor"),
    # safety buffer rounds up
    pytest.param(10_000, 4096, 0.02, 0, 0, 0, 0, 1500, 200, 8300, False, id="safety-buffer"),
    pytest.param(8192, 8192, 0.01, 0, 0, 0, 0, 1229, 82, 6881, False, id="safety-buffer-ceil"),
    # every term subtracted
    pytest.param(10_000, 4096, 0.02, 1000, 2000, 500, 300, 1500, 200, 4500, False, id="all-terms"),
    # over-committed: clamped at 0, constrained
    pytest.param(8192, 8192, 0.01, 3000, 5000, 0, 0, 1229, 82, 0, True, id="clamped-to-zero"),
    # the 256 boundary: 256 is healthy, 255 is constrained
    pytest.param(4000, 4000, 0.0, 3144, 0, 0, 0, 600, 0, 256, False, id="exactly-256"),
    pytest.param(4000, 4000, 0.0, 3145, 0, 0, 0, 600, 0, 255, True, id="255-constrained"),
    pytest.param(4000, 4000, 0.0, 0, 3400, 0, 0, 600, 0, 0, True, id="exactly-zero"),
]


@pytest.mark.parametrize(
    "window,max_out,safety,directive,messages,tools,overhead,reserve,buffer,usable,constrained", CASES
)
def test_budget_table(
    window: int,
    max_out: int,
    safety: float,
    directive: int,
    messages: int,
    tools: int,
    overhead: int,
    reserve: int,
    buffer: int,
    usable: int,
    constrained: bool,
) -> None:
    b = compute_budget(
        cap(window, max_out, safety),
        directive_tokens=directive,
        messages_tokens=messages,
        tool_schema_tokens=tools,
        formatter_overhead_tokens=overhead,
    )
    assert (b.response_reserve, b.safety_buffer, b.usable, b.constrained) == (reserve, buffer, usable, constrained)
    assert (b.directive_tokens, b.messages_tokens, b.tool_schema_tokens, b.formatter_overhead_tokens) == (
        directive,
        messages,
        tools,
        overhead,
    )
    # The ledger balances: every token of the window is accounted for.
    spent = b.response_reserve + b.safety_buffer + directive + messages + tools + overhead
    assert b.usable == max(0, window - spent)
    assert b.shortfall == max(0, spent - window)


def test_budget_from_the_catalog_by_name_and_alias() -> None:
    b = compute_budget("gpt-4o", directive_tokens=1500, messages_tokens=6000)
    assert b.model == "gpt-4o" and b.context_window == 128_000 and b.tokenizer_family == "o200k_base"
    assert b.response_reserve == 4096
    assert b.safety_buffer == math.ceil(128_000 * b.safety_fraction)
    assert b.usable == 128_000 - 4096 - b.safety_buffer - 7500
    assert compute_budget("gpt-4o-2024-08-06").record() == compute_budget("GPT-4o").record()


def test_budget_record_has_every_term() -> None:
    rec = compute_budget("claude-sonnet-4", tool_schema_tokens=900).record()
    for key in (
        "context_window",
        "response_reserve",
        "safety_buffer",
        "directive_tokens",
        "messages_tokens",
        "tool_schema_tokens",
        "formatter_overhead_tokens",
        "usable",
        "constrained",
        "tokenizer_family",
        "estimate_kind",
    ):
        assert key in rec
    assert rec["tool_schema_tokens"] == 900 and rec["estimate_kind"] == "estimate"


def test_budget_is_immutable() -> None:
    b = compute_budget("gpt-4")
    with pytest.raises(AttributeError):
        b.usable = 10  # type: ignore[misc]
    assert isinstance(b, Budget)


def test_policy_is_configurable() -> None:
    policy = BudgetPolicy(response_fraction=0.25, response_min=100, response_max=10_000, constrained_below=1000)
    b = compute_budget(cap(8000, 8000), policy=policy, messages_tokens=5100)
    assert b.response_reserve == 2000 and b.usable == 900 and b.constrained
    assert (
        compute_budget(cap(8000, 8000), policy=BudgetPolicy(response_fraction=0, response_min=0)).response_reserve == 0
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"response_fraction": -0.1}, "response_fraction"),
        ({"response_fraction": 1.5}, "response_fraction"),
        ({"response_fraction": float("nan")}, "response_fraction"),
        ({"response_min": -1}, "response_min"),
        ({"response_max": 2.5}, "response_max"),
        ({"constrained_below": -5}, "constrained_below"),
        ({"response_min": 5000, "response_max": 4000}, "must not exceed"),
    ],
)
def test_policy_that_makes_no_sense_is_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ctxcore.ConfigError, match=match):
        BudgetPolicy(**kwargs)  # type: ignore[arg-type]


def test_tagged_counts_must_match_the_models_tokenizer() -> None:
    model = cap(10_000, 4096, family="cl100k_base", kind=TokenKind.ESTIMATE)
    ok = TokenCount(700, "cl100k_base", TokenKind.ESTIMATE)
    assert compute_budget(model, directive_tokens=ok).directive_tokens == 700
    with pytest.raises(ctxcore.TokenizerMismatch, match="messages_tokens is a o200k_base"):
        compute_budget(model, messages_tokens=TokenCount(5, "o200k_base", TokenKind.ESTIMATE))
    with pytest.raises(ctxcore.TokenizerMismatch, match="exact"):
        compute_budget(model, tool_schema_tokens=TokenCount(5, "cl100k_base", TokenKind.EXACT))


def test_estimated_terms_flow_into_the_budget() -> None:
    directive = "You are a careful assistant. Answer from the memories below when they apply."
    est = ctxcore.estimate_tokens(directive, "claude")
    b = compute_budget("claude-sonnet-4", directive_tokens=est)
    assert b.directive_tokens == est.value > 0


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"directive_tokens": -1}, ValueError, "directive_tokens must be >= 0"),
        ({"messages_tokens": 1.5}, TypeError, "messages_tokens must be an int"),
        ({"tool_schema_tokens": True}, TypeError, "tool_schema_tokens"),
        ({"formatter_overhead_tokens": "12"}, TypeError, "formatter_overhead_tokens"),
    ],
)
def test_bad_terms_are_rejected(kwargs: dict[str, object], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        compute_budget("gpt-4", **kwargs)  # type: ignore[arg-type]


def test_unknown_model_names_close_matches() -> None:
    with pytest.raises(ctxcore.UnknownModel, match="did you mean 'gpt-4o'") as info:
        compute_budget("gpt4o")
    assert "gpt-4o" in info.value.suggestions
    with pytest.raises(TypeError):
        compute_budget(12)  # type: ignore[arg-type]


def test_a_users_catalog_is_used(tmp_path: object) -> None:
    text = """
[tokenizer_policy.cl100k_base]
exact = 0.1
[models."house-model"]
context_window = 20000
max_output_tokens = 2000
tokenizer_family = "cl100k_base"
estimate_kind = "exact"
"""
    import pathlib

    p = pathlib.Path(str(tmp_path)) / "c.toml"
    p.write_text(text, encoding="utf-8")
    catalog = ctxcore.load_catalog(p)
    b = compute_budget("house-model", catalog=catalog)
    assert (b.response_reserve, b.safety_buffer, b.usable) == (2000, 2000, 16000)
    with pytest.raises(ctxcore.UnknownModel):
        compute_budget("gpt-4o", catalog=catalog)


# ---- a caller's token budget: never more room for a tighter cap ---------------------------------


def test_one_token_less_of_token_budget_never_leaves_more_room() -> None:
    # Just under window - reserve (123,904 for gpt-4o) the cap's own buffer (620) is
    # smaller than the window's (640): the window's figure stands.
    window = compute_budget("gpt-4o")
    at = compute_budget("gpt-4o", token_budget=123_904)
    under = compute_budget("gpt-4o", token_budget=123_903)
    assert at.usable == under.usable == window.usable == 123_264
    assert (under.safety_buffer, under.capped, at.capped) == (640, False, False)
    # The cap binds once it leaves less, each side less its own buffer: 123,884 - 620 is
    # the window's 123,264, one token fewer is below it.
    assert not compute_budget("gpt-4o", token_budget=123_884).capped
    below = compute_budget("gpt-4o", token_budget=123_883)
    assert below.capped and (below.safety_buffer, below.usable) == (620, 123_263)


MODELS = sorted(ctxcore.default_catalog())
TERMS = st.integers(0, 3000)
# Caps drawn near the window's room (window - reserve), where the cap starts to bind, as
# well as anywhere.
NEAR_ROOM = st.integers(-200, 20_000)


def _room(model: ModelCapability, policy: BudgetPolicy) -> int:
    return model.context_window - policy.response_reserve(model.context_window, model.max_output_tokens)


@given(
    model=st.sampled_from(MODELS),
    below_room=st.lists(NEAR_ROOM, min_size=1, max_size=4),
    anywhere=st.lists(st.integers(1, 2_200_000), max_size=3),
    terms=st.tuples(TERMS, TERMS, TERMS, TERMS),
)
def test_usable_never_grows_as_the_token_budget_shrinks(
    model: str, below_room: list[int], anywhere: list[int], terms: tuple[int, int, int, int]
) -> None:
    directive, messages, tools, overhead = terms
    kwargs = dict(
        directive_tokens=directive,
        messages_tokens=messages,
        tool_schema_tokens=tools,
        formatter_overhead_tokens=overhead,
    )
    window = compute_budget(model, **kwargs)
    fixed = directive + messages + tools + overhead
    room = _room(ctxcore.default_catalog()[model], BudgetPolicy())
    caps = {max(1, room - k) for k in below_room} | set(anywhere)
    previous = -1
    for cap in sorted(caps | {c + 1 for c in caps}):
        b = compute_budget(model, token_budget=cap, **kwargs)
        assert previous <= b.usable <= window.usable
        previous = b.usable
        # Both sides hold: the payload leaves the window's reserve and buffer free, and
        # never exceeds the cap less its own buffer.
        assert fixed + b.usable + b.response_reserve + window.safety_buffer <= b.context_window or b.usable == 0
        assert fixed + b.usable + math.ceil(cap * b.safety_fraction) <= cap or b.usable == 0
        # The ledger balances on the side that binds, with the buffer of that side.
        side = cap if b.capped else b.context_window - b.response_reserve
        assert b.safety_buffer == math.ceil((cap if b.capped else b.context_window) * b.safety_fraction)
        assert b.usable - b.shortfall == side - b.safety_buffer - fixed
        assert min(b.usable, b.shortfall) == 0
        if cap >= room:
            # A cap that does not bind changes nothing.
            assert not b.capped
            assert (b.usable, b.safety_buffer, b.shortfall) == (window.usable, window.safety_buffer, window.shortfall)


@given(
    window=st.integers(1, 300_000),
    share=st.floats(0, 1),
    safety=st.sampled_from([0.0, 0.005, 0.02, 0.05, 0.1, 0.5, 0.999]),
    policy=st.builds(BudgetPolicy, response_fraction=st.floats(0, 1), response_min=st.integers(0, 4096)),
    below_room=NEAR_ROOM,
    anywhere=st.integers(1, 400_000),
)
def test_usable_is_monotone_in_the_token_budget_for_any_capability(
    window: int, share: float, safety: float, policy: BudgetPolicy, below_room: int, anywhere: int
) -> None:
    model = ModelCapability("m", "", window, max(1, int(window * share)), "cl100k_base", TokenKind.ESTIMATE, safety)
    uncapped = compute_budget(model, policy=policy).usable
    for cap in (max(1, _room(model, policy) - below_room), anywhere):
        got = [compute_budget(model, policy=policy, token_budget=t).usable for t in (cap, cap + 1, cap + 97)]
        assert got[0] <= got[1] <= got[2] <= uncapped
