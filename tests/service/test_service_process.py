"""`ctxcore serve` as an operator runs it: a real process on a loopback port over the
SQLite store. Health is NOT_SERVING until the store is open and from SIGTERM on; calls in
flight finish during the drain; reflection only on loopback; metrics on their own port;
JSON logs that never carry memory text; API keys from `ctxcore api-key`; two replicas
behind the client's round_robin policy; and a refusal to start without authentication on
a non-loopback address."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from service_support import CTXCORE, FakeSources, make_tenants, open_config, running

from ctxcore.client import ContextClient
from ctxcore.memory import Query
from ctxcore.request import AssemblyRequest
from ctxcore.service import AuthConfig, ContextService, ServiceConfig

ORG, AGENT = "acme-retail", "support"


class Served:
    def __init__(self, proc: subprocess.Popen[str], port: int, metrics_port: int | None) -> None:
        self.proc, self.port, self.metrics_port = proc, port, metrics_port
        self.log: list[dict[str, Any]] = []

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
            return str(r.read().decode())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(15)
        assert self.proc.stderr is not None
        for line in self.proc.stderr.read().splitlines():
            self.log.append(json.loads(line))
        self.proc.stderr.close()
        return rc


def _serve(*args: str) -> Served:
    proc = subprocess.Popen(
        [*CTXCORE, "serve", "--bind", "127.0.0.1:0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    port, metrics_port, log = 0, None, []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"ctxcore serve exited with {proc.wait()}")
        rec = json.loads(line)
        log.append(rec)
        if rec["event"] == "starting":
            port, metrics_port = rec["port"], rec["metrics_port"]
        if rec["event"] == "serving":
            s = Served(proc, port, metrics_port)
            s.log = log
            return s
    proc.kill()
    raise AssertionError("ctxcore serve did not start")


@pytest.fixture
def served(demo_db: Path) -> Iterator[Served]:
    s = _serve("--db", str(demo_db), "--allow-unauthenticated", "--metrics-port", "0")
    yield s
    if s.proc.poll() is None:
        s.stop()


def _request(query: str = "Can I return shoes after three weeks?") -> AssemblyRequest:
    return AssemblyRequest(ORG, AGENT, "gpt-4o", Query(query))


def test_serve_answers_reflects_and_counts(served: Served) -> None:
    async def main() -> list[str]:
        target = f"127.0.0.1:{served.port}"
        async with grpc.aio.insecure_channel(target) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for name in ("", "ctxcore.v1.ContextAssemblyService"):
                r = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)
                assert r.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            names: list[str] = []
            async for resp in refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            ):
                names += [s.name for s in resp.list_services_response.service]
            assert "ctxcore.v1.ContextAssemblyService" in names and "grpc.health.v1.Health" in names
        bodies = []
        async with ContextClient(target, timeout=2.0) as client:
            for q in ("Can I return shoes after three weeks?", "refund to gift card", "shipping to Canada"):
                ctx = await client.assemble(_request(q))
                assert ctx.scope.organization_id == ORG  # (the first call may degrade while caches warm)
                bodies += re.findall(r"<(?:memory|m) [^>]*>([^<]{20,})</(?:memory|m)>", ctx.text)
        return bodies

    bodies = asyncio.run(main())
    assert bodies, "the demo store returned no memories"
    text = served.metrics()
    assert re.search(r'ctxcore_requests_total\{code="OK",rpc="AssembleContext"\} 3\.0', text), text
    for branch in ("directive", "hot", "cold"):
        outcomes = re.findall(rf'ctxcore_branch_outcomes_total\{{branch="{branch}",status="\w+"\}} (\d+)', text)
        assert sum(float(n) for n in outcomes) == 3, (branch, outcomes)
    assert "ctxcore_stage_seconds_bucket" in text and "ctxcore_usable_budget_tokens_count 3.0" in text
    assert re.search(r'ctxcore_pack_path_total\{path="(dp|trivial|greedy)"\}', text)
    assert served.stop() == 0
    events = [r["event"] for r in served.log]
    assert events[:3] == ["starting", "store_open", "serving"] and events[-2:] == ["draining", "stopped"]
    calls = [r for r in served.log if r["event"] == "call"]
    assert len(calls) == 3 and all(c["code"] == "OK" and c["rpc"] == "AssembleContext" for c in calls)
    logged = json.dumps(served.log)
    for body in bodies:
        assert body not in logged, "memory text reached the logs"


def test_sigterm_drains_in_flight_calls() -> None:
    """Health goes NOT_SERVING as soon as the drain starts (while calls are still
    accepted for ``drain_delay_s``, so load balancers move away first); a call in flight
    finishes; a call after the drain is refused."""
    tenants = make_tenants(1)
    t = tenants[0]
    started = asyncio.Event()

    async def slow_assemble(request: Any, **kw: Any) -> Any:
        from ctxcore.assembly import assemble

        started.set()
        await asyncio.sleep(0.3)
        return await assemble(request, **{**kw, "deadline": None})

    async def main() -> None:
        svc = ContextService(
            open_config(shutdown_grace_s=3.0, drain_delay_s=0.2),
            sources=FakeSources(tenants).sources(),
            assemble=slow_assemble,
        )
        await svc.start()
        target = f"127.0.0.1:{svc.port}"
        async with ContextClient(target, timeout=5.0) as client, grpc.aio.insecure_channel(target) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            call = asyncio.ensure_future(
                client.assemble(AssemblyRequest(t.scope.organization_id, t.scope.agent_id, "gpt-4o", Query("q")))
            )
            await started.wait()
            stopping = asyncio.ensure_future(svc.stop())
            await asyncio.sleep(0.05)
            r = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
            ctx = await call  # finishes during the drain
            assert ctx.scope.organization_id == t.scope.organization_id
            await stopping
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await client.assemble(
                    AssemblyRequest(t.scope.organization_id, t.scope.agent_id, "gpt-4o", Query("q")), timeout=1.0
                )
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())


def test_not_serving_until_the_store_is_open() -> None:
    tenants = make_tenants(1)
    t = tenants[0]
    gate = asyncio.Event()

    async def main() -> None:
        async def opener() -> Any:
            await gate.wait()
            return FakeSources(tenants)

        svc = ContextService(open_config(), store_opener=opener)
        starting = asyncio.ensure_future(svc.start())
        for _ in range(200):
            if svc.port:
                break
            await asyncio.sleep(0.01)
        target = f"127.0.0.1:{svc.port}"
        async with grpc.aio.insecure_channel(target) as ch, ContextClient(target, timeout=2.0) as client:
            health = health_pb2_grpc.HealthStub(ch)
            r = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
            req = AssemblyRequest(t.scope.organization_id, t.scope.agent_id, "gpt-4o", Query("q"))
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await client.assemble(req)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            gate.set()
            await starting
            r = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
            assert (await client.assemble(req)).scope.agent_id == t.scope.agent_id
        await svc.stop(0)

    asyncio.run(main())


def test_reflection_can_be_turned_off() -> None:
    async def main() -> None:
        async with running(open_config(reflection=False), sources=FakeSources(make_tenants(1)).sources()) as svc:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
                refl = reflection_pb2_grpc.ServerReflectionStub(ch)
                # No request message: the server's UNIMPLEMENTED can then never race the
                # client's send of one (which gRPC reports as INTERNAL "Failed execute_batch").
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    async for _ in refl.ServerReflectionInfo(iter([])):
                        pass
                assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED

    asyncio.run(main())


def test_refuses_to_start_without_auth_off_loopback(demo_db: Path) -> None:
    with pytest.raises(ValueError, match="loopback binds only"):
        ContextService(ServiceConfig(bind="10.1.2.3:7000", auth=AuthConfig(allow_unauthenticated=True)))
    for args in (["--bind", "0.0.0.0:0"], ["--bind", "0.0.0.0:0", "--allow-unauthenticated"], []):
        r = subprocess.run([*CTXCORE, "serve", "--db", str(demo_db), *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, r
        assert "refusing to serve" in r.stderr


def test_api_keys_and_grants(tmp_path: Path, demo_db: Path) -> None:
    r = subprocess.run([*CTXCORE, "api-key", "checkout"], capture_output=True, text=True, timeout=30, check=True)
    key = re.search(r"^key:\s+(\S+)$", r.stdout, re.M)
    line = re.search(r"^line:\s+(.+)$", r.stdout, re.M)
    assert key and line and line.group(1).startswith("checkout sha256:")
    assert key.group(1) not in line.group(1)
    keys = tmp_path / "keys.txt"
    keys.write_text(line.group(1) + "\n")
    s = _serve("--db", str(demo_db), "--api-key-file", str(keys), "--grant", f"checkout={ORG}/*")

    async def main() -> None:
        async with ContextClient(f"127.0.0.1:{s.port}", api_key=key.group(1), timeout=2.0) as c:
            assert (await c.assemble(_request())).principal == "checkout"
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await c.assemble(AssemblyRequest("other-org", AGENT, "gpt-4o", Query("q")))
            assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        async with ContextClient(f"127.0.0.1:{s.port}", api_key="wrong", timeout=2.0) as c:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await c.assemble(_request())
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED

    try:
        asyncio.run(main())
    finally:
        assert s.stop() == 0
    assert key.group(1) not in json.dumps(s.log)


def test_two_replicas_behind_round_robin(demo_db: Path) -> None:
    a = _serve("--db", str(demo_db), "--allow-unauthenticated", "--metrics-port", "0")
    b = _serve("--db", str(demo_db), "--allow-unauthenticated", "--metrics-port", "0")
    try:

        async def main() -> None:
            async with ContextClient(f"ipv4:127.0.0.1:{a.port},127.0.0.1:{b.port}", timeout=2.0) as c:
                for _ in range(40):
                    await c.assemble(_request())

        asyncio.run(main())
        counts = []
        for s in (a, b):
            m = re.search(r'ctxcore_requests_total\{code="OK",rpc="AssembleContext"\} (\d+)', s.metrics())
            counts.append(int(m.group(1)) if m else 0)
        assert sum(counts) == 40 and min(counts) >= 10, counts
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_start_up_errors_are_named(tmp_path: Path, served: Served) -> None:
    missing = tmp_path / "nope.db"
    not_a_db = tmp_path / "text.db"
    not_a_db.write_text("these are not the pages you are looking for\n" * 100)
    cases = [
        (["--db", str(not_a_db), "--allow-unauthenticated"], "cannot open the memory store"),
        (["--db", str(missing), "--allow-unauthenticated"], "does not exist"),
        (["--db", str(missing), "--allow-unauthenticated", "--bind", f"127.0.0.1:{served.port}"], "does not exist"),
        (["--allow-unauthenticated"], "store.db (or --db) is required"),
        (["--config", str(tmp_path / "missing.toml")], "cannot read config"),
        (["--jwt-issuer", "i", "--allow-unauthenticated"], "go together"),
    ]
    for args, needle in cases:
        r = subprocess.run([*CTXCORE, "serve", *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and needle in r.stderr, (args, r.stderr)


def test_a_taken_port_is_an_error(served: Served, demo_db: Path) -> None:
    r = subprocess.run(
        [*CTXCORE, "serve", "--db", str(demo_db), "--allow-unauthenticated", "--bind", f"127.0.0.1:{served.port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "cannot bind" in r.stderr, r.stderr


@pytest.mark.parametrize("tune", [False, True], ids=["library", "tuned"])
def test_serve_changes_the_interpreter_only_when_asked(tune: bool) -> None:
    # `serve` is a library call: it leaves the host process's switch interval and frozen
    # objects as they are; `ctxcore serve` asks for the tuning (tune=True), which holds
    # while serving and is put back when `serve` returns.
    import gc
    import sys

    from ctxcore.service.server import SERVING_FULL_COLLECTION_THRESHOLD, SWITCH_INTERVAL_S, serve

    before = sys.getswitchinterval()
    frozen = gc.get_freeze_count()
    thresholds = gc.get_threshold()
    assert thresholds[2] < SERVING_FULL_COLLECTION_THRESHOLD  # Python's default, 10
    seen: list[tuple[float, int, tuple[int, ...]]] = []

    def on_serving(svc: ContextService) -> None:
        seen.append((sys.getswitchinterval(), gc.get_freeze_count(), gc.get_threshold()))
        asyncio.get_running_loop().create_task(svc.stop(0))

    asyncio.run(
        serve(
            open_config(reflection=False),
            on_serving=on_serving,
            tune=tune,
            sources=FakeSources(make_tenants(1)).sources(),
        )
    )
    assert len(seen) == 1
    interval, freeze_count, serving_thresholds = seen[0]
    if tune:
        assert interval == SWITCH_INTERVAL_S != before and freeze_count > frozen
        assert serving_thresholds == (*thresholds[:2], SERVING_FULL_COLLECTION_THRESHOLD)
    else:
        assert interval == before and freeze_count == frozen and serving_thresholds == thresholds
    assert sys.getswitchinterval() == before and gc.get_freeze_count() == frozen
    assert gc.get_threshold() == thresholds
