"""Shared helpers for the benchmark gates: medians and p99s of a reference timed in the
same process, so that every gate is a ratio or a bound with headroom, not a bare time."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest


def sample(fn: Callable[[], object], rounds: int, warmup: int = 3) -> np.ndarray:
    """Wall times (seconds) of `rounds` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = np.empty(rounds)
    for k in range(rounds):
        t0 = time.perf_counter()
        fn()
        out[k] = time.perf_counter() - t0
    return out


@pytest.fixture
def timed() -> Callable[..., np.ndarray]:
    """`sample` as a fixture (bench modules are not importable from one another)."""
    return sample
