"""Evidence recall at equal spend: ctxcore's defaults against the baselines a user would
otherwise write, on a generated conversational corpus (bench/quality_corpus.py: dated
sessions, paraphrased questions, multi-hop questions, updated facts and distractors),
two seeds of twelve conversations each, a WordLlama store (the `wordllama` extra).

Reference, in the same run and at the same spend: BM25, the embedder alone, their
reciprocal-rank fusion and recency (`ctxcore.evaluation`), each charged its memories'
text plus one token per memory, while ctxcore is charged its whole rendered memories
section. Gate, per seed and spend: ctxcore's recall is at least 1.05x the best
baseline's (`QUALITY_FLOOR`, below the 1.11-1.35x measured; docs/quality.md gives the
ratios). The branches get generous timeouts and no assembly may degrade: the gate
measures what the context holds, the latency gates measure how fast it is built.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from quality_corpus import generate

pytest.importorskip("wordllama")
pytest.importorskip("bm25s")

from ctxcore import AssemblyConfig
from ctxcore.evaluation import Label, evaluate
from ctxcore.stores import NewMemory, SqliteMemoryStore, WordLlamaEmbedder

SEEDS = (1, 2)
SPENDS = (256, 512, 1024)
#: ctxcore's recall / the best baseline's, at least (per seed and spend).
QUALITY_FLOOR = 1.05
CONVERSATIONS = 12
#: Timeouts that a loaded CI machine cannot hit on a local SQLite file.
GENEROUS = AssemblyConfig(
    client_timeout_ms=5000,
    server_deadline_ms=4000,
    directive_timeout_ms=1000,
    hot_timeout_ms=1000,
    cold_timeout_ms=1000,
)


@pytest.mark.parametrize("seed", SEEDS)
def test_evidence_recall_against_the_baselines(seed: int, tmp_path: Path) -> None:
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    corpus = generate(seed, conversations=CONVERSATIONS)
    labels = [Label.parse(doc, line=i + 1) for i, doc in enumerate(corpus.labels)]
    with SqliteMemoryStore(str(tmp_path / "quality.db"), embedder=WordLlamaEmbedder()) as store:
        store.add_many([NewMemory(**m) for m in corpus.memories])  # type: ignore[arg-type]
        report = asyncio.run(evaluate(store, labels, budgets=SPENDS, config=GENEROUS))
    print(f"\nseed {seed}: {len(corpus.memories)} memories, {len(labels)} labels\n{report.table()}")
    assert report.missing_evidence == 0
    assert report.degraded == 0
    for spend in SPENDS:
        mine, best = report.score("ctxcore", spend), report.best_baseline(spend)
        assert mine.spent <= spend
        assert mine.recall >= QUALITY_FLOOR * best.recall, (
            f"seed {seed}, {spend} tokens: ctxcore {mine.recall:.3f} < {QUALITY_FLOOR} x {best.system} "
            f"{best.recall:.3f}"
        )
