"""Admission control: refuse at arrival the calls that cannot finish inside their deadline.

A call that the server accepts and then answers late has cost the server its work and
the caller its deadline; refused at arrival, it costs neither, and the caller can go to
another replica at once. `Admission` decides, for each AssembleContext, before anything
else is done for it:

- **bounded queue**: at most ``max_queue`` assemblies are admitted at a time; beyond it
  the call gets RESOURCE_EXHAUSTED with a retry hint (``grpc-retry-pushback-ms`` in the
  trailing metadata, gRPC's own pushback key) of the time the admitted calls are expected
  to take to drain;
- **service-time estimate**: an admitted assembly's retrieval is cut to the caller's
  deadline, so what can make it late is the part after retrieval (scoring, pricing,
  packing, formatting, the response) and the wait for the CPU behind the calls already
  admitted. That *tail* is modelled from recent calls as ``a + b x ahead``, where
  ``ahead`` is the number of admitted calls at arrival, fitted by exponentially weighted
  least squares (the newest calls count most), plus a margin of three times the recent
  mean absolute error, plus the event loop's lag in the share of recent calls that let
  the loop run once admitted (a call whose branches all answer at once does not). A call
  whose deadline leaves less than ``min_retrieval_ms`` + that estimate + the response
  headroom is refused at once: RESOURCE_EXHAUSTED with a retry hint when load is why
  (see `Admission.decide`), DEADLINE_EXCEEDED when its deadline is too short for an
  assembly on a quiet server; an admitted
  call's retrieval wall leaves the estimated tail free, so the answer is back inside the
  deadline;
- **turns** (``max_running``; by default one with the SQLite store read in the server's
  own process, see ``ctxcore.service.config.DEFAULT_MAX_RUNNING``): at most that many
  ordinary assemblies run at once; the others wait their turn in arrival order, each only
  as long as its deadline leaves room for a retrieval and the estimated tail, and is then
  refused with RESOURCE_EXHAUSTED (``refused-wait``) without having done any work; a call
  whose deadline the waiters ahead of it are expected to outlast (at recent turns' length
  each, measured by `Turns`) is refused so at once. While the line is overloaded (more
  than ``LIFO_AFTER_WAITERS`` per turn wait, in arrival order the newest would not get its
  turn in the time it has left, and either by far, ``LIFO_LINE_FACTOR`` times, or a call
  was turned away at arrival for the line since it was last served in time), a turn goes
  to the newest waiter, and a new call is not refused for the line (it is served next):
  the oldest have the least time left and would answer late or degraded; they are refused
  when their time runs out. A line that arrival order serves in time or nearly (a closed
  loop at capacity, in a slow spell too) stays in arrival order, however long its first
  waiter has waited: newest-first would serve the same few callers over and over while
  the others wait out their deadlines. On a host where the
  assemblies are CPU-bound, one that runs alone finishes its retrieval inside its wall,
  where several sharing the cores (and the GIL) all run out of it and answer degraded;
- **saturation**: while the event loop runs its callbacks more than ``max_lag_ms`` (or a
  tenth of the call's remaining time) late, tick after tick of a probe timer, the CPU is saturated
  and every call admitted now delays the arrival of the next ones; new calls get
  RESOURCE_EXHAUSTED (with a retry hint) until the admitted ones have drained the backlog.

Every refusal carries ``ctxcore-admission`` in the trailing metadata (``refused-deadline``,
``refused-queue``, ``refused-wait`` or ``refused-load``), so a client can tell a refusal at arrival from a call that ran out
of time, and the metrics count them by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ADMISSION_KEY",
    "DEFAULT_MAX_QUEUE",
    "RETRY_PUSHBACK_KEY",
    "Admission",
    "Decision",
    "LIFO_AFTER_WAITERS",
    "LIFO_LINE_FACTOR",
    "LOADED_LAG_MS",
    "TailModel",
    "Turns",
]

#: Trailing-metadata key that marks a refusal at arrival, with its reason as the value.
ADMISSION_KEY = "ctxcore-admission"
#: gRPC's retry pushback key: milliseconds to wait before trying again.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
#: Assemblies admitted at a time, at most. With ~5 ms of CPU per assembly on two cores,
#: 64 admitted calls are ~160 ms of work: three times the 45 ms client timeout, so the
#: queue bound only bites when the deadline estimate has nothing to go on (calls without
#: a deadline); calls with one are refused by the estimate long before.
DEFAULT_MAX_QUEUE = 64
#: Event-loop lag beyond which new calls are refused while others are admitted: a loop
#: this late delays every step of every call by as much, and the arrivals queued behind
#: it wait longer than a 45 ms deadline can spare.
DEFAULT_MAX_LAG_MS = 4.0
#: Event-loop lag (`Admission.lag_ms`: it rises at once and falls over a few ticks) beyond
#: which the loop counts as busy when a call is refused for its deadline: a call that
#: reaches admission while the loop runs this late waited for the loop before it got there
#: (where its deadline went), so it is refused for load, RESOURCE_EXHAUSTED. An idle
#: loop's probe wakes a few tenths of a millisecond late. (On a machine whose other work
#: keeps this process waiting for a core, the loop runs late too, and a refusal then is
#: for that load.)
LOADED_LAG_MS = 1.0
#: ... or beyond this share of the call's remaining time, whichever is larger: a call with
#: seconds to spare is not refused for a few milliseconds of lag.
LAG_SHARE_OF_DEADLINE = 0.1
#: A server is quiet, for a deadline refusal, when no call is admitted and none has ended
#: for this long. Under a closed loop of callers the server runs one call after another
#: (turns): at each arrival nothing may be admitted, and the calls behind it wait in
#: gRPC's queue, not in admission; a call that ended a moment ago says the server is busy,
#: and a call arriving with little of its deadline left lost it in that queue.
QUIET_AFTER_MS = 100.0
#: While the server sheds load (it refused a call for load in the last `SHEDDING_FOR_MS`),
#: a call is admitted only with this many times the time an assembly needs. Under load the
#: time a call has left when the server first sees it is its deadline less its wait in
#: gRPC's queue, which the server cannot see and which varies from call to call by an
#: assembly's length or more (each assembly holds the event loop while the calls behind it
#: queue). Admitting every call that can just finish keeps that queue as long as the
#: deadlines allow: calls then arrive with about the need left, and the spread puts a share
#: of them below the least any assembly needs or past their deadline by the time the answer
#: is back. Twice the need settles the line where calls arrive with that much left: the
#: calls shed go back early (RESOURCE_EXHAUSTED with a retry hint), and those admitted
#: have time to spare. Measured with 16 closed-loop callers at a 45 ms deadline on two
#: cores (docs/performance/service.md): 0.1-0.25% of calls DEADLINE_EXCEEDED against
#: 1.5-4.6% admitting to the need, and more answers a second.
SHED_NEED_FACTOR = 2.0
#: How long after a refusal for load the server counts as shedding, in ms (a call refused
#: only for the reserve does not count: the shedding ends once calls meet the need again).
SHEDDING_FOR_MS = 100.0
#: Half-life of a finished call's weight in the tail model, in seconds: at a few hundred
#: calls a second the model follows the last ~100 calls, and after a quiet second what it
#: learned under load has faded into the prior.
_HALF_LIFE_S = 0.25
#: Weight of the prior (no calls ahead, a tail of the assembly's packing headroom): it
#: holds the model where the design puts it until calls say otherwise, and pulls it back
#: when refusals leave it without fresh calls.
_PRIOR_WEIGHT = 1.0
#: Pulls the slope toward 0 while few calls have been seen at different queue lengths.
_RIDGE = 4.0
#: Weight of the newest call in `Admission.waited_share` (exponentially weighted): it
#: follows the last few dozen calls.
_WAITED_WEIGHT = 0.05
#: The margin over the fitted tail, in mean absolute errors: for errors with an
#: exponential tail, mean x ln(100) = 4.6 x mean is their p99.
_MARGIN_MAES = 4.6
#: The tail estimate is at most this many times the longest recent tail.
PEAK_FACTOR = 2.0
#: How often the loop-lag probe wakes, in seconds.
_LAG_PERIOD_S = 0.005
#: The probe sleeps once no call has arrived for this long and none is admitted: an idle
#: server wakes for nothing (every 5 ms, the probe alone kept ~5% of a core busy), and the
#: next arrival wakes it. A loop that was idle has no backlog: the lag starts again at 0.
PROBE_IDLE_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict for one call.

    Attributes:
        admitted: whether the call may run.
        reason: ``"ok"``, ``"refused-deadline"``, ``"refused-queue"`` or ``"refused-load"``.
        tail_ms: the estimated time the call needs after retrieval.
        details: the status details for a refusal (empty when admitted).
        retry_after_ms: for a refusal made for load, the suggested wait before retrying.
        overload: for a refusal, whether load is why the call cannot finish (see
            `Admission.decide`): the server answers such a refusal RESOURCE_EXHAUSTED,
            and one whose deadline is too short for an assembly on a quiet server
            DEADLINE_EXCEEDED.
    """

    admitted: bool
    reason: str
    tail_ms: float
    details: str = ""
    retry_after_ms: int = 0
    overload: bool = False


class TailModel:
    """Exponentially time-weighted least squares of a call's tail against the calls ahead.

    Args:
        prior_ms: the tail assumed before any call is seen (and again once they fade).

    >>> m = TailModel(prior_ms=5.0)
    >>> for i, ahead in enumerate((0, 4, 8) * 40):
    ...     m.observe(ahead, 2.0 + 0.5 * ahead, now=i * 0.001)
    >>> round(m.predict(6, now=0.12), 1), m.margin(now=0.12) < 1.0
    (5.0, True)
    >>> round(m.predict(6, now=10.0), 1)  # ten quiet seconds later: back to the prior
    5.0
    """

    __slots__ = ("prior_ms", "_sw", "_sx", "_sy", "_sxx", "_sxy", "_se", "_t", "n", "peak_ms")

    def __init__(self, prior_ms: float = 0.0) -> None:
        self.prior_ms = prior_ms
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._se = 0.0
        self._t = 0.0
        self.n = 0
        #: the longest recent tail (fading like the samples): a cap on extrapolation
        self.peak_ms = 0.0

    def _age(self, now: float) -> None:
        if now > self._t:
            f = 0.5 ** ((now - self._t) / _HALF_LIFE_S)
            self._sw *= f
            self._sx *= f
            self._sy *= f
            self._sxx *= f
            self._sxy *= f
            self._se *= f
            self.peak_ms *= f
            self._t = now

    def coefficients(self, now: float | None = None) -> tuple[float, float]:
        """``(a, b)`` of ``tail = a + b x ahead``; neither is ever negative."""
        self._age(time.monotonic() if now is None else now)
        sw = self._sw + _PRIOR_WEIGHT
        mx, my = self._sx / sw, (self._sy + _PRIOR_WEIGHT * self.prior_ms) / sw
        var = self._sxx - sw * mx * mx
        cov = self._sxy - self._sx * my
        b = max(0.0, cov / (max(0.0, var) + _RIDGE))
        return max(0.0, my - b * mx), b

    def predict(self, ahead: int, now: float | None = None) -> float:
        """The fitted tail in ms for a call with `ahead` admitted calls before it."""
        a, b = self.coefficients(now)
        return a + b * ahead

    def margin(self, now: float | None = None) -> float:
        """The margin kept over the fit, in ms."""
        self._age(time.monotonic() if now is None else now)
        return _MARGIN_MAES * self._se / (self._sw + _PRIOR_WEIGHT)

    def observe(self, ahead: int, tail_ms: float, now: float | None = None) -> None:
        """Add one finished call: `ahead` calls were admitted when it arrived, and it
        took `tail_ms` after its retrieval."""
        if not math.isfinite(tail_ms) or tail_ms < 0:
            return
        t = time.monotonic() if now is None else now
        self._se += abs(tail_ms - self.predict(ahead, t))
        self.peak_ms = max(self.peak_ms, tail_ms)
        self._sw += 1.0
        self._sx += ahead
        self._sy += tail_ms
        self._sxx += ahead * ahead
        self._sxy += ahead * tail_ms
        self.n += 1


class Admission:
    """The admission state of one server.

    Args:
        max_queue: assemblies admitted at a time, at most.
        min_retrieval_ms: the least retrieval time worth running a call for.
        response_headroom_ms: time kept for the response after the assembly.
        floor_tail_ms: the least tail assumed (the assembly's own packing headroom).
        max_lag_ms: the event loop's sustained lag beyond which calls are refused while
            others are admitted (or a tenth of a call's remaining time, if more).
        probe_idle_after_s: the lag probe sleeps after this long without an arrival while
            no call is admitted (`PROBE_IDLE_AFTER_S`); the next `decide` wakes it.

    >>> adm = Admission(max_queue=2, min_retrieval_ms=1.0, response_headroom_ms=1.0, floor_tail_ms=5.0)
    >>> adm.decide(45.0).admitted, adm.decide(3.0).reason
    (True, 'refused-deadline')
    """

    def __init__(
        self,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        min_retrieval_ms: float = 1.0,
        response_headroom_ms: float = 1.0,
        floor_tail_ms: float = 0.0,
        max_lag_ms: float = DEFAULT_MAX_LAG_MS,
        probe_idle_after_s: float = PROBE_IDLE_AFTER_S,
    ) -> None:
        if not (math.isfinite(probe_idle_after_s) and probe_idle_after_s >= 0):
            raise ValueError(f"probe_idle_after_s must be a finite number >= 0, got {probe_idle_after_s!r}")
        self.max_queue = max_queue
        self.min_retrieval_ms = min_retrieval_ms
        self.response_headroom_ms = response_headroom_ms
        self.floor_tail_ms = floor_tail_ms
        self.max_lag_ms = max_lag_ms
        self.model = TailModel(prior_ms=floor_tail_ms)
        self.admitted = 0
        self.lag_ms = 0.0
        #: The share of recent admitted calls that let the event loop run between their
        #: admission and their end (1 until calls show otherwise): see `tail_estimate`.
        self.waited_share = 1.0
        self.sustained_lag_ms = 0.0
        self._last_late = 0.0
        self._sojourn_ms = 0.0
        self._probe: asyncio.Task[None] | None = None
        self._idle_after_s = float(probe_idle_after_s)
        self._last_arrival = time.monotonic()
        #: `time.monotonic()` when an admitted call last ended (-inf: none yet).
        self.last_release = -math.inf
        #: `time.monotonic()` of the last refusal for load (-inf: none yet).
        self.last_shed = -math.inf
        self._for_reserve = False
        self._asleep = False
        self._wake: asyncio.Event | None = None

    # ---- the loop-lag probe ----------------------------------------------------------

    def start(self) -> None:
        """Start measuring the event loop's lag (call from the loop)."""
        if self._probe is None:
            self._wake = asyncio.Event()
            self._last_arrival = time.monotonic()
            self._probe = asyncio.get_running_loop().create_task(self._measure_lag(), name="ctxcore-loop-lag")

    async def stop(self) -> None:
        """Stop the probe."""
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None  # (a sleeping probe left its sleep on the way out)

    @property
    def probing(self) -> bool:
        """Whether the loop-lag probe is measuring: started, not stopped, and not asleep
        for want of calls (see `PROBE_IDLE_AFTER_S`)."""
        return self._probe is not None and not self._asleep

    async def _measure_lag(self) -> None:
        lag = 0.0
        assert self._wake is not None
        while True:
            if not self.admitted and time.monotonic() - self._last_arrival >= self._idle_after_s:
                self.lag_ms = self.sustained_lag_ms = self._last_late = lag = 0.0
                self._wake.clear()
                self._asleep = True
                try:
                    await self._wake.wait()
                finally:
                    self._asleep = False
                continue
            t0 = time.perf_counter()
            await asyncio.sleep(_LAG_PERIOD_S)
            late = max(0.0, (time.perf_counter() - t0 - _LAG_PERIOD_S) * 1000.0)
            # Rise at once, fall over a few periods: a single quiet tick does not say the
            # backlog is gone.
            lag = late if late > lag else 0.5 * lag + 0.5 * late
            self.lag_ms = lag
            # Saturation is lateness tick after tick; one long stall (the process was not
            # scheduled for a while) followed by a prompt tick is not.
            self.sustained_lag_ms = min(late, self._last_late)
            self._last_late = late

    # ---- decisions -------------------------------------------------------------------

    def tail_estimate(self) -> float:
        """The tail a call arriving now should be given, in ms: the model's, plus the
        loop's current lag in the share of recent calls that waited for the loop once
        admitted (each step of such a call waits that long for the loop; a call whose
        branches all answer at once runs from its admission to its answer without
        letting the loop run, and its tail is its own work, which the model has)."""
        m = self.model
        est = m.predict(self.admitted) + m.margin()
        if m.peak_ms > 0:
            # The line is fitted where calls were seen; far beyond, calls mostly waiting on
            # retrieval do not each add their slope, so twice the longest recent tail caps it.
            est = min(est, PEAK_FACTOR * m.peak_ms)
        return max(self.floor_tail_ms, est) + self.lag_ms * self.waited_share

    def idle_need_ms(self) -> float:
        """The time an assembly needs here with nobody ahead and a prompt event loop, in
        ms: the least retrieval, the model's tail for a call with no calls ahead (without
        the loop's lag) and the response headroom."""
        m = self.model
        tail = max(self.floor_tail_ms, m.predict(0) + m.margin())
        return self.min_retrieval_ms + tail + self.response_headroom_ms

    def quiet(self) -> bool:
        """Whether no call is admitted and none ended in the last `QUIET_AFTER_MS`."""
        return not self.admitted and (time.monotonic() - self.last_release) * 1000.0 >= QUIET_AFTER_MS

    def busy_besides_one(self) -> bool:
        """Whether, for an admitted call, another call is admitted or one ended in the last
        `QUIET_AFTER_MS`."""
        return self.admitted > 1 or (time.monotonic() - self.last_release) * 1000.0 < QUIET_AFTER_MS

    def shedding(self) -> bool:
        """Whether a call was refused for load in the last `SHEDDING_FOR_MS` (see
        `SHED_NEED_FACTOR`)."""
        return (time.monotonic() - self.last_shed) * 1000.0 < SHEDDING_FOR_MS

    def shed(self) -> None:
        """Count a refusal for load that the server made after admission (a call whose
        turn did not come in time); `decide` counts its own."""
        self.last_shed = time.monotonic()

    def floor_need_ms(self) -> float:
        """The least time any assembly needs here, in ms, learned from nothing: the least
        retrieval, the floor of the tail and the response headroom."""
        return self.min_retrieval_ms + self.floor_tail_ms + self.response_headroom_ms

    def decide(self, remaining_ms: float | None) -> Decision:
        """Whether a call with `remaining_ms` to its deadline (None: no deadline) may run.

        A queue or saturation refusal is made for load (`Decision.overload`); so is a
        deadline refusal when the deadline would be enough with nobody ahead and a prompt
        loop (`idle_need_ms`: what makes the call late is the calls ahead or the loop's
        lag), while the event loop runs more than `LOADED_LAG_MS` late, or while the server
        is not `quiet` and the deadline is above `floor_need_ms` (the call's time then went
        to waiting in line before admission saw it, in the server's gRPC queue or in its
        client: under load the tail learned for a call with nobody ahead is itself
        inflated). Only a call whose deadline is too short for an assembly on a quiet
        server, or below the least any assembly needs, is refused for its deadline alone.
        While the server is `shedding`, a call needs `SHED_NEED_FACTOR` times the time an
        assembly needs, and one refused for the difference is refused for load.

        An admitted call must be `release`d when it ends.
        """
        self._for_reserve = False
        d = self._decide(remaining_ms)
        if d.overload and not self._for_reserve:
            # A call refused only for the reserve does not prolong the shedding: it ends
            # once calls meet the need itself again.
            self.last_shed = time.monotonic()
        return d

    def _decide(self, remaining_ms: float | None) -> Decision:
        self._last_arrival = time.monotonic()
        if self._asleep:
            assert self._wake is not None
            self._wake.set()
        tail = self.tail_estimate()
        if self.admitted >= self.max_queue:
            wait = max(1, math.ceil(self._sojourn_ms or tail))
            return Decision(
                False,
                "refused-queue",
                tail,
                f"the server's queue is full ({self.admitted} assemblies admitted, max_queue = "
                f"{self.max_queue}); retry in {wait} ms",
                wait,
                overload=True,
            )
        if (
            self.admitted
            and remaining_ms is not None
            and self.sustained_lag_ms > max(self.max_lag_ms, LAG_SHARE_OF_DEADLINE * remaining_ms)
        ):
            # The loop runs every callback this late: the CPU is saturated, and each call
            # admitted now slows the arrival of the next. Let the admitted ones finish.
            wait = max(1, math.ceil(self.sustained_lag_ms))
            return Decision(
                False,
                "refused-load",
                tail,
                f"the server is saturated (event loop {self.sustained_lag_ms:.1f} ms late with {self.admitted} "
                f"assemblies admitted, {remaining_ms:.2f} ms left at arrival); retry in {wait} ms",
                wait,
                overload=True,
            )
        if remaining_ms is not None:
            need = self.min_retrieval_ms + tail + self.response_headroom_ms
            shedding = self.shedding()
            if remaining_ms < (SHED_NEED_FACTOR * need if shedding else need):
                self._for_reserve = remaining_ms >= need
                overload = (
                    remaining_ms >= need
                    or self.lag_ms > LOADED_LAG_MS
                    or remaining_ms >= self.idle_need_ms()
                    or (not self.quiet() and remaining_ms >= self.floor_need_ms())
                )
                return Decision(
                    False,
                    "refused-deadline",
                    tail,
                    f"{remaining_ms:.2f} ms left at arrival; an assembly needs about {need:.2f} ms "
                    f"now ({self.min_retrieval_ms:g} ms retrieval + {tail:.2f} ms estimated for "
                    f"scoring, packing, formatting and {self.admitted} calls ahead + "
                    f"{self.response_headroom_ms:g} ms response headroom)"
                    + (f", {SHED_NEED_FACTOR:g} times that while the server sheds load" if shedding else "")
                    + (
                        f"; refused for load ({self.admitted} admitted, event loop {self.lag_ms:.1f} ms late, "
                        f"about {self.idle_need_ms():.2f} ms with nobody ahead and a prompt loop)"
                        if overload
                        else ""
                    ),
                    max(1, math.ceil(self._sojourn_ms or tail)) if overload else 0,
                    overload=overload,
                )
        self.admitted += 1
        return Decision(True, "ok", tail)

    def release(self, ahead: int, sojourn_ms: float, retrieval_ms: float | None, waited: bool = True) -> None:
        """A call admitted with `ahead` calls before it ended after `sojourn_ms` (0: its
        time says nothing of an ordinary call's), of which `retrieval_ms` went to retrieval
        (None when it never got that far); `waited`: it let the event loop run on the way."""
        self.admitted = max(0, self.admitted - 1)
        self.last_release = time.monotonic()
        if sojourn_ms > 0:  # a call refused before it started says nothing of the time one takes
            self._sojourn_ms = 0.9 * self._sojourn_ms + 0.1 * sojourn_ms if self._sojourn_ms else sojourn_ms
            self.waited_share += _WAITED_WEIGHT * (float(waited) - self.waited_share)
        if retrieval_ms is not None:
            self.model.observe(ahead, max(0.0, sojourn_ms - retrieval_ms))

    @property
    def sojourn_ms(self) -> float:
        """Recent admitted calls' time from their start to their end, in ms
        (exponentially weighted; 0 before any)."""
        return self._sojourn_ms


#: A line is congested only when more than this many calls per turn wait (and arrival
#: order would not serve its newest in time, see `Turns.lifo`): a short line goes in
#: arrival order whatever the deadlines.
LIFO_AFTER_WAITERS = 4
#: ... and only when, in arrival order, its newest waiter would get its turn after the time
#: it has left, and either after this many times that time or since a call was turned away
#: at arrival for the line: that is overload (more calls arrive than the turns serve). A
#: line only a little too long, turning nobody away, is a slow spell of a closed loop at
#: capacity, which arrival order serves best: the calls near its head still get their
#: turns in time, where newest-first would serve the same few callers over and over while
#: the rest wait out their deadlines.
LIFO_LINE_FACTOR = 1.5


class _Waiter:
    """One call in line: its future, when it joined and when it gives up (None: never)."""

    __slots__ = ("fut", "since", "until")

    def __init__(self, fut: asyncio.Future[None], since: float, until: float | None) -> None:
        self.fut = fut
        self.since = since
        self.until = until


#: Weight of the newest turn in `Turns.turn_ms` (exponentially weighted): at a few hundred
#: turns a second it follows the last few dozen milliseconds.
_TURN_WEIGHT = 0.05


class Turns:
    """At most `limit` holders at a time; the others wait in line. A turn given back passes
    straight to a waiter: the first in line, unless arrival order would not serve the
    newest in time (adaptive LIFO, see `lifo`), and then the newest. Waiting can be bounded
    (`take` with a timeout) or cancelled without losing a turn. Use from one event loop.

    `turn_ms` is how long a turn lasts these days, in ms (0: not known): by default
    measured here, from the time between turns given back while every turn was held (the
    pace at which the line moves), so it is the turn's own length whatever a call does
    outside its turn; or given as a function.

    >>> async def demo():
    ...     t = Turns(1)
    ...     first = await t.take(None)
    ...     late = await t.take(0.01)  # the only turn is held: no turn within 10 ms
    ...     waiter = asyncio.ensure_future(t.take(1.0))
    ...     await asyncio.sleep(0)
    ...     t.give_back()  # straight to the waiter
    ...     return first, late, await waiter, t.running, t.waiting
    >>> asyncio.run(demo())
    (True, False, True, 1, 0)
    """

    __slots__ = (
        "limit",
        "running",
        "newest_first",
        "_given_turn_ms",
        "_waiting",
        "_full_since",
        "_interval_ms",
        "_overloaded",
    )

    def __init__(self, limit: int, turn_ms: Callable[[], float] | None = None) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        self.limit = limit
        self._given_turn_ms = turn_ms
        self.running = 0
        #: How many turns went to the newest waiter (`lifo`) so far.
        self.newest_first = 0
        self._waiting: deque[_Waiter] = deque()
        # Since when every turn has been held (None: one is free), and the weighted time
        # between turns given back while they all were.
        self._full_since: float | None = None
        self._interval_ms = 0.0
        # A call was turned away at arrival for the line since the line was last served
        # in time in arrival order.
        self._overloaded = False

    def turn_ms(self) -> float:
        """How long a turn lasts these days, in ms (0: not known yet).

        >>> async def demo():
        ...     t = Turns(1)
        ...     await t.take(None)
        ...     waiter = asyncio.ensure_future(t.take(None))
        ...     await asyncio.sleep(0.02)  # a 20 ms turn, with a call waiting for the next
        ...     t.give_back()
        ...     await waiter
        ...     return t.turn_ms()
        >>> 15.0 < asyncio.run(demo()) < 200.0
        True
        """
        if self._given_turn_ms is not None:
            return self._given_turn_ms()
        return self._interval_ms * self.limit

    def line_ms(self) -> float:
        """How long the waiters in line are expected to take to get their turns, at
        `turn_ms` each, in ms."""
        return len(self._waiting) / self.limit * self.turn_ms()

    @property
    def waiting(self) -> int:
        """How many wait for a turn."""
        return len(self._waiting)

    async def take(self, timeout: float | None) -> bool:
        """Wait for a turn, at most `timeout` seconds (None: as long as it takes). True
        once the caller holds one (it must `give_back`), False when none came in time."""
        if self.running < self.limit and not self._waiting:
            self.running += 1
            if self.running == self.limit and self._full_since is None:
                self._full_since = time.monotonic()  # every turn is held from now
            return True
        if timeout is not None and timeout <= 0:
            return False
        now = time.monotonic()
        w = _Waiter(asyncio.get_running_loop().create_future(), now, None if timeout is None else now + timeout)
        self._waiting.append(w)
        try:
            async with asyncio.timeout(timeout):
                await w.fut
            return True
        except TimeoutError:
            self._leave(w)
            return False
        except BaseException:
            self._leave(w)
            raise

    def _leave(self, w: _Waiter) -> None:
        # A waiter that stops waiting: out of the line, or, if the turn reached it in the
        # meantime, the turn goes on to the next.
        if w.fut.done() and not w.fut.cancelled():
            self._full_since = None  # a turn nobody used says nothing of a turn's length
            self.give_back()
        else:
            with contextlib.suppress(ValueError):
                self._waiting.remove(w)

    def turned_away(self) -> None:
        """Note that a call was refused at arrival because the line ahead of it would
        outlast its deadline: the line is full, a sign of overload (see `lifo`)."""
        self._overloaded = True

    @property
    def lifo(self) -> bool:
        """Whether the next turn goes to the newest waiter: the line is congested, longer
        than `LIFO_AFTER_WAITERS` per turn, and in arrival order its newest waiter would get
        its turn only after the time it has left (everyone ahead at `turn_ms` each), and
        the line is overloaded: that wait is over `LIFO_LINE_FACTOR` times the time left,
        or a call was `turned_away` since the line was last served in time. Such a line
        is past what the turns serve in time: in arrival order every waiter would get its
        turn late (its answer degraded, or late once it travels back), where the newest
        has most of its time; the first is refused when its time runs out. A line that
        arrival order serves in time, or nearly (a closed loop at capacity, time to spare,
        a slow spell), goes in arrival order."""
        late = 0.0
        if len(self._waiting) > LIFO_AFTER_WAITERS * self.limit:
            newest = self._waiting[-1]
            line_ms = self.line_ms()
            if newest.until is not None and line_ms > 0:
                left_ms = (newest.until - time.monotonic()) * 1000.0
                late = line_ms / left_ms if left_ms > 0 else math.inf
        if late < 1.0:
            self._overloaded = False  # served in time: nobody turned away counts any more
            return False
        return self._overloaded or late >= LIFO_LINE_FACTOR

    def give_back(self) -> None:
        """End a turn: a waiter gets it (the first, or the newest while the line is
        congested: `lifo`), else one more is free."""
        now = time.monotonic()
        if self._full_since is not None and self.running >= self.limit:
            # Every turn was held since then: the line moved one place in this long.
            ms = (now - self._full_since) * 1000.0
            self._interval_ms = (
                ms if not self._interval_ms else ((1.0 - _TURN_WEIGHT) * self._interval_ms + _TURN_WEIGHT * ms)
            )
        while self._waiting:
            newest = self.lifo
            w = self._waiting.pop() if newest else self._waiting.popleft()
            if not w.fut.done():
                w.fut.set_result(None)
                self._full_since = now
                self.newest_first += newest
                return
        self.running = max(0, self.running - 1)
        self._full_since = None
