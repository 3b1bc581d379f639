"""Faults and leaks through the real server: every branch x {raise, hang, corrupt,
out-of-scope} x {one, two, all three branches} gives the documented degraded outcome
(never INTERNAL, never a foreign memory); and a canary check across 50 tenants under
concurrent, faulty load finds no tenant's canary in another tenant's response.

Documented outcomes, per faulted branch:
  raise         -> branch ``error`` (the wire carries the exception class only), degraded
  hang          -> branch ``timeout`` (cancelled at its timeout or the wall), degraded
  corrupt       -> branch ``error`` (the whole result is rejected), degraded
  out_of_scope  -> memory branches: ``ok``, the foreign memories dropped and counted
                   (trace entries without ids); the directive, which is plain text with no
                   scope of its own, gets records instead of text: ``error``, degraded
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from pathlib import Path

import grpc
import pytest
from service_support import (
    BRANCHES,
    FAULTS,
    FakeSources,
    FaultPlan,
    api_key_file,
    make_tenants,
    open_config,
    running,
)

from ctxcore.client import ContextClient
from ctxcore.memory import Query
from ctxcore.request import AssemblyRequest
from ctxcore.service import AuthConfig, Grant, ServiceConfig
from ctxcore.service.admission import ADMISSION_KEY
from ctxcore.v1 import context_assembly_pb2 as pb

CANARY = re.compile(rb"CANARY-(\d{3})-\d{2}-[0-9a-f]{12}")
CASES = [(fault, subset) for fault in FAULTS for k in (1, 2, 3) for subset in itertools.combinations(BRANCHES, k)]
_BRANCH = {"directive": pb.BRANCH_DIRECTIVE, "hot": pb.BRANCH_HOT, "cold": pb.BRANCH_COLD}


def _expected_status(fault: str | None, branch: str) -> int:
    if fault is None:
        return pb.BRANCH_STATUS_OK
    if fault == "hang":
        return pb.BRANCH_STATUS_TIMEOUT
    if fault == "out_of_scope" and branch != "directive":
        return pb.BRANCH_STATUS_OK
    return pb.BRANCH_STATUS_ERROR


def _foreign_canaries(blob: bytes, tenant: int) -> list[bytes]:
    return [m.group(0) for m in CANARY.finditer(blob) if int(m.group(1)) != tenant]


#: Branch timeouts long enough that only a hanging source ever times out, however busy the
#: machine: the matrix checks outcomes, not speed.
ROOMY = {
    "client_timeout_ms": 1000,
    "server_deadline_ms": 1000,
    "directive_timeout_ms": 250,
    "hot_timeout_ms": 250,
    "cold_timeout_ms": 300,
}


def test_fault_matrix() -> None:
    tenants = make_tenants(4)
    fake = FakeSources(tenants)
    t = tenants[0]

    async def main() -> None:
        async with running(open_config(assembly=ROOMY), sources=fake.sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=2.0) as client:
                for fault, subset in CASES:
                    fake.plan = FaultPlan({b: fault for b in subset})
                    where = f"{fault} x {subset}"
                    r = await client.assemble(
                        AssemblyRequest(t.scope.organization_id, t.scope.agent_id, "gpt-4o", Query("marker"))
                    )
                    blob = r.SerializeToString()
                    assert _foreign_canaries(blob, 0) == [], where
                    statuses = {b.branch: b for b in r.branches}
                    failed = False
                    for name in BRANCHES:
                        f = fault if name in subset else None
                        rec = statuses[_BRANCH[name]]
                        assert rec.status == _expected_status(f, name), (where, name, rec)
                        failed |= rec.status in (pb.BRANCH_STATUS_ERROR, pb.BRANCH_STATUS_TIMEOUT)
                        if f == "raise":
                            assert rec.error == "RuntimeError", where
                        if f == "out_of_scope" and name != "directive":
                            assert rec.dropped_out_of_scope == 2 + 2 * (name == "cold") or rec.dropped_out_of_scope > 0
                    assert r.degraded == failed, where
                    if failed:
                        assert r.degradation_reasons, where
                    own = {m.group(0) for m in CANARY.finditer(r.text.encode())}
                    want_own = set()
                    if _expected_status(fault if "directive" in subset else None, "directive") == pb.BRANCH_STATUS_OK:
                        want_own.add(sorted(t.canaries)[-1])
                    for name, mems in (("hot", t.memories[:2]), ("cold", t.memories[2:])):
                        if _expected_status(fault if name in subset else None, name) == pb.BRANCH_STATUS_OK:
                            want_own |= {c for c in t.canaries if any(c in m.text for m in mems)}
                    assert {c.decode() for c in own} == want_own, where
                    out_of_scope = [e for e in r.trace if e.reason == pb.TRACE_REASON_OUT_OF_SCOPE]
                    assert all(e.memory_id == "" for e in out_of_scope), where

    asyncio.run(main())


def test_faults_under_a_tight_deadline_never_internal() -> None:
    """With every branch hanging and 20 ms on the clock: a degraded answer under the
    caller's wall, DEADLINE_EXCEEDED, or a refusal at arrival for load (RESOURCE_EXHAUSTED
    with the admission mark); nothing else."""
    tenants = make_tenants(2)
    fake = FakeSources(tenants, FaultPlan({b: "hang" for b in BRANCHES}))
    t = tenants[0]

    async def main() -> None:
        codes: dict[str, int] = {}
        async with running(open_config(), sources=fake.sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}") as client:
                for timeout in (0.004, 0.008, 0.012, 0.020, 0.030):
                    for _ in range(5):
                        try:
                            r = await client.assemble(
                                AssemblyRequest(t.scope.organization_id, t.scope.agent_id, "gpt-4o", Query("q")),
                                timeout=timeout,
                            )
                            assert r.degraded and r.wall.source == pb.WALL_SOURCE_CALLER_DEADLINE
                            codes["OK"] = codes.get("OK", 0) + 1
                        except grpc.aio.AioRpcError as exc:
                            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                                assert ADMISSION_KEY in dict(exc.trailing_metadata() or ()), exc
                            else:
                                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
                            codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
        assert codes.get("OK", 0) > 0 and codes.get("DEADLINE_EXCEEDED", 0) + codes.get("RESOURCE_EXHAUSTED", 0) > 0, (
            codes
        )

    asyncio.run(main())


# ---- canary leak check -----------------------------------------------------------------


def run_canary(
    n_requests: int, n_tenants: int = 50, concurrency: int = 48, seed: int = 11, tmp: Path | None = None
) -> dict[str, int]:
    """`n_requests` assemblies by `n_tenants` tenants, each with its own API key granted its
    own organization/agent only, while every branch faults at random (30% of calls: raise,
    hang, corrupt or out-of-scope). One in ten requests asks for another tenant's scope
    and must be refused. Every response is scanned whole for canaries."""
    assert tmp is not None
    tenants = make_tenants(n_tenants)
    keys = {f"tenant-{t.index}": f"key-{t.index:03d}-" + "k" * 40 for t in tenants}
    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(
            api_key_file=api_key_file(tmp, keys),
            principals={f"tenant-{t.index}": (Grant(t.scope.organization_id, t.scope.agent_id),) for t in tenants},
        ),
    )
    fake = FakeSources(tenants, FaultPlan(rate=0.3, mixed=FAULTS, rng=random.Random(seed)))
    stats = {"requests": 0, "ok": 0, "denied": 0, "degraded": 0, "own_canaries": 0, "foreign_canaries": 0, "other": 0}

    async def main() -> None:
        async with running(cfg, sources=fake.sources()) as svc:
            clients = [
                ContextClient(f"127.0.0.1:{svc.port}", api_key=keys[f"tenant-{t.index}"], timeout=2.0) for t in tenants
            ]
            rng = random.Random(seed)
            plan = [(rng.randrange(n_tenants), rng.random() < 0.1) for _ in range(n_requests)]
            it = iter(plan)

            async def worker() -> None:
                for who, cross in it:
                    target = tenants[(who + 1) % n_tenants] if cross else tenants[who]
                    req = AssemblyRequest(
                        target.scope.organization_id, target.scope.agent_id, "gpt-4o", Query("secret marker")
                    )
                    stats["requests"] += 1
                    try:
                        r = await clients[who].assemble(req)
                    except grpc.aio.AioRpcError as exc:
                        if cross and exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                            stats["denied"] += 1
                        else:
                            stats["other"] += 1
                        continue
                    assert not cross, "a cross-tenant request was served"
                    blob = r.SerializeToString()
                    foreign = _foreign_canaries(blob, who)
                    stats["foreign_canaries"] += len(foreign)
                    stats["own_canaries"] += len(CANARY.findall(r.text.encode())) - len(foreign)
                    stats["ok"] += 1
                    stats["degraded"] += r.degraded

            try:
                await asyncio.gather(*(worker() for _ in range(concurrency)))
            finally:
                for c in clients:
                    await c.close()

    asyncio.run(main())
    return stats


def test_canary_leak_check(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    stats = run_canary(10_000, tmp=tmp_path)
    elapsed = time.perf_counter() - t0
    print(f"\ncanary check: {stats} in {elapsed:.1f} s ({stats['requests'] / elapsed:.0f} req/s)")
    assert stats["requests"] == 10_000
    assert stats["foreign_canaries"] == 0
    assert stats["other"] == 0
    assert stats["denied"] > 500 and stats["degraded"] > 1000 and stats["own_canaries"] > 10_000


@pytest.mark.slow
def test_canary_leak_check_long(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    stats = run_canary(100_000, tmp=tmp_path, seed=12)
    elapsed = time.perf_counter() - t0
    print(f"\ncanary check (long): {stats} in {elapsed:.1f} s")
    assert stats["foreign_canaries"] == 0 and stats["other"] == 0
