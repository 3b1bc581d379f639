"""Admission control against a real server on a loopback port: the bounded queue refuses
with RESOURCE_EXHAUSTED and a retry hint, the service-time estimate learned from recent
calls refuses at arrival (DEADLINE_EXCEEDED, before any work) the calls whose deadline it
cannot meet and cuts the retrieval wall of the ones it admits so that the rest still
fits; every refusal is marked in the trailing metadata and counted.

The overload figures (2x the sustainable rate: offered vs answered, the share of failures
refused at arrival, p99 of accepted calls) come from bench/test_bench_service.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest
from service_support import FakeSources, make_tenants, open_config, running

from ctxcore.client import ContextClient
from ctxcore.errors import ConfigError
from ctxcore.memory import NowOrLater, Query, Sources
from ctxcore.request import AssemblyRequest
from ctxcore.service.admission import (
    ADMISSION_KEY,
    QUIET_AFTER_MS,
    RETRY_PUSHBACK_KEY,
    SHED_NEED_FACTOR,
    SHEDDING_FOR_MS,
    Admission,
    TailModel,
    Turns,
)
from ctxcore.service.config import ServiceConfig, load_service_config
from ctxcore.service.fullgc import HELD_FULL_COLLECTION_THRESHOLD
from ctxcore.service.wire import METHOD_PREFIX, request_to_proto
from ctxcore.v1 import context_assembly_pb2 as pb

TENANTS = make_tenants(2)
T = TENANTS[0]
REQ = AssemblyRequest(T.scope.organization_id, T.scope.agent_id, "gpt-4o", Query("marker"))


def _marks(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: v for k, v in (exc.trailing_metadata() or ()) if isinstance(v, str)}


class _Held:
    """An assembly function that counts the calls entering it and holds each until `gate`
    is set."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = 0

    async def __call__(self, request: Any, **kw: Any) -> Any:
        from ctxcore.assembly import assemble

        self.entered += 1
        await self.gate.wait()
        return await assemble(request, **kw)


def test_the_queue_is_bounded_and_refusals_carry_a_retry_hint() -> None:
    held = _Held()

    async def main() -> None:
        async with running(open_config(max_queue=2), sources=FakeSources(TENANTS).sources(), assemble=held) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=10.0) as client:
                first = [asyncio.ensure_future(client.assemble(REQ)) for _ in range(2)]
                while held.entered < 2:
                    await asyncio.sleep(0.01)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await client.assemble(REQ)
                assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                marks = _marks(ei.value)
                assert marks[ADMISSION_KEY] == "refused-queue"
                assert int(marks[RETRY_PUSHBACK_KEY]) >= 1
                assert "max_queue = 2" in (ei.value.details() or "")
                assert held.entered == 2  # the refused call did no work
                held.gate.set()
                for f in first:
                    assert (await f).scope.organization_id == T.scope.organization_id
                assert (await client.assemble(REQ)).scope.organization_id == T.scope.organization_id
                assert svc.admission.admitted == 0
                refused = svc.metrics.registry.get_sample_value(
                    "ctxcore_admission_refused_total", {"reason": "refused-queue"}
                )
                assert refused == 1

    asyncio.run(main())


def test_calls_that_cannot_finish_in_time_are_refused_at_arrival() -> None:
    """The tail after retrieval is 40 ms of blocking work here. A fresh server admits a
    30 ms call (it knows nothing better than the packing headroom); once recent calls
    have shown the tail, the same call is refused at arrival without touching the store,
    and a 3 s call is admitted with its retrieval wall cut to leave the tail room."""
    tail_s = 0.040
    runs = 0
    fake = FakeSources(TENANTS)

    async def slow_tail(request: Any, **kw: Any) -> Any:
        from ctxcore.assembly import assemble

        nonlocal runs
        runs += 1
        ctx = await assemble(request, **kw)
        time.sleep(tail_s)  # CPU-bound work after retrieval, on the loop
        return ctx

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        # Roomy service walls, so that the caller's deadline is what sets the wall.
        roomy = {"client_timeout_ms": 60_000, "server_deadline_ms": 60_000}
        async with running(open_config(assembly=roomy), sources=fake.sources(), assemble=slow_tail) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}") as client:
                # The estimate adds the event loop's measured lag, which a busy host can
                # push past 30 ms while the server starts: let it settle first.
                for _ in range(200):
                    if svc.admission.lag_ms < 2.0:
                        break
                    await asyncio.sleep(0.025)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await client.assemble(REQ, timeout=0.030)  # admitted, and then late
                assert ADMISSION_KEY not in _marks(ei.value)
                out["fresh"] = ei.value.code()
                for _ in range(12):
                    await client.assemble(REQ, timeout=5.0)
                # Those calls kept the loop busy back to back; once it is quiet, a call
                # whose deadline is too short for the known tail is refused for its deadline.
                for _ in range(200):
                    await asyncio.sleep(0.01)
                    if svc.admission.lag_ms < 0.5:
                        break
                out["estimate_ms"] = svc.admission.tail_estimate()
                before, asked = runs, len(fake.asked)
                t0 = time.perf_counter()
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await client.assemble(REQ, timeout=0.030)
                out["refused_after_ms"] = (time.perf_counter() - t0) * 1000
                out["refused"] = (ei.value.code(), _marks(ei.value).get(ADMISSION_KEY), ei.value.details())
                out["work_done"] = (runs - before, len(fake.asked) - asked)
                r = await client.assemble(REQ, timeout=3.0)
                out["admitted_wall_ms"] = r.wall.limit_ms
                out["metric"] = svc.metrics.registry.get_sample_value(
                    "ctxcore_admission_refused_total", {"reason": "refused-deadline"}
                )
        return out

    out = asyncio.run(main())
    print(
        f"\ntail estimate after 12 calls with a {tail_s * 1000:g} ms tail: {out['estimate_ms']:.1f} ms; "
        f"refusal answered in {out['refused_after_ms']:.1f} ms; admitted 3 s call's wall "
        f"{out['admitted_wall_ms']:.1f} ms"
    )
    assert out["fresh"] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert out["estimate_ms"] >= tail_s * 1000
    code, mark, details = out["refused"]
    # For its deadline; or for load when the loop (which the client shares here) still ran
    # late as the call arrived: both refused at arrival, before any work.
    assert mark == "refused-deadline", details
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED and "refused for load" in details
    ), details
    assert "left at arrival" in details and "estimated" in details
    assert out["work_done"] == (0, 0)
    assert out["admitted_wall_ms"] <= 3000 - tail_s * 1000
    assert out["metric"] == 1


def test_the_time_left_at_arrival_is_a_histogram_of_the_callers_deadlines() -> None:
    # What the caller's deadline leaves when a call reaches admission: the wait before the
    # handler (the client, the network, the server's accept), which admission cannot see
    # as a line, shows as calls arriving with little time left.
    async def main() -> tuple[dict[str, float | None], float | None, float | None]:
        async with running(open_config(), sources=FakeSources(TENANTS).sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}") as client:
                for _ in range(2):
                    await client.assemble(REQ, timeout=0.3)
                await client.assemble(REQ, timeout=20.0)
                # No deadline at all: not observed (there is no time left to speak of).
                call = client._channel.unary_unary(
                    METHOD_PREFIX + "AssembleContext", request_serializer=None, response_deserializer=None
                )
                answer = pb.AssembledContext.FromString(await call(request_to_proto(REQ).SerializeToString()))
                assert answer.scope.organization_id == T.scope.organization_id
            reg = svc.metrics.registry
            name = "ctxcore_admission_time_left_seconds"
            buckets = {
                le: reg.get_sample_value(f"{name}_bucket", {"le": le})
                for le in ("0.045", "0.1", "0.5", "10.0", "30.0", "+Inf")
            }
            return buckets, reg.get_sample_value(f"{name}_count"), reg.get_sample_value(f"{name}_sum")

    buckets, count, total = asyncio.run(main())
    assert buckets == {"0.045": 0.0, "0.1": 0.0, "0.5": 2.0, "10.0": 2.0, "30.0": 3.0, "+Inf": 3.0}
    assert count == 3
    # gRPC's timeout header rounds a timeout up (20 s arrives as ~20.1 s left).
    assert total is not None and 20.2 < total <= 21.0


def test_the_tail_model_follows_the_queue_and_forgets() -> None:
    m = TailModel(prior_ms=5.0)
    assert m.predict(10, now=0.0) == pytest.approx(5.0)
    for i in range(200):  # calls with more calls ahead of them take longer
        ahead = i % 10
        m.observe(ahead, 3.0 + 2.0 * ahead, now=i * 0.002)
    a, b = m.coefficients(now=0.4)
    assert b == pytest.approx(2.0, rel=0.1) and a == pytest.approx(3.0, abs=1.0)
    assert m.predict(9, now=0.4) > m.predict(0, now=0.4) + 15
    # After quiet seconds what was learned under load fades back to the prior, so a
    # server that refused everything for a while admits again.
    assert m.predict(9, now=10.0) == pytest.approx(5.0, abs=0.1)


def test_admission_decisions() -> None:
    adm = Admission(max_queue=3, min_retrieval_ms=1.0, response_headroom_ms=1.0, floor_tail_ms=5.0)
    assert adm.decide(None).admitted and adm.decide(45.0).admitted
    d = adm.decide(6.0)  # 1 + 5 + 1 = 7 ms needed
    assert (d.admitted, d.reason) == (False, "refused-deadline")
    assert not d.overload  # too short for an assembly with nobody ahead: the caller's deadline
    assert adm.decide(45.0).admitted
    d = adm.decide(45.0)
    assert (d.admitted, d.reason, d.retry_after_ms >= 1) == (False, "refused-queue", True)
    for _ in range(3):
        adm.release(0, 20.0, 10.0)
    assert adm.admitted == 0


def test_a_deadline_refusal_is_for_load_unless_the_server_is_quiet() -> None:
    adm = Admission(min_retrieval_ms=1.0, response_headroom_ms=1.0, floor_tail_ms=5.0)
    assert adm.idle_need_ms() == pytest.approx(7.0)
    # Quiet: a deadline shorter than an assembly needs is the caller's, DEADLINE_EXCEEDED.
    d = adm.decide(6.0)
    assert (d.admitted, d.reason, d.overload, d.retry_after_ms) == (False, "refused-deadline", False, 0)
    assert "refused for load" not in d.details
    # The loop late: the call waited for it before admission saw it.
    adm.lag_ms = 3.0
    d = adm.decide(6.0)
    assert (d.admitted, d.reason, d.overload) == (False, "refused-deadline", True)
    assert "refused for load" in d.details and d.retry_after_ms >= 1
    # A deadline a prompt loop would meet, refused because the loop's recent lag adds to
    # the estimate: load.
    adm.lag_ms = 30.0
    d = adm.decide(20.0)
    assert (d.admitted, d.reason, d.overload) == (False, "refused-deadline", True)


def test_while_shedding_load_a_call_needs_twice_the_time_an_assembly_needs() -> None:
    adm = Admission(min_retrieval_ms=1.0, response_headroom_ms=1.0, floor_tail_ms=5.0)
    need = adm.idle_need_ms()
    assert need == pytest.approx(7.0)
    # Not shedding: a call with just over the need is admitted.
    assert not adm.shedding()
    assert adm.decide(need + 0.5).admitted
    # A refusal for load (the queue is full) starts shedding ...
    adm.max_queue = 1
    d = adm.decide(100.0)
    assert (d.reason, d.overload) == ("refused-queue", True)
    adm.max_queue = 64
    assert adm.shedding()
    # ... and while it lasts a call needs twice as much; one refused for the difference is
    # refused for load, with a retry hint.
    d = adm.decide(need + 0.5)
    assert (d.admitted, d.reason, d.overload) == (False, "refused-deadline", True)
    assert d.retry_after_ms >= 1 and f"{SHED_NEED_FACTOR:g} times that while the server sheds load" in d.details
    tail = adm.tail_estimate()
    assert adm.decide(SHED_NEED_FACTOR * (1.0 + tail + 1.0) + 0.5).admitted
    # A refusal for the reserve alone does not prolong the shedding.
    shed_at = adm.last_shed
    assert not adm.decide(need + 0.5).admitted
    assert adm.last_shed == shed_at
    # A refusal the server makes after admission (a turn that did not come) counts too.
    time.sleep(SHEDDING_FOR_MS / 1000 + 0.02)
    assert not adm.shedding()
    adm.shed()
    assert adm.shedding()
    # A deadline refused for its own shortness is not load and does not start shedding.
    time.sleep(SHEDDING_FOR_MS / 1000 + 0.02)
    for _ in range(2):
        adm.release(0, 0.0, None)
    time.sleep(QUIET_AFTER_MS / 1000 + 0.02)
    d = adm.decide(3.0)
    assert (d.reason, d.overload) == ("refused-deadline", False)
    assert not adm.shedding()
    assert adm.decide(need + 0.5).admitted


def test_a_deadline_refusal_is_for_load_while_calls_are_admitted() -> None:
    adm = Admission(min_retrieval_ms=1.0, response_headroom_ms=1.0, floor_tail_ms=5.0)
    assert adm.floor_need_ms() == pytest.approx(7.0)
    for _ in range(50):  # calls that took 20 ms after their retrieval
        assert adm.decide(100.0).admitted
        adm.release(0, 21.0, 1.0)
    assert adm.idle_need_ms() > 20.0
    # A call ended a moment ago: the server is busy, one call after another, and the
    # next waited in gRPC's queue with nothing admitted. 10 ms left is load: what is
    # learned for nobody ahead is learned under load.
    assert not adm.quiet()
    d = adm.decide(10.0)
    assert (d.admitted, d.reason, d.overload) == (False, "refused-deadline", True)
    assert "refused for load" in d.details and d.retry_after_ms >= 1
    # Below the least any assembly needs (1 + 5 + 1 ms): the caller's, whatever the load.
    d = adm.decide(6.0)
    assert (d.admitted, d.overload) == (False, False)
    # Quiet (nothing admitted, nothing ended for QUIET_AFTER_MS): 10 ms is less than an
    # assembly has taken here with nobody ahead: the caller's deadline.
    time.sleep(QUIET_AFTER_MS / 1000 + 0.02)
    assert adm.quiet()
    d = adm.decide(10.0)
    assert (d.admitted, d.reason, d.overload, d.retry_after_ms) == (False, "refused-deadline", False, 0)
    # With a call admitted the same 10 ms is load again.
    assert adm.decide(100.0).admitted
    assert not adm.quiet()
    d = adm.decide(10.0)
    assert (d.admitted, d.reason, d.overload) == (False, "refused-deadline", True)
    # For an admitted call that finds its deadline short once validated: alone on a quiet
    # server it is the caller's deadline; with another admitted, or one just ended, load.
    assert not adm.busy_besides_one()
    assert adm.decide(100.0).admitted
    assert adm.busy_besides_one()
    adm.release(0, 3.0, 1.0)
    assert adm.admitted == 1 and adm.busy_besides_one()


def test_the_loops_lag_counts_in_the_share_of_calls_that_wait_for_the_loop_once_admitted() -> None:
    adm = Admission(max_queue=8, min_retrieval_ms=1.0, response_headroom_ms=1.0, floor_tail_ms=5.0)
    adm.lag_ms = 10.0
    assert adm.tail_estimate() == pytest.approx(15.0)  # nothing seen yet: every call waits
    assert not adm.decide(16.0).admitted  # 1 + 5 + 10 + 1 = 17 ms needed
    for _ in range(100):  # calls that ran from admission to answer without the loop
        assert adm.decide(45.0).admitted
        adm.release(0, 2.0, 1.0, waited=False)
    assert adm.waited_share < 0.01
    assert adm.tail_estimate() == pytest.approx(5.0, abs=0.1)
    # (The first refusal was for load, the loop being late: once the server has not shed
    # for a while, a call needs the time an assembly needs, not twice that.)
    time.sleep(SHEDDING_FOR_MS / 1000 + 0.02)
    assert adm.decide(8.0).admitted  # 1 + 5 + 1 = 7 ms needed now
    adm.release(0, 2.0, 1.0, waited=False)
    for _ in range(100):  # calls that waited for the loop again
        assert adm.decide(45.0).admitted
        adm.release(0, 2.0, 1.0, waited=True)
    assert adm.waited_share > 0.99 and adm.tail_estimate() > 14.9
    adm.release(0, 0.0, None, waited=False)  # a call that never ran says nothing
    assert adm.waited_share > 0.99


def test_the_lag_probe_sleeps_while_no_call_arrives_and_an_arrival_wakes_it() -> None:
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        adm = Admission(
            max_queue=8, min_retrieval_ms=1.0, response_headroom_ms=1.0, floor_tail_ms=5.0, probe_idle_after_s=0.05
        )
        out["before_start"] = adm.probing
        adm.start()
        out["started"] = adm.probing

        async def until(cond: Any) -> bool:
            for _ in range(400):
                if cond():
                    return True
                await asyncio.sleep(0.01)
            return False

        out["slept"] = await until(lambda: not adm.probing)
        out["lag_asleep"] = (adm.lag_ms, adm.sustained_lag_ms)
        assert adm.decide(45.0).admitted  # an arrival wakes it
        out["woke"] = await until(lambda: adm.probing)
        # Awake while a call is admitted, however long it runs: it measures the loop's lag.
        seen = 0.0
        for _ in range(3):
            time.sleep(0.03)  # the loop blocked
            for _ in range(10):
                await asyncio.sleep(0.001)
                seen = max(seen, adm.lag_ms)
            await asyncio.sleep(0.03)
        out["awake_with_a_call"] = adm.probing
        out["lag_measured"] = seen
        adm.release(0, 2.0, 1.0)
        out["slept_again"] = await until(lambda: not adm.probing)
        out["lag_after"] = adm.lag_ms
        await adm.stop()
        out["stopped"] = adm.probing
        return out

    out = asyncio.run(main())
    assert out["before_start"] is False and out["started"] is True
    assert out["slept"] and out["lag_asleep"] == (0.0, 0.0)
    assert out["woke"] and out["awake_with_a_call"] is True
    assert out["lag_measured"] > 5.0
    assert out["slept_again"] and out["lag_after"] == 0.0
    assert out["stopped"] is False
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="probe_idle_after_s"):
            Admission(probe_idle_after_s=bad)


def test_an_idle_server_stops_probing_its_loop_and_answers_the_next_call_at_once() -> None:
    async def main() -> tuple[bool, bool, int, bool]:
        async with running(open_config(), sources=FakeSources(TENANTS).sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}") as client:
                await client.assemble(REQ, timeout=5.0)
                busy = svc.admission.probing
                for _ in range(300):  # idle: asleep after PROBE_IDLE_AFTER_S (1 s)
                    if not svc.admission.probing:
                        break
                    await asyncio.sleep(0.01)
                idle = svc.admission.probing
                r = await client.assemble(REQ, timeout=5.0)
                await asyncio.sleep(0.02)
                return busy, idle, r.pack.selected, svc.admission.probing

    busy, idle, selected, after = asyncio.run(main())
    assert busy is True and idle is False
    assert selected > 0 and after is True


def test_a_server_learns_whether_its_calls_wait_for_the_loop() -> None:
    fake = FakeSources(TENANTS)

    def at_hand(branch: str) -> Any:
        def now(scope: Any, *args: Any) -> Any:
            t = fake.by_scope[scope]
            return t.directive if branch == "directive" else t.memories[:2] if branch == "hot" else t.memories[2:]

        return now

    def waits(branch: str) -> Any:
        async def read(*args: Any) -> Any:
            await asyncio.sleep(0)
            return await getattr(fake, branch)(*args)

        return read

    answers_now = Sources(*(NowOrLater(getattr(fake, b), at_hand(b)) for b in ("directive", "hot", "cold")))
    waiting = Sources(*(waits(b) for b in ("directive", "hot", "cold")))

    async def share(sources: Sources) -> tuple[float, int]:
        async with running(open_config(), sources=sources) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}") as client:
                selected = 0
                for _ in range(60):
                    r = await client.assemble(REQ, timeout=5.0)
                    selected += r.pack.selected
            return svc.admission.waited_share, selected

    (now_share, now_selected), (wait_share, wait_selected) = (
        asyncio.run(share(answers_now)),
        asyncio.run(share(waiting)),
    )
    assert now_share < 0.1 and wait_share > 0.9
    assert now_selected == wait_selected > 0


def test_turns_go_in_arrival_order_and_none_is_lost() -> None:
    async def main() -> None:
        t = Turns(2)
        assert [await t.take(None), await t.take(None)] == [True, True]
        order: list[int] = []

        async def wait(k: int, timeout: float | None) -> bool:
            got = await t.take(timeout)
            if got:
                order.append(k)
            return got

        waiters = [asyncio.ensure_future(wait(k, None)) for k in range(3)]
        late = asyncio.ensure_future(wait(9, 0.02))
        cancelled = asyncio.ensure_future(wait(8, None))
        await asyncio.sleep(0.05)
        assert late.done() and late.result() is False  # its time ran out in line
        cancelled.cancel()
        await asyncio.sleep(0)
        assert (t.running, t.waiting) == (2, 3)  # neither left a turn behind nor stayed in line
        for _ in range(5):
            t.give_back()
            await asyncio.sleep(0)
        assert order == [0, 1, 2] and all(w.result() for w in waiters)
        assert (t.running, t.waiting) == (0, 0)
        assert await t.take(0) is True  # a free turn needs no waiting
        assert await t.take(0) is True and await t.take(0) is False

    asyncio.run(main())
    with pytest.raises(ValueError, match="limit"):
        Turns(0)


def test_turns_measure_their_own_length_and_not_the_time_a_turn_stood_free() -> None:
    """A line moves at the pace turns are handed on while all are held: with two turns
    each held ~40 ms, one is handed on every ~20 ms and a turn lasts ~40 ms; the time a
    turn stood free is no turn's length."""

    async def main() -> None:
        t = Turns(2)
        assert t.turn_ms() == 0.0  # nothing measured yet
        assert await t.take(None) and await t.take(None)
        done: list[int] = []

        async def work(k: int) -> None:
            assert await t.take(None)
            await asyncio.sleep(0.04)
            done.append(k)
            t.give_back()

        workers = [asyncio.ensure_future(work(k)) for k in range(8)]
        await asyncio.sleep(0.04)
        t.give_back()
        await asyncio.sleep(0.02)
        t.give_back()
        await asyncio.gather(*workers)
        assert sorted(done) == list(range(8)) and (t.running, t.waiting) == (0, 0)
        measured = t.turn_ms()
        assert 30.0 < measured < 400.0  # ~40 ms, on a loaded host more
        # A turn that stood free for half a second, then one held briefly with the other
        # free: neither is a turn's length.
        await asyncio.sleep(0.5)
        assert await t.take(None)
        t.give_back()
        assert t.turn_ms() == measured
        with pytest.raises(ValueError, match="limit"):
            Turns(True)

    asyncio.run(main())


def test_a_congested_line_serves_its_newest_waiter_first() -> None:
    """Adaptive LIFO: while more than LIFO_AFTER_WAITERS per turn wait and arrival order
    would give the newest its turn only after its time is up (everyone ahead at the turns'
    recent length), turns go to the newest waiter; a short line, one with time to spare, or
    one that arrival order serves in time goes in arrival order."""

    from ctxcore.service.admission import LIFO_AFTER_WAITERS, LIFO_LINE_FACTOR

    n = LIFO_AFTER_WAITERS + 3

    async def line(timeout: float | None, wait_s: float, turn_ms: float, n: int = n, away: bool = False) -> list[int]:
        t = Turns(1, lambda: turn_ms)
        assert await t.take(None)
        order: list[int] = []

        async def wait(k: int) -> None:
            if await t.take(timeout):
                order.append(k)
                t.give_back()

        waiters = []
        for k in range(n):
            waiters.append(asyncio.ensure_future(wait(k)))
            await asyncio.sleep(0)  # in line in this order
        assert t.waiting == n
        await asyncio.sleep(wait_s)
        if away:
            t.turned_away()  # a call refused at arrival: the line is full
        t.give_back()
        await asyncio.gather(*waiters)
        assert (t.running, t.waiting) == (0, 0)
        return order

    async def main() -> None:
        assert await line(None, 0.05, 500.0) == list(range(n))  # no deadline: never congested
        assert await line(10.0, 0.05, 500.0) == list(range(n))  # time to spare
        assert await line(2.0, 1.2, 500.0, LIFO_AFTER_WAITERS) == list(range(LIFO_AFTER_WAITERS))  # short
        # 1.2 of 2 s spent waiting, but turns of 10 ms serve the whole line in time: the
        # first has waited longer than it has left, and the line still goes in arrival order.
        assert await line(2.0, 1.2, 10.0) == list(range(n))
        # Turns of 150 ms: the newest (0.8 s left) would wait 1.05 s, a little past its time
        # (less than LIFO_LINE_FACTOR times it): a slow spell, served in arrival order.
        assert LIFO_LINE_FACTOR * 0.8 > n * 0.150 > 0.8
        assert await line(2.0, 1.2, 150.0) == list(range(n))
        # The same line once a call was turned away at arrival for it (overload): the newest
        # go first until arrival order would serve the newest in time again (5 x 150 ms
        # < 0.8 s), and the line goes in arrival order from then on.
        assert await line(2.0, 1.2, 150.0, away=True) == [n - 1, n - 2, *range(n - 2)]
        # Turns of 500 ms: in arrival order the newest (0.8 s left) would wait 3.5 s. Turns
        # go to the newest until the line is short again, then in arrival order.
        assert await line(2.0, 1.2, 500.0) == [n - 1, n - 2, n - 3, *range(LIFO_AFTER_WAITERS)]
        assert await line(2.0, 1.2, 0.0) == list(range(n))  # no turn measured yet

    asyncio.run(main())


def test_with_max_running_calls_wait_their_turn_and_one_that_cannot_is_refused_before_work() -> None:
    held = _Held()

    async def main() -> None:
        # The third call's wait ends when its deadline leaves less than the retrieval minimum
        # and the tail: 150 ms of retrieval minimum puts that refusal well before the client's
        # own deadline fires, on a loaded host too.
        cfg = open_config(max_running=1, min_retrieval_ms=150.0)
        async with running(cfg, sources=FakeSources(TENANTS).sources(), assemble=held) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=10.0) as client:
                first = asyncio.ensure_future(client.assemble(REQ))
                second = asyncio.ensure_future(client.assemble(REQ))
                until = time.monotonic() + 10
                while (held.entered < 1 or svc.turns is None or svc.turns.waiting < 1) and time.monotonic() < until:
                    await asyncio.sleep(0.01)
                assert svc.turns is not None and svc.turns.waiting == 1
                assert held.entered == 1  # the second waits its turn without starting
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await client.assemble(REQ, timeout=0.5)
                assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert _marks(ei.value)[ADMISSION_KEY] == "refused-wait"
                assert "server.max_running" in (ei.value.details() or "")
                assert held.entered == 1  # refused in line: no work done
                held.gate.set()
                for f in (first, second):
                    assert (await f).scope.organization_id == T.scope.organization_id
                assert held.entered == 2
                assert (svc.turns.running, svc.turns.waiting, svc.admission.admitted) == (0, 0, 0)
                reg = svc.metrics.registry
                assert reg.get_sample_value("ctxcore_admission_refused_total", {"reason": "refused-wait"}) == 1
                assert reg.get_sample_value("ctxcore_admission_waiting") == 0

    asyncio.run(main())


def test_a_call_the_line_would_outlast_is_refused_at_once_unless_the_newest_goes_first() -> None:
    """Recent turns took a second each: a call with half a second left behind one waiter
    (with time to spare) is refused at arrival, without waiting. Once the line is congested
    (in arrival order its newest would get its turn after its time is up) the newest goes
    first, so a call with little time left is not refused: it is served next."""
    from ctxcore.service.admission import LIFO_AFTER_WAITERS

    held = _Held()

    async def main() -> None:
        async with running(open_config(max_running=1), sources=FakeSources(TENANTS).sources(), assemble=held) as svc:
            svc.turns = turns = Turns(1, lambda: 1000.0)  # recent turns took a second each

            async def until(cond: Any) -> None:
                stop = time.monotonic() + 10
                while not cond() and time.monotonic() < stop:
                    await asyncio.sleep(0.005)
                assert cond()

            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=30.0) as client:
                first = asyncio.ensure_future(client.assemble(REQ))
                await until(lambda: held.entered == 1)
                spare = asyncio.ensure_future(client.assemble(REQ))  # 30 s: time to spare
                await until(lambda: turns.waiting == 1)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await client.assemble(REQ, timeout=0.5)
                assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert _marks(ei.value)[ADMISSION_KEY] == "refused-wait"
                assert "the line ahead is expected to take 1000.0 ms" in (ei.value.details() or "")
                assert held.entered == 1 and not spare.done()
                held.gate.set()
                for f in (first, spare):
                    assert (await f).scope.organization_id == T.scope.organization_id
        # A congested line: 5 waiters of 3 s, having waited 2 s of it, where turns take
        # 0.5 s: the newest would get its turn in 2.5 s, after its time is up.
        held2 = _Held()
        async with running(open_config(max_running=1), sources=FakeSources(TENANTS).sources(), assemble=held2) as svc:
            # 0.5 s a turn: the 3 s waiters join the line (4 ahead take 2 s); 5 ahead would
            # outlast 0.8 s.
            svc.turns = turns = Turns(1, lambda: 500.0)
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=30.0) as client:
                first = asyncio.ensure_future(client.assemble(REQ))
                await until(lambda: held2.entered == 1)
                olds = []
                for k in range(LIFO_AFTER_WAITERS + 1):
                    olds.append(asyncio.ensure_future(client.assemble(REQ, timeout=3.0)))
                    await until(lambda: turns.waiting == k + 1)
                await asyncio.sleep(2.0)
                assert turns.lifo
                short = asyncio.ensure_future(client.assemble(REQ, timeout=0.8))
                await until(lambda: turns.waiting == len(olds) + 1)  # not refused for the line
                held2.gate.set()
                assert (await short).scope.organization_id == T.scope.organization_id
                reg = svc.metrics.registry
                assert reg.get_sample_value("ctxcore_admission_newest_first_turns_total") >= 1
                assert reg.get_sample_value("ctxcore_admission_turn_seconds") == 0.5  # the line's pace
                assert (await first).scope.organization_id == T.scope.organization_id
                for f in olds:
                    try:
                        await f  # answered after the short one, or refused in line
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    asyncio.run(main())


def test_a_request_with_few_but_long_messages_does_not_take_a_turn() -> None:
    """A large request runs beside the ordinary ones, never in a turn they wait for:
    pricing its text could hold the turn for seconds. While one with three 100 kB messages
    is held, an ordinary call is answered."""
    from ctxcore.request import Message

    class HoldLarge:
        def __init__(self) -> None:
            self.gate = asyncio.Event()
            self.large_in = asyncio.Event()

        async def __call__(self, request: Any, **kw: Any) -> Any:
            from ctxcore.assembly import assemble

            if sum(len(m.content) for m in request.messages) > 100_000:
                self.large_in.set()
                await self.gate.wait()
            return await assemble(request, **kw)

    held = HoldLarge()
    big = AssemblyRequest(
        T.scope.organization_id,
        T.scope.agent_id,
        "gpt-4o",
        Query("marker"),
        messages=[Message("user", "word " * 20_000) for _ in range(3)],
    )

    async def main() -> None:
        async with running(open_config(max_running=1), sources=FakeSources(TENANTS).sources(), assemble=held) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=30.0) as client:
                large = asyncio.ensure_future(client.assemble(big))
                await asyncio.wait_for(held.large_in.wait(), 10)
                small = await client.assemble(REQ, timeout=5.0)  # not behind the large one
                assert small.scope.organization_id == T.scope.organization_id
                assert not large.done()
                ordinary_ms = svc.admission.sojourn_ms
                assert ordinary_ms > 0
                await asyncio.sleep(0.3)  # the large one is held: its time is long
                held.gate.set()
                assert (await large).scope.organization_id == T.scope.organization_id
                # The line's estimate of a turn learns nothing from a call that takes none.
                assert svc.admission.sojourn_ms == ordinary_ms
                assert svc.turns is not None and (svc.turns.running, svc.turns.waiting) == (0, 0)

    asyncio.run(main())


def test_an_ordinary_calls_stages_run_on_the_loop_and_a_large_ones_on_the_executor() -> None:
    """Handing an ordinary call's stages (well under a millisecond) to the executor and
    back costs more CPU than they take; a large call's still leave the loop."""
    import threading

    from ctxcore.request import Message

    seen: list[tuple[int, bool]] = []

    async def spy(request: Any, *, executor: Any = None, **kw: Any) -> Any:
        from ctxcore.assembly import assemble

        seen.append((len(request.messages), executor is None))
        assert threading.current_thread() is threading.main_thread()
        return await assemble(request, executor=executor, **kw)

    big = AssemblyRequest(
        T.scope.organization_id,
        T.scope.agent_id,
        "gpt-4o",
        Query("marker"),
        messages=[Message("user", "word " * 20_000) for _ in range(3)],
    )

    async def main() -> None:
        async with running(open_config(), sources=FakeSources(TENANTS).sources(), assemble=spy) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=30.0) as client:
                small = await client.assemble(REQ)
                large = await client.assemble(big)
        assert small.scope.organization_id == large.scope.organization_id == T.scope.organization_id
        for answer in (small, large):
            assert any(e.reason == pb.TRACE_REASON_SELECTED for e in answer.trace)

    asyncio.run(main())
    assert seen == [(len(REQ.messages), True), (3, False)]


def _numbered_large(k: int) -> AssemblyRequest:
    """A large request (three 100 kB messages) whose first word is `k`."""
    from ctxcore.request import Message

    return AssemblyRequest(
        T.scope.organization_id,
        T.scope.agent_id,
        "gpt-4o",
        Query("marker"),
        messages=[Message("user", f"{k} " + "word " * 20_000) for _ in range(3)],
    )


def _large_number(request: AssemblyRequest) -> int:
    """The `k` of a `_numbered_large` request."""
    return int(request.messages[0].content.split()[0])


def test_full_collections_wait_while_large_calls_run() -> None:
    """A large call's objects live long enough to reach the collector's oldest generation,
    and a full collection walking them holds the GIL for tens of milliseconds: while large
    calls run (two here, overlapping) the oldest generation's threshold is held up, ordinary
    calls alone leave it as it was, and the last large call to end puts it back."""
    import gc

    seen: list[tuple[str, int]] = []
    gates = [asyncio.Event(), asyncio.Event()]
    entered = asyncio.Queue[int]()

    async def spy(request: Any, **kw: Any) -> Any:
        from ctxcore.assembly import assemble

        if request.messages:
            k = _large_number(request)
            await entered.put(k)
            await gates[k].wait()
            seen.append((f"large {k}", gc.get_threshold()[2]))
        else:
            seen.append(("small", gc.get_threshold()[2]))
        return await assemble(request, **kw)

    before = gc.get_threshold()

    async def main() -> None:
        async with running(open_config(), sources=FakeSources(TENANTS).sources(), assemble=spy) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=30.0) as client:
                await client.assemble(REQ)
                first = asyncio.ensure_future(client.assemble(_numbered_large(0)))
                second = asyncio.ensure_future(client.assemble(_numbered_large(1)))
                assert {await asyncio.wait_for(entered.get(), 10) for _ in range(2)} == {0, 1}
                await client.assemble(REQ)  # beside both
                gates[0].set()
                await first
                await client.assemble(REQ)  # beside the second
                gates[1].set()
                await second
                await client.assemble(REQ)

    asyncio.run(main())
    held = HELD_FULL_COLLECTION_THRESHOLD
    assert seen == [
        ("small", before[2]),
        ("small", held),
        ("large 0", held),
        ("small", held),
        ("large 1", held),
        ("small", before[2]),
    ]
    assert gc.get_threshold() == before


def test_full_collections_are_held_off_for_a_bounded_stretch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large calls that keep overlapping could hold off full collections for ever, and
    cyclic garbage would pile up: past `FULL_COLLECTIONS_HELD_AT_MOST_S` (0 here) the next
    large call to arrive puts the threshold back, and it stays back until none runs."""
    import gc

    from ctxcore.service import fullgc

    monkeypatch.setattr(fullgc, "FULL_COLLECTIONS_HELD_AT_MOST_S", 0.0)
    seen: list[tuple[str, int]] = []
    gate = asyncio.Event()
    entered = asyncio.Queue[int]()

    async def spy(request: Any, **kw: Any) -> Any:
        from ctxcore.assembly import assemble

        if request.messages:
            k = _large_number(request)
            seen.append((f"large {k} in", gc.get_threshold()[2]))
            await entered.put(k)
            await gate.wait()
        else:
            seen.append(("small", gc.get_threshold()[2]))
        return await assemble(request, **kw)

    before = gc.get_threshold()

    async def main() -> None:
        async with running(open_config(), sources=FakeSources(TENANTS).sources(), assemble=spy) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=30.0) as client:
                first = asyncio.ensure_future(client.assemble(_numbered_large(0)))
                assert await asyncio.wait_for(entered.get(), 10) == 0
                second = asyncio.ensure_future(client.assemble(_numbered_large(1)))
                assert await asyncio.wait_for(entered.get(), 10) == 1
                await client.assemble(REQ)
                gate.set()
                await asyncio.gather(first, second)

    asyncio.run(main())
    # The hold ends when the second call's conversion arrives (before its assembly starts).
    assert seen == [("large 0 in", HELD_FULL_COLLECTION_THRESHOLD), ("large 1 in", before[2]), ("small", before[2])]
    assert gc.get_threshold() == before


def test_max_running_is_read_from_the_file_and_checked(tmp_path: Any) -> None:
    path = tmp_path / "serve.toml"
    path.write_text('[server]\nmax_running = 2\n[store]\ndb = "m.db"\n')
    assert load_service_config(path).max_running == 2
    path.write_text('[server]\nmax_running = "auto"\n[store]\ndb = "m.db"\n')
    assert load_service_config(path).max_running is None
    assert ServiceConfig().max_running is None  # auto unless asked for
    for bad in (-1, 1.5, True, "two"):
        with pytest.raises(ConfigError, match="server.max_running"):
            ServiceConfig(max_running=bad)  # type: ignore[arg-type]
    path.write_text('[server]\nmax_running = "some"\n')
    with pytest.raises(ConfigError, match="server.max_running"):
        load_service_config(path)


def test_max_running_on_the_command_line_is_a_count_or_auto_and_overrides_the_file(tmp_path: Any) -> None:
    from ctxcore.cli import build_parser
    from ctxcore.service.cli import config_from_args

    path = tmp_path / "serve.toml"
    path.write_text("[server]\nmax_running = 3\n")
    parser = build_parser()

    def limit(*flags: str) -> int | None:
        return config_from_args(parser.parse_args(["serve", "--config", str(path), *flags])).max_running

    assert limit() == 3
    assert limit("--max-running", "0") == 0
    assert limit("--max-running", "auto") is None
    for bad in ("-1", "many", "1.5"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--max-running", bad])


def test_by_default_assemblies_over_the_sqlite_store_take_turns_and_other_sources_do_not(tmp_path: Any) -> None:
    """Auto: one assembly at a time when this process reads the SQLite store (its
    assemblies are CPU-bound here), no limit for sources handed in (a remote store waits
    on another process); an explicit setting wins either way."""
    from ctxcore.stores import NewMemory, SqliteMemoryStore

    db = tmp_path / "m.db"
    with SqliteMemoryStore(db) as store:
        store.add_many([NewMemory("m1", T.scope.organization_id, T.scope.agent_id, "marker note")])

    async def main() -> None:
        # Roomy branch timeouts: the answers are whole however busy the machine is.
        roomy = {
            k: 5000.0
            for k in (
                "client_timeout_ms",
                "server_deadline_ms",
                "directive_timeout_ms",
                "hot_timeout_ms",
                "cold_timeout_ms",
            )
        }
        async with running(open_config(db=db, assembly=roomy)) as svc:
            assert svc.turns is not None and svc.turns.limit == 1
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=10.0) as client:
                calls = await asyncio.gather(*(client.assemble(REQ) for _ in range(4)))
            assert all("marker note" in c.text and not c.degraded for c in calls)
            assert (svc.turns.running, svc.turns.waiting) == (0, 0)
        async with running(open_config(db=db, max_running=0)) as svc:
            assert svc.turns is None
        async with running(open_config(), sources=FakeSources(TENANTS).sources()) as svc:
            assert svc.turns is None
        async with running(open_config(max_running=2), sources=FakeSources(TENANTS).sources()) as svc:
            assert svc.turns is not None and svc.turns.limit == 2

    asyncio.run(main())
