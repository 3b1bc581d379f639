"""ctxcore.pack / ctxcore.pack_arrays through the public API: properties against exact
oracles (brute force for small sets, an exact DP on exact token counts for mid-size sets),
record semantics, determinism, pinned candidates, bad input and thread safety."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import pickle
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore import Candidate, InvalidCandidate, PackPath, Reason
from ctxcore.benchmarking.instances import pack_instance

SOURCE_TREE = Path(__file__).resolve().parents[2]


# ---- oracles ------------------------------------------------------------------------


def rank_key(c: Candidate) -> tuple[float, str]:
    return (-c.score, c.id)


def pinned_part(cands: Sequence[Candidate], budget: int) -> tuple[list[Candidate], int]:
    """The documented pinned rule: in rank order, each pinned candidate while it fits
    (and nothing at all for a non-positive budget)."""
    if budget <= 0:
        return [], budget
    taken, room = [], budget
    for c in sorted((c for c in cands if c.pinned), key=rank_key):
        if c.tokens <= room:
            taken.append(c)
            room -= c.tokens
    return taken, room


def brute_force(items: Sequence[Candidate], capacity: int) -> float:
    best = 0.0
    for r in range(len(items) + 1):
        for combo in itertools.combinations(items, r):
            if sum(c.tokens for c in combo) <= capacity:
                best = max(best, sum(c.score for c in combo))
    return best


def exact_dp(items: Sequence[Candidate], capacity: int) -> float:
    """0/1 knapsack on exact token counts (numpy, one row per item)."""
    dp = np.zeros(capacity + 1)
    for c in items:
        if c.tokens == 0:
            dp += c.score
        elif c.tokens <= capacity:
            np.maximum(dp[c.tokens :], dp[: -c.tokens] + c.score, out=dp[c.tokens :])
    return float(dp[capacity])


def optimum(cands: Sequence[Candidate], budget: int, solver=brute_force) -> float:
    """Best achievable total for the non-pinned part (pinned are fixed by rule)."""
    if budget <= 0:
        return 0.0
    _, room = pinned_part(cands, budget)
    free = [c for c in cands if not c.pinned and c.score > 0]
    return solver(free, room)


# ---- strategies ---------------------------------------------------------------------

ids = st.text(min_size=1, max_size=6)
scores = st.one_of(
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    st.floats(min_value=-2.0, max_value=50.0, allow_nan=False),
    st.sampled_from([0.0, 0.5, 1.0]),
)


@st.composite
def candidate_sets(draw, max_n=12, max_tokens=300, pinned=True):
    names = draw(st.lists(ids, max_size=max_n, unique=True))
    return [
        Candidate(
            name,
            draw(st.integers(0, max_tokens)),
            draw(scores),
            draw(st.booleans()) if pinned and draw(st.integers(0, 4)) == 0 else False,
        )
        for name in names
    ]


budgets = st.integers(-20, 1500)


def check_invariants(cands: Sequence[Candidate], budget: int, res: ctxcore.PackResult) -> None:
    by_id = {c.id: c for c in cands}
    chosen = [by_id[i] for i in res.ids]
    # never over budget; totals and record consistent with the selection
    assert res.tokens_used == sum(c.tokens for c in chosen)
    assert res.tokens_used <= max(budget, 0)
    assert math.isclose(res.total_score, math.fsum(c.score for c in chosen), rel_tol=1e-9, abs_tol=1e-9)
    assert res.total_score <= res.upper_bound
    assert res.evaluated == len(cands)
    assert [cands[i].id for i in res.indices.tolist()] == list(res.ids)
    # one decision per input candidate, in input order, consistent with the selection
    decisions = res.decisions
    assert [d.id for d in decisions] == [c.id for c in cands]
    assert {d.id for d in decisions if d.selected} == set(res.ids)
    budget_reasons = {Reason.BUDGET_EXHAUSTED, Reason.PINNED_OVER_BUDGET}
    assert res.excluded_for_budget == sum(d.reason in budget_reasons for d in decisions)
    for d in decisions:
        c = by_id[d.id]
        assert (d.reason in (Reason.PINNED, Reason.PINNED_OVER_BUDGET)) == c.pinned
        if d.reason == Reason.NON_POSITIVE_SCORE:
            assert c.score <= 0
    # truncation semantics
    if not cands:
        assert not res.truncated and res.path == PackPath.TRIVIAL
    elif budget <= 0:
        assert res.truncated and res.path == PackPath.TRIVIAL and not res.ids
    else:
        assert res.truncated == (res.excluded_for_budget > 0)
    # emit order: pinned first, each block by descending score then id
    pinned_ids = [i for i in res.ids if by_id[i].pinned]
    assert list(res.ids[: len(pinned_ids)]) == pinned_ids
    assert pinned_ids == [c.id for c in sorted((by_id[i] for i in pinned_ids), key=rank_key)]
    rest = list(res.ids[len(pinned_ids) :])
    assert rest == [c.id for c in sorted((by_id[i] for i in rest), key=rank_key)]
    # the pinned rule
    if budget > 0:
        expected_pinned, _ = pinned_part(cands, budget)
        assert pinned_ids == [c.id for c in expected_pinned]


def free_value(cands: Sequence[Candidate], res: ctxcore.PackResult) -> float:
    by_id = {c.id: c for c in cands}
    return math.fsum(by_id[i].score for i in res.ids if not by_id[i].pinned)


# ---- properties ---------------------------------------------------------------------


def test_tests_use_the_installed_package() -> None:
    installed = Path(ctxcore.__file__).resolve().parent
    assert installed != SOURCE_TREE / "ctxcore"
    assert "site-packages" in installed.parts


@given(candidate_sets(), budgets)
@settings(max_examples=400, deadline=None)
def test_small_sets_match_brute_force(cands: list[Candidate], budget: int) -> None:
    res = ctxcore.pack(cands, budget)
    check_invariants(cands, budget, res)
    best = optimum(cands, budget)
    assert free_value(cands, res) >= 0.999 * best - 1e-9
    assert res.upper_bound >= sum(c.score for c in pinned_part(cands, budget)[0]) + best - 1e-9
    if res.proven_optimal:
        assert math.isclose(free_value(cands, res), best, rel_tol=1e-9, abs_tol=1e-9)


@given(candidate_sets(), budgets)
@settings(max_examples=300, deadline=None)
def test_fallback_path_meets_the_same_properties(cands: list[Candidate], budget: int) -> None:
    res = ctxcore.pack(cands, budget, cell_ceiling=1)
    check_invariants(cands, budget, res)
    # A one-cell table only holds a single item against a budget under half a bucket,
    # which dominance can leave (two equal items, room for one).
    assert res.path in (PackPath.TRIVIAL, PackPath.GREEDY) or res.dp_cells <= 1
    assert free_value(cands, res) >= 0.999 * optimum(cands, budget) - 1e-9


@st.composite
def mid_sets(draw):
    n = draw(st.integers(20, 160))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    style = draw(st.sampled_from(["uniform", "correlated", "memory", "small"]))
    cands = []
    for i in range(n):
        if style == "small":
            t = rng.randint(1, 40)
        elif style == "memory":
            t = int(rng.lognormvariate(4.6, 0.7)) + 1
        else:
            t = rng.randint(1, 400)
        s = t / 100 + 0.1 if style == "correlated" else rng.random()
        cands.append(Candidate(f"m{i:04d}", t, round(s, 6), pinned=rng.random() < 0.03))
    budget = draw(st.integers(0, min(3000, sum(c.tokens for c in cands))))
    return cands, budget


@given(mid_sets(), st.sampled_from([1 << 22, 1]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mid_size_sets_match_exact_dp(inst: tuple[list[Candidate], int], ceiling: int) -> None:
    cands, budget = inst
    res = ctxcore.pack(cands, budget, cell_ceiling=ceiling)
    check_invariants(cands, budget, res)
    best = optimum(cands, budget, solver=exact_dp)
    assert free_value(cands, res) >= 0.999 * best - 1e-9
    if res.proven_optimal:
        assert math.isclose(free_value(cands, res), best, rel_tol=1e-9, abs_tol=1e-9)


# ---- many candidates, large items ------------------------------------------------------
# Thousands of candidates, many of them a sizeable share of the budget: where a density
# fallback alone loses value (0.979 of the optimum at 3,000 items of 1,000-9,000 tokens
# against 16,000). The exact reductions shrink these to a few dozen free items.

LARGE_FAMILIES = ("large", "large-correlated", "memory", "skewed")


def large_instance(family: str, n: int, seed: int) -> tuple[list[Candidate], int]:
    """One instance of a family: `large` 1,000-9,000 tokens with uniform scores,
    `large-correlated` the same with scores tracking size, `memory` log-normal
    memory-sized texts, `skewed` 10% large high-score items among many small ones."""
    rng = np.random.default_rng(seed)
    tokens, scores = pack_instance(family, n, rng)
    budget = int(rng.choice([8_000, 16_000, 32_000] if family == "memory" else [16_000, 32_000]))
    pinned = rng.random(n) < 0.002
    return [
        Candidate(f"L{i:05d}", int(t), float(s), bool(p)) for i, (t, s, p) in enumerate(zip(tokens, scores, pinned))
    ], budget


def check_large(family: str, n: int, seed: int, ceiling: int) -> ctxcore.PackResult:
    cands, budget = large_instance(family, n, seed)
    res = ctxcore.pack(cands, budget, cell_ceiling=ceiling)
    check_invariants(cands, budget, res)
    best = optimum(cands, budget, solver=exact_dp)
    got = free_value(cands, res)
    assert got >= 0.999 * best - 1e-9, (family, n, seed, ceiling, got / best)
    if res.proven_optimal:
        assert math.isclose(got, best, rel_tol=1e-9), (family, n, seed, ceiling)
    # Nothing left out still fits (dominated candidates included).
    room = budget - res.tokens_used
    assert all(d.selected or d.tokens > room or d.score <= 0 or d.pinned for d in res.decisions)
    return res


@given(st.sampled_from(LARGE_FAMILIES), st.integers(300, 800), st.integers(0, 2**32 - 1), st.sampled_from([1 << 20, 1]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_large_item_sets_match_exact_dp(family: str, n: int, seed: int, ceiling: int) -> None:
    check_large(family, n, seed, ceiling)


@pytest.mark.slow
@given(
    st.sampled_from(LARGE_FAMILIES), st.integers(3000, 10_000), st.integers(0, 2**32 - 1), st.sampled_from([1 << 20, 1])
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_thousands_of_candidates_match_exact_dp(family: str, n: int, seed: int, ceiling: int) -> None:
    check_large(family, n, seed, ceiling)


@pytest.mark.parametrize("budget", [16_000, 32_000])
@pytest.mark.parametrize("ceiling", [1 << 20, 1])
def test_three_thousand_large_items_are_solved_exactly(budget: int, ceiling: int) -> None:
    # The hard family: 3,000 candidates of 1,000-9,000 tokens. Dominance leaves
    # a few dozen; the result is the optimum, proven.
    rng = np.random.default_rng(budget + ceiling)
    names = [f"x{i}" for i in range(3000)]
    tokens = rng.integers(1000, 9001, 3000)
    scores = rng.random(3000)
    res = ctxcore.pack_arrays(names, tokens, scores, budget, cell_ceiling=ceiling)
    cands = [Candidate(c, int(t), float(s)) for c, t, s in zip(names, tokens, scores)]
    best = exact_dp(cands, budget)
    assert res.dominated > 2800 and res.free_items < 100
    assert res.proven_optimal
    assert math.isclose(res.total_score, best, rel_tol=1e-9)
    # A dominated candidate is recorded like any other left out for lack of room.
    reasons = {d.reason for d in res.decisions if not d.selected}
    assert reasons == {Reason.BUDGET_EXHAUSTED}
    assert res.excluded_for_budget == 3000 - len(res.ids)


def test_equal_candidates_tie_by_id_under_dominance() -> None:
    # 40 identical candidates, room for 25: the 25 first by id, in any input order.
    cands = [Candidate(f"e{i:02d}", 640, 0.5) for i in range(40)]
    for order in (cands, cands[::-1], cands[7:] + cands[:7]):
        res = ctxcore.pack(order, 16_000)
        assert res.ids == tuple(f"e{i:02d}" for i in range(25))
        assert res.dominated == 15 and res.proven_optimal


@given(candidate_sets(max_n=30), budgets, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_same_result_for_any_input_order(cands: list[Candidate], budget: int, rnd: random.Random) -> None:
    shuffled = cands[:]
    rnd.shuffle(shuffled)
    a = ctxcore.pack(cands, budget)
    b = ctxcore.pack(shuffled, budget)
    assert a.ids == b.ids
    assert a.record() == b.record()
    assert {d.id: d.reason for d in a.decisions} == {d.id: d.reason for d in b.decisions}


def test_results_are_deterministic_across_calls() -> None:
    rng = np.random.default_rng(5)
    n = 3000
    names = [f"c{i}" for i in range(n)]
    tokens = rng.integers(1, 500, n)
    scores = np.round(rng.random(n), 2)  # many ties
    first = ctxcore.pack_arrays(names, tokens, scores, 20_000)
    for _ in range(3):
        assert ctxcore.pack_arrays(names, tokens, scores, 20_000) == first


def test_emit_order_on_near_ties_and_long_runs_of_equal_scores() -> None:
    # Scores that differ only in their last bits, long runs of equal ones, and -0.0
    # beside 0.0: the emit order is still descending score, then id in UTF-8 byte order,
    # and does not depend on the input order.
    rng = np.random.default_rng(11)
    n = 600
    base = 0.4375
    levels = np.array([base, np.nextafter(base, 1.0), np.nextafter(np.nextafter(base, 1.0), 1.0), 0.25, 0.0, -0.0])
    scores = levels[rng.integers(0, levels.size, n)]
    tokens = rng.integers(1, 60, n)
    names = [f"{rng.integers(0, 10**6)}-{i}" for i in range(n)]
    res = ctxcore.pack_arrays(names, tokens, scores, 4000)
    assert res.truncated and res.tokens_used <= 4000
    chosen = [(float(scores[i]), names[i]) for i in res.indices.tolist()]
    assert chosen == sorted(chosen, key=lambda c: (-c[0], c[1].encode()))
    perm = rng.permutation(n)
    again = ctxcore.pack_arrays([names[i] for i in perm], tokens[perm], scores[perm], 4000)
    assert again.ids == res.ids and again.record() == res.record()


@pytest.mark.parametrize("container", [list, tuple])
def test_non_ascii_and_str_subclass_ids_come_back_as_given(container: type) -> None:
    class Tag(str):
        pass

    names = ["plain", "é", "日本語", Tag("tag"), "a\U0001f600", "A"]
    res = ctxcore.pack_arrays(container(names), [1] * len(names), [0.5] * len(names), 100)
    # All fit; equal scores emit in id order (UTF-8 bytes), as the very objects passed.
    assert res.ids == tuple(sorted(names, key=str.encode))
    assert all(res.ids[k] is names[i] for k, i in enumerate(res.indices.tolist()))
    assert [d.id for d in res.decisions] == names


# ---- the record, by example ---------------------------------------------------------


def test_empty_candidate_set_is_not_a_truncation() -> None:
    res = ctxcore.pack([], 100)
    assert (res.ids, res.truncated, res.path, res.excluded_for_budget) == ((), False, PackPath.TRIVIAL, 0)
    assert ctxcore.pack([], 0).truncated is False


@pytest.mark.parametrize("budget", [0, -1, -(2**63)])
def test_non_positive_budget_with_candidates_is_a_truncation(budget: int) -> None:
    res = ctxcore.pack([Candidate("a", 0, 1.0), Candidate("b", 5, 1.0)], budget)
    assert res.ids == () and res.truncated and res.path == PackPath.TRIVIAL
    assert [d.reason for d in res.decisions] == [Reason.BUDGET_EXHAUSTED] * 2


def test_everything_fits_is_trivial_and_optimal() -> None:
    res = ctxcore.pack([Candidate("a", 10, 0.2), Candidate("b", 0, 0.1), Candidate("c", 30, 0.9)], 2**63 - 1)
    assert res.ids == ("c", "a", "b")
    assert res.path == PackPath.TRIVIAL and res.proven_optimal and not res.truncated


def test_zero_token_and_all_equal_scores() -> None:
    cands = [Candidate(f"z{i}", 0, 1.0) for i in range(5)] + [Candidate(f"t{i}", 10, 1.0) for i in range(10)]
    res = ctxcore.pack(cands, 35)
    assert res.tokens_used == 30 and math.isclose(res.total_score, 8.0)
    assert sum(i.startswith("z") for i in res.ids) == 5
    assert list(res.ids) == sorted(res.ids)  # equal scores: emitted by id


def test_knapsack_beats_a_score_sort() -> None:
    # One large high-score item versus several small ones that are worth more together.
    cands = [Candidate("big", 1000, 0.9)] + [Candidate(f"s{i}", 100, 0.5) for i in range(10)]
    res = ctxcore.pack(cands, 1000)
    assert "big" not in res.ids and math.isclose(res.total_score, 5.0)


def test_pinned_first_and_overflowing_pin_recorded() -> None:
    cands = [
        Candidate("p-low", 60, 0.1, pinned=True),
        Candidate("p-high", 50, 0.2, pinned=True),
        Candidate("x", 40, 5.0),
    ]
    res = ctxcore.pack(cands, 100)
    assert res.ids == ("p-high", "x")
    assert res.decisions[0].reason == Reason.PINNED_OVER_BUDGET
    assert res.truncated


def test_non_positive_scores_are_recorded_not_dropped() -> None:
    res = ctxcore.pack([Candidate("neg", 1, -0.5), Candidate("zero", 1, 0.0), Candidate("pos", 1, 0.5)], 10)
    assert res.ids == ("pos",)
    assert [d.reason for d in res.decisions][:2] == [Reason.NON_POSITIVE_SCORE] * 2
    assert not res.truncated


def test_huge_budgets_and_token_counts() -> None:
    big = ctxcore._core.MAX_TOKENS
    cands = [Candidate(f"h{i}", big - i, 1.0 + i) for i in range(6)]
    for budget in (big, 3 * big, 2**63 - 1, 10**30):
        res = ctxcore.pack(cands, budget)
        check_invariants(cands, budget, res)
        assert res.budget == budget
    assert ctxcore.pack(cands, -(10**30)).truncated


# ---- the result object ----------------------------------------------------------------


def test_result_is_frozen_picklable_and_read_only() -> None:
    res = ctxcore.pack([Candidate("a", 10, 1.0), Candidate("b", 20, 1.5)], 25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.total_score = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        res.indices[0] = 1
    assert pickle.loads(pickle.dumps(res)) == res
    assert pickle.loads(pickle.dumps(res)).decisions == res.decisions


def test_numpy_inputs_of_several_dtypes() -> None:
    names = ["a", "b", "c"]
    expected = ctxcore.pack_arrays(names, [60, 50, 50], [6.0, 5.0, 5.0], 100)
    for tokens in (np.array([60, 50, 50], np.int32), np.array([60, 50, 50], np.uint16), np.array([60.0, 50.0, 50.0])):
        for scores in (np.array([6, 5, 5], np.int64), np.array([6, 5, 5], np.float32)):
            assert ctxcore.pack_arrays(names, tokens, scores, 100).ids == expected.ids
    assert ctxcore.pack_arrays(tuple(names), [60, 50, 50], [6.0, 5.0, 5.0], 100.0).ids == expected.ids
    assert ctxcore.pack_arrays(iter(names), [60, 50, 50], [6.0, 5.0, 5.0], 100).ids == expected.ids


# ---- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cand", "fragment"),
    [
        ({"id": "x", "tokens": -1, "score": 1.0}, ">= 0"),
        ({"id": "x", "tokens": 2.5, "score": 1.0}, "integer"),
        ({"id": "x", "tokens": True, "score": 1.0}, "integer"),
        ({"id": "x", "tokens": "12", "score": 1.0}, "integer"),
        ({"id": "x", "tokens": 2**41, "score": 1.0}, "2\\*\\*40"),
        ({"id": "x", "tokens": 1, "score": float("nan")}, "finite"),
        ({"id": "x", "tokens": 1, "score": float("inf")}, "finite"),
        ({"id": "x", "tokens": 1, "score": "high"}, "real number"),
        ({"id": "", "tokens": 1, "score": 1.0}, "non-empty"),
        ({"id": "x", "tokens": 1, "score": 1.0, "pinned": "yes"}, "bool"),
        ({"id": "x", "score": 1.0}, "missing 'tokens'"),
        ({"tokens": 1, "score": 1.0}, "missing 'id'"),
    ],
)
def test_bad_candidates_are_named(cand: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidCandidate, match=fragment) as info:
        ctxcore.pack([{"id": "ok", "tokens": 1, "score": 1.0}, cand], 10)
    assert isinstance(info.value, ValueError)
    assert info.value.index == 1
    assert "index 1" in str(info.value)


@pytest.mark.parametrize(
    ("tokens", "shown"),
    [
        (10**26, "got 100000000000000000000000000$"),
        (10**400, "got an integer of 1329 bits$"),
        (-(10**400), ">= 0, got a negative integer of 1329 bits$"),
    ],
    ids=["past-float-precision", "past-float-range", "negative-past-float-range"],
)
def test_out_of_range_int_tokens_are_named_as_written(tokens: int, shown: str) -> None:
    # Ints past a float's precision or range are shown exactly, never through a float.
    for call in (
        lambda: ctxcore.pack([Candidate("a", tokens, 1.0)], 10),
        lambda: ctxcore.pack([{"id": "a", "tokens": tokens, "score": 1.0}], 10),
        lambda: ctxcore.pack_arrays(["a"], [tokens], [1.0], 10),
    ):
        with pytest.raises(InvalidCandidate, match=shown) as info:
            call()
        assert (info.value.index, info.value.candidate_id) == (0, "a")


def test_non_str_id_is_named() -> None:
    with pytest.raises(InvalidCandidate, match="id must be str, got int") as info:
        ctxcore.pack([Candidate(7, 1, 1.0)], 10)  # type: ignore[arg-type]
    assert info.value.index == 0


@pytest.mark.parametrize("one", [{"id": "a", "tokens": 1, "score": 1.0}, "abc", b"abc"])
def test_one_candidate_instead_of_an_iterable_is_named(one: object) -> None:
    with pytest.raises(InvalidCandidate, match=rf"not a single {type(one).__name__}: pass \[candidate\]") as info:
        ctxcore.pack(one, 10)  # type: ignore[arg-type]
    assert (info.value.index, info.value.candidate_id) == (-1, None)


def test_duplicate_ids_name_both_positions() -> None:
    with pytest.raises(
        InvalidCandidate, match=r"candidate 'a' \(index 2\): duplicate id \(first seen at index 0\)"
    ) as info:
        ctxcore.pack([Candidate("a", 1, 1.0), Candidate("b", 1, 1.0), Candidate("a", 2, 2.0)], 10)
    assert (info.value.index, info.value.candidate_id) == (2, "a")


def test_lone_surrogate_id_is_rejected() -> None:
    with pytest.raises(InvalidCandidate, match="surrogate"):
        ctxcore.pack([Candidate("\ud800", 1, 1.0)], 10)


@pytest.mark.parametrize("budget", [12.5, "100", None, float("nan"), True])
def test_non_integer_budgets(budget: object) -> None:
    with pytest.raises(InvalidCandidate, match="budget must be an integer") as info:
        ctxcore.pack([Candidate("a", 1, 1.0)], budget)  # type: ignore[arg-type]
    assert info.value.index == -1 and info.value.candidate_id is None


def test_mismatched_lengths() -> None:
    with pytest.raises(InvalidCandidate, match="mismatched lengths: 2 ids, 3 tokens, 2 scores"):
        ctxcore.pack_arrays(["a", "b"], [1, 2, 3], [1.0, 2.0], 10)
    with pytest.raises(InvalidCandidate, match="1 pinned flags"):
        ctxcore.pack_arrays(["a", "b"], [1, 2], [1.0, 2.0], 10, pinned=[True])
    with pytest.raises(InvalidCandidate, match="0 pinned flags"):
        ctxcore.pack_arrays(["a"], [1], [1.0], 10, pinned=[])


@pytest.mark.parametrize("empty", [[], (), np.array([]), np.zeros(0, bool), np.zeros(0, np.int64)])
def test_empty_pinned_and_groups_for_no_candidates(empty: object) -> None:
    # [] and np.array([]) read as float64: with nothing to flag, any empty array is no flags.
    want = ctxcore.pack_arrays([], [], [], 10)
    for kwargs in ({"pinned": empty}, {"groups": empty}, {"pinned": empty, "groups": empty}):
        res = ctxcore.pack_arrays([], [], [], 10, **kwargs)  # type: ignore[arg-type]
        assert res == want and res.ids == () and not res.truncated and res.decisions == ()
    assert ctxcore.pack([], 10, groups=empty) == want  # type: ignore[arg-type]


MASKED = np.ma.masked_array


@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    [
        ("ids", (MASKED(["a", "b"], mask=[False, True]), [1, 1], [1.0, 1.0]), {}),
        ("tokens", (["a", "b"], MASKED([1, 10**6], mask=[False, True]), [1.0, 1.0]), {}),
        ("scores", (["a", "b"], [1, 1], MASKED([1.0, np.nan], mask=[False, True])), {}),
        ("scores", (["a", "b"], [1, 1], MASKED([1.0, 2.0], mask=False)), {}),
        ("pinned", (["a", "b"], [1, 1], [1.0, 1.0]), {"pinned": MASKED([False, True], mask=[False, True])}),
        ("groups", (["a", "b"], [1, 1], [1.0, 1.0]), {"groups": MASKED([0, 0], mask=[False, True])}),
    ],
)
def test_masked_arrays_are_refused_by_name(name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    # numpy drops the mask on conversion: the masked entries would be packed as data.
    with pytest.raises(InvalidCandidate, match=rf"^{name} must not be a masked array \(np\.ma\.MaskedArray\)") as info:
        ctxcore.pack_arrays(*args, 10, **kwargs)  # type: ignore[arg-type]
    assert (info.value.index, info.value.candidate_id) == (-1, None)
    if name == "groups":
        with pytest.raises(InvalidCandidate, match="groups must not be a masked array"):
            ctxcore.pack([Candidate("a", 1, 1.0), Candidate("b", 1, 1.0)], 10, groups=kwargs["groups"])  # type: ignore[arg-type]


def test_bad_arrays() -> None:
    with pytest.raises(InvalidCandidate, match="1-D"):
        ctxcore.pack_arrays(["a"], [[1]], [1.0], 10)
    with pytest.raises(InvalidCandidate, match=r"candidate 'b' \(index 1\): tokens must be an integer"):
        ctxcore.pack_arrays(["a", "b"], [1.0, 1.5], [1.0, 1.0], 10)
    with pytest.raises(InvalidCandidate, match=r"candidate 'b' \(index 1\): score must be finite"):
        ctxcore.pack_arrays(["a", "b"], [1, 1], [1.0, np.nan], 10)
    with pytest.raises(InvalidCandidate, match="dtype"):
        ctxcore.pack_arrays(["a"], np.array(["1"]), [1.0], 10)
    with pytest.raises(InvalidCandidate, match="single str"):
        ctxcore.pack_arrays("ab", [1, 1], [1.0, 1.0], 10)
    with pytest.raises(InvalidCandidate, match="pinned must be booleans"):
        ctxcore.pack_arrays(["a"], [1], [1.0], 10, pinned=[2])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"bucket_tokens": 0}, "bucket_tokens"),
        ({"cell_ceiling": -1}, "cell_ceiling"),
        ({"search_node_limit": -1}, "search_node_limit"),
        ({"rank_tolerance": 1.0}, r"rank_tolerance must be a number in \[0, 1\), got 1.0"),
        ({"rank_tolerance": -0.01}, "rank_tolerance"),
        ({"rank_tolerance": math.nan}, "rank_tolerance"),
        ({"rank_tolerance": True}, "rank_tolerance"),
        ({"rank_tolerance": "0.1"}, "rank_tolerance"),
        ({"rank_tolerance": None}, "rank_tolerance"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ctxcore.pack([Candidate("a", 1, 1.0)], 10, **kwargs)
    with pytest.raises(ValueError, match=fragment):
        ctxcore.pack_arrays(["a"], [1], [1.0], 10, **kwargs)


# ---- rank tolerance -----------------------------------------------------------------

# Rank order takes "a" alone (1.0); the optimum "b" + "c" (1.1) is worth 10% more.
TIED = [Candidate("a", 60, 1.0), Candidate("b", 50, 0.55), Candidate("c", 50, 0.55)]


@pytest.mark.parametrize(
    ("tolerance", "ids", "rank_order"),
    [(0, ("b", "c"), False), (0.0, ("b", "c"), False), (0.05, ("b", "c"), False), (0.2, ("a",), True)],
)
def test_rank_tolerance_in_pack_as_in_pack_arrays(tolerance: float, ids: tuple[str, ...], rank_order: bool) -> None:
    """`pack` takes ``rank_tolerance`` keyword-only, as `pack_arrays` does: the rank-order
    packing stays unless the optimum beats it by more than that share."""
    res = ctxcore.pack(TIED, 100, rank_tolerance=tolerance)
    assert (res.ids, res.rank_order) == (ids, rank_order)
    arrays = ctxcore.pack_arrays(
        [c.id for c in TIED], [c.tokens for c in TIED], [c.score for c in TIED], 100, rank_tolerance=tolerance
    )
    assert arrays == res and arrays.rank_order == res.rank_order
    assert res.tokens_used <= 100 and res.total_score <= res.upper_bound


def test_rank_tolerance_defaults_to_the_optimum_and_is_keyword_only() -> None:
    assert ctxcore.pack(TIED, 100) == ctxcore.pack(TIED, 100, rank_tolerance=0.0)
    assert not ctxcore.pack(TIED, 100).rank_order
    assert inspect.signature(ctxcore.pack).parameters["rank_tolerance"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(ctxcore.pack).parameters["rank_tolerance"].default == 0.0
    with pytest.raises(TypeError):
        ctxcore.pack(TIED, 100, 16, 1 << 20, 20_000, 0.2)  # type: ignore[misc]


# ---- threads ------------------------------------------------------------------------


def test_concurrent_calls_give_the_serial_answers() -> None:
    rng = np.random.default_rng(11)
    instances = []
    for k in range(48):
        n = int(rng.integers(50, 2000))
        instances.append(
            (
                [f"t{k}-{i}" for i in range(n)],
                rng.integers(1, 600, n),
                rng.random(n),
                int(rng.integers(500, 40_000)),
                int(rng.choice([1, 1 << 22])),
            )
        )

    def run(inst: tuple[list[str], np.ndarray, np.ndarray, int, int]) -> ctxcore.PackResult:
        names, tokens, scores, budget, ceiling = inst
        return ctxcore.pack_arrays(names, tokens, scores, budget, cell_ceiling=ceiling)

    serial = [run(inst) for inst in instances]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            assert list(pool.map(run, instances)) == serial
