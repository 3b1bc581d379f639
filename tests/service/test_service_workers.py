"""``ctxcore serve --workers N`` as an operator runs it: N real server processes on one
loopback port over the SQLite store. Connections are spread over the workers; every
worker answers and counts its own calls; SIGTERM drains them all; a second server on the
port is refused; a worker that dies is started again; workers stop when their supervisor
is killed; a worker that cannot start fails the start with its error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from service_support import CTXCORE

from ctxcore.client import ContextClient
from ctxcore.errors import ConfigError
from ctxcore.memory import Query
from ctxcore.request import AssemblyRequest
from ctxcore.service import usable_cpus
from ctxcore.service.config import MAX_WORKERS, ServiceConfig, parse_service_config

ORG, AGENT = "acme-retail", "support"


class Group:
    """A running ``ctxcore serve --workers N``; its stderr read by a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*CTXCORE, "serve", *args],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self.log.append(json.loads(line))

    def wait_for(self, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for rec in self.log:
                    if pred(rec):
                        return rec
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"ctxcore serve exited with {self.proc.returncode}: {self.log}")
            time.sleep(0.05)
        raise AssertionError(f"no such log line within {timeout} s: {self.log}")

    def serving(self) -> dict[str, Any]:
        return self.wait_for(lambda r: r["event"] == "serving" and "worker" not in r)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(30)
        self._reader.join(10)
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(30)  # the workers stop once the supervisor is gone
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture
def group(demo_db: Path) -> Iterator[Group]:
    g = Group(
        "--workers",
        "2",
        "--bind",
        "127.0.0.1:0",
        "--db",
        str(demo_db),
        "--allow-unauthenticated",
        "--metrics-port",
        "0",
        "--drain-delay-s",
        "0.2",
    )
    yield g
    g.close()


def _request() -> AssemblyRequest:
    return AssemblyRequest(ORG, AGENT, "gpt-4o", Query("Can I return shoes after three weeks?"))


async def _call_on_fresh_connections(port: int, n: int) -> None:
    """One call on each of `n` new connections."""
    for _ in range(n):
        async with ContextClient(
            f"127.0.0.1:{port}", timeout=5.0, options=[("grpc.use_local_subchannel_pool", 1)]
        ) as c:
            ctx = await c.assemble(_request())
            assert ctx.scope.organization_id == ORG


def _answered(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(r'ctxcore_requests_total\{code="OK",rpc="AssembleContext"\} (\d+)', text)
    return int(m.group(1)) if m else 0


def test_workers_share_the_port_and_drain_on_sigterm(group: Group) -> None:
    ready = group.serving()
    port, pids, metrics_ports = ready["port"], ready["pids"], ready["metrics_ports"]
    assert port > 0 and len(pids) == 2 and len(set(pids)) == 2 and group.proc.pid not in pids
    assert len(set(metrics_ports)) == 2
    asyncio.run(_call_on_fresh_connections(port, 32))
    counts = [_answered(p) for p in metrics_ports]
    # 32 connections, each given to one worker by the kernel: both workers answered.
    assert sum(counts) == 32 and min(counts) >= 1, counts
    assert group.stop() == 0
    for i in (0, 1):
        events = [r["event"] for r in group.log if r.get("worker") == i and not r["event"].startswith("worker_")]
        # A worker opens its store before it binds the shared port ("starting"), then serves.
        assert events[:3] == ["store_open", "starting", "serving"], events
        assert events[-2:] == ["draining", "stopped"], events
    mine = [r["event"] for r in group.log if "worker" not in r]
    assert mine[0] == "starting" and mine[-1] == "stopped" and "signal" in mine, mine
    calls = [r for r in group.log if r["event"] == "call"]
    assert len(calls) == 32 and {c["worker"] for c in calls} == {0, 1}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_second_server_on_the_port_is_refused(group: Group, demo_db: Path) -> None:
    port = group.serving()["port"]
    for extra in ((), ("--workers", "2")):
        r = subprocess.run(
            [*CTXCORE, "serve", "--db", str(demo_db), "--allow-unauthenticated", "--bind", f"127.0.0.1:{port}", *extra],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and "cannot bind" in r.stderr, (extra, r.stderr)
    asyncio.run(_call_on_fresh_connections(port, 2))  # the group still serves
    assert group.stop() == 0


def test_a_worker_that_dies_is_started_again(group: Group) -> None:
    ready = group.serving()
    victim = ready["pids"][0]
    os.kill(victim, signal.SIGKILL)
    exited = group.wait_for(lambda r: r["event"] == "worker_exited")
    assert exited["worker"] == 0 and exited["pid"] == victim and exited["exitcode"] == -signal.SIGKILL
    again = group.wait_for(lambda r: r["event"] == "worker_serving")
    assert again["worker"] == 0
    started = [r for r in group.log if r["event"] == "worker_started" and r["worker"] == 0]
    assert len(started) == 2 and started[-1]["pid"] != victim
    asyncio.run(_call_on_fresh_connections(ready["port"], 8))
    assert group.stop() == 0


def test_workers_stop_when_the_supervisor_is_killed(group: Group) -> None:
    ready = group.serving()
    group.proc.kill()  # SIGKILL: no chance to forward anything
    group.proc.wait(10)
    deadline = time.monotonic() + 30
    alive = list(ready["pids"])
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.1)
    assert not alive, "workers outlived their supervisor"
    group._reader.join(10)
    for i in (0, 1):
        assert [r["event"] for r in group.log if r.get("worker") == i][-1] == "stopped", group.log


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def _taken_after_a_free_port() -> Iterator[int]:
    """A listening port p whose port p - 1 is free (as far as a bind can tell)."""
    for _ in range(50):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            p = taken.getsockname()[1]
            try:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p - 1))
            except OSError:
                continue
            taken.listen()
            yield p
            return
    raise AssertionError("no free port below a free port")


def test_a_worker_that_cannot_start_fails_the_start(demo_db: Path) -> None:
    # Worker 1's metrics port (metrics.port + 1) is taken; worker 0's is free.
    with _taken_after_a_free_port() as p:
        r = subprocess.run(
            [
                *CTXCORE,
                "serve",
                "--workers",
                "2",
                "--bind",
                "127.0.0.1:0",
                "--db",
                str(demo_db),
                "--allow-unauthenticated",
                "--metrics-port",
                str(p - 1),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1, r.stderr
    assert "worker 1 failed to start" in r.stderr and f"cannot serve metrics on 127.0.0.1:{p}" in r.stderr, r.stderr


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_workers_need_linux(platform: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.platform", platform)
    with pytest.raises(ConfigError, match=f"server.workers > 1 needs Linux.*this is {platform}"):
        ServiceConfig(workers=2)
    assert ServiceConfig(workers=1).workers == 1


def test_workers_settings_are_checked() -> None:
    assert ServiceConfig().workers == 1
    assert parse_service_config("[server]\nworkers = 4").workers == 4
    for bad, needle in (
        (0, "server.workers must be a positive integer"),
        (65, "server.workers must be at most 64"),
        (True, "server.workers must be a positive integer"),
        ("2", "server.workers must be a positive integer"),
    ):
        with pytest.raises(ConfigError, match=needle):
            ServiceConfig(workers=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a TCP bind"):
        ServiceConfig(workers=2, bind="unix:/tmp/ctxcore.sock")
    with pytest.raises(ConfigError, match="past 65535"):
        ServiceConfig(workers=4, metrics_port=65534)
    r = subprocess.run(
        [*CTXCORE, "serve", "--workers", "0", "--db", "x.db", "--allow-unauthenticated"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "server.workers must be a positive integer, got 0" in r.stderr, r.stderr


def _cgroup(tmp_path: Path, proc: str, files: dict[str, str]) -> dict[str, Path]:
    """A cgroup file system and a /proc/self/cgroup of a process in it, as files."""
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    (tmp_path / "proc_cgroup").write_text(proc)
    return {"cgroup_root": root, "proc_cgroup": tmp_path / "proc_cgroup"}


def test_usable_cpus_follow_the_affinity_and_the_cgroup_cpu_limit(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    v2 = "0::/kubepods/pod1/app\n"
    cases: list[tuple[str, str, dict[str, str], int]] = [
        ("no cgroup limit (v2 max)", v2, {"kubepods/pod1/app/cpu.max": "max 100000\n"}, affinity),
        ("1.5 CPUs: one worker", v2, {"kubepods/pod1/app/cpu.max": "150000 100000\n"}, 1),
        (
            "a parent's limit is the tightest",
            v2,
            {"kubepods/cpu.max": "100000 100000\n", "kubepods/pod1/app/cpu.max": "400000 100000\n"},
            1,
        ),
        ("less than one CPU", v2, {"kubepods/pod1/app/cpu.max": "20000 100000\n"}, 1),
        (
            "v1 quota",
            "5:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "100000\n",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            },
            1,
        ),
        (
            "v1 without a quota",
            "5:cpu,cpuacct:/\n",
            {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            affinity,
        ),
        ("malformed files are no limit", v2, {"kubepods/pod1/app/cpu.max": "lots\n"}, affinity),
        ("no cgroup file system", v2, {}, affinity),
    ]
    for name, proc, files, want in cases:
        case = tmp_path / str(len(name))
        case.mkdir(exist_ok=True)
        assert usable_cpus(**_cgroup(case, proc, files)) == min(want, affinity), name
    assert usable_cpus(cgroup_root=tmp_path / "absent", proc_cgroup=tmp_path / "absent") == affinity
    assert 1 <= usable_cpus() <= affinity


def test_auto_workers_start_one_per_usable_cpu(tmp_path: Path) -> None:
    want = min(MAX_WORKERS, usable_cpus())
    assert parse_service_config('[server]\nworkers = "auto"').workers == want
    with pytest.raises(ConfigError, match="server.workers must be a positive integer or \"auto\", got 'all'"):
        parse_service_config('[server]\nworkers = "all"')
    from ctxcore.cli import build_parser
    from ctxcore.service.cli import config_from_args

    parser = build_parser()
    path = tmp_path / "serve.toml"
    path.write_text("[server]\nworkers = 3\n")
    assert config_from_args(parser.parse_args(["serve", "--config", str(path)])).workers == 3
    assert config_from_args(parser.parse_args(["serve", "--config", str(path), "--workers", "auto"])).workers == want
    r = subprocess.run(
        [*CTXCORE, "serve", "--workers", "every", "--db", "x.db", "--allow-unauthenticated"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "expected auto or a positive integer, got 'every'" in r.stderr, r.stderr


def test_auto_workers_are_one_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.platform", "darwin")
    assert parse_service_config('[server]\nworkers = "auto"').workers == 1


def test_one_connection_stays_with_one_worker(group: Group) -> None:
    """A client with one channel keeps its calls on the worker its connection reached."""
    ready = group.serving()

    async def main() -> None:
        async with ContextClient(f"127.0.0.1:{ready['port']}", timeout=5.0) as c:
            for _ in range(10):
                await c.assemble(_request())

    asyncio.run(main())
    assert sorted(_answered(p) for p in ready["metrics_ports"]) == [0, 10]
    assert group.stop() == 0
    with pytest.raises(grpc.FutureTimeoutError):
        with grpc.insecure_channel(f"127.0.0.1:{ready['port']}") as ch:
            grpc.channel_ready_future(ch).result(timeout=1)


def test_a_client_with_several_connections_reaches_every_worker(group: Group) -> None:
    ready = group.serving()

    async def main() -> None:
        async with ContextClient(f"127.0.0.1:{ready['port']}", timeout=5.0, connections=16) as c:
            for _ in range(32):
                await c.assemble(_request())
            await asyncio.gather(*(c.assemble(_request()) for _ in range(32)))

    asyncio.run(main())
    counts = [_answered(p) for p in ready["metrics_ports"]]
    # (Which worker a connection reaches is the kernel's hash: all 16 on one has odds 2**-15.)
    assert sum(counts) == 64 and min(counts) >= 1, counts
    assert group.stop() == 0


def test_a_worker_listens_on_the_shared_port_only_once_it_can_answer() -> None:
    """A worker of a group (``workers`` > 1) opens its store and warms up before it binds:
    a worker started again beside running ones is given no connection, whose calls would
    fail UNAVAILABLE, until it answers. (A single process binds first: a port in use then
    fails its start at once.)"""
    from service_support import FakeSources, make_tenants, open_config

    from ctxcore.service import ContextService

    tenants = make_tenants(1)
    t = tenants[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        gate = asyncio.Event()

        async def opener() -> Any:
            await gate.wait()
            return FakeSources(tenants)

        svc = ContextService(open_config(bind=f"127.0.0.1:{port}", workers=2), store_opener=opener)
        starting = asyncio.ensure_future(svc.start())
        await asyncio.sleep(0.3)
        assert not starting.done()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        gate.set()
        assert await starting == port
        async with ContextClient(f"127.0.0.1:{port}", timeout=5.0) as c:
            ctx = await c.assemble(AssemblyRequest(t.scope.organization_id, t.scope.agent_id, "gpt-4o", Query("q")))
            assert ctx.scope.agent_id == t.scope.agent_id
        await svc.stop(0)

    asyncio.run(main())


class _PeerServer:
    """A real gRPC server on loopback whose AssembleContext notes each call's peer (its
    client port: one per connection) and answers a peer as `behave` says: ``"fast"``,
    ``"slow"`` (after `slow_s`) or ``"refuse"`` (UNAVAILABLE at once). Peers are numbered
    in the order their first call arrives; the first `hold` calls wait until all of them
    have arrived, so that they take `hold` connections."""

    def __init__(self, behave: dict[int, str], hold: int = 0, slow_s: float = 0.03) -> None:
        self.behave, self.hold, self.slow_s = behave, hold, slow_s
        self.peers: list[str] = []
        self.order: list[str] = []

    def index(self, peer: str) -> int:
        return self.order.index(peer)

    async def run(self, body: Any) -> None:
        from ctxcore.service.wire import SERVICE_NAME
        from ctxcore.v1 import context_assembly_pb2 as pb

        held = asyncio.Event()

        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            peer = context.peer()
            if peer not in self.order:
                self.order.append(peer)
            self.peers.append(peer)
            if len(self.peers) == self.hold:
                held.set()
            if len(self.peers) <= self.hold:
                await held.wait()
            how = self.behave.get(self.index(peer), "fast")
            if how == "slow":
                await asyncio.sleep(self.slow_s)
            elif how == "refuse":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
            return pb.AssembledContext()

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE_NAME,
                    {
                        "AssembleContext": grpc.unary_unary_rpc_method_handler(
                            handle,
                            request_deserializer=pb.AssembleContextRequest.FromString,
                            response_serializer=pb.AssembledContext.SerializeToString,
                        )
                    },
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            await body(port)
        finally:
            await server.stop(None)


async def _calls(c: ContextClient, n: int) -> int:
    """`n` calls one at a time; the number that failed UNAVAILABLE."""
    refused = 0
    for _ in range(n):
        try:
            await c.assemble(_request())
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            refused += 1
    return refused


def test_calls_at_once_take_the_connections_with_fewest_in_flight() -> None:
    from collections import Counter

    srv = _PeerServer({}, hold=3)

    async def body(port: int) -> None:
        async with ContextClient(f"127.0.0.1:{port}", timeout=5.0, connections=3) as c:
            await asyncio.gather(*(c.assemble(_request()) for _ in range(3)))
            # Three at once again: each connection holds one, whatever their speeds.
            srv.hold = 6
            await asyncio.gather(*(c.assemble(_request()) for _ in range(3)))

    asyncio.run(srv.run(body))
    assert len(set(srv.peers[:3])) == 3, srv.peers
    assert Counter(srv.peers[3:]) == {p: 1 for p in srv.order}, srv.peers


@pytest.mark.parametrize("how", ["slow", "refuse"])
def test_calls_move_away_from_a_slow_or_refusing_connection(how: str) -> None:
    """One connection's process answers 30 ms late (``slow``) or fails every call at once
    (``refuse``: UNAVAILABLE, as when draining or overloaded; its quick failures count as
    slow as the call's deadline), the others answer at once: once each has answered, calls
    one at a time go to the quick ones."""
    srv = _PeerServer({0: how}, hold=3)

    async def body(port: int) -> None:
        async with ContextClient(f"127.0.0.1:{port}", timeout=0.5, connections=3) as c:
            results = await asyncio.gather(*(c.assemble(_request()) for _ in range(3)), return_exceptions=True)
            failed = sum(isinstance(r, grpc.aio.AioRpcError) for r in results)
            assert failed == (1 if how == "refuse" else 0), results
            assert await _calls(c, 30) == 0

    asyncio.run(srv.run(body))
    later = [srv.index(p) for p in srv.peers[3:]]
    assert len(later) == 30 and 0 not in later, later


def test_calls_do_not_all_pile_onto_the_quickest_connection() -> None:
    """Seven connections answer 5 ms late, one at once: the quick one takes the calls for
    which it is one of the two compared (about a quarter of them), not all of them, so
    that many callers together do not pile onto one process before it slows down."""
    srv = _PeerServer({i: "slow" for i in range(1, 8)}, hold=8, slow_s=0.005)

    async def body(port: int) -> None:
        async with ContextClient(f"127.0.0.1:{port}", timeout=5.0, connections=8) as c:
            await asyncio.gather(*(c.assemble(_request()) for _ in range(8)))
            await _calls(c, 40)

    asyncio.run(srv.run(body))
    later = [srv.index(p) for p in srv.peers[8:]]
    assert len(later) == 40 and 0 < later.count(0) <= 30, later


def test_a_passed_over_connection_is_tried_again_once_its_estimate_fades(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxcore.client

    monkeypatch.setattr(ctxcore.client, "CONNECTION_COST_DECAY_S", 0.005)
    srv = _PeerServer({0: "slow"}, hold=2, slow_s=0.02)

    async def body(port: int) -> None:
        async with ContextClient(f"127.0.0.1:{port}", timeout=5.0, connections=2) as c:
            await asyncio.gather(*(c.assemble(_request()) for _ in range(2)))
            # The quick connection, used last, holds the fresher estimate; the slow one's
            # is older and fades further in each pause of many e-folds, below the quick
            # one's: it is tried again.
            seen: set[int] = set()
            for _ in range(8):
                await asyncio.sleep(0.2)
                await c.assemble(_request())
                seen.add(srv.index(srv.peers[-1]))
            assert seen == {0, 1}, srv.peers

    asyncio.run(srv.run(body))


@pytest.mark.parametrize("bad", [0, 65, True, 2.0, "2"])
def test_connections_out_of_range_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"connections must be an int in \[1, 64\]"):
        ContextClient("127.0.0.1:1", connections=bad)
