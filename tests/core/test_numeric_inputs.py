"""Numbers at the edges of what a float holds, through the public API: each is either
handled exactly or refused with a typed error that names it, never an OverflowError
from deep inside, a silently zeroed vector or a request that fails as a whole."""

from __future__ import annotations

import asyncio
import datetime
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ctxcore
from ctxcore import AssemblyConfig, AssemblyRequest, MemoryBatch, MemoryRecord, Query, Scope, Sources
from ctxcore.retrieval import BranchTimeouts, compute_wall
from ctxcore.stores import InvalidMemory, NewMemory, SqliteMemoryStore

HUGE = 10**400  # an int no float holds
CFG = AssemblyConfig(
    client_timeout_ms=5000,
    server_deadline_ms=5000,
    directive_timeout_ms=2000,
    hot_timeout_ms=2000,
    cold_timeout_ms=2000,
)


@pytest.mark.parametrize("scale", [1e200, 1e-200, 1.0])
def test_embeddings_of_any_finite_scale_keep_their_direction(tmp_path: Path, scale: float) -> None:
    # The squares of 1e200 overflow and those of 1e-200 vanish: the vector is scaled by its
    # largest value first, so the stored unit vector (and the search) is the same.
    with SqliteMemoryStore(tmp_path / "m.db") as store:
        store.add(NewMemory("m1", "o", "a", "tea", embedding=[3.0 * scale, 4.0 * scale]))
        stored = NewMemory("m2", "o", "a", "tea", embedding=[3.0 * scale, 4.0 * scale]).embedding
        assert stored is not None and np.allclose(stored, [0.6, 0.8])
        hits = asyncio.run(store.cold(Scope("o", "a"), Query("", (scale, scale * 4 / 3)), 5, min_similarity=0.99))
        assert [m.id for m in hits] == ["m1"] and hits[0].similarity == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "make, error, names",
    [
        (lambda: NewMemory("m", "o", "a", "t", embedding=[HUGE, 1]), InvalidMemory, "embedding"),
        (lambda: NewMemory("m", "o", "a", "t", created_at=HUGE), InvalidMemory, "created_at"),
        (lambda: Query("q", (HUGE,)), ValueError, "query embedding"),
        (lambda: Query("q", ("x",)), TypeError, "query embedding"),
        (lambda: MemoryRecord("m", "o", "a", "t", confidence=1e306), ValueError, "confidence"),
        (lambda: MemoryRecord("m", "o", "a", "t", similarity=1.5), ValueError, "similarity"),
        (lambda: MemoryRecord("m", "o", "a", "t", importance=-0.1), ValueError, "importance"),
        (lambda: MemoryRecord("m", "o", "a", "t", created_at=HUGE), ValueError, "created_at"),
        (
            lambda: MemoryRecord("m", "o", "a", "t", token_count=2**70, token_family="claude", token_kind="estimate"),
            ValueError,
            "token_count",
        ),
        (lambda: MemoryRecord("m", "o", "a", "t", exact_tokens={"o200k_base": 2**62}), ValueError, "exact_tokens"),
        (
            lambda: MemoryBatch("o", "a", ids=["m"], texts=["t"], origins=["hot"], confidence=[2.0]),
            ValueError,
            "confidence",
        ),
        (
            lambda: MemoryBatch("o", "a", ids=["m"], texts=["t"], origins=["hot"], similarity=[-1.5]),
            ValueError,
            "similarity",
        ),
        (
            lambda: MemoryBatch("o", "a", ids=["m"], texts=["t"], origins=["hot"], token_count=[2**41]),
            ValueError,
            "token_count",
        ),
        (
            lambda: MemoryBatch("o", "a", ids=["m"], texts=["t"], origins=["hot"], exact_tokens=[{"x": 2**64}]),
            ValueError,
            "exact_tokens",
        ),
        (lambda: ctxcore.pack([{"id": "a", "tokens": 1, "score": HUGE}], 10), ctxcore.InvalidCandidate, "score"),
        (lambda: ctxcore.pack_arrays(["a"], [1], [HUGE], 10), ctxcore.InvalidCandidate, "score"),
        (lambda: ctxcore.score_candidates([HUGE], [0.5]), ValueError, "similarity"),
        (lambda: AssemblyConfig(client_timeout_ms=HUGE), ctxcore.ConfigError, "client_timeout_ms"),
        (lambda: compute_wall(-5, 100), ValueError, "client_timeout_ms"),
        (lambda: BranchTimeouts(hot_ms=HUGE), ValueError, "hot_ms"),
        (lambda: BranchTimeouts(cold_ms=np.float32("nan")), ValueError, "cold_ms"),
        (lambda: AssemblyConfig(hot_timeout_ms=np.int64(-1)), ctxcore.ConfigError, "hot_timeout_ms"),
        (lambda: compute_wall(45, math.nan), ValueError, "server_deadline_ms"),
        (lambda: ctxcore.compute_budget("gpt-4o", catalog={}), TypeError, "catalog"),
        (lambda: ctxcore.AssemblyOptions(max_memories=10**30), ValueError, "max_memories"),
    ],
)
def test_out_of_range_numbers_are_refused_by_name(make: Any, error: type[Exception], names: str) -> None:
    with pytest.raises(error, match=names):
        make()


@pytest.mark.parametrize("kind", [np.int64, np.float32, np.float64, Fraction, int])
def test_timeouts_take_real_numbers_of_any_type(kind: Any) -> None:
    names = ("client_timeout_ms", "server_deadline_ms", "directive_timeout_ms", "hot_timeout_ms", "cold_timeout_ms")
    cfg = AssemblyConfig(**{name: kind(30 + k) for k, name in enumerate(names)}, packing_headroom_ms=kind(2))
    got = [getattr(cfg, name) for name in (*names, "packing_headroom_ms")]
    assert got == [30.0, 31.0, 32.0, 33.0, 34.0, 2.0] and {type(x) for x in got} == {float}
    assert cfg.branch_timeouts == BranchTimeouts(32.0, 33.0, 34.0) == BranchTimeouts(kind(32), kind(33), kind(34))
    assert compute_wall(kind(30), kind(31), headroom_ms=kind(2)).limit_ms == 30.0


def test_a_registered_tokenizers_count_beyond_2_40_is_refused() -> None:
    with pytest.raises(ctxcore.InvalidTokenizerOutput, match="above 2\\*\\*40"):  # probed at registration
        ctxcore.register_tokenizer("test-huge-counts", lambda s: 2**70, fallback_family="cl100k_base")
    ctxcore.register_tokenizer(
        "test-huge-counts", lambda s: 2**70 if s == "boom" else len(s), fallback_family="cl100k_base"
    )
    try:
        for call in (
            lambda: ctxcore.count_tokens_batch(["a", "boom"], "test-huge-counts"),
            lambda: ctxcore.count_tokens("boom", "test-huge-counts"),
        ):
            with pytest.raises(ctxcore.InvalidTokenizerOutput, match="above 2\\*\\*40"):
                call()
    finally:
        ctxcore.unregister_tokenizer("test-huge-counts")


# The creation times the compact rendering writes: 0001-01-01T00:00:00Z to
# 9999-12-31T23:59:59Z in seconds since the epoch.
FIRST_SECOND, LAST_SECOND = -62135596800, 253402300799
ISO_SECOND = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


@pytest.mark.parametrize(
    ("when", "text"),
    [
        (FIRST_SECOND, "0001-01-01T00:00:00Z"),
        (float(FIRST_SECOND), "0001-01-01T00:00:00Z"),
        (FIRST_SECOND + 0.5, "0001-01-01T00:00:00Z"),
        (-62104060801, "0001-12-31T23:59:59Z"),
        (-59011459200, "0100-01-01T00:00:00Z"),
        (-30610224001, "0999-12-31T23:59:59Z"),
        (-30610224000, "1000-01-01T00:00:00Z"),
        (-0.5, "1969-12-31T23:59:59Z"),  # to the second, rounded down
        (0, "1970-01-01T00:00:00Z"),
        (np.int64(1715090580), "2024-05-07T14:03:00Z"),
        (np.float32(1024.0), "1970-01-01T00:17:04Z"),
        (Fraction(1715090580, 1), "2024-05-07T14:03:00Z"),
        (LAST_SECOND, "9999-12-31T23:59:59Z"),
        (LAST_SECOND + 0.5, "9999-12-31T23:59:59Z"),
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z"),
        ("0001-01-01T00:30:00+00:30", "0001-01-01T00:00:00Z"),
        ("9999-12-31T23:59:59.999999+00:00", "9999-12-31T23:59:59Z"),
        (datetime.datetime.max.replace(tzinfo=datetime.UTC), "9999-12-31T23:59:59Z"),
        (datetime.datetime.min.replace(tzinfo=datetime.UTC), "0001-01-01T00:00:00Z"),
    ],
)
def test_creation_times_at_the_edges_are_iso_8601(when: Any, text: str) -> None:
    assert ctxcore.formatting.created_at_text(when) == text


@given(st.integers(FIRST_SECOND, LAST_SECOND))
def test_every_written_creation_time_is_iso_8601_and_reads_back(seconds: int) -> None:
    text = ctxcore.formatting.created_at_text(seconds)
    assert text is not None and ISO_SECOND.fullmatch(text)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    assert datetime.datetime.fromisoformat(text) == epoch + datetime.timedelta(seconds=seconds)
    assert ctxcore.formatting.created_at_text(float(seconds) + 0.25) == text


@pytest.mark.parametrize(
    "when",
    [
        FIRST_SECOND - 1,
        FIRST_SECOND - 0.5,
        LAST_SECOND + 1,
        1e300,
        -1e300,
        math.inf,
        -math.inf,
        HUGE,
        -HUGE,
        Fraction(HUGE),
        "0001-01-01T00:30:00+01:00",
        "9999-12-31T23:59:59-00:01",
        datetime.datetime(1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1))),
    ],
)
def test_creation_times_beyond_four_digit_years_are_refused_by_name(when: Any) -> None:
    with pytest.raises(ValueError, match=r"created_at is out of range: .* is not between 0001-01-01T00:00:00Z and"):
        ctxcore.formatting.created_at_text(when)
    # Formatting names the memory; assembling writes the time as unknown (tests/assembly/test_memory_format.py).
    with pytest.raises(
        ctxcore.InvalidFormatInput, match=r"^memory 'note-2' \(index 1\): created_at is out of range"
    ) as info:
        ctxcore.format_context(
            memories=[
                {"id": "note-1", "text": "x", "created_at": 0},
                {"id": "note-2", "text": "y", "created_at": when},
            ],
            memory_format="compact",
            memory_attributes=("created_at",),
        )
    assert (info.value.section, info.value.index, info.value.item_id) == ("memories", 1, "note-2")


@pytest.mark.parametrize("count", [lambda t: len(t) / 4, lambda t: str(len(t)), lambda t: True])
def test_formatter_overhead_takes_only_int_counts(count: Any) -> None:
    # A fractional count truncated would price the memories below what they cost.
    with pytest.raises(TypeError, match="not an int"):
        ctxcore.formatter_overhead([{"id": "m", "text": "x" * 5}], count=count)
    ov = ctxcore.formatter_overhead([{"id": "m", "text": "x" * 5}], count=lambda t: np.int64(len(t)))
    out = ctxcore.format_context(memories=[{"id": "m", "text": "x" * 5}], nonce=ov.nonce)
    assert ov.total_tokens + sum(ov.memory_tokens) >= len(out.text)


def test_store_limits_and_retention_times_are_checked(tmp_path: Path) -> None:
    with SqliteMemoryStore(tmp_path / "m.db") as store:
        store.add(NewMemory("m1", "o", "a", "tea", created_at=100.0))
        with pytest.raises(ValueError, match="limit"):
            asyncio.run(store.hot(Scope("o", "a"), Query(""), 2**63))
        with pytest.raises(ValueError, match="max_age_seconds"):
            store.expire(HUGE)
        with pytest.raises(ValueError, match="now"):
            store.expire(5, now=math.inf)
        assert store.expire(5, now=100.0) == 0  # nothing deleted by a refused call either
        assert store.expire(5, now=106.0) == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"confidence": 1e306},
        {"similarity": 7.0},
        {"token_count": 2**70, "token_family": "claude", "token_kind": "estimate"},
    ],
)
def test_a_source_building_an_out_of_range_record_degrades_its_branch(fields: dict[str, Any]) -> None:
    # The record is refused where the source builds it: the branch is an error, the
    # others still serve, and the assembly answers.
    async def hot(scope: Scope, query: Query, limit: int) -> list[MemoryRecord]:
        return [MemoryRecord("m1", "o", "a", "hi", **fields)]

    async def cold(scope: Scope, query: Query, limit: int, min_similarity: float) -> list[MemoryRecord]:
        return [MemoryRecord("m2", "o", "a", "tea", similarity=0.9)]

    for model in ("gpt-4o", "claude-sonnet-4"):
        r = asyncio.run(
            ctxcore.assemble(AssemblyRequest("o", "a", model, "q"), sources=Sources(hot=hot, cold=cold), config=CFG)
        )
        statuses = {b.branch.value: b.status.value for b in r.branches}
        assert statuses["hot"] == "error" and statuses["cold"] == "ok", statuses
        assert r.selected_ids == ("m2",) and r.degraded


def test_a_source_building_records_from_numpy_numbers_is_served() -> None:
    # Similarities computed in float32, counts summed in int64: kept as plain numbers.
    record = MemoryRecord(
        "m1",
        "o",
        "a",
        "tea",
        similarity=np.float32(0.9),
        confidence=np.float32(0.8),
        importance=np.float64(0.5),
        created_at=np.float32(1.7e9),
        fulltext_score=np.float32(2.5),
        token_count=np.int64(1),
        token_family="o200k_base",
        token_kind="exact",
        exact_tokens={"o200k_base": np.int64(9)},
    )
    assert (record.similarity, record.confidence, record.importance, record.created_at) == (0.9, 0.8, 0.5, 1.7e9)
    assert (record.fulltext_score, record.token_count, dict(record.exact_tokens or {})) == (2.5, 1, {"o200k_base": 9})
    numbers = [record.similarity, record.confidence, record.importance, record.created_at, record.fulltext_score]
    assert {type(x) for x in numbers} == {float} and type(record.token_count) is int
    assert [type(n) for n in (record.exact_tokens or {}).values()] == [int]

    async def hot(scope: Scope, query: Query, limit: int) -> list[MemoryRecord]:
        return [record]

    r = asyncio.run(ctxcore.assemble(AssemblyRequest("o", "a", "gpt-4o", "q"), sources=Sources(hot=hot), config=CFG))
    assert r.selected_ids == ("m1",) and not r.degraded


def test_a_batch_of_numpy_counts_is_served() -> None:
    batch = MemoryBatch(
        "o",
        "a",
        ids=["m1", "m2"],
        texts=["tea", "green tea"],
        origins=["vector", "vector"],
        similarity=np.array([0.9, 0.8], dtype=np.float32),
        token_count=np.array([1, 2]),
        token_family=["o200k_base", "o200k_base"],
        token_kind=["exact", "exact"],
        exact_tokens=[{"o200k_base": np.int64(9)}, None],
    )
    assert batch.token_count == [1, 2] and [type(n) for n in batch.token_count] == [int, int]
    assert batch.counts("o200k_base").tolist() == [9, -1] and batch[0].exact_tokens == {"o200k_base": 9}
    with pytest.raises(ValueError, match=r"memory 'm1': token_count must be an int in \[0, 2\*\*40\]"):
        MemoryBatch("o", "a", ids=["m1"], texts=["t"], origins=["hot"], token_count=[np.int64(-1)])

    async def hot(scope: Scope, query: Query, limit: int) -> MemoryBatch:
        return batch

    r = asyncio.run(ctxcore.assemble(AssemblyRequest("o", "a", "gpt-4o", "q"), sources=Sources(hot=hot), config=CFG))
    assert set(r.selected_ids) == {"m1", "m2"} and not r.degraded


@pytest.mark.parametrize("when", [1e300, -1e300])
def test_far_times_still_score_and_pack(when: float) -> None:
    async def hot(scope: Scope, query: Query, limit: int) -> list[MemoryRecord]:
        return [MemoryRecord("m1", "o", "a", "hi", similarity=0.9, created_at=when, accessed_at=when, importance=1.0)]

    r = asyncio.run(ctxcore.assemble(AssemblyRequest("o", "a", "gpt-4o", "q"), sources=Sources(hot=hot), config=CFG))
    assert r.selected_ids == ("m1",) and not r.degraded


@pytest.mark.parametrize(
    "make, field, value",
    [
        (lambda v: ctxcore.ValueModel(sharpness=v), "sharpness", 4.0),
        (lambda v: ctxcore.ValueModel(rrf_k=v), "rrf_k", 20.0),
        (lambda v: ctxcore.ValueModel(rank_tolerance=v), "rank_tolerance", 0.25),
        (lambda v: ctxcore.ScoringConfig(relevance_floor=v), "relevance_floor", 0.25),
        (lambda v: ctxcore.ScoringConfig(min_similarity=v), "min_similarity", 0.25),
        (lambda v: ctxcore.ScoreWeights(similarity=v), "similarity", 0.25),
    ],
)
@pytest.mark.parametrize("kind", [np.float32, np.float64, Fraction, float])
def test_scoring_settings_take_real_numbers_of_any_type(make: Any, field: str, value: float, kind: Any) -> None:
    given = kind(value) if kind is not Fraction else Fraction(value)
    built = make(given)
    got = getattr(built, field)
    assert type(got) in (int, float) and got == value


@pytest.mark.parametrize("value", [np.int64(20), np.uint8(3)])
def test_value_model_counts_take_numpy_integers(value: Any) -> None:
    assert ctxcore.ValueModel(rrf_k=value).rrf_k == float(value)


@pytest.mark.parametrize(
    "make, names",
    [
        (lambda: ctxcore.ValueModel(rrf_k=HUGE), "rrf_k"),
        (lambda: ctxcore.ValueModel(sharpness=np.float32("nan")), "sharpness"),
        (lambda: ctxcore.ScoringConfig(relevance_floor=HUGE), "relevance_floor"),
        (lambda: ctxcore.ScoringConfig(min_similarity=np.float64("inf")), "min_similarity"),
        (lambda: ctxcore.ScoreWeights(confidence=HUGE), "confidence"),
        (lambda: ctxcore.ScoreWeights(confidence="1"), "confidence"),
    ],
)
def test_scoring_settings_out_of_range_are_a_config_error(make: Any, names: str) -> None:
    with pytest.raises(ctxcore.ConfigError, match=names):
        make()


@pytest.mark.parametrize("tolerance", [np.float32(0.2), np.float64(0.2), Fraction(1, 5), np.int64(0)])
def test_pack_takes_a_rank_tolerance_of_any_real_type(tolerance: Any) -> None:
    tied = [ctxcore.Candidate("a", 60, 1.0), ctxcore.Candidate("b", 50, 0.55), ctxcore.Candidate("c", 50, 0.55)]
    want = ctxcore.pack(tied, 100, rank_tolerance=float(tolerance))
    got = ctxcore.pack(tied, 100, rank_tolerance=tolerance)
    assert got.ids == want.ids and got.rank_order == want.rank_order
    with pytest.raises(ValueError, match="rank_tolerance"):
        ctxcore.pack(tied, 100, rank_tolerance=np.float32(1.0))
