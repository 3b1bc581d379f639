"""Redundancy-aware packing through the public API: ``pack_arrays(..., groups=...)`` and
``pack(..., groups=...)`` against a brute-force oracle of the multiple-choice knapsack,
the group constraint and the reasons on mid-size sets, the ungrouped path unchanged,
bad group arrays, and `near_duplicate_groups` (texts, vectors, bad input)."""

from __future__ import annotations

import itertools
import pickle
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore import InvalidCandidate, Reason

# ---- oracle and checks --------------------------------------------------------------


def grouped_brute_force(tokens: list[int], scores: list[float], groups: list[int], budget: int) -> float:
    """Best total over subsets within the budget holding one member per group at most
    (nothing at all for a non-positive budget, as documented)."""
    best = 0.0
    if budget <= 0:
        return best
    n = len(tokens)
    for r in range(n + 1):
        for combo in itertools.combinations(range(n), r):
            labels = [groups[i] for i in combo if groups[i] >= 0]
            if len(labels) != len(set(labels)):
                continue
            if sum(tokens[i] for i in combo) <= budget:
                best = max(best, sum(scores[i] for i in combo))
    return best


def check_groups(res: ctxcore.PackResult, groups: np.ndarray, budget: int) -> None:
    """The constraint, the budget, and Redundant exactly where a group member is in."""
    assert res.tokens_used <= max(budget, 0)
    chosen = set(res.indices.tolist())
    labels = [int(groups[i]) for i in chosen if groups[i] >= 0]
    assert len(labels) == len(set(labels)), "two members of one group selected"
    taken = set(labels)
    for d in res.decisions:
        assert d.selected == (d.index in chosen)
        if not d.selected and d.reason not in (Reason.NON_POSITIVE_SCORE, Reason.PINNED_OVER_BUDGET):
            in_taken_group = groups[d.index] >= 0 and int(groups[d.index]) in taken
            assert (d.reason == Reason.REDUNDANT) == in_taken_group, d
    assert res.redundant == sum(d.reason == Reason.REDUNDANT for d in res.decisions)
    assert res.excluded_for_budget == sum(
        d.reason in (Reason.BUDGET_EXHAUSTED, Reason.PINNED_OVER_BUDGET) for d in res.decisions
    )


@st.composite
def grouped_sets(draw: st.DrawFn, max_n: int = 10) -> tuple[list[int], list[float], list[int]]:
    n = draw(st.integers(0, max_n))
    kinds = draw(st.integers(1, 4))
    tokens = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    if draw(st.booleans()):
        scores = draw(
            st.lists(st.floats(-1.0, 10.0, allow_nan=False).map(lambda x: round(x, 3)), min_size=n, max_size=n)
        )
    else:  # on one line through the tokens: collinear hulls, many equal densities
        scores = [t / 100 + 0.1 for t in tokens]
    groups = draw(st.lists(st.integers(-1, kinds - 1), min_size=n, max_size=n))
    return tokens, scores, groups


# ---- the packer with groups -----------------------------------------------------------


@given(grouped_sets(), st.integers(-5, 1200), st.sampled_from([1 << 20, 1]))
@settings(max_examples=400, deadline=None)
def test_grouped_packing_is_the_brute_force_optimum(
    case: tuple[list[int], list[float], list[int]], budget: int, ceiling: int
) -> None:
    tokens, scores, groups = case
    ids = [f"c{i}" for i in range(len(tokens))]
    res = ctxcore.pack_arrays(ids, tokens, scores, budget, groups=groups, cell_ceiling=ceiling)
    check_groups(res, np.array(groups, np.int64), budget)
    optimum = grouped_brute_force(tokens, scores, groups, budget)
    assert res.proven_optimal
    assert res.total_score == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    assert res.total_score <= res.upper_bound + 1e-9


@given(st.integers(0, 2**32 - 1), st.integers(100, 600), st.sampled_from([1 << 20, 1]), st.booleans())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mid_size_grouped_sets_keep_the_constraint_and_do_not_depend_on_order(
    seed: int, n: int, ceiling: int, pin: bool
) -> None:
    rng = np.random.default_rng(seed)
    ids = [f"m{i}" for i in range(n)]
    tokens = rng.integers(20, 600, n)
    tokens[rng.random(n) < 0.03] = 0
    scores = rng.random(n)
    groups = np.where(rng.random(n) < 0.4, rng.integers(0, n // 4, n), -1)
    pinned = rng.random(n) < 0.02 if pin else None
    budget = int(rng.integers(0, 40_000))
    res = ctxcore.pack_arrays(ids, tokens, scores, budget, groups=groups, pinned=pinned, cell_ceiling=ceiling)
    check_groups(res, groups, budget)
    perm = rng.permutation(n)
    again = ctxcore.pack_arrays(
        [ids[i] for i in perm],
        tokens[perm],
        scores[perm],
        budget,
        groups=groups[perm],
        pinned=None if pinned is None else pinned[perm],
        cell_ceiling=ceiling,
    )
    assert again.ids == res.ids
    assert [d.reason for d in again.decisions] == [res.decisions[i].reason for i in perm]


def test_one_member_of_a_group_is_selected_and_the_rest_are_redundant() -> None:
    res = ctxcore.pack_arrays(
        ["a", "a-again", "b", "a-long"], [10, 10, 10, 30], [5.0, 4.9, 1.0, 5.5], 1000, groups=[7, 7, -1, 7]
    )
    assert res.ids == ("a-long", "b")
    assert [d.reason for d in res.decisions] == [Reason.REDUNDANT, Reason.REDUNDANT, Reason.SELECTED, Reason.SELECTED]
    assert (res.redundant, res.excluded_for_budget, res.truncated) == (2, 0, False)
    assert res.record()["redundant"] == 2
    assert pickle.loads(pickle.dumps(res)) == res


def test_pack_takes_groups_in_candidate_order() -> None:
    cands = [ctxcore.Candidate("x", 40, 0.9), {"id": "y", "tokens": 30, "score": 0.8}, ctxcore.Candidate("z", 30, 0.3)]
    res = ctxcore.pack(cands, 60, groups=[0, 0, -1])
    assert res.ids == ("y", "z")
    assert res.decisions[0].reason == Reason.REDUNDANT


def test_no_groups_and_all_minus_one_give_the_ungrouped_result() -> None:
    rng = np.random.default_rng(3)
    for n, budget in [(300, 8000), (1000, 32_000), (50, 10)]:
        ids = [f"k{i}" for i in range(n)]
        tokens, scores = rng.integers(1, 500, n), rng.random(n)
        plain = ctxcore.pack_arrays(ids, tokens, scores, budget)
        grouped = ctxcore.pack_arrays(ids, tokens, scores, budget, groups=np.full(n, -1))
        assert grouped == plain
        assert grouped.redundant == 0


def test_threads_get_the_serial_answer_with_groups() -> None:
    # The core runs without the GIL; the groups array must stay alive and unshared.
    rng = np.random.default_rng(11)
    cases = []
    for k in range(8):
        n = 400
        groups = np.where(rng.random(n) < 0.5, rng.integers(0, 60, n), -1)[::-1]  # a strided view
        cases.append(([f"t{k}-{i}" for i in range(n)], rng.integers(1, 400, n), rng.random(n), groups))
    serial = [ctxcore.pack_arrays(ids, t, s, 12_000, groups=g) for ids, t, s, g in cases]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda c: ctxcore.pack_arrays(c[0], c[1], c[2], 12_000, groups=c[3]), cases * 3))
    assert threaded == serial * 3


def test_group_labels_may_be_any_integers() -> None:
    ids = ["a", "b", "c", "d"]
    base = ctxcore.pack_arrays(ids, [10, 10, 10, 10], [4.0, 3.0, 2.0, 1.0], 100, groups=[0, 0, 1, 1])
    for labels in ([2**62, 2**62, 5, 5], np.array([9, 9, 0, 0], np.uint8), np.array([3, 3, 4, 4], np.int32)):
        assert ctxcore.pack_arrays(ids, [10, 10, 10, 10], [4.0, 3.0, 2.0, 1.0], 100, groups=labels).ids == base.ids
    assert base.ids == ("a", "c")


def test_rank_tolerance_keeps_one_member_per_group() -> None:
    res = ctxcore.pack_arrays(
        ["a", "a2", "b"], [40, 40, 60], [1.0, 0.99, 0.5], 100, groups=[0, 0, -1], rank_tolerance=0.5
    )
    assert res.ids == ("a", "b")
    assert res.decisions[1].reason == Reason.REDUNDANT


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([0, 1], "mismatched lengths: 3 ids, 3 tokens, 3 scores, 2 groups"),
        ([0, 1, 2, 3], "4 groups"),
        ([0.0, 1.0, 2.0], "groups must be integers (-1 for none), got an array of dtype float64"),
        ([True, False, True], "dtype bool"),
        (["0", "1", "2"], "groups must be integers"),
        ([[0], [1], [2]], "groups must be a 1-D array, got 2 dimensions"),
        (np.int64(3), "groups must be a 1-D array, got 0 dimensions"),
        ([0, -2, 1], "candidate 'b' (index 1): group must be >= 0, or -1 for none, got -2"),
        (np.array([0, 2**63, 1], np.uint64), "candidate 'b' (index 1): group must be < 2**63"),
        (
            np.array([0, None, 1], object),
            "candidate 'b' (index 1): group must be an integer (-1 for none), got NoneType",
        ),
        (np.array([0, 1, 2**70], object), "candidate 'c' (index 2): group must be >= 0"),
    ],
)
def test_bad_groups_are_named(groups: object, message: str) -> None:
    with pytest.raises(InvalidCandidate) as err:
        ctxcore.pack_arrays(["a", "b", "c"], [1, 2, 3], [1.0, 1.0, 1.0], 10, groups=groups)
    assert message in str(err.value)


@given(
    st.lists(
        st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=3), st.none(), st.booleans()),
        min_size=3,
        max_size=3,
    )
)
@settings(max_examples=200, deadline=None)
def test_arbitrary_group_values_give_a_result_or_a_typed_error(values: list[object]) -> None:
    try:
        res = ctxcore.pack_arrays(
            ["a", "b", "c"], [5, 5, 5], [1.0, 2.0, 3.0], 10, groups=np.array(values, dtype=object)
        )
    except InvalidCandidate as exc:
        assert "group" in str(exc)
    else:
        assert all(isinstance(v, int) and not isinstance(v, bool) and -1 <= v < 2**63 for v in values)
        check_groups(res, np.array(values, np.int64), 10)


# ---- near_duplicate_groups ------------------------------------------------------------


def test_texts_that_normalise_alike_share_a_group() -> None:
    texts = [
        "The refund takes 5 days.",
        "the  REFUND takes 5 days",
        "Thé refund — takes 5 days!!",
        "The refund takes 6 days.",
        "",
        "...",
    ]
    assert ctxcore.near_duplicate_groups(texts).tolist() == [0, 0, 0, -1, -1, -1]
    assert ctxcore.normalized_text_key("Ｆｕｌｌ-width ＣＡＦÉ") == "full width cafe"


def test_text_keys_drop_exactly_the_combining_marks_of_every_plane() -> None:
    # Every code point but the surrogates: the compatibility decomposition, less the
    # characters whose canonical combining class is not zero; a run of them stays one
    # word of the near-duplicate key, with no mark left in it.
    import unicodedata

    from ctxcore.stores.text import strip_diacritics

    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    for c in points:
        text = "x" + c
        want = "".join(ch for ch in unicodedata.normalize("NFKD", text) if unicodedata.combining(ch) == 0)
        assert strip_diacritics(text) == want, hex(ord(c))
    for k in range(0, len(points), 4096):
        key = ctxcore.normalized_text_key("".join(points[k : k + 4096]))
        assert not any(unicodedata.combining(ch) for ch in key), hex(k)
    assert ctxcore.normalized_text_key("Crème brûlée à l'Ὀδυσσεύς") == "creme brulee a l οδυσσευσ"


def test_vectors_above_the_threshold_share_a_group_transitively() -> None:
    texts = ["a", "b", "c", "d", "e"]
    angle = np.deg2rad([0.0, 15.0, 30.0, 90.0, 0.0])
    vectors = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    vectors[4] = 0.0  # no direction: close to nothing
    # cos 15 deg = 0.966: a~b and b~c, so a, b, c are one group though cos 30 deg = 0.866.
    assert ctxcore.near_duplicate_groups(texts, vectors).tolist() == [0, 0, 0, -1, -1]
    assert ctxcore.near_duplicate_groups(texts, vectors, threshold=0.97).tolist() == [-1, -1, -1, -1, -1]
    assert ctxcore.near_duplicate_groups(texts, vectors, threshold=0.8).tolist() == [0, 0, 0, -1, -1]
    copies = np.array([[0.1, 0.2, 0.3]] * 3)
    assert ctxcore.near_duplicate_groups(["x", "y", "z"], copies, threshold=1.0).tolist() == [0, 0, 0]


@pytest.mark.parametrize("scale", [1e300, 1e200, 1.0, 1e-200, 1e-320])
def test_vectors_of_any_finite_scale_keep_their_direction(scale: float) -> None:
    # The squares of 1e200 overflow and those of 1e-200 vanish: each row is scaled by its
    # largest value before its length is taken.
    texts = ["a", "b", "c", "d"]
    vectors = np.array([[3.0, 4.0], [3.0, 4.0], [4.0, -3.0], [0.0, 0.0]]) * scale
    assert ctxcore.near_duplicate_groups(texts, vectors).tolist() == [0, 0, -1, -1]
    mixed = np.array([[3.0 * scale, 4.0 * scale], [0.3, 0.4], [4.0, -3.0], [0.0, 0.0]])
    assert ctxcore.near_duplicate_groups(texts, mixed).tolist() == [0, 0, -1, -1]


def test_text_and_vector_pairs_join_one_group() -> None:
    texts = ["same text", "Same text.", "other", "unrelated"]
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    assert ctxcore.near_duplicate_groups(texts, vectors).tolist() == [0, 0, 0, -1]


@given(st.integers(0, 2**32 - 1), st.integers(0, 120), st.floats(0.5, 1.0))
@settings(max_examples=60, deadline=None)
def test_groups_are_the_components_of_the_similar_pairs(seed: int, n: int, threshold: float) -> None:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(max(1, n // 5), 8))
    vectors = centers[rng.integers(0, len(centers), n)] + rng.normal(scale=0.15, size=(n, 8))
    texts = [f"t{rng.integers(0, max(1, n))}" for _ in range(n)]
    labels = ctxcore.near_duplicate_groups(texts, vectors, threshold=threshold)
    # Oracle: a plain union-find over every pair.
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    for i in range(n):
        for j in range(i + 1, n):
            if texts[i] == texts[j] or float(unit[i] @ unit[j]) >= threshold:
                ri, rj = find(i), find(j)
                parent[max(ri, rj)] = min(ri, rj)
    roots = [find(i) for i in range(n)]
    want = [r if roots.count(r) > 1 else -1 for r in roots]
    assert labels.tolist() == want
    assert labels.dtype == np.int64


def test_the_groups_feed_the_packer() -> None:
    texts = ["Return within 30 days.", "return within 30 days", "Shipping is free over 50."]
    groups = ctxcore.near_duplicate_groups(texts)
    res = ctxcore.pack_arrays(["m1", "m2", "m3"], [6, 5, 7], [0.9, 0.8, 0.5], 100, groups=groups)
    assert res.ids == ("m1", "m3")
    assert res.decisions[1].reason == Reason.REDUNDANT


def test_a_thousand_candidates_with_vectors_are_grouped() -> None:
    rng = np.random.default_rng(0)
    n, dim = 1000, 384
    vectors = rng.normal(size=(n, dim))
    vectors[500:] = vectors[:500] + rng.normal(scale=0.05, size=(500, dim))  # 500 near copies
    labels = ctxcore.near_duplicate_groups([f"text {i}" for i in range(n)], vectors)
    assert labels[:500].tolist() == list(range(500))
    assert labels[500:].tolist() == list(range(500))


@pytest.mark.parametrize(
    ("texts", "vectors", "threshold", "error", "message"),
    [
        (["a", "b"], [[1.0, 0.0]], 0.95, InvalidCandidate, "mismatched lengths: 2 texts, 1 vectors"),
        (["a", "b"], [1.0, 0.0], 0.95, InvalidCandidate, "vectors must be a 2-D array"),
        (["a", "b"], [[1.0, np.nan], [0.0, 1.0]], 0.95, InvalidCandidate, "index 0: vector must be finite"),
        (["a", "b"], [[1.0, 0.0], [np.inf, 1.0]], 0.95, InvalidCandidate, "index 1: vector must be finite"),
        (["a", "b"], [["x", "y"], ["z", "w"]], 0.95, InvalidCandidate, "vectors must be real numbers"),
        pytest.param(
            ["a", "b"],
            np.ma.masked_array([[1.0, 0.0], [1.0, 0.0]], mask=[[False, False], [True, True]]),
            0.95,
            InvalidCandidate,
            "vectors must not be a masked array (np.ma.MaskedArray)",
            id="masked",
        ),
        (["a", 3], None, 0.95, InvalidCandidate, "index 1: text must be str, got int"),
        ("ab", None, 0.95, InvalidCandidate, "not a single str"),
        (["a"], None, 0.0, ValueError, "threshold must be a number in (0, 1]"),
        (["a"], None, 1.5, ValueError, "threshold must be a number in (0, 1]"),
        (["a"], None, float("nan"), ValueError, "threshold must be a number in (0, 1]"),
        (["a"], None, True, ValueError, "threshold must be a number in (0, 1]"),
        (["a"], None, "0.9", ValueError, "threshold must be a number in (0, 1]"),
        pytest.param(["a"], None, 10**400, ValueError, "threshold must be a number in (0, 1]", id="huge-int"),
    ],
)
def test_bad_input_to_the_grouping_is_named(
    texts: object, vectors: object, threshold: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as err:
        ctxcore.near_duplicate_groups(texts, vectors, threshold=threshold)  # type: ignore[arg-type]
    assert message in str(err.value)


def test_threshold_takes_real_numbers_of_any_type() -> None:
    vectors = [[1.0, 0.0], [0.96, 0.28], [0.0, 1.0]]  # cos(a, b) = 0.96
    for threshold in (np.float32(0.95), np.float64(0.95), Fraction(19, 20)):
        assert ctxcore.near_duplicate_groups(["a", "b", "c"], vectors, threshold=threshold).tolist() == [0, 0, -1]
    assert ctxcore.near_duplicate_groups(["a", "b", "c"], vectors, threshold=np.int64(1)).tolist() == [-1, -1, -1]


# ---- in the assembly ---------------------------------------------------------------------------


def test_assemble_takes_one_of_each_set_of_near_duplicates() -> None:
    import asyncio

    from ctxcore import AssemblyRequest, MemoryRecord, Query, Sources

    mems = [
        MemoryRecord("a", "o", "g", "Refunds take 5 days.", similarity=0.9),
        MemoryRecord("b", "o", "g", "refunds  TAKE 5 days!", similarity=0.85),
        MemoryRecord("c", "o", "g", "Shipping is free.", similarity=0.5),
        MemoryRecord("d", "o", "g", "Refunds take 6 days.", similarity=0.4),
    ]

    async def hot(scope: object, query: object, limit: int) -> list[MemoryRecord]:
        return mems

    ctx = asyncio.run(ctxcore.assemble(AssemblyRequest("o", "g", "gpt-4o", Query("refunds")), sources=Sources(hot=hot)))
    reasons = {e.memory_id: e.reason.value for e in ctx.trace}
    assert ctx.selected_ids == ("a", "c", "d")  # "d" differs in a digit: not a duplicate
    assert reasons["b"] == "redundant" and ctx.pack is not None and ctx.pack.redundant == 1
    assert ctx.record()["pack"]["redundant"] == 1
    # Nothing is dropped as redundant when no two memories share a text.
    distinct = asyncio.run(
        ctxcore.assemble(
            AssemblyRequest("o", "g", "gpt-4o", Query("refunds")),
            sources=Sources(hot=lambda s, q, n: _as_coro([mems[0], mems[2], mems[3]])),
        )
    )
    assert distinct.selected_ids == ("a", "c", "d") and distinct.pack is not None and distinct.pack.redundant == 0


async def _as_coro(value: object) -> object:
    return value


def test_text_keys_keep_a_working_set_in_two_generations() -> None:
    from ctxcore.redundancy import TextKeys

    texts = [f"Memory {i}: the café opens at {i % 24}h!" for i in range(300)]
    keys = TextKeys(capacity=200)
    assert keys.keys(texts) == [ctxcore.normalized_text_key(t) for t in texts]
    # The first 200 went to the old generation when the young one filled: a text found
    # there moves back, and every key stays the function's, whatever the generation.
    again = keys.keys(texts[:150] + texts[250:])
    assert again == [ctxcore.normalized_text_key(t) for t in texts[:150] + texts[250:]]
    assert keys.keys([]) == []
    keys.clear()
    assert keys.keys(texts[:3]) == [ctxcore.normalized_text_key(t) for t in texts[:3]]
    with pytest.raises(ValueError, match="capacity"):
        TextKeys(capacity=0)
