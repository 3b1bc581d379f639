"""Retrieval: the directive, hot-memory and cold-memory branches, run concurrently under
one shared wall.

The stage after budgeting. A branch that can answer at once (a `NowOrLater`, as the
SQLite store's branches are) is asked first, where retrieval runs: an answer at hand costs
no task. Each other branch runs as its own task with its own timeout, cut to
what is left of the wall. On Python 3.12 and later the tasks start eagerly
(`asyncio.eager_task_factory`): a branch that answers without waiting (a cache hit, a read
of microseconds) is done when its task is created, without a pass of the event loop, and
only the branches that wait are waited for. When the wall is reached the branches still
running are cancelled and given `CANCEL_GRACE_MS` to stop; a branch that completed is
kept. A source that ignores its cancellation (catches `CancelledError` and goes on) is
not waited for past the grace: its task is left to finish on its own, its result or
exception discarded, and its branch is recorded as a timeout that says so.
Every branch ends with a `BranchRecord`: ``ok``, ``timeout`` (its timeout or the wall
came first), ``error`` (the source raised, a `TimeoutError` or `CancelledError` of its
own included, or returned malformed data) or ``skipped``, with its latency. Memories are
checked against the request's scope here, before anything else sees them: a memory of
another organization or agent is dropped and counted, never used. A failed branch is
only recorded; nothing is retried wider, cached or substituted.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _core
from ._numbers import as_real
from .memory import LATER, Chain, MemoryBatch, MemoryRecord, NowOrLater, Query, Scope, Sources
from .result import Branch, BranchRecord, BranchStatus, Wall, WallSource

__all__ = [
    "DEFAULT_CLIENT_TIMEOUT_MS",
    "DEFAULT_COLD_TIMEOUT_MS",
    "DEFAULT_DIRECTIVE_TIMEOUT_MS",
    "DEFAULT_HOT_TIMEOUT_MS",
    "DEFAULT_SERVER_DEADLINE_MS",
    "CANCEL_GRACE_MS",
    "BranchTimeouts",
    "Retrieved",
    "compute_wall",
    "retrieve",
]

#: Client (outer) retrieval timeout: "IBEX_CONTEXT_TIMEOUT=45ms".
DEFAULT_CLIENT_TIMEOUT_MS = 45.0
#: Server retrieval wall: "IBEX_CONTEXT_DEADLINE_MS=40ms". The wall is the smaller of the two.
DEFAULT_SERVER_DEADLINE_MS = 40.0
#: Per-branch timeouts: "Directive timeout: 5ms. Hot-memory timeout: 15ms. Cold-memory
#: timeout: 45ms." (the cold one is in practice bounded by the wall).
DEFAULT_DIRECTIVE_TIMEOUT_MS = 5.0
DEFAULT_HOT_TIMEOUT_MS = 15.0
DEFAULT_COLD_TIMEOUT_MS = 45.0
#: How long a cancelled branch is given to stop before the call goes on without it.
#: A source that honours cancellation stops within a pass or two of the event loop.
CANCEL_GRACE_MS = 2.0
#: Longest error text kept in a branch record: enough to diagnose, never a memory dump.
_MAX_ERROR_CHARS = 200


@dataclass(frozen=True, slots=True)
class BranchTimeouts:
    """Per-branch timeouts in milliseconds.

    >>> BranchTimeouts().hot_ms
    15.0
    """

    directive_ms: float = DEFAULT_DIRECTIVE_TIMEOUT_MS
    hot_ms: float = DEFAULT_HOT_TIMEOUT_MS
    cold_ms: float = DEFAULT_COLD_TIMEOUT_MS

    def __post_init__(self) -> None:
        for name in ("directive_ms", "hot_ms", "cold_ms"):
            v = getattr(self, name)
            ms = as_milliseconds(v)
            if ms is None:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r:.40}")
            object.__setattr__(self, name, ms)

    def of(self, branch: Branch) -> float:
        """The timeout of `branch`, in milliseconds."""
        return {Branch.DIRECTIVE: self.directive_ms, Branch.HOT: self.hot_ms, Branch.COLD: self.cold_ms}[branch]


@dataclass(frozen=True, slots=True)
class Retrieved:
    """What the three branches brought back, already scope-checked.

    Attributes:
        directive: the directive text, or None (no directive, or the branch failed).
        memories: in-scope memories, hot first then cold, in the order the sources gave (a
            sequence that keeps a store's `MemoryBatch` as columns until a record is read).
        out_of_scope: memories a source returned for another organization or agent:
            dropped, kept here only to be counted and traced (by id).
        branches: one record per branch, directive, hot, cold.
        wall: the wall that bounded retrieval.
    """

    directive: str | None
    memories: Sequence[MemoryRecord]
    out_of_scope: tuple[MemoryRecord, ...]
    branches: tuple[BranchRecord, ...]
    wall: Wall

    def branch(self, which: Branch) -> BranchRecord:
        """The record of one branch."""
        return next(b for b in self.branches if b.branch == which)


def as_milliseconds(v: object) -> float | None:
    """`v` as a plain float when it is a duration in ms: a finite real number >= 0 of any
    type (numpy's too; not a bool, not an int too large for a float), else None.

    >>> as_milliseconds(30), as_milliseconds(-1), as_milliseconds(10**400)
    (30.0, None, None)
    """
    if type(v) is float:
        return v if 0.0 <= v < math.inf else None
    x = as_real(v)
    if x is None or not 0 <= x <= sys.float_info.max:  # NaN, inf and ints past float range fail too
        return None
    return float(x)


def is_milliseconds(v: object) -> bool:
    """Whether `v` is a duration in ms (see `as_milliseconds`)."""
    return as_milliseconds(v) is not None


def compute_wall(
    client_timeout_ms: float,
    server_deadline_ms: float,
    *,
    deadline: float | None = None,
    headroom_ms: float = 0.0,
    now: float | None = None,
) -> Wall:
    """The retrieval wall: min(client timeout, server deadline), and, when the caller has a
    deadline (an absolute `time.monotonic()` time), its remaining time minus the headroom
    kept for packing and formatting.

    >>> compute_wall(45, 40)
    Wall(limit_ms=40.0, source=<WallSource.SERVER_DEADLINE: 'server_deadline'>)
    >>> compute_wall(45, 40, deadline=100.020, headroom_ms=5, now=100.0).source.value
    'caller_deadline'
    """
    ms: list[float] = []
    for name, v in (
        ("client_timeout_ms", client_timeout_ms),
        ("server_deadline_ms", server_deadline_ms),
        ("headroom_ms", headroom_ms),
    ):
        x = as_milliseconds(v)
        if x is None:
            raise ValueError(f"{name} must be a finite number of milliseconds >= 0, got {v!r:.40}")
        ms.append(x)
    client_ms, server_ms, headroom = ms
    if client_ms <= server_ms:
        wall = Wall(client_ms, WallSource.CLIENT_TIMEOUT)
    else:
        wall = Wall(server_ms, WallSource.SERVER_DEADLINE)
    if deadline is not None:
        remaining_ms = (deadline - (time.monotonic() if now is None else now)) * 1000.0 - headroom
        if remaining_ms < wall.limit_ms:
            wall = Wall(max(0.0, remaining_ms), WallSource.CALLER_DEADLINE)
    return wall


@dataclass(slots=True)
class _Outcome:
    record: BranchRecord
    value: Any = None
    out_of_scope: list[MemoryRecord] = field(default_factory=list)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def _check_memories(value: object, scope: Scope) -> tuple[Sequence[MemoryRecord], list[MemoryRecord]]:
    """Split a branch's result into in-scope and out-of-scope memories; raise on anything
    that is not a sequence of `MemoryRecord` (the whole result is then an error: a
    partial result of unknown scope is never used). A `MemoryBatch` (one scope) stays
    columns: it is wholly in scope or wholly out."""
    if type(value) is MemoryBatch:
        if value.organization_id == scope.organization_id and value.agent_id == scope.agent_id:
            return value, []
        return [], list(value)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"expected a sequence of MemoryRecord, got {type(value).__name__}")
    # One C-level pass: the type of each item (MemoryRecord validates its fields when
    # built) and its scope.
    ok, foreign = _core.split_scope(value, MemoryRecord, scope.organization_id, scope.agent_id)
    return ok, foreign


#: Starts a task eagerly where asyncio can (3.12+): it runs at once, on the caller's turn,
#: until it first waits, as its own current task (so sources built on anyio or trio-style
#: cancel scopes see the task they run in).
_EAGER_TASK: Callable[..., asyncio.Task[Any]] | None = getattr(asyncio, "eager_task_factory", None)


def _start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, _Outcome], name: str) -> asyncio.Task[_Outcome]:
    if _EAGER_TASK is not None:
        return _EAGER_TASK(loop, coro, name=name)
    return loop.create_task(coro, name=name)


def _answered(branch: Branch, value: Any, scope: Scope, t0: float) -> _Outcome:
    """A branch's answer, checked: a directive is a str or None, memories are split by
    scope; anything else is the branch's error."""

    def record(status: BranchStatus, error: str | None = None, items: int = 0, foreign: int = 0) -> BranchRecord:
        return BranchRecord(branch, status, (time.perf_counter() - t0) * 1000.0, error, items, foreign)

    try:
        if branch == Branch.DIRECTIVE:
            if value is not None and not isinstance(value, str):
                raise TypeError(f"expected str or None, got {type(value).__name__}")
            return _Outcome(record(BranchStatus.OK, items=0 if value is None else 1), value)
        ok, foreign = _check_memories(value, scope)
    except TypeError as exc:
        return _Outcome(record(BranchStatus.ERROR, f"malformed result: {exc}"))
    return _Outcome(record(BranchStatus.OK, items=len(ok), foreign=len(foreign)), ok, foreign)


def _failed(branch: Branch, exc: BaseException, t0: float) -> _Outcome:
    return _Outcome(BranchRecord(branch, BranchStatus.ERROR, (time.perf_counter() - t0) * 1000.0, _error_text(exc)))


def _answer_now(branch: Branch, now: Callable[..., Any], args: tuple[Any, ...], scope: Scope) -> _Outcome | None:
    """A `NowOrLater` branch's answer from its `now`, or None when it says `LATER`."""
    t0 = time.perf_counter()
    try:
        value = now(*args)
    except (Exception, asyncio.CancelledError) as exc:  # a failing source is recorded, never propagated
        # A synchronous call is never cancelled from outside: a CancelledError is the source's.
        return _failed(branch, exc, t0)
    return None if value is LATER else _answered(branch, value, scope, t0)


async def _run_branch(branch: Branch, call: Callable[[], Awaitable[Any]], timeout_s: float, scope: Scope) -> _Outcome:
    """One branch as a task: its answer, or why it has none. Only the branch's own timeout
    firing is a timeout; an exception the source raises is its error, whatever its class
    (a `TimeoutError` or a `CancelledError` of its own included). A cancellation of this
    task (the wall, or the caller cancelling the whole call) propagates."""
    t0 = time.perf_counter()
    task = asyncio.current_task()
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            value = await call()
    except asyncio.CancelledError as exc:
        if task is None or task.cancelling():
            raise
        return _failed(branch, exc, t0)
    except Exception as exc:  # a failing source is recorded, never propagated
        if timeout.expired():
            return _Outcome(
                BranchRecord(
                    branch,
                    BranchStatus.TIMEOUT,
                    (time.perf_counter() - t0) * 1000.0,
                    f"no answer within {timeout_s * 1000:.1f} ms",
                )
            )
        if task is not None and task.cancelling():
            # Cancelled (at the wall) and the source answered the cancellation with an
            # exception of its own: the task ends cancelled all the same.
            raise asyncio.CancelledError from exc
        return _failed(branch, exc, t0)
    return _answered(branch, value, scope, t0)


async def retrieve(
    scope: Scope,
    query: Query,
    sources: Sources,
    *,
    wall: Wall,
    timeouts: BranchTimeouts | None = None,
    limit: int = 64,
    min_similarity: float = 0.70,
    run_directive: bool = True,
    run_memory: bool = True,
    wall_start: float | None = None,
) -> Retrieved:
    """Run the three branches concurrently and return what came back within the wall.

    Args:
        scope: the request's organization and agent; every memory must match it.
        query: passed to the memory branches.
        sources: the branch callables; a None branch is ``skipped``.
        wall: the shared wall (see `compute_wall`).
        timeouts: per-branch timeouts; each is also cut to what is left of the wall.
        limit: most memories asked of each memory branch.
        min_similarity: the ANN cutoff passed to the cold branch.
        run_directive: False skips the directive branch.
        run_memory: False skips both memory branches.
        wall_start: `time.perf_counter()` when the wall started (default: now), so that
            work done before retrieval in the same request counts against it.

    Returns:
        `Retrieved`; it never raises for a failing or slow source.

    >>> async def directive(scope): return "Be brief."
    >>> r = asyncio.run(retrieve(Scope("o", "a"), Query("q"), Sources(directive=directive), wall=compute_wall(45, 40)))
    >>> (r.directive, [b.status.value for b in r.branches])
    ('Be brief.', ['ok', 'skipped', 'skipped'])
    """
    timeouts = timeouts or BranchTimeouts()
    start = time.perf_counter() if wall_start is None else wall_start
    wall_end = start + wall.limit_ms / 1000.0
    calls: list[tuple[Branch, Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []
    d, h, c = sources.directive, sources.hot, sources.cold
    if run_directive and d is not None:
        calls.append((Branch.DIRECTIVE, d, (scope,)))
    if run_memory and h is not None:
        calls.append((Branch.HOT, h, (scope, query, limit)))
    if run_memory and c is not None:
        calls.append((Branch.COLD, c, (scope, query, limit, min_similarity)))
    tasks: dict[Branch, asyncio.Task[_Outcome]] = {}
    outcomes: dict[Branch, _Outcome] = {}
    loop = asyncio.get_running_loop()
    for branch, fn, args in calls:
        budget_s = max(0.0, min(timeouts.of(branch) / 1000.0, wall_end - time.perf_counter()))
        if budget_s > 0.0 and isinstance(fn, NowOrLater):
            outcome = _answer_now(branch, fn.now, args, scope)
            if outcome is not None:
                outcomes[branch] = outcome
                continue
        tasks[branch] = _start(
            loop, _run_branch(branch, functools.partial(fn, *args), budget_s, scope), f"ctxcore-{branch}"
        )

    waiting = [t for t in tasks.values() if not t.done()]
    pending: set[asyncio.Task[_Outcome]] = set()
    running: set[asyncio.Task[_Outcome]] = set()
    if waiting:
        try:
            _, pending = await asyncio.wait(waiting, timeout=max(0.0, wall_end - time.perf_counter()))
        except asyncio.CancelledError:
            await _cancel(tasks.values())
            raise
        running = await _cancel(pending)
    for branch, task in tasks.items():
        if task not in pending and not task.cancelled():
            outcomes[branch] = task.result()
        else:
            error = f"cancelled at the {wall.source.value} wall ({wall.limit_ms:.1f} ms)"
            if task in running:
                error += f"; still running {CANCEL_GRACE_MS:g} ms later, left to finish without this call"
            outcomes[branch] = _Outcome(
                BranchRecord(branch, BranchStatus.TIMEOUT, (time.perf_counter() - start) * 1000.0, error)
            )

    records = []
    for branch in (Branch.DIRECTIVE, Branch.HOT, Branch.COLD):
        if branch in outcomes:
            records.append(outcomes[branch].record)
        else:
            reason = "not requested" if _has_source(sources, branch) else "no source"
            records.append(BranchRecord(branch, BranchStatus.SKIPPED, 0.0, reason))
    directive_outcome = outcomes.get(Branch.DIRECTIVE)
    directive = (
        directive_outcome.value if directive_outcome and directive_outcome.record.status == BranchStatus.OK else None
    )
    parts: list[Sequence[MemoryRecord]] = []
    foreign: list[MemoryRecord] = []
    for branch in (Branch.HOT, Branch.COLD):
        o = outcomes.get(branch)
        if o is not None and o.record.status == BranchStatus.OK:
            if len(o.value):
                parts.append(o.value)
            foreign.extend(o.out_of_scope)
    return Retrieved(directive, Chain(parts), tuple(foreign), tuple(records), wall)


#: Branch tasks that did not stop within the grace, held until they end (the event loop
#: keeps only weak references to tasks).
_LEFT_RUNNING: set[asyncio.Task[Any]] = set()


def _left_to_finish(task: asyncio.Task[Any]) -> None:
    _LEFT_RUNNING.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a source's late failure is not "never retrieved"


async def _cancel(tasks: Iterable[asyncio.Task[_Outcome]]) -> set[asyncio.Task[_Outcome]]:
    """Cancel `tasks` and wait up to `CANCEL_GRACE_MS` for them to stop; return those that
    did not, which are left to finish on their own."""
    live = [t for t in tasks if not t.done()]
    for t in live:
        t.cancel()
    if not live:
        return set()
    _, running = await asyncio.wait(live, timeout=CANCEL_GRACE_MS / 1000.0)
    for t in running:
        _LEFT_RUNNING.add(t)
        t.add_done_callback(_left_to_finish)
    return running


def _has_source(sources: Sources, branch: Branch) -> bool:
    return {Branch.DIRECTIVE: sources.directive, Branch.HOT: sources.hot, Branch.COLD: sources.cold}[branch] is not None
