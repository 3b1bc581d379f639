"""Latency gates users run in their own CI: ctxcore's stages timed on their data.

Three ways in, one machinery (`gates`): the pytest plugin (the ``ctxcore_gate`` fixture
and marker, on pytest-benchmark; `pytest_plugin`), ``ctxcore bench`` on the command line
(`command`), and these functions. The reference workloads ship with the package
(`workloads`); pictures are drawn with matplotlib (`plots`). Install the extras with
``pip install 'ctxcore-llm[bench]'`` (pytest-benchmark, matplotlib, markupsafe).

>>> from ctxcore.benchmarking import LatencyStats, load_workload, make_gates, measure, evaluate
>>> import ctxcore
>>> ids, tokens, scores = load_workload("pack-memory").pack_columns("cl100k_base")
>>> times, _ = measure(lambda: ctxcore.pack_arrays(ids, tokens, scores, 8000), rounds=100)
>>> stats = LatencyStats.from_seconds(times)
>>> [v.passed for v in evaluate(make_gates(p99_ms=1000), stats, None)]
[True]
"""

from __future__ import annotations

from .gates import (
    DEFAULT_GATES,
    DEFAULT_REFERENCE_ROUNDS,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    MAX_ROUNDS,
    MIN_ROUNDS,
    Gate,
    GateBounds,
    GateKind,
    GateUsageError,
    LatencyGateFailed,
    LatencyStats,
    StageResult,
    Verdict,
    evaluate,
    make_gates,
    measure,
    sample,
)
from .references import numpy_dp
from .workloads import (
    STAGES,
    CandidateSet,
    WorkloadError,
    default_workload,
    load_workload,
    read_candidates,
    workload_names,
)

__all__ = [
    "DEFAULT_GATES",
    "DEFAULT_REFERENCE_ROUNDS",
    "DEFAULT_ROUNDS",
    "DEFAULT_WARMUP",
    "MAX_ROUNDS",
    "MIN_ROUNDS",
    "STAGES",
    "CandidateSet",
    "Gate",
    "GateBounds",
    "GateKind",
    "GateUsageError",
    "LatencyGateFailed",
    "LatencyStats",
    "StageResult",
    "Verdict",
    "WorkloadError",
    "default_workload",
    "evaluate",
    "load_workload",
    "make_gates",
    "measure",
    "numpy_dp",
    "read_candidates",
    "sample",
    "workload_names",
]
