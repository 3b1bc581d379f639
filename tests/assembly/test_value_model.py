"""The fused value model's conversational-context signal: a memory created next to a
strong match gains part of its relevance, within a time window, never above the best."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
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
