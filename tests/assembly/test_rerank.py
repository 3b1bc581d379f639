"""The rerank stage: a reranker given to `assemble` reorders the best fused candidates
inside the deadline; late, failing or malformed, it is skipped with the reason recorded
and the fused order stands."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import ctxcore
from ctxcore import AssemblyRequest, CrossEncoderReranker, MemoryRecord, Query, RerankStatus, Sources

ROOMY = dict(
    client_timeout_ms=5000,
    server_deadline_ms=5000,
    directive_timeout_ms=5000,
    hot_timeout_ms=5000,
    cold_timeout_ms=5000,
)

# Ten memories the fused ranking orders m0 (best) .. m9; only m7 answers the question.
MEMS = [
    MemoryRecord(
        f"m{i}",
        "org",
        "agent",
        f"memory number {i} " + ("the answer: blue" if i == 7 else "noise"),
        similarity=0.9 - 0.02 * i,
    )
    for i in range(10)
]


def _assemble(
    reranker: Any, *, token_budget: int | None = None, deadline: float | None = None, **cfg: Any
) -> ctxcore.AssembledContext:
    async def hot(scope: Any, query: Any, limit: int) -> list[MemoryRecord]:
        return MEMS

    req = AssemblyRequest("org", "agent", "gpt-4o", Query("what colour?"), token_budget=token_budget)
    config = ctxcore.AssemblyConfig(**{**ROOMY, **cfg})
    return asyncio.run(
        ctxcore.assemble(req, sources=Sources(hot=hot), config=config, deadline=deadline, reranker=reranker)
    )


def answer_first(query: str, texts: Sequence[str]) -> list[float]:
    assert query == "what colour?"
    return [1.0 if "answer" in t else 0.0 for t in texts]


def _budget_for_one() -> int:
    """A token budget that holds the fixed parts and one memory."""
    ctx = _assemble(None)
    per = max(e.tokens for e in ctx.trace)
    return ctx.prompt_tokens.value - sum(e.tokens for e in ctx.trace if e.reason.value == "selected") + per + 2  # type: ignore[union-attr]


def test_without_a_reranker_the_fused_order_stands() -> None:
    ctx = _assemble(None, token_budget=_budget_for_one())
    assert ctx.selected_ids == ("m0",) and ctx.rerank is None and not ctx.degraded


def test_a_reranker_reorders_the_pool_and_the_packer_follows() -> None:
    ctx = _assemble(answer_first, token_budget=_budget_for_one())
    assert ctx.selected_ids == ("m7",)
    assert ctx.rerank is not None and ctx.rerank.status is RerankStatus.OK and ctx.rerank.candidates == 10
    assert not ctx.degraded and ctx.record()["rerank"]["status"] == "ok"
    # The pool keeps its values, handed out in the reranker's order.
    plain = {e.memory_id: e.score for e in _assemble(None).trace}
    reranked = {e.memory_id: e.score for e in _assemble(answer_first).trace}
    assert sorted(plain.values()) == pytest.approx(sorted(reranked.values()))
    assert reranked["m7"] == pytest.approx(max(plain.values()))


def test_only_the_pool_is_reranked() -> None:
    seen: list[int] = []

    def count(query: str, texts: Sequence[str]) -> list[float]:
        seen.append(len(texts))
        return list(range(len(texts)))

    ctx = _assemble(count, rerank_pool=4)
    assert seen == [4] and ctx.rerank is not None and ctx.rerank.candidates == 4


def test_a_late_reranker_is_skipped_and_the_fused_order_stands() -> None:
    release = threading.Event()

    def slow(query: str, texts: Sequence[str]) -> list[float]:
        release.wait(5)
        return answer_first(query, texts)

    try:
        t0 = time.perf_counter()
        ctx = _assemble(slow, token_budget=_budget_for_one(), rerank_timeout_ms=30)
        waited = time.perf_counter() - t0
    finally:
        release.set()
    assert ctx.selected_ids == ("m0",)
    assert ctx.rerank is not None and ctx.rerank.status is RerankStatus.TIMEOUT
    assert ctx.degraded and "rerank_timeout" in ctx.degradation_reasons
    assert waited < 4  # it was not waited for


def test_no_time_left_means_no_rerank_call() -> None:
    called: list[bool] = []

    def rec(query: str, texts: Sequence[str]) -> list[float]:
        called.append(True)
        return [0.0] * len(texts)

    async def slow_hot(scope: Any, query: Any, limit: int) -> list[MemoryRecord]:
        time.sleep(0.12)  # blocks the loop past the deadline less the headroom, then answers
        return MEMS

    req = AssemblyRequest("org", "agent", "gpt-4o", Query("what colour?"))
    config = ctxcore.AssemblyConfig(**{**ROOMY, "packing_headroom_ms": 100.0})
    ctx = asyncio.run(
        ctxcore.assemble(
            req, sources=Sources(hot=slow_hot), config=config, deadline=time.monotonic() + 0.2, reranker=rec
        )
    )
    assert ctx.selected_ids, "the hot branch's answer was kept"
    assert not called
    assert ctx.rerank is not None and ctx.rerank.status is RerankStatus.SKIPPED
    assert "rerank_skipped" in ctx.degradation_reasons


def test_nothing_to_rerank_is_not_a_degradation() -> None:
    ctx = asyncio.run(
        ctxcore.assemble(
            AssemblyRequest("org", "agent", "gpt-4o", Query("q")),
            sources=Sources(hot=lambda s, q, n: _empty()),
            reranker=answer_first,
        )
    )
    assert ctx.rerank is not None and ctx.rerank.status is RerankStatus.OK and ctx.rerank.candidates == 0
    assert not any(r.startswith("rerank") for r in ctx.degradation_reasons)


async def _empty() -> list[MemoryRecord]:
    return []


@pytest.mark.parametrize(
    "bad",
    [
        lambda q, t: [1.0],  # too few
        lambda q, t: [float("nan")] * len(t),
        lambda q, t: "high",
        lambda q, t: 1 / 0,
    ],
)
def test_a_failing_or_malformed_reranker_is_an_error_record(bad: Any) -> None:
    ctx = _assemble(bad, token_budget=_budget_for_one())
    assert ctx.selected_ids == ("m0",)
    assert ctx.rerank is not None and ctx.rerank.status is RerankStatus.ERROR and ctx.rerank.error
    assert "rerank_error" in ctx.degradation_reasons


def test_bad_rerank_settings_are_config_errors() -> None:
    with pytest.raises(ctxcore.ConfigError, match="rerank_pool"):
        ctxcore.AssemblyConfig(rerank_pool=0)
    with pytest.raises(ctxcore.ConfigError, match="rerank_timeout_ms"):
        ctxcore.AssemblyConfig(rerank_timeout_ms=float("inf"))
    assert ctxcore.AssemblyConfig.from_env({"CTXCORE_RERANK_TIMEOUT_MS": "7"}).rerank_timeout_ms == 7.0
    # Numbers of any type, kept as plain ones.
    cfg = ctxcore.AssemblyConfig(rerank_pool=np.int64(8), rerank_timeout_ms=np.float32(5.0))
    assert (cfg.rerank_pool, cfg.rerank_timeout_ms) == (8, 5.0)
    assert (type(cfg.rerank_pool), type(cfg.rerank_timeout_ms)) == (int, float)
    with pytest.raises(ctxcore.ConfigError, match="rerank_timeout_ms"):
        ctxcore.AssemblyConfig(rerank_timeout_ms=10**400)
    with pytest.raises(ctxcore.ConfigError, match="rerank_pool"):
        ctxcore.AssemblyConfig(rerank_pool=8.0)


class PairModel:
    """A loaded model as sentence-transformers' CrossEncoder exposes it: ``predict(pairs)``."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def predict(self, pairs: list[tuple[str, str]], batch_size: int = 32, show_progress_bar: bool = False) -> Any:
        self.batches.append(batch_size)
        return np.array([float(len(set(q.split()) & set(t.split()))) for q, t in pairs])


def test_a_cross_encoder_reranker_scores_each_pair() -> None:
    model = PairModel()
    r = CrossEncoderReranker(model=model, batch_size=8)
    assert r("blue sky", ["a blue sky", "grass", "sky"]) == [2.0, 0.0, 1.0]
    assert r("q", []) == [] and model.batches == [8]
    with pytest.raises(TypeError, match="predict"):
        CrossEncoderReranker(model=object())
    with pytest.raises(ValueError, match="exactly one"):
        CrossEncoderReranker()


def test_a_cross_encoder_needs_a_model_directory(tmp_path: Any) -> None:
    with pytest.raises(ctxcore.ConfigError, match="no cross-encoder model directory"):
        CrossEncoderReranker(tmp_path / "missing")
