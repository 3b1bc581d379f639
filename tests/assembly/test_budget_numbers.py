"""Numbers of any type at the budget's inputs: an integer of any type (numpy's, such as
the sum of `count_tokens_batch`) is a count and a real of any type a fraction, kept as a
plain int or float; bools, NaN, negatives and non-numbers are refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import ctxcore
from ctxcore import AssemblyOptions, AssemblyRequest, BudgetPolicy, ModelCapability, TokenKind, compute_budget
from ctxcore.budget import check_token_budget

ORG, AGENT = "org-1", "agent-1"
TERMS = ("directive_tokens", "messages_tokens", "tool_schema_tokens", "formatter_overhead_tokens")
INTEGERS = [np.int64, np.int32, np.int16, np.uint16, np.uint64]


def test_the_libraries_own_counts_go_into_the_budget() -> None:
    n = ctxcore.count_tokens_batch(["hello", "world"], "o200k_base").sum()
    assert isinstance(n, np.integer)
    b = compute_budget("gpt-4o", messages_tokens=n)
    assert b == compute_budget("gpt-4o", messages_tokens=int(n))
    assert type(b.messages_tokens) is int
    json.dumps(b.record())  # plain values all through


@pytest.mark.parametrize("kind", INTEGERS)
@pytest.mark.parametrize("term", TERMS)
def test_every_term_takes_a_numpy_integer(term: str, kind: type[np.integer[Any]]) -> None:
    b = compute_budget("gpt-4", **{term: kind(700)})
    assert b == compute_budget("gpt-4", **{term: 700})
    assert type(getattr(b, term)) is int


@pytest.mark.parametrize("kind", INTEGERS)
def test_the_token_budget_takes_a_numpy_integer(kind: type[np.integer[Any]]) -> None:
    b = compute_budget("gpt-4o", directive_tokens=np.int64(100), token_budget=kind(2000))
    assert b == compute_budget("gpt-4o", directive_tokens=100, token_budget=2000)
    assert type(b.token_budget) is int and b.capped and b.usable == 1890
    assert check_token_budget(kind(2000)) == 2000


@pytest.mark.parametrize(
    "value, error, match",
    [
        (True, TypeError, "must be an int or a TokenCount, got bool"),
        (np.bool_(False), TypeError, "must be an int or a TokenCount, got bool"),
        (np.float64(3.0), TypeError, "must be an int or a TokenCount, got float64"),
        (np.float32("nan"), TypeError, "must be an int or a TokenCount, got float32"),
        (float("nan"), TypeError, "must be an int or a TokenCount, got float"),
        (np.array([1, 2]), TypeError, "must be an int or a TokenCount, got ndarray"),
        ("12", TypeError, "must be an int or a TokenCount, got str"),
        (np.int64(-1), ValueError, "must be >= 0, got -1"),
    ],
)
@pytest.mark.parametrize("term", TERMS)
def test_a_term_that_is_not_a_count_is_refused_naming_it(
    term: str, value: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=f"{term} {match}"):
        compute_budget("gpt-4", **{term: value})


@pytest.mark.parametrize(
    "value, error",
    [
        (np.bool_(True), TypeError),
        (np.float64(2000.0), TypeError),
        (np.float32("nan"), TypeError),
        (np.int64(0), ValueError),
        (np.int32(-7), ValueError),
    ],
)
def test_a_token_budget_that_is_not_a_count_is_refused_naming_it(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="token_budget must be an int >= 1 or None"):
        compute_budget("gpt-4o", token_budget=value)  # type: ignore[arg-type]
    with pytest.raises(error, match="token_budget must be an int >= 1 or None"):
        AssemblyRequest(ORG, AGENT, "gpt-4o", "hi", token_budget=value)  # type: ignore[arg-type]


def test_a_policy_takes_numpy_numbers_as_plain_ones() -> None:
    made = BudgetPolicy(
        response_fraction=np.float32(0.15),
        response_min=np.int64(10),
        response_max=np.uint16(4096),
        constrained_below=np.int32(256),
    )
    assert made == BudgetPolicy(response_min=10)
    assert [
        type(v) for v in (made.response_fraction, made.response_min, made.response_max, made.constrained_below)
    ] == [
        float,
        int,
        int,
        int,
    ]
    # float32's 0.15 is the decimal it prints as: 15% of 4000 is 600, not 601.
    model = ModelCapability("m", "", 4000, 4000, "cl100k_base", TokenKind.ESTIMATE, 0.0)
    assert compute_budget(model, policy=BudgetPolicy(response_fraction=np.float32(0.15))).response_reserve == 600
    assert BudgetPolicy(response_fraction=np.float16(0.25)).response_fraction == 0.25
    assert BudgetPolicy(response_fraction=np.int64(1)).response_fraction == 1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"response_fraction": np.float32("nan")}, "response_fraction must be a number in \\[0, 1\\]"),
        ({"response_fraction": np.float64(1.5)}, "response_fraction must be a number in \\[0, 1\\]"),
        ({"response_fraction": np.bool_(True)}, "response_fraction must be a number in \\[0, 1\\]"),
        ({"response_fraction": True}, "response_fraction must be a number in \\[0, 1\\]"),
        ({"response_fraction": "0.15"}, "response_fraction must be a number in \\[0, 1\\]"),
        ({"response_min": np.int64(-1)}, "response_min must be an integer >= 0"),
        ({"response_min": np.bool_(True)}, "response_min must be an integer >= 0"),
        ({"response_max": np.float64(4096.0)}, "response_max must be an integer >= 0"),
        ({"constrained_below": True}, "constrained_below must be an integer >= 0"),
        ({"response_min": np.int64(5000), "response_max": np.int64(4000)}, "must not exceed"),
    ],
)
def test_a_policy_refuses_what_is_not_a_number_naming_it(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ctxcore.ConfigError, match=match):
        BudgetPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_request_takes_numpy_counts_and_fractions_as_plain_ones() -> None:
    options = AssemblyOptions(
        pool=np.int64(40),
        max_memories=np.uint8(5),
        relevance_floor=np.float32(0.2),
        min_similarity=np.float64(0.7),
        weights={"similarity": np.float32(0.85), "confidence": np.int64(1)},
    )
    assert options == AssemblyOptions(
        pool=40, max_memories=5, relevance_floor=0.2, min_similarity=0.7, weights={"similarity": 0.85, "confidence": 1}
    )
    assert (type(options.pool), type(options.max_memories), type(options.relevance_floor)) == (int, int, float)
    assert type(options.min_similarity) is float and type(options.weights["similarity"]) is float  # type: ignore[index]
    r = AssemblyRequest(
        ORG,
        AGENT,
        "gpt-4o",
        "hi",
        options=options,
        token_budget=np.int64(3000),
        section_budgets={"history": np.int32(500), "memories": np.uint64(800)},
    )
    assert r.token_budget == 3000 and type(r.token_budget) is int
    assert dict(r.section_budgets) == {"history": 500, "memories": 800}
    assert all(type(v) is int for v in r.section_budgets.values())


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"pool": np.bool_(True)}, ValueError, "pool must be an int"),
        ({"pool": np.float64(40.0)}, ValueError, "pool must be an int"),
        ({"max_memories": np.int64(-1)}, ValueError, "max_memories must be None or an int"),
        ({"max_memories": True}, ValueError, "max_memories must be None or an int"),
        ({"relevance_floor": np.float32("nan")}, ValueError, "relevance_floor must be in \\[0, 1\\]"),
        ({"relevance_floor": True}, ValueError, "relevance_floor must be in \\[0, 1\\]"),
        ({"min_similarity": np.float64(1.5)}, ValueError, "min_similarity must be in \\[0, 1\\]"),
        ({"weights": {"similarity": np.bool_(True)}}, TypeError, "weights\\['similarity'\\] must be a number"),
        ({"weights": {"similarity": np.float32("inf")}}, ValueError, "weights\\['similarity'\\] must be a finite"),
        ({"weights": {"similarity": np.int64(-1)}}, ValueError, "weights\\['similarity'\\] must be a finite"),
    ],
)
def test_options_refuse_what_is_not_a_number_naming_it(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        AssemblyOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value, error, match",
    [
        (np.bool_(True), TypeError, "must be an int >= 0, got bool"),
        (np.float64(10.0), TypeError, "must be an int >= 0, got float64"),
        (np.int64(-3), ValueError, "must be an int >= 0, got -3"),
    ],
)
def test_a_section_budget_that_is_not_a_count_is_refused_naming_it(
    value: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=f"section_budgets\\['history'\\] {match}"):
        AssemblyRequest(ORG, AGENT, "gpt-4o", "hi", section_budgets={"history": value})  # type: ignore[dict-item]
