"""Shared helpers for the benchmark gates: the latency gates themselves come from ctxcore's
pytest plugin (the ``ctxcore_gate`` fixture, loaded through its entry point: the gates
users run are the ones CI runs); `timed` samples wall times with the same machinery; and
a SQLite memory store holding 100k memories, built once per session."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest
from bench_support import STORE_MEMORIES, Store100k, Timed, store_corpus

from ctxcore.benchmarking import sample
from ctxcore.memory import Scope
from ctxcore.stores import HashingEmbedder, NewMemory, SqliteMemoryStore


@pytest.fixture
def timed() -> Timed:
    """`ctxcore.benchmarking.sample` (wall times of `rounds` calls after `warmup` untimed
    ones) as a fixture; gates on a stage use the plugin's ``ctxcore_gate`` fixture."""
    return sample


# ---- a SQLite memory store holding 100k memories (built once per session) ----------------


@pytest.fixture(scope="session")
def store_100k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store100k]:
    """A `SqliteMemoryStore` with 100,000 memories (HashingEmbedder embeddings, exact
    cl100k_base counts), its embedding matrices loaded (`warm`)."""
    path = tmp_path_factory.mktemp("store") / "bench.db"
    large = Scope("org-00", "agent-0")
    t0 = time.perf_counter()
    with SqliteMemoryStore(path, embedder=HashingEmbedder()) as s:
        batch: list[NewMemory] = []
        for m in store_corpus(large):
            batch.append(m)
            if len(batch) == 10_000:
                s.add_many(batch)
                batch = []
        s.add_many(batch)
    print(f"\nbuilt a store of {STORE_MEMORIES} memories in {time.perf_counter() - t0:.1f} s")
    with SqliteMemoryStore(path) as s:
        s.warm()
        # As `ctxcore serve` does once its store is loaded: the bench process's long-lived
        # objects are kept out of the cyclic collector's full walks, which take 20-50 ms
        # here and would land in timed rounds as p99 outliers of the store, not its own.
        gc.collect()
        gc.freeze()
        try:
            yield Store100k(s, large, Scope("org-07", "agent-3"), STORE_MEMORIES)
        finally:
            gc.unfreeze()
