"""Shared pieces of the service tests: a real server on a loopback port, fake retrieval
sources with canaries and injectable faults, test PKI and JWTs.

Imported by tests/service/test_service_*.py by name (pyproject.toml puts tests/ on the pytest path).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import random
import secrets
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ctxcore.memory import MemoryOrigin, MemoryRecord, Query, Scope, Sources
from ctxcore.service import AuthConfig, ContextService, ServiceConfig, hash_api_key

#: The ``ctxcore`` command of the interpreter running the tests.
CTXCORE = [sys.executable, "-m", "ctxcore.cli"]

ISSUER = "https://issuer.test"
AUDIENCE = "ctxcore-test"
FAULTS = ("raise", "hang", "corrupt", "out_of_scope")
BRANCHES = ("directive", "hot", "cold")


def canary(tenant: int, k: int) -> str:
    return f"CANARY-{tenant:03d}-{k:02d}-{secrets.token_hex(6)}"


@dataclass
class Tenant:
    index: int
    scope: Scope
    directive: str
    memories: list[MemoryRecord]
    canaries: set[str]


def make_tenants(n: int, per_tenant: int = 4) -> list[Tenant]:
    out = []
    for t in range(n):
        scope = Scope(f"org-{t:03d}", f"agent-{t:03d}")
        canaries = {canary(t, k) for k in range(per_tenant + 1)}
        cs = sorted(canaries)
        mems = [
            MemoryRecord(
                f"mem-{t:03d}-{k}",
                scope.organization_id,
                scope.agent_id,
                f"Tenant {t} note {k}: the secret marker is {cs[k]}.",
                origin=MemoryOrigin.VECTOR,
                similarity=0.9 - 0.01 * k,
                confidence=0.9,
            )
            for k in range(per_tenant)
        ]
        out.append(Tenant(t, scope, f"Directive for tenant {t}: {cs[per_tenant]}", mems, canaries))
    return out


@dataclass
class FaultPlan:
    """Which branches misbehave, and how; `rate` < 1 faults only that share of calls."""

    faults: dict[str, str] = field(default_factory=dict)
    rate: float = 1.0
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    #: when set, every branch faults with probability `rate`, the kind drawn from these
    mixed: tuple[str, ...] = ()

    def fault(self, branch: str) -> str | None:
        if self.mixed:
            return self.rng.choice(self.mixed) if self.rng.random() < self.rate else None
        f = self.faults.get(branch)
        if f is None or (self.rate < 1.0 and self.rng.random() >= self.rate):
            return None
        return f


class FakeSources:
    """Tenants' directives and memories behind the three branches, with faults.

    Faults: ``raise`` (an exception whose message quotes another tenant's canary),
    ``hang`` (never answers), ``corrupt`` (malformed data), ``out_of_scope`` (the
    tenant's own memories plus another tenant's; for the directive, which is plain text
    with no scope of its own, another tenant's memory records instead of text).
    """

    def __init__(self, tenants: Sequence[Tenant], plan: FaultPlan | None = None) -> None:
        self.by_scope = {t.scope: t for t in tenants}
        self.tenants = list(tenants)
        self.plan = plan or FaultPlan()
        self.asked: list[Scope] = []

    def _foreign(self, scope: Scope) -> Tenant:
        t = self.by_scope[scope]
        return self.tenants[(t.index + 1) % len(self.tenants)]

    async def _fault(self, branch: str, scope: Scope) -> Any:
        f = self.plan.fault(branch)
        if f == "raise":
            raise RuntimeError(f"store exploded near {next(iter(self._foreign(scope).canaries))}")
        if f == "hang":
            await asyncio.sleep(3600)
        if f == "corrupt":
            return ("corrupt", [{"id": "x", "text": next(iter(self._foreign(scope).canaries))}])
        if f == "out_of_scope":
            return ("foreign", self._foreign(scope).memories)
        return None

    async def directive(self, scope: Scope) -> Any:
        self.asked.append(scope)
        got = await self._fault("directive", scope)
        if got is not None:
            return got[1] if got[0] == "foreign" else 12345
        t = self.by_scope.get(scope)
        return t.directive if t else None

    async def hot(self, scope: Scope, query: Query, limit: int) -> Any:
        self.asked.append(scope)
        got = await self._fault("hot", scope)
        t = self.by_scope.get(scope)
        own = t.memories[:2] if t else []
        if got is not None:
            return got[1] if got[0] == "corrupt" else [*own, *got[1]]
        return own

    async def cold(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> Any:
        self.asked.append(scope)
        got = await self._fault("cold", scope)
        t = self.by_scope.get(scope)
        own = t.memories[2:] if t else []
        if got is not None:
            return got[1] if got[0] == "corrupt" else [*own, *got[1]]
        return own

    def sources(self) -> Sources:
        return Sources(directive=self.directive, hot=self.hot, cold=self.cold)


def open_config(**kw: Any) -> ServiceConfig:
    """Unauthenticated loopback mode on a free port (no drain delay unless asked for)."""
    kw.setdefault("bind", "127.0.0.1:0")
    kw.setdefault("drain_delay_s", 0.0)
    return ServiceConfig(auth=AuthConfig(allow_unauthenticated=True), **kw)


@contextlib.asynccontextmanager
async def running(config: ServiceConfig, **kw: Any) -> AsyncIterator[ContextService]:
    svc = ContextService(config, **kw)
    # As `ctxcore serve` does: the test process's long-lived objects (pytest, hypothesis,
    # every imported module) are kept out of the cyclic collector's full walks, which
    # take 50-100 ms here and would stall the loop the server runs on. Done before the
    # start, so that the collection itself is not counted as loop lag.
    gc.collect()
    gc.freeze()
    await svc.start()
    try:
        yield svc
    finally:
        gc.unfreeze()
        await svc.stop(0.5)


# ---- credentials ----------------------------------------------------------------------


@dataclass
class Pki:
    ca_pem: bytes
    server_cert: bytes
    server_key: bytes
    client_cert: bytes
    client_key: bytes
    rogue_cert: bytes  # same CN, signed by another CA
    rogue_key: bytes

    def write(self, d: Path) -> dict[str, Path]:
        out = {}
        for name in ("ca_pem", "server_cert", "server_key"):
            p = d / f"{name}.pem"
            p.write_bytes(getattr(self, name))
            out[name] = p
        return out


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert(
    subject_cn: str, key: Any, issuer_cn: str, issuer_key: Any, *, ca: bool, san: list[x509.GeneralName] | None = None
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(client_cn: str) -> Pki:
    import ipaddress

    ca_key, rogue_ca_key = _key(), _key()
    ca = _cert("ctxcore test CA", ca_key, "ctxcore test CA", ca_key, ca=True)
    server_key = _key()
    server = _cert(
        "localhost",
        server_key,
        "ctxcore test CA",
        ca_key,
        ca=False,
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key, rogue_key = _key(), _key()
    client = _cert(client_cn, client_key, "ctxcore test CA", ca_key, ca=False)
    rogue = _cert(client_cn, rogue_key, "rogue CA", rogue_ca_key, ca=False)
    pem = serialization.Encoding.PEM
    return Pki(
        ca.public_bytes(pem),
        server.public_bytes(pem),
        _pem_key(server_key),
        client.public_bytes(pem),
        _pem_key(client_key),
        rogue.public_bytes(pem),
        _pem_key(rogue_key),
    )


def rsa_keypair() -> tuple[bytes, bytes]:
    k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pub = k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return priv, pub


def make_jwt(
    private_pem: bytes,
    sub: str,
    *,
    aud: str = AUDIENCE,
    iss: str = ISSUER,
    ttl: float = 300,
    alg: str = "RS256",
    **extra: Any,
) -> str:
    now = int(time.time())
    claims = {"sub": sub, "aud": aud, "iss": iss, "iat": now, "exp": now + int(ttl), **extra}
    return jwt.encode(claims, private_pem, algorithm=alg)


def unsigned_jwt(sub: str) -> str:
    """An ``alg=none`` token with otherwise valid claims."""
    import base64
    import json

    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    now = int(time.time())
    return (
        f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64({'sub': sub, 'aud': AUDIENCE, 'iss': ISSUER, 'exp': now + 300})}."
    )


def api_key_file(d: Path, keys: dict[str, str]) -> Path:
    p = d / "keys.txt"
    p.write_text("# principal sha256:hex\n" + "".join(f"{who} {hash_api_key(k)}\n" for who, k in keys.items()))
    return p


class SlowSources(FakeSources):
    """Branches that answer after a random delay: directive 0-8 ms, hot 1-20 ms, cold
    2-60 ms, so every deadline meets some answered and some cancelled branches.
    `running` counts source calls in progress (0 when nothing was left behind)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.rng = random.Random(5)
        self.running = 0

    async def _slow(self, lo: float, hi: float, call: Any) -> Any:
        self.running += 1
        try:
            await asyncio.sleep(self.rng.uniform(lo, hi) / 1000)
            return await call()
        finally:
            self.running -= 1

    async def directive(self, scope: Scope) -> Any:
        return await self._slow(0, 8, lambda: super(SlowSources, self).directive(scope))

    async def hot(self, scope: Scope, query: Query, limit: int) -> Any:
        return await self._slow(1, 20, lambda: super(SlowSources, self).hot(scope, query, limit))

    async def cold(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> Any:
        return await self._slow(2, 60, lambda: super(SlowSources, self).cold(scope, query, limit, min_similarity))


class ServeProcess:
    """`ctxcore serve` as a child process on a free loopback port, its JSON log in a file
    (a pipe would fill up and stall the server under thousands of calls)."""

    def __init__(self, log_dir: Path, *args: str, timeout_s: float = 60.0) -> None:
        import json
        import os
        import subprocess
        import sys

        self.log_path = log_dir / f"serve-{secrets.token_hex(4)}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctxcore.cli", "serve", "--bind", "127.0.0.1:0", "--drain-delay-s", "0", *args],
            stderr=self._log,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.port = 0
        self.metrics_port: int | None = None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.close()
                raise AssertionError(f"ctxcore serve exited with {self.proc.returncode}: {self.log_path.read_text()}")
            for line in self.log_path.read_text().splitlines():
                rec = json.loads(line)
                if rec["event"] == "starting":
                    self.port, self.metrics_port = rec["port"], rec.get("metrics_port")
                if rec["event"] == "serving":
                    return
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        raise AssertionError("ctxcore serve did not start")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def events(self) -> list[dict[str, Any]]:
        import json

        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def stop(self) -> int:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        self._log.close()
        return rc


def _serve_fake(tenants: int, fault_rate: float) -> None:
    """Run a server over `SlowSources` until SIGTERM; print its ports as one JSON line."""
    import json
    import signal

    async def main() -> None:
        fake = SlowSources(make_tenants(tenants), FaultPlan(rate=fault_rate, mixed=("hang", "raise")))
        svc = ContextService(open_config(metrics_port=0), sources=fake.sources())
        await svc.start()
        print(json.dumps({"port": svc.port, "metrics_port": svc.metrics_port}), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await svc.stop(1.0)

    asyncio.run(main())


if __name__ == "__main__":
    import sys

    _serve_fake(int(sys.argv[1]), float(sys.argv[2]))
