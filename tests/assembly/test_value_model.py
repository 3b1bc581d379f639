"""The fused value model's conversational-context signal: a memory created next to a
strong match gains part of its relevance, within a time window, never above the best."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore.scoring import CONTEXT_SPAN, ValueModel, context_boost
from ctxcore.stores import NewMemory, SqliteMemoryStore


def test_a_neighbour_of_a_match_gains_and_a_distant_memory_does_not() -> None:
    rel, added = context_boost([1.0, 0.0, 0.0, 0.0], [0.0, 30.0, 60.0, 90_000.0], weight=0.3, window_s=600)
    assert rel[0] == 1.0
    assert rel[1] == pytest.approx(0.3)
    assert rel[2] == pytest.approx(0.15)  # two places away: half the share
    assert rel[3] == 0.0  # a day later: outside the window
    assert added.tolist() == pytest.approx([0.0, 0.3, 0.15, 0.0])


def test_only_the_span_on_each_side_gains() -> None:
    t = np.arange(CONTEXT_SPAN + 2, dtype=np.float64)
    rel, _ = context_boost([1.0] + [0.0] * (CONTEXT_SPAN + 1), t, weight=0.5, window_s=100)
    assert rel[CONTEXT_SPAN] > 0
    assert rel[CONTEXT_SPAN + 1] == 0.0


def test_rows_of_one_memory_count_once_and_share_its_gain() -> None:
    # Memory "a" was found by two paths; its rows are one place in the conversation.
    rel, _ = context_boost([0.9, 0.5, 0.0], [0.0, 0.0, 10.0], ids=["a", "a", "b"], weight=0.3, window_s=600)
    # "b" gains from a's best row (0.9), and a itself gains from b's nothing.
    assert rel[2] == pytest.approx(0.3 * 0.9)
    assert rel[0] == pytest.approx(0.9) and rel[1] == pytest.approx(0.5)


def test_weight_zero_and_unknown_times_change_nothing() -> None:
    base = [0.8, 0.1, 0.4]
    assert context_boost(base, [0.0, 1.0, 2.0], weight=0.0)[0].tolist() == base
    assert context_boost(base, [np.nan, np.nan, np.nan])[0].tolist() == base


def test_mismatched_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="one length"):
        context_boost([0.1, 0.2], [0.0])


@given(
    st.lists(
        st.tuples(st.floats(0, 1), st.one_of(st.none(), st.floats(0, 10_000))),
        min_size=1,
        max_size=40,
    ),
    st.floats(0, 2),
)
def test_the_best_relevance_is_kept_and_nothing_loses(rows: list[tuple[float, float | None]], weight: float) -> None:
    rel = np.array([r for r, _ in rows])
    t = np.array([np.nan if w is None else w for _, w in rows])
    out, added = context_boost(rel, t, weight=weight, window_s=1800)
    assert np.all(np.isfinite(out)) and np.all(added >= 0)
    assert float(out.max()) == pytest.approx(float(rel.max()))
    # Rescaled, a memory may fall in absolute terms, never in rank against one that gained nothing.
    untouched = np.flatnonzero(added == 0)
    for i in untouched.tolist():
        assert np.all(out[untouched][rel[untouched] < rel[i]] <= out[i] + 1e-12)


@pytest.mark.parametrize("bad", [{"context_weight": -0.1}, {"context_window_s": 0}, {"context_weight": float("nan")}])
def test_bad_context_settings_are_refused_by_name(bad: dict[str, float]) -> None:
    name = next(iter(bad))
    with pytest.raises(ctxcore.ConfigError, match=name):
        ValueModel(**bad)


def test_the_record_names_the_context_settings() -> None:
    rec = ValueModel(context_weight=0.25, context_window_s=900).record()
    assert rec["context_weight"] == 0.25 and rec["context_window_s"] == 900


def _conversation(path: Path) -> SqliteMemoryStore:
    store = SqliteMemoryStore(str(path))
    t0 = 1_700_000_000.0
    turns = [
        "Alice: we adopted a puppy from the shelter yesterday!",
        "Bob: that sounds wonderful",
        "Alice: Biscuit, after my grandmother's cookies.",
    ]
    rows = [NewMemory(f"t{k}", "org", "agent", text, created_at=t0 + 20 * k) for k, text in enumerate(turns)]
    # Other days of the same conversation, none about the question.
    filler = [
        "the weather was grey all week",
        "my commute took ages because of the roadworks",
        "we watched a documentary about volcanoes",
        "the bakery on the corner closed for the holidays",
    ]
    for day in range(1, 30):
        for k, text in enumerate(filler):
            rows.append(NewMemory(f"d{day}-{k}", "org", "agent", f"Bob: {text}", created_at=t0 + day * 86_400 + 20 * k))
    store.add_many(rows)
    return store


def _assemble(store: SqliteMemoryStore, model: ValueModel, budget: int) -> ctxcore.AssembledContext:
    req = ctxcore.AssemblyRequest(
        "org",
        "agent",
        "gpt-4o",
        ctxcore.Query("which puppy was adopted from the shelter, and its name?"),
        options=ctxcore.AssemblyOptions(value_model=model),
        token_budget=budget,
    )
    return asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources.from_store(store)))


def _rank(ctx: ctxcore.AssembledContext, memory_id: str) -> int:
    ranked = sorted((e for e in ctx.trace if e.score > 0), key=lambda e: (-e.score, e.memory_id))
    return next((k for k, e in enumerate(ranked) if e.memory_id == memory_id), len(ranked))


def test_the_reply_that_answers_is_ranked_for_its_context(tmp_path: Path) -> None:
    with _conversation(tmp_path / "m.db") as store:
        with_context = _assemble(store, ValueModel(), 4000)
        without = _assemble(store, ValueModel(context_weight=0), 4000)
    by_id = {e.memory_id: e for e in with_context.trace}
    assert by_id["t1"].signal == "context" and by_id["t2"].signal == "context"
    # The reply next to the match comes right after it; without the signal it is noise.
    assert _rank(with_context, "t0") == 0 and _rank(without, "t0") == 0
    assert _rank(with_context, "t1") <= 2 < 10 < _rank(without, "t1")
    assert _rank(with_context, "t2") < _rank(without, "t2")
    assert with_context.scoring["value_model"]["context_weight"] == ValueModel().context_weight


@pytest.mark.parametrize("fusion", ["zscore", "weighted", "rrf"])
def test_a_candidate_no_signal_carries_is_worth_nothing(fusion: str) -> None:
    from ctxcore.scoring import fuse

    nan = float("nan")
    rel, dom = fuse(
        [0.9, 0.4, nan, nan],
        [nan, 2.0, 5.0, nan],
        fulltext=np.array([False, False, True, False]),
        model=ValueModel(fusion=fusion),
    )
    assert rel[3] == 0.0 and dom[3] == -1
    assert (rel[:3] > 0).all() and rel.max() <= 1.0
    assert dom[:3].tolist() == [1, 0, 0]  # a row's dominant signal is one it carries


# ---- the caller's relevance floor -----------------------------------------------------


async def _refunds(scope: ctxcore.Scope, query: ctxcore.Query, limit: int) -> list[ctxcore.MemoryRecord]:
    return [
        ctxcore.MemoryRecord("good", "org", "agent", "Refunds take 5 days.", similarity=0.9),
        ctxcore.MemoryRecord("fair", "org", "agent", "Refunds go to the card used.", similarity=0.6),
        ctxcore.MemoryRecord("bad", "org", "agent", "The cafeteria serves soup.", similarity=-0.9),
    ]


def _with_options(**options: object) -> ctxcore.AssembledContext:
    req = ctxcore.AssemblyRequest(
        "org",
        "agent",
        "gpt-4o",
        "how long do refunds take?",
        options=ctxcore.AssemblyOptions(**options),  # type: ignore[arg-type]
    )
    return asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=_refunds)))


def test_the_callers_floor_drops_what_the_fused_model_rates_below_it() -> None:
    ctx = _with_options(relevance_floor=0.4)
    by_id = {e.memory_id: e for e in ctx.trace}
    assert by_id["bad"].reason == ctxcore.TraceReason.BELOW_RELEVANCE_FLOOR and by_id["bad"].relevance < 0.4
    assert "bad" not in ctx.selected_ids and "good" in ctx.selected_ids
    # Without the caller's floor, the model's own (0.01) keeps it.
    assert "bad" in _with_options().selected_ids
    assert ctx.scoring["relevance_floor"] == 0.4
    assert ctx.scoring["value_model"]["absolute_floor"] == 0.4
    # The model's own settings stay as they were, the relative floor included.
    assert ctx.scoring["relative_floor"] == ValueModel().relative_floor
    assert ctx.scoring["value_model"]["sharpness"] == ValueModel().sharpness


def _below_floor(ctx: ctxcore.AssembledContext, floor: float) -> tuple[set[str], set[str]]:
    """The memories the trace has below the relevance floor, and those the floors (the
    absolute `floor` and, under the fused model, the relative one) should drop."""
    best = max(e.relevance for e in ctx.trace)
    relative = ctx.scoring.get("relative_floor", 0.0) * best
    traced = {e.memory_id for e in ctx.trace if e.reason == ctxcore.TraceReason.BELOW_RELEVANCE_FLOOR}
    expected = {e.memory_id for e in ctx.trace if e.relevance < floor or e.relevance < relative}
    return traced, expected


@pytest.mark.parametrize(
    "value_model",
    [ValueModel(), ValueModel(fusion="weighted"), ValueModel(fusion="rrf"), ValueModel(absolute_floor=0.3), "interim"],
    ids=["zscore", "weighted", "rrf", "own-floor", "interim"],
)
@pytest.mark.parametrize("floor", [0.0, 0.2, 0.45])
def test_the_callers_floor_applies_under_every_value_model(value_model: ValueModel | str, floor: float) -> None:
    ctx = _with_options(relevance_floor=floor, value_model=value_model)
    assert ctx.scoring["relevance_floor"] == floor
    traced, expected = _below_floor(ctx, floor)
    assert traced == expected
    if isinstance(value_model, ValueModel):
        # The caller's floor replaces the model's absolute floor and nothing else.
        assert ctx.scoring["value_model"] == {**value_model.record(), "absolute_floor": floor}


@pytest.mark.parametrize(
    ("value_model", "floor"),
    [(ValueModel(), ValueModel().absolute_floor), (ValueModel(absolute_floor=0.2), 0.2), ("interim", 0.15)],
    ids=["fused", "own-floor", "interim"],
)
def test_without_a_floor_of_its_own_the_request_gets_the_models(value_model: ValueModel | str, floor: float) -> None:
    ctx = _with_options(value_model=value_model)
    assert ctx.scoring["relevance_floor"] == floor
    traced, expected = _below_floor(ctx, floor)
    assert traced == expected


def test_a_floor_at_the_full_text_sentinel_is_refused_under_every_model() -> None:
    for value_model in (ValueModel(), "interim"):
        with pytest.raises(ctxcore.ConfigError, match="relevance_floor"):
            _with_options(relevance_floor=0.5, value_model=value_model)


# ---- extreme but finite signals -------------------------------------------------------


def _fulltext_hits(scores: list[float]) -> ctxcore.AssembledContext:
    async def hot(scope: ctxcore.Scope, query: ctxcore.Query, limit: int) -> list[ctxcore.MemoryRecord]:
        return [
            ctxcore.MemoryRecord(f"m{i}", "org", "agent", f"note {i}", origin="fulltext", fulltext_score=s)
            for i, s in enumerate(scores)
        ]

    req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", "q")
    return asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot)))


def _relevance(ctx: ctxcore.AssembledContext, n: int) -> list[float]:
    by_id = {e.memory_id: e.relevance for e in ctx.trace}
    return [by_id[f"m{i}"] for i in range(n)]


def test_scores_near_the_float_maximum_standardize_without_overflow() -> None:
    # The sum and the squares of these overflow; their z-scores are those of [1, 1, 0].
    rel = _relevance(_fulltext_hits([1e308, 1e308, 0.0]), 3)
    assert rel[:2] == [1.0, 1.0]
    assert rel[2] == pytest.approx(math.exp(-1.5 * math.sqrt(2)), rel=1e-12)
    # Magnitudes 600 orders apart (warnings are errors in this suite: none is raised).
    rel = _relevance(_fulltext_hits([1.7e308, 1e-300, 3.0]), 3)
    assert rel[0] == 1.0 and rel[1] == rel[2] == pytest.approx(math.exp(-1.5 * math.sqrt(2)), rel=1e-12)


@given(st.lists(st.just(0.0) | st.floats(min_value=1e-6, max_value=1e6), min_size=2, max_size=12))
@settings(deadline=None, max_examples=60)
def test_ordinary_scores_standardize_as_the_textbook_z_score(scores: list[float]) -> None:
    v = np.array(scores)
    std = float(v.std())
    z = np.minimum((v - v.mean()) / std, ValueModel().z_cap) if std > 0 else np.zeros(v.size)
    want = np.exp(np.minimum(z - z.max(), 0.0))
    got = np.array(_relevance(_fulltext_hits(scores), len(scores)))
    assert np.allclose(got, want, rtol=0, atol=1e-12)


_finite = st.floats(allow_nan=False, allow_infinity=False)
_unit = st.floats(min_value=0.0, max_value=1.0)
_record = st.builds(
    lambda k, origin, sim, fts, conf, imp, created: ctxcore.MemoryRecord(
        f"m{k}",
        "org",
        "agent",
        f"note {k}",
        origin=origin,
        similarity=sim,
        fulltext_score=fts,
        confidence=conf,
        importance=imp,
        created_at=created,
    ),
    st.integers(0, 8),
    st.sampled_from(["hot", "vector", "fulltext"]),
    st.none() | st.floats(min_value=-1.0, max_value=1.0),
    st.none() | st.floats(min_value=0.0, allow_infinity=False),
    _unit,
    st.none() | _unit,
    st.none() | _finite,
)
_options = st.sampled_from(
    [
        ctxcore.AssemblyOptions(),
        ctxcore.AssemblyOptions(value_model=ValueModel(fusion="weighted")),
        ctxcore.AssemblyOptions(value_model=ValueModel(fusion="rrf")),
        ctxcore.AssemblyOptions(value_model=ValueModel(recency_half_life_days=7.0), relevance_floor=0.2),
        ctxcore.AssemblyOptions(value_model="interim"),
        ctxcore.AssemblyOptions(weights={"similarity": 1.0, "recency": 1.0, "importance": 1.0}),
    ]
)


@given(st.lists(_record, max_size=12), st.lists(_record, max_size=12), _options)
@settings(deadline=None, max_examples=150)
def test_any_finite_signals_assemble_with_finite_relevance(
    hot_records: list[ctxcore.MemoryRecord], cold_records: list[ctxcore.MemoryRecord], options: ctxcore.AssemblyOptions
) -> None:
    async def hot(scope: ctxcore.Scope, query: ctxcore.Query, limit: int) -> list[ctxcore.MemoryRecord]:
        return hot_records

    async def cold(scope: ctxcore.Scope, query: ctxcore.Query, limit: int, cut: float) -> list[ctxcore.MemoryRecord]:
        return cold_records

    req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", "q", options=options)
    ctx = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot, cold=cold)))
    assert len(ctx.trace) == len(hot_records) + len(cold_records)
    for e in ctx.trace:
        assert math.isfinite(e.relevance) and math.isfinite(e.score)
    assert set(ctx.selected_ids) <= {r.id for r in hot_records + cold_records}
