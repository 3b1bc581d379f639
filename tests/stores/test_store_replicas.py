"""Two ``ctxcore serve`` processes on one PostgreSQL database (a real server, the app
role under row-level security): a memory written through one store is served by the
other replica within a second, a forget is honoured by both, and the canary leak check
(many tenants, concurrent calls through both replicas) finds no foreign memory. Also the
``ctxcore memories`` commands with a ``postgresql://`` URL."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_support import Database, PgServer
from service_support import CTXCORE

from ctxcore.client import ContextClient
from ctxcore.memory import Query
from ctxcore.request import AssemblyRequest
from ctxcore.stores import HashingEmbedder, NewMemory, PostgresMemoryStore

TENANTS = 12
# Roomy branch timeouts: these tests show what the replicas serve, not how fast (the
# shared 2-core machine can take tens of milliseconds for any query); bench/ measures.
ROOMY = {
    "CTXCORE_CONTEXT_TIMEOUT_MS": "4000",
    "CTXCORE_CONTEXT_DEADLINE_MS": "3800",
    "CTXCORE_DIRECTIVE_TIMEOUT_MS": "1000",
    "CTXCORE_HOT_TIMEOUT_MS": "1500",
    "CTXCORE_COLD_TIMEOUT_MS": "3000",
}
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", **ROOMY}


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    server = PgServer().start()
    yield server
    server.stop()


class Replica:
    def __init__(self, db_url: str) -> None:
        self.proc = subprocess.Popen(
            [*CTXCORE, "serve", "--bind", "127.0.0.1:0", "--db", db_url, "--allow-unauthenticated"],
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        assert self.proc.stderr is not None
        self.log: list[dict[str, object]] = []
        self.port = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError(f"ctxcore serve exited with {self.proc.wait()}: {self.log}")
            rec = json.loads(line)
            self.log.append(rec)
            if rec["event"] == "starting":
                self.port = int(rec["port"])  # type: ignore[call-overload]
            if rec["event"] == "serving":
                return
        self.proc.kill()
        raise AssertionError("ctxcore serve did not start")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(20)
        assert self.proc.stderr is not None
        self.log += [json.loads(x) for x in self.proc.stderr.read().splitlines()]
        self.proc.stderr.close()
        return rc


def _req(org: str, agent: str, q: str) -> AssemblyRequest:
    return AssemblyRequest(org, agent, "gpt-4o", Query(q))


def _bodies(text: str) -> list[str]:
    return re.findall(r"<(?:memory|m) [^>]*>([^<]+)</(?:memory|m)>", text)


@pytest.fixture(scope="module")
def shared(pg_server: PgServer) -> Iterator[tuple[Database, Replica, Replica]]:
    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(), grant_to=db.app) as s:
        for t in range(TENANTS):
            org, agent = f"org-{t:02d}", f"agent-{t:02d}"
            s.add_many(
                NewMemory(
                    f"m-{t:02d}-{k}", org, agent, f"Tenant {t} refund policy note {k}: marker CANARY-{t:02d}-{k}."
                )
                for k in range(4)
            )
            s.set_directive(org, None, f"Directive of tenant {t}: CANARY-{t:02d}-D.")
    a, b = Replica(db.app_url), Replica(db.app_url)
    yield db, a, b
    assert a.stop() == 0 and b.stop() == 0
    logged = json.dumps(a.log + b.log)
    assert db.app_password not in logged and "CANARY" not in logged


def test_a_write_through_one_is_served_by_the_other_within_a_second(shared: tuple[Database, Replica, Replica]) -> None:
    db, a, b = shared

    async def main() -> float:
        async with (
            ContextClient(f"127.0.0.1:{a.port}", timeout=5.0) as ca,
            ContextClient(f"127.0.0.1:{b.port}", timeout=5.0) as cb,
        ):
            for c in (ca, cb):  # both warm
                await c.assemble(_req("org-00", "agent-00", "refund policy"))
            with PostgresMemoryStore(db.app_url, migrate=False) as writer:
                await asyncio.to_thread(
                    writer.add,
                    NewMemory("fresh-1", "org-00", "agent-00", "A new note about the kettle warranty FRESH-MARK."),
                )
            # Calls sent from the write on: one sent within a second of it must serve it
            # (how long a call then takes is the machine's load, not visibility).
            t0 = time.monotonic()
            while (sent := time.monotonic() - t0) < 1.0:
                ctx_a, ctx_b = await asyncio.gather(
                    ca.assemble(_req("org-00", "agent-00", "kettle warranty")),
                    cb.assemble(_req("org-00", "agent-00", "kettle warranty")),
                )
                if "FRESH-MARK" in ctx_a.text and "FRESH-MARK" in ctx_b.text:
                    return sent
            raise AssertionError("no call sent within a second of the write was served the new memory by both")

    assert asyncio.run(main()) < 1.0


def test_a_forget_is_honoured_by_both(shared: tuple[Database, Replica, Replica]) -> None:
    db, a, b = shared
    r = subprocess.run(
        [*CTXCORE, "memories", "forget", "--db", db.app_url, "--org", "org-01", "--agent", "agent-01", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"memories": 4, "directives": 0}
    assert db.app_password not in r.stdout + r.stderr

    async def main() -> None:
        for port in (a.port, b.port):
            async with ContextClient(f"127.0.0.1:{port}", timeout=5.0) as c:
                ctx = await c.assemble(_req("org-01", "agent-01", "Tenant 1 refund policy note"))
                assert "CANARY-01-0" not in ctx.text and not _bodies(ctx.text)

    asyncio.run(main())


def test_no_foreign_memory_through_either_replica(shared: tuple[Database, Replica, Replica]) -> None:
    _, a, b = shared

    async def main() -> tuple[int, int]:
        async with (
            ContextClient(f"127.0.0.1:{a.port}", timeout=5.0) as ca,
            ContextClient(f"127.0.0.1:{b.port}", timeout=5.0) as cb,
        ):
            calls = []
            for rnd in range(4):
                for t in range(TENANTS):
                    c = ca if (t + rnd) % 2 else cb
                    calls.append(
                        (
                            t,
                            c.assemble(
                                _req(
                                    f"org-{t:02d}",
                                    f"agent-{t:02d}",
                                    f"Tenant {(t + rnd) % TENANTS} refund policy note marker",
                                )
                            ),
                        )
                    )
            results = await asyncio.gather(*(c for _, c in calls))
        seen, foreign = 0, 0
        for (t, _), ctx in zip(calls, results):
            for m in re.findall(r"CANARY-(\d\d)-", ctx.text):
                seen += 1
                foreign += int(m) != t
        return seen, foreign

    seen, foreign = asyncio.run(main())
    assert seen > 0 and foreign == 0


def test_memories_commands_take_a_url(pg_server: PgServer, tmp_path: Path) -> None:
    db = pg_server.new_database()
    r = subprocess.run(
        [*CTXCORE, "memories", "init", "--db", db.owner_url, "--grant-to", db.app],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert r.returncode == 0 and "256 dimensions" in r.stdout, r.stderr
    src = tmp_path / "m.jsonl"
    src.write_text(
        "\n".join(
            json.dumps({"id": f"m{k}", "organization_id": "o", "agent_id": "a", "text": f"note {k} about refunds"})
            for k in range(3)
        )
        + "\n"
    )
    r = subprocess.run(
        [*CTXCORE, "memories", "add", str(src), "--db", db.app_url], capture_output=True, text=True, timeout=60, env=ENV
    )
    assert r.returncode == 0 and "stored 3 memories" in r.stdout, r.stderr
    assert db.app_password not in r.stdout and "***" in r.stdout
    r = subprocess.run(
        [*CTXCORE, "memories", "delete", "m0", "m9", "--db", db.app_url, "--org", "o", "--agent", "a"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert r.returncode == 0 and "deleted 1 of 2" in r.stdout, r.stderr
    r = subprocess.run(
        [*CTXCORE, "memories", "stats", "--db", db.app_url, "--org", "o", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert json.loads(r.stdout)["memories"] == 2
    r = subprocess.run(
        [*CTXCORE, "memories", "stats", "--db", db.app_url], capture_output=True, text=True, timeout=60, env=ENV
    )
    assert r.returncode == 1 and "schema owner" in r.stderr and db.app_password not in r.stderr
    r = subprocess.run(
        [
            *CTXCORE,
            "assemble",
            "--db",
            db.app_url,
            "--org",
            "o",
            "--agent",
            "a",
            "--model",
            "gpt-4o",
            "--query",
            "refunds",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {t["memory_id"] for t in doc["trace"]} == {"m1", "m2"}, doc["branches"]
