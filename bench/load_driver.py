#!/usr/bin/env python3
"""A closed-loop grpc.aio load driver for `ctxcore serve`, loopback only.

    python bench/load_driver.py build-db bench.db --memories 100000
    ctxcore serve --db bench.db --allow-unauthenticated --bind 127.0.0.1:50051 &
    python bench/load_driver.py run --target 127.0.0.1:50051 --concurrency 16 --requests 20000

``run`` keeps exactly ``--concurrency`` AssembleContext calls in flight (each worker sends
its next call when the last one answers) until ``--requests`` calls are done or
``--max-seconds`` have passed, whichever is first, and prints one JSON document: calls,
seconds, rps, p50/p90/p99/max latency in ms, errors by status code, degraded answers and
which wall applied. Several targets (``--target A,B``) are balanced by the client's
``round_robin`` policy, the stateless scale-out path. Targets must be loopback addresses:
this driver never sends load anywhere else.

``open`` is the open loop that overload needs: calls arrive as a Poisson process at
``--rate`` per second for ``--seconds``, whether or not earlier ones have answered (a
closed loop slows down with the server and can never offer more than it answers). It
reports the offered and answered rates, how many calls the server refused at arrival
(its admission control marks them with ``ctxcore-admission`` in the trailing metadata),
their share of all failed calls, and the latency and deadline misses of the calls it
accepted. ``overload`` first measures the sustainable rate (a closed loop with a generous
deadline), then runs ``open`` at ``--factor`` times it::

    python bench/load_driver.py overload --target 127.0.0.1:50051 --factor 2 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
from bench_support import QUESTIONS, demo_texts, memory_text, scopes

from ctxcore.client import MAX_CONNECTIONS, ContextClient
from ctxcore.memory import Query, Scope
from ctxcore.request import AssemblyRequest
from ctxcore.retrieval import DEFAULT_CLIENT_TIMEOUT_MS
from ctxcore.service.wire import METHOD_PREFIX, request_to_proto
from ctxcore.v1 import context_assembly_pb2 as pb

#: The bounds every run obeys, whatever the flags say.
MAX_REQUESTS = 1_000_000
MAX_SECONDS = 600.0
MAX_CONCURRENCY = 1024


def check_loopback(target: str) -> list[str]:
    """The host:port pairs of a target list, each checked to be a loopback address.

    >>> check_loopback("127.0.0.1:5001,127.0.0.1:5002")
    ['127.0.0.1:5001', '127.0.0.1:5002']
    """
    hosts = target.removeprefix("ipv4:").removeprefix("ipv6:").split(",")
    for hp in hosts:
        host = hp.rpartition(":")[0].strip("[]")
        ok = host == "localhost"
        try:
            ok = ok or ipaddress.ip_address(host).is_loopback
        except ValueError:
            pass
        if not ok:
            raise SystemExit(f"refusing to send load to {hp!r}: loopback addresses only (127.0.0.0/8, ::1)")
    return hosts


def channel_target(hosts: Sequence[str]) -> str:
    """One gRPC target for one or several loopback replicas."""
    return hosts[0] if len(hosts) == 1 else "ipv4:" + ",".join(hosts)


# ---- the bench database ---------------------------------------------------------------


def _corpus(n: int) -> Iterator[Any]:
    from ctxcore.stores import NewMemory

    texts = demo_texts()
    rng = random.Random(2026)
    all_scopes = scopes()
    for i in range(n):
        text = memory_text(rng, texts)
        s = all_scopes[rng.randrange(len(all_scopes))]
        yield NewMemory(f"m{i:06d}", s.organization_id, s.agent_id, text, created_at=1.7e9 + i)


def build_db(path: Path, n: int, optimize: bool = True) -> float:
    """Create the bench database (n memories over 100 scopes, one directive each), its
    full-text index merged into one segment as after any bulk load (`optimize`, see
    `SqliteMemoryStore.optimize`); returns the seconds it took."""
    from ctxcore.stores import HashingEmbedder, SqliteMemoryStore

    t0 = time.perf_counter()
    with SqliteMemoryStore(path, embedder=HashingEmbedder()) as store:
        batch = []
        for m in _corpus(n):
            batch.append(m)
            if len(batch) == 10_000:
                store.add_many(batch)
                batch = []
        store.add_many(batch)
        for s in scopes():
            store.set_directive(
                s.organization_id,
                s.agent_id,
                f"You are the assistant of {s.organization_id}/{s.agent_id}. Be brief and exact.",
            )
        if optimize:
            store.optimize()
    return time.perf_counter() - t0


# ---- the closed loop ------------------------------------------------------------------


async def wait_serving(hosts: Sequence[str], timeout_s: float = 30.0) -> None:
    """Wait until every replica's grpc.health.v1 status is SERVING (its store is open)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    for host in hosts:
        async with grpc.aio.insecure_channel(host) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                try:
                    r = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{host} is not SERVING after {timeout_s:g} s")
                await asyncio.sleep(0.05)


async def run_load(
    target: str,
    *,
    concurrency: int = 16,
    requests: int = 10_000,
    max_seconds: float = 60.0,
    timeout_ms: float = DEFAULT_CLIENT_TIMEOUT_MS,
    model: str = "gpt-4o",
    api_key: str | None = None,
    token: str | None = None,
    seed: int = 1,
    warm_pairs: bool = False,
    connections: int = 1,
) -> dict[str, Any]:
    """Closed-loop load: `concurrency` workers, each sending its next AssembleContext as
    soon as the last one answered, until `requests` are done or `max_seconds` pass.
    `warm_pairs` first sends every scope/question pair once (4 in flight, 2 s deadlines),
    before the clock: the run then measures a server that has seen its traffic (a scope's
    first reads of a query's terms cost more than later ones). The client opens
    `connections` connections to every target (`ContextClient`'s ``connections``: each
    call on the one with the fewest calls in flight): a server with ``--workers N``
    spreads connections, not calls, over its processes."""
    hosts = check_loopback(target)
    concurrency = max(1, min(concurrency, MAX_CONCURRENCY))
    requests = max(1, min(requests, MAX_REQUESTS))
    max_seconds = min(max_seconds, MAX_SECONDS)
    rng = random.Random(seed)
    all_scopes = scopes()
    lat: list[float] = []
    errors: dict[str, int] = {}
    refused: dict[str, int] = {}
    ok_lat: list[float] = []
    degraded = 0
    walls: dict[str, int] = {}
    branches: dict[str, int] = {}
    sent = 0
    connections = max(1, min(connections, MAX_CONNECTIONS))
    await wait_serving(hosts)
    async with ContextClient(
        channel_target(hosts), api_key=api_key, token=token, timeout=timeout_ms / 1000, connections=connections
    ) as c:
        # Connect to the replicas before the clock starts (the client's `_pick` takes each
        # connection in turn while none has a call in flight).
        for _ in range(connections * len(hosts)):
            await c.model_capabilities("gpt-4o", timeout=5.0)
        warmed = 0
        if warm_pairs:
            line = asyncio.Semaphore(4)

            async def warm(s: Scope, q: str) -> None:
                nonlocal warmed
                async with line:
                    await c.assemble(AssemblyRequest(s.organization_id, s.agent_id, model, Query(q)), timeout=2.0)
                    warmed += 1

            await asyncio.gather(*(warm(s, q) for s in all_scopes for q in QUESTIONS))
        stop_at = time.monotonic() + max_seconds
        t_start = time.perf_counter()

        async def worker() -> None:
            nonlocal sent, degraded
            while sent < requests and time.monotonic() < stop_at:
                sent += 1
                s = all_scopes[rng.randrange(len(all_scopes))]
                req = AssemblyRequest(s.organization_id, s.agent_id, model, Query(rng.choice(QUESTIONS)))
                t0 = time.perf_counter()
                try:
                    r = await c.assemble(req)
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                    reason = _admission_reason(exc)
                    if reason:
                        refused[reason] = refused.get(reason, 0) + 1
                    lat.append((time.perf_counter() - t0) * 1000)
                    continue
                lat.append((time.perf_counter() - t0) * 1000)
                ok_lat.append(lat[-1])
                degraded += r.degraded
                for b in r.branches:
                    if b.status not in (pb.BRANCH_STATUS_OK, pb.BRANCH_STATUS_SKIPPED):
                        key = (
                            f"{pb.Branch.Name(b.branch).removeprefix('BRANCH_').lower()}_"
                            f"{pb.BranchStatus.Name(b.status).removeprefix('BRANCH_STATUS_').lower()}"
                        )
                        branches[key] = branches.get(key, 0) + 1
                w = pb.WallSource.Name(r.wall.source).removeprefix("WALL_SOURCE_").lower()
                walls[w] = walls.get(w, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t_start
    lat.sort()
    ok_lat.sort()

    def pct(p: float, xs: list[float] = lat) -> float:
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else float("nan")

    return {
        "targets": hosts,
        "concurrency": concurrency,
        "connections": connections,
        "warmed_pairs": warmed,
        "calls": len(lat),
        "seconds": round(elapsed, 3),
        "rps": round(len(lat) / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(lat[-1], 3) if lat else float("nan"),
        "errors": errors,
        # Of the failed calls, those the server refused at arrival (by admission reason):
        # answered at once, with no work done, where the rest ran out of time.
        "refused_at_arrival": dict(sorted(refused.items())),
        "ok_share": round(len(ok_lat) / len(lat), 4) if lat else 0.0,
        "deadline_exceeded_share": round(errors.get("DEADLINE_EXCEEDED", 0) / len(lat), 4) if lat else 0.0,
        "ok_p50_ms": pct(0.50, ok_lat),
        "ok_p99_ms": pct(0.99, ok_lat),
        "degraded": degraded,
        "degraded_branches": dict(sorted(branches.items())),
        "walls": walls,
    }


#: The trailing-metadata key of a refusal at arrival (ctxcore.service.admission.ADMISSION_KEY).
ADMISSION_KEY = "ctxcore-admission"


def _admission_reason(exc: grpc.aio.AioRpcError) -> str | None:
    """The admission reason a refused call carries (None: the call was not refused at
    arrival)."""
    # grpc.aio's AioRpcError.trailing_metadata() returns a grpc.aio.Metadata (or None);
    # grpc-stubs types it as the sync RpcError's tuple of _Metadatum.
    trailing = cast("grpc.aio.Metadata | None", exc.trailing_metadata())
    mark = trailing.get(ADMISSION_KEY) if trailing is not None else None
    return mark if isinstance(mark, str) else None


#: Calls of the open loop outstanding at once, at most: beyond it arrivals are counted as
#: not sent rather than piling up in the driver.
MAX_OUTSTANDING = 4096


def _pct(xs: Sequence[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p * len(s)))], 3)


async def run_open_loop(
    target: str,
    *,
    rate: float,
    seconds: float = 10.0,
    timeout_ms: float = DEFAULT_CLIENT_TIMEOUT_MS,
    model: str = "gpt-4o",
    api_key: str | None = None,
    token: str | None = None,
    seed: int = 1,
) -> dict[str, Any]:
    """Open-loop load: Poisson arrivals at `rate` calls/s for `seconds`, each an
    AssembleContext with a `timeout_ms` deadline, sent whether or not earlier calls have
    answered.

    Returns a report: ``offered_rps`` (calls sent per second), ``answered_rps`` (OK per
    second), ``refused_at_arrival`` (failed calls marked by the server's admission
    control), ``refused_share_of_failures``, ``accepted`` (calls not refused at arrival)
    with their ``accepted_p50_ms`` / ``accepted_p99_ms`` and ``accepted_met_deadline``
    (the share of them answered OK inside the deadline), and ``codes``.
    """
    hosts = check_loopback(target)
    rate = max(0.1, float(rate))
    seconds = min(float(seconds), MAX_SECONDS)
    rng = random.Random(seed)
    # Requests are serialized up front and answers are not decoded, so that the driver
    # (which shares the machine with the server) spends as little as it can per call.
    payloads = [
        request_to_proto(AssemblyRequest(s.organization_id, s.agent_id, model, Query(q))).SerializeToString()
        for s in scopes()
        for q in QUESTIONS
    ]
    metadata: list[tuple[str, str]] = []
    if api_key is not None:
        metadata.append(("x-api-key", api_key))
    if token is not None:
        metadata.append(("authorization", f"Bearer {token}"))
    codes: dict[str, int] = {}
    refused: dict[str, int] = {}
    accepted_lat: list[float] = []
    lag: list[float] = []
    lost = 0
    tasks: set[asyncio.Task[None]] = set()
    await wait_serving(hosts)
    async with ContextClient(channel_target(hosts), api_key=api_key, token=token, timeout=timeout_ms / 1000) as c:
        for _ in hosts:
            await c.model_capabilities("gpt-4o", timeout=5.0)
        call = c._channel.unary_unary(  # type: ignore[call-arg]  # grpc-stubs lack _registered_method
            METHOD_PREFIX + "AssembleContext",
            request_serializer=None,
            response_deserializer=None,
            _registered_method=True,
        )

        async def one(payload: bytes) -> None:
            t0 = time.perf_counter()
            try:
                await call(payload, timeout=timeout_ms / 1000, metadata=metadata)
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
                mark = _admission_reason(exc)
                if mark is not None:
                    refused[mark] = refused.get(mark, 0) + 1
                    codes[code] = codes.get(code, 0) + 1
                    return
            codes[code] = codes.get(code, 0) + 1
            accepted_lat.append((time.perf_counter() - t0) * 1000)

        sent = 0
        t_start = time.perf_counter()
        next_at = t_start
        end = t_start + seconds
        while True:
            next_at += rng.expovariate(rate)
            if next_at >= end:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            # How late the driver sends: its own lateness, apart from the server's.
            lag.append(max(0.0, (time.perf_counter() - next_at) * 1000))
            if len(tasks) >= MAX_OUTSTANDING:
                lost += 1
                continue
            t = asyncio.create_task(one(payloads[rng.randrange(len(payloads))]))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            sent += 1
        if tasks:
            await asyncio.wait(set(tasks))
        elapsed = max(seconds, time.perf_counter() - t_start)
    failed = sum(v for k, v in codes.items() if k != "OK")
    n_refused = sum(refused.values())
    return {
        "targets": hosts,
        "timeout_ms": timeout_ms,
        "rate": rate,
        "seconds": round(elapsed, 3),
        "sent": sent,
        "not_sent": lost,
        "offered_rps": round(sent / seconds, 1),
        "answered_rps": round(codes.get("OK", 0) / seconds, 1),
        "ok": codes.get("OK", 0),
        "failed": failed,
        "refused_at_arrival": n_refused,
        "refused_by_reason": refused,
        "refused_share_of_failures": round(n_refused / failed, 4) if failed else 1.0,
        "accepted": len(accepted_lat),
        # A call answered OK met its deadline: the client's gRPC runtime enforces it.
        "accepted_met_deadline": round(codes.get("OK", 0) / len(accepted_lat), 4) if accepted_lat else 1.0,
        "accepted_p50_ms": _pct(accepted_lat, 0.50),
        "accepted_p99_ms": _pct(accepted_lat, 0.99),
        "driver_lag_p99_ms": _pct(lag, 0.99),
        "codes": codes,
    }


async def run_overload(
    target: str,
    *,
    factor: float = 2.0,
    seconds: float = 10.0,
    timeout_ms: float = DEFAULT_CLIENT_TIMEOUT_MS,
    calibrate_requests: int = 1500,
    concurrency: int = 16,
    **kw: Any,
) -> dict[str, Any]:
    """The sustainable rate (closed loop, `concurrency` in flight, 2 s deadlines: what the
    server completes per second when nothing expires), then `run_open_loop` at `factor`
    times it."""
    closed = await run_load(
        target, concurrency=concurrency, requests=calibrate_requests, max_seconds=60.0, timeout_ms=2000.0, **kw
    )
    sustainable = float(closed["rps"])
    report = await run_open_loop(target, rate=factor * sustainable, seconds=seconds, timeout_ms=timeout_ms, **kw)
    report["sustainable_rps"] = sustainable
    report["factor"] = factor
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Closed-loop load driver for ctxcore serve (loopback only).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-db", help="create the bench SQLite database")
    b.add_argument("path", type=Path)
    b.add_argument("--memories", type=int, default=100_000)
    b.add_argument(
        "--no-optimize",
        action="store_true",
        help="leave the full-text index in the segments the writes left (no `optimize`)",
    )
    r = sub.add_parser("run", help="run the closed loop and print a JSON report")
    r.add_argument("--target", required=True, help="host:port, or several joined by commas (round_robin)")
    r.add_argument("--concurrency", type=int, default=16)
    r.add_argument("--requests", type=int, default=10_000)
    r.add_argument("--max-seconds", type=float, default=60.0)
    r.add_argument("--timeout-ms", type=float, default=DEFAULT_CLIENT_TIMEOUT_MS)
    r.add_argument("--model", default="gpt-4o")
    r.add_argument("--api-key")
    r.add_argument("--token")
    r.add_argument(
        "--warm-pairs", action="store_true", help="first send every scope/question pair once, before the clock"
    )
    r.add_argument(
        "--connections",
        type=int,
        default=1,
        help="channels, each with its own connection, that share the calls (default 1)",
    )
    for name, helptext in (
        ("open", "open-loop Poisson arrivals at --rate calls/s"),
        ("overload", "measure the sustainable rate, then run open at --factor times it"),
    ):
        o = sub.add_parser(name, help=helptext)
        o.add_argument("--target", required=True, help="host:port, or several joined by commas (round_robin)")
        o.add_argument("--seconds", type=float, default=10.0)
        o.add_argument("--timeout-ms", type=float, default=DEFAULT_CLIENT_TIMEOUT_MS)
        o.add_argument("--model", default="gpt-4o")
        o.add_argument("--api-key")
        o.add_argument("--token")
        if name == "open":
            o.add_argument("--rate", type=float, required=True, help="calls per second offered")
        else:
            o.add_argument("--factor", type=float, default=2.0, help="offered rate over the sustainable rate")
    args = ap.parse_args(argv)
    if args.cmd in ("open", "overload"):
        common = dict(
            seconds=args.seconds, timeout_ms=args.timeout_ms, model=args.model, api_key=args.api_key, token=args.token
        )
        if args.cmd == "open":
            out = asyncio.run(run_open_loop(args.target, rate=args.rate, **common))
        else:
            out = asyncio.run(run_overload(args.target, factor=args.factor, **common))
        print(json.dumps(out, indent=2))
        return 0
    if args.cmd == "build-db":
        if args.path.exists():
            raise SystemExit(f"{args.path} exists")
        secs = build_db(args.path, args.memories, optimize=not args.no_optimize)
        print(json.dumps({"path": str(args.path), "memories": args.memories, "seconds": round(secs, 1)}))
        return 0
    report = asyncio.run(
        run_load(
            args.target,
            concurrency=args.concurrency,
            requests=args.requests,
            max_seconds=args.max_seconds,
            timeout_ms=args.timeout_ms,
            model=args.model,
            api_key=args.api_key,
            token=args.token,
            warm_pairs=args.warm_pairs,
            connections=args.connections,
        )
    )
    print(json.dumps(report, indent=2))
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
