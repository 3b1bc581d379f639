"""Latency gates: percentiles of timed rounds, bounds on them, and their verdicts.

A gate times a subject (``ctxcore.pack_arrays`` on a user's candidates, say) for a number
of rounds, one call per round, and checks the rounds against bounds: a p99 and a median in
milliseconds, and a ratio of medians against a reference timed in the same process (an
exact numpy DP for packing, markupsafe escaping for formatting) so that a gate stays
meaningful on a slow or noisy CI machine: a neighbour that slows the subject slows the
reference alike. Both the pytest plugin and ``ctxcore bench`` measure through this module.

How rounds are taken (the same in both):

* warm-up: `DEFAULT_WARMUP` untimed calls first (caches, lazy imports, allocator pools);
* garbage collection: a full collection before the warm-up; the collector then stays on
  during the rounds (its pauses are latency a service sees) unless told to disable it
  (pytest-benchmark's ``--benchmark-disable-gc``);
* rounds: `DEFAULT_ROUNDS` by default; a p99 bound needs at least `MIN_ROUNDS` (with fewer,
  the "99th percentile" is just the maximum);
* the reference runs `DEFAULT_REFERENCE_ROUNDS` rounds spread evenly among the subject's
  rounds, each followed by one untimed subject call so the next timed round does not pay
  for the caches the reference evicted;
* percentiles: numpy's linear interpolation between the closest ranks.
"""

from __future__ import annotations

import enum
import gc
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from .._numbers import as_int, as_real

__all__ = [
    "DEFAULT_GATES",
    "DEFAULT_REFERENCE_ROUNDS",
    "DEFAULT_ROUNDS",
    "DEFAULT_WARMUP",
    "MAX_ROUNDS",
    "MIN_ROUNDS",
    "Gate",
    "GateBounds",
    "GateKind",
    "GateUsageError",
    "Interleaver",
    "LatencyGateFailed",
    "LatencyStats",
    "StageResult",
    "Verdict",
    "evaluate",
    "make_gates",
    "measure",
    "sample",
]

#: Timed rounds per gate unless told otherwise (~0.3 s for a 1,000-candidate pack).
DEFAULT_ROUNDS = 300
#: Fewest rounds a p99 bound accepts: below 100 the 99th percentile is the maximum.
MIN_ROUNDS = 100
#: Most timed (or reference) rounds a measurement takes: each round's time is kept, and
#: ten million rounds of the quickest stage already take minutes.
MAX_ROUNDS = 10_000_000
#: Untimed calls before the first timed round.
DEFAULT_WARMUP = 10
#: Reference rounds for a ratio bound (the reference is usually much slower; its median
#: over 11 rounds is stable to a few per cent).
DEFAULT_REFERENCE_ROUNDS = 11


#: The gates this repository's CI holds the shipped workloads to (bench/test_bench_gates.py),
#: which `ctxcore bench` applies by default. Packing: p99 of a 1,000-candidate pack <= 10 ms
#: (median ~0.13-0.25 ms on a shared 2-core machine; the bound leaves room for a scheduler
#: preemption, not for a slower packer) and at most half the time of the exact numpy DP.
#: Formatting: not slower than markupsafe escaping the bodies alone. Assembly over 1,000
#: in-process candidates with stored counts: p99 <= 25 ms (measured p50 1.6 ms, p99 2.1 ms
#: on a 2-core machine at a load average of ~4; the bound is for a neighbour's time slices
#: on a shared CI machine, where one preemption sets a p99); against a store, within the 45 ms
#: client timeout.
class GateBounds(TypedDict, total=False):
    """The bounds of one stage's gates, the keywords of `make_gates` and of the
    ``ctxcore_gate`` fixture's methods: ``ctxcore_gate.pack(cands, budget,
    **DEFAULT_GATES["pack"])`` type-checks."""

    p99_ms: float
    median_ms: float
    max_ratio: float


DEFAULT_GATES: Mapping[str, GateBounds] = {
    "pack": {"p99_ms": 10.0, "max_ratio": 0.5},
    "format": {"max_ratio": 1.0},
    "assemble": {"p99_ms": 25.0},
    "assemble-store": {"p99_ms": 45.0},
}


class GateUsageError(ValueError):
    """A gate that cannot be measured as asked: a bound that is not a positive finite
    number, too few rounds for a p99, or a ratio bound without a reference."""


class LatencyGateFailed(AssertionError):
    """A latency gate missed its bound; the message names the gate, the measured value
    and the bound."""


class GateKind(enum.Enum):
    """What a gate bounds."""

    P99 = "p99"
    MEDIAN = "median"
    RATIO = "ratio"


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Percentiles of timed rounds, in milliseconds.

    >>> s = LatencyStats.from_seconds([0.001] * 99 + [0.010])
    >>> (s.rounds, s.p50_ms, s.max_ms)
    (100, 1.0, 10.0)
    """

    rounds: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float

    @classmethod
    def from_seconds(cls, seconds: Sequence[float] | npt.NDArray[np.float64]) -> LatencyStats:
        """Summarize round durations given in seconds."""
        ms = np.asarray(seconds, dtype=np.float64) * 1e3
        if ms.size == 0:
            raise GateUsageError("no timed rounds to summarize")
        p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
        return cls(int(ms.size), float(ms.min()), p50, p90, p99, float(ms.max()), float(ms.mean()))

    def record(self) -> dict[str, float | int]:
        """The stats as JSON-ready values (milliseconds, rounded to the microsecond's tenth)."""
        return {
            "rounds": self.rounds,
            "min_ms": round(self.min_ms, 4),
            "p50_ms": round(self.p50_ms, 4),
            "p90_ms": round(self.p90_ms, 4),
            "p99_ms": round(self.p99_ms, 4),
            "max_ms": round(self.max_ms, 4),
            "mean_ms": round(self.mean_ms, 4),
        }


@dataclass(frozen=True, slots=True)
class Gate:
    """One bound: p99 or median in milliseconds, or the ratio of the subject's median to
    the reference's (at most `bound`)."""

    kind: GateKind
    bound: float

    def check(self, stats: LatencyStats, reference: LatencyStats | None) -> Verdict:
        """The verdict of this gate on `stats` (and `reference`, for a ratio)."""
        if self.kind is GateKind.P99:
            return Verdict(self.kind.value, stats.p99_ms, self.bound, "ms", stats.p99_ms <= self.bound)
        if self.kind is GateKind.MEDIAN:
            return Verdict(self.kind.value, stats.p50_ms, self.bound, "ms", stats.p50_ms <= self.bound)
        if reference is None:
            raise GateUsageError("a ratio bound needs a reference timed in the same run")
        ratio = stats.p50_ms / reference.p50_ms if reference.p50_ms > 0 else math.inf
        return Verdict(self.kind.value, ratio, self.bound, "x", ratio <= self.bound)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A gate's outcome: the measured `value` against its `bound` (``ms`` or ``x``)."""

    gate: str
    value: float
    bound: float
    unit: str
    passed: bool

    def describe(self, stage: str, reference_name: str | None = None) -> str:
        """One line, e.g. ``PASS  pack p99 1.21 ms <= 10 ms``."""
        op = "<=" if self.passed else ">"
        if self.unit == "ms":
            what = f"{self.gate} {self.value:.3f} ms {op} {self.bound:g} ms"
        else:
            vs = f" of {reference_name}'s median" if reference_name else " of the reference's median"
            what = f"median ratio {self.value:.3f}x{vs} {op} {self.bound:g}x"
        return f"{'PASS' if self.passed else 'FAIL'}  {stage} {what}"

    def record(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "gate": self.gate,
            "value": round(self.value, 4),
            "bound": self.bound,
            "unit": self.unit,
            "passed": self.passed,
        }


def _bound(name: str, value: object) -> float:
    x = as_real(value)  # a real number of any type, numpy's too
    if x is None or not 0 < x <= sys.float_info.max:  # NaN, inf and ints past float range fail too
        raise GateUsageError(f"{name} must be a positive finite number, got {value!r:.40}")
    return float(x)


def make_gates(
    *, p99_ms: float | None = None, median_ms: float | None = None, max_ratio: float | None = None
) -> tuple[Gate, ...]:
    """Gates from bounds (None: no such gate), validated.

    >>> [g.kind.value for g in make_gates(p99_ms=10, max_ratio=0.5)]
    ['p99', 'ratio']
    >>> make_gates(p99_ms=-1)
    Traceback (most recent call last):
    ...
    ctxcore.benchmarking.gates.GateUsageError: p99_ms must be a positive finite number, got -1
    """
    out = []
    if p99_ms is not None:
        out.append(Gate(GateKind.P99, _bound("p99_ms", p99_ms)))
    if median_ms is not None:
        out.append(Gate(GateKind.MEDIAN, _bound("median_ms", median_ms)))
    if max_ratio is not None:
        out.append(Gate(GateKind.RATIO, _bound("max_ratio", max_ratio)))
    return tuple(out)


def check_rounds(rounds: object, warmup: object, gates: Sequence[Gate], reference_rounds: object = 1) -> None:
    """Reject round counts the gates cannot be measured with."""
    counts = []
    for name, v, least, most in (
        ("rounds", rounds, 1, MAX_ROUNDS),
        ("warmup", warmup, 0, None),
        ("reference_rounds", reference_rounds, 1, MAX_ROUNDS),
    ):
        n = as_int(v)  # an integer of any type, numpy's too
        if n is None or n < least:
            raise GateUsageError(f"{name} must be an integer >= {least}, got {v!r:.40}")
        if most is not None and n > most:
            raise GateUsageError(f"{name} must be at most {most:,}, got {v!r:.40}")
        counts.append(n)
    if any(g.kind is GateKind.P99 for g in gates) and counts[0] < MIN_ROUNDS:
        raise GateUsageError(
            f"a p99 bound needs at least {MIN_ROUNDS} rounds (got {counts[0]}): with fewer, the "
            "99th percentile is just the slowest round"
        )


def evaluate(gates: Sequence[Gate], stats: LatencyStats, reference: LatencyStats | None) -> tuple[Verdict, ...]:
    """Every gate's verdict."""
    return tuple(g.check(stats, reference) for g in gates)


@dataclass
class Interleaver:
    """Runs the reference's rounds spread evenly among the subject's: call `before_round`
    before each subject call (the first `skip` of them untimed warm-up calls). After a reference round it makes one untimed
    subject call, so that the next timed round starts with warm caches."""

    subject: Callable[[], object]
    reference: Callable[[], object] | None
    rounds: int
    reference_rounds: int
    timer: Callable[[], float] = time.perf_counter
    skip: int = 0
    reference_times: list[float] = field(default_factory=list)
    _next: int = 0
    _schedule: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        # `skip` calls come first that are not rounds (pytest-benchmark calls its setup
        # before warm-up calls too); the reference goes among the timed rounds only.
        if self.reference is not None:
            n = min(self.reference_rounds, self.rounds)
            self._schedule = frozenset(self.skip + k * self.rounds // n for k in range(n))

    def before_round(self) -> None:
        """Run a reference round if one is due before the next subject round."""
        k = self._next
        self._next += 1
        if self.reference is not None and k in self._schedule:
            t0 = self.timer()
            self.reference()
            self.reference_times.append(self.timer() - t0)
            self.subject()


def measure(
    subject: Callable[[], object],
    *,
    rounds: int = DEFAULT_ROUNDS,
    warmup: int = DEFAULT_WARMUP,
    reference: Callable[[], object] | None = None,
    reference_rounds: int = DEFAULT_REFERENCE_ROUNDS,
    disable_gc: bool = False,
    timer: Callable[[], float] = time.perf_counter,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]:
    """Time `rounds` calls of `subject` (seconds each), with the reference interleaved.

    Returns:
        The subject's round times, and the reference's (None without a reference).

    >>> times, ref = measure(lambda: sum(range(100)), rounds=20, warmup=2)
    >>> times.shape, ref is None
    ((20,), True)
    """
    gc.collect()
    for _ in range(warmup):
        subject()
    if reference is not None:
        reference()  # its own warm-up
    inter = Interleaver(subject, reference, rounds, reference_rounds, timer)
    out = np.empty(rounds)
    was_enabled = gc.isenabled()
    if disable_gc:
        gc.disable()
    try:
        for k in range(rounds):
            inter.before_round()
            t0 = timer()
            subject()
            out[k] = timer() - t0
    finally:
        if was_enabled:
            gc.enable()
    ref = np.array(inter.reference_times) if reference is not None else None
    return out, ref


def sample(fn: Callable[[], object], rounds: int, warmup: int = 3) -> npt.NDArray[np.float64]:
    """Wall times (seconds) of `rounds` calls of `fn`, after `warmup` untimed calls.

    >>> sample(lambda: None, rounds=5).shape
    (5,)
    """
    return measure(fn, rounds=rounds, warmup=warmup)[0]


@dataclass(frozen=True)
class StageResult:
    """One gated measurement: a stage on a workload, its stats, the reference's, the
    verdicts, and the raw round times (seconds) for plots."""

    stage: str
    workload: Mapping[str, Any]
    stats: LatencyStats
    verdicts: tuple[Verdict, ...]
    times: npt.NDArray[np.float64] = field(repr=False)
    reference_name: str | None = None
    reference: LatencyStats | None = None
    reference_times: npt.NDArray[np.float64] | None = field(default=None, repr=False)
    warmup: int = DEFAULT_WARMUP

    @property
    def passed(self) -> bool:
        """Every gate passed."""
        return all(v.passed for v in self.verdicts)

    def failures(self) -> list[str]:
        """One line per failed gate."""
        return [v.describe(self.stage, self.reference_name) for v in self.verdicts if not v.passed]

    def record(self) -> dict[str, Any]:
        """JSON-ready record (the shape `report.schema.json` documents for one stage)."""
        rec: dict[str, Any] = {"stage": self.stage, "workload": dict(self.workload), "warmup": self.warmup}
        rec.update(self.stats.record())
        rec["reference"] = None if self.reference is None else {"name": self.reference_name, **self.reference.record()}
        rec["gates"] = [v.record() for v in self.verdicts]
        rec["passed"] = self.passed
        return rec
