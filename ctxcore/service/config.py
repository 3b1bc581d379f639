"""The configuration of `ctxcore serve`: one TOML file, overridden by flags.

Read once at start-up and validated whole, so a bad value stops the server before it
binds, with a message that names the key. The shape (every key optional)::

    [server]
    bind = "127.0.0.1:50051"        # host:port, [v6]:port or unix:PATH
    max_message_bytes = 4194304     # larger requests get RESOURCE_EXHAUSTED (at most 2**31 - 1)
    max_concurrent_rpcs = 1024      # more in flight get RESOURCE_EXHAUSTED (at most 2**31 - 1)
    deadline_headroom_ms = 1.0      # kept back from the caller's deadline for the response
    min_retrieval_ms = 1.0          # less than this left -> DEADLINE_EXCEEDED at once
    shutdown_grace_s = 10.0         # in-flight calls get this long after SIGTERM (at most 3600)
    drain_delay_s = 2.0             # NOT_SERVING this long before new calls are refused (at most 3600)
    max_queue = 64                  # assemblies admitted at a time; more: RESOURCE_EXHAUSTED
    cpu_workers = 2                 # threads for the assembly's CPU-heavy stages
    workers = 1                     # server processes sharing the port (SO_REUSEPORT; a TCP bind);
                                    # "auto": one per usable CPU (affinity and cgroup CPU limit)
    max_running = "auto"            # ordinary assemblies run at a time, others wait (0: no limit;
                                    # auto: 1 with the SQLite store, no limit with PostgreSQL)
    reflection = "auto"             # auto (loopback binds only) | false
    catalog = "models.toml"         # a capability catalog instead of the shipped one

    [store]
    db = "memories.db"              # the SQLite memory store, or a postgresql:// URL

    [assembly]                      # ctxcore.AssemblyConfig fields
    client_timeout_ms = 45
    server_deadline_ms = 40
    packing_headroom_ms = 5         # kept back from the caller's deadline for packing

    [metrics]
    port = 9464                     # Prometheus text format on http://bind:port/metrics
    bind = "127.0.0.1"

    [auth]
    allow_unauthenticated = false   # loopback binds only: trust request fields
    allow_plaintext = false         # non-loopback bind without TLS (behind a TLS proxy)
    api_key_file = "keys.txt"       # lines "principal sha256:HEX"
    [auth.jwt]
    issuer = "https://issuer.example"
    audience = "ctxcore"
    algorithms = ["RS256"]
    key_file = "issuer-public.pem"  # PEM public key (RS/ES/PS/EdDSA) or HMAC secret (HS*)
    leeway_s = 5
    principal_claim = "sub"
    [auth.tls]
    cert_file = "server.pem"
    key_file = "server-key.pem"
    client_ca_file = "clients-ca.pem"   # mTLS: the principal is the client cert's CN
    client_auth = "require"             # require | none (server TLS only; tokens or keys)
    [auth.principals]
    "svc-checkout" = ["org-1/agent-7", "org-2/*"]
"""

from __future__ import annotations

import enum
import ipaddress
import math
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .._files import read_utf8
from ..assembly import AssemblyConfig
from ..errors import ConfigError
from .admission import DEFAULT_MAX_QUEUE  # assemblies admitted at a time: defined with the admission
from .cpus import usable_cpus

__all__ = [
    "ASSEMBLY_SETTINGS",
    "DEFAULT_BIND",
    "DEFAULT_CPU_WORKERS",
    "DEFAULT_DEADLINE_HEADROOM_MS",
    "DEFAULT_DRAIN_DELAY_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_MIN_RETRIEVAL_MS",
    "ASSEMBLY_KEYS",
    "AuthConfig",
    "ClientAuth",
    "Grant",
    "JwtConfig",
    "ServiceConfig",
    "TlsConfig",
    "check_tls_files",
    "is_loopback_bind",
    "load_service_config",
    "usable_cpus",
]

#: What an organization, agent or memory id may not hold (nor surrounding whitespace):
#: the control characters, Unicode category Cc (C0, DEL and C1, among them NEL, which
#: splits a line of text as a newline does). A request holding one is refused, so a grant
#: holding one could never match.
ID_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: The byte order mark some editors put at the start of a UTF-8 file: skipped where the
#: configuration and the API key file are read.
BOM = "\ufeff"
#: Where the server listens when nothing is said: loopback only, gRPC's usual port.
DEFAULT_BIND = "127.0.0.1:50051"
#: gRPC's own default receive limit (4 MiB); a context request is a few hundred KiB at most.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Bound on concurrent calls: beyond it gRPC answers RESOURCE_EXHAUSTED instead of queueing
#: work that would miss a 45 ms deadline anyway.
DEFAULT_MAX_CONCURRENT_RPCS = 1024
#: Time kept back from the caller's deadline for what happens after the assembly returns:
#: converting it to a protobuf message, serializing and writing the response (~0.2 ms for
#: a 100 KiB context here). Scoring, packing and formatting have their own headroom,
#: ``[assembly] packing_headroom_ms``, which the assembly subtracts in turn.
DEFAULT_DEADLINE_HEADROOM_MS = 1.0
#: A call whose deadline leaves less than this for retrieval after the headroom fails at
#: once with DEADLINE_EXCEEDED: there is no time to retrieve anything useful.
DEFAULT_MIN_RETRIEVAL_MS = 1.0
DEFAULT_SHUTDOWN_GRACE_S = 10.0
#: How long health says NOT_SERVING before new calls are refused: a load balancer that
#: health-checks every second (a common Envoy interval; a Kubernetes readiness probe at
#: periodSeconds 1) sees it at least once in that time and moves calls elsewhere before
#: this server refuses them. Slower checkers need a longer delay.
DEFAULT_DRAIN_DELAY_S = 2.0
#: Threads that run the assembly's CPU-heavy stages off the event loop. The compiled core
#: releases the GIL, so two threads keep two cores busy; more only queue behind the GIL.
DEFAULT_CPU_WORKERS = 2
#: Most threads `cpu_workers` may ask for.
MAX_CPU_WORKERS = 64
#: Most server processes `workers` may ask for (`ctxcore.service.workers`).
MAX_WORKERS = 64
#: Largest `max_message_bytes` and `max_concurrent_rpcs`: gRPC takes both as a C ``int``
#: (32-bit signed), and a larger value fails inside grpc.aio.server with an OverflowError.
MAX_GRPC_INT = 2**31 - 1
#: Longest `drain_delay_s` and `shutdown_grace_s`: an hour is far past any load
#: balancer's health-check interval or a call's deadline, and a larger value would leave a
#: SIGTERM'd server draining for practically ever.
MAX_SHUTDOWN_S = 3600.0
#: Ordinary assemblies that run at once (0: no limit; see ctxcore.service.admission.Turns).
#: None ("auto", the default) is `AUTO_MAX_RUNNING_EMBEDDED` when the server reads the
#: SQLite store in its own process, where an assembly is CPU-bound: one that runs alone
#: finishes its retrieval inside its wall, where several share the cores (and the GIL) and
#: all degrade; more cores are used by more replicas, each with its turn. With any other
#: store (PostgreSQL, a store or sources handed to the server) retrieval mostly waits on
#: another process, and there is no limit.
DEFAULT_MAX_RUNNING: int | None = None
#: The auto limit with the embedded SQLite store.
AUTO_MAX_RUNNING_EMBEDDED = 1

#: The [assembly] settings, in their order: the number fields of ctxcore.AssemblyConfig.
ASSEMBLY_SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(AssemblyConfig) if f.type in ("float", float))
#: The [assembly] keys.
ASSEMBLY_KEYS = frozenset(ASSEMBLY_SETTINGS)


class ClientAuth(enum.StrEnum):
    """Whether TLS clients must present a certificate."""

    NONE = "none"  #: server-side TLS only: callers authenticate with a token or key
    REQUIRE = "require"  #: the handshake fails without a certificate from the client CA

    # There is no "optional" mode: gRPC does not verify a client certificate it does not
    # require, so an optional certificate's name could not be trusted.


def _id_like(value: str) -> bool:
    """Whether `value` is an id a request may carry: no surrounding whitespace, no
    control character (`ID_CONTROL`)."""
    return value == value.strip() and not ID_CONTROL.search(value)


@dataclass(frozen=True, slots=True)
class Grant:
    """One (organization, agent) a principal may act for; agent ``*`` means any agent.

    >>> Grant.parse("org-1/*").allows("org-1", "agent-9")
    True
    """

    organization_id: str
    agent_id: str

    @classmethod
    def parse(cls, text: str) -> Grant:
        """``ORG/AGENT`` or ``ORG/*``."""
        org, sep, agent = text.partition("/")
        if not sep or "/" in agent:
            why = f"{text.count('/')} slashes" if sep else "no slash"
            problem = f"has {why}; ORG/AGENT has exactly one, and the agent may be '*'"
        elif not org or not agent:
            problem = f"has an empty {'organization' if not org else 'agent'}"
        elif org == "*":
            problem = "names the organization '*': the organization cannot be a wildcard, only the agent"
        elif bad := next((w for w, v in (("organization", org), ("agent", agent)) if not _id_like(v)), None):
            problem = (
                f"has surrounding whitespace or a control character in its {bad}: "
                f"no request's {bad} id can hold one, so it would match none"
            )
        else:
            return cls(org, agent)
        raise ConfigError(f"grant {text!r} {problem} (expected 'ORG/AGENT' or 'ORG/*')")

    def allows(self, organization_id: str, agent_id: str) -> bool:
        """Whether this grant covers the pair."""
        return self.organization_id == organization_id and self.agent_id in ("*", agent_id)

    def __str__(self) -> str:
        return f"{self.organization_id}/{self.agent_id}"


@dataclass(frozen=True, slots=True)
class JwtConfig:
    """How bearer JWTs are verified (PyJWT): every one needs this issuer, audience, an
    expiry, and a signature by `key_file` in one of `algorithms` (never ``none``)."""

    issuer: str
    audience: str
    algorithms: tuple[str, ...]
    key_file: Path
    leeway_s: float = 0.0
    principal_claim: str = "sub"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The server's certificate and, for mTLS, the CA that signs client certificates."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth: ClientAuth = ClientAuth.NONE


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Who may call, and for which organizations and agents."""

    jwt: JwtConfig | None = None
    api_key_file: Path | None = None
    tls: TlsConfig | None = None
    principals: Mapping[str, tuple[Grant, ...]] = field(default_factory=dict)
    allow_unauthenticated: bool = False
    allow_plaintext: bool = False

    @property
    def authenticates(self) -> bool:
        """Whether any credential check is configured."""
        return (
            self.jwt is not None
            or self.api_key_file is not None
            or (self.tls is not None and self.tls.client_auth is not ClientAuth.NONE)
        )


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Everything `ctxcore serve` needs, validated (see the module docstring for the TOML)."""

    bind: str = DEFAULT_BIND
    db: Path | None = None
    catalog: Path | None = None
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS
    deadline_headroom_ms: float = DEFAULT_DEADLINE_HEADROOM_MS
    min_retrieval_ms: float = DEFAULT_MIN_RETRIEVAL_MS
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    drain_delay_s: float = DEFAULT_DRAIN_DELAY_S
    max_queue: int = DEFAULT_MAX_QUEUE
    cpu_workers: int = DEFAULT_CPU_WORKERS
    #: Server processes that share the bind's port (`ctxcore.service.workers`): each one a
    #: whole `ContextService` with its own event loop, store connections and caches.
    workers: int = 1
    max_running: int | None = DEFAULT_MAX_RUNNING  #: None: auto (`DEFAULT_MAX_RUNNING`)
    reflection: bool | None = None
    assembly: Mapping[str, float] = field(default_factory=dict)
    auth: AuthConfig = field(default_factory=AuthConfig)
    #: A PostgreSQL memory store (``postgresql://`` URL) to serve instead of `db`; shared
    #: by any number of replicas. Its password is never logged.
    db_url: str | None = None

    def __post_init__(self) -> None:
        host_port(self.bind)
        if self.db_url is not None and not (
            isinstance(self.db_url, str) and self.db_url.lower().startswith(("postgresql://", "postgres://"))
        ):
            raise ConfigError("store.db_url must be a postgresql:// URL")
        for name in ("max_message_bytes", "max_concurrent_rpcs", "max_queue", "cpu_workers", "workers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"server.{name} must be a positive integer, got {v!r}")
        for name in ("max_message_bytes", "max_concurrent_rpcs"):
            v = getattr(self, name)
            if v > MAX_GRPC_INT:
                raise ConfigError(f"server.{name} must be at most 2**31 - 1 = {MAX_GRPC_INT} (gRPC's limit), got {v}")
        if self.cpu_workers > MAX_CPU_WORKERS:
            raise ConfigError(f"server.cpu_workers must be at most {MAX_CPU_WORKERS}, got {self.cpu_workers}")
        if self.workers > MAX_WORKERS:
            raise ConfigError(f"server.workers must be at most {MAX_WORKERS}, got {self.workers}")
        if self.workers > 1 and not sys.platform.startswith("linux"):
            # Elsewhere SO_REUSEPORT does not spread connections (BSD and macOS give them
            # all to one socket) or is not there (Windows).
            raise ConfigError(
                f"server.workers > 1 needs Linux, where the kernel spreads a shared port's "
                f"connections over the workers (this is {sys.platform})"
            )
        if self.workers > 1 and self.bind.startswith("unix:"):
            raise ConfigError(f"server.workers > 1 needs a TCP bind (host:port): processes cannot share {self.bind!r}")
        if self.max_running is not None and (
            isinstance(self.max_running, bool) or not isinstance(self.max_running, int) or self.max_running < 0
        ):
            raise ConfigError(
                f'server.max_running must be "auto" or an integer >= 0 (0: no limit), got {self.max_running!r}'
            )
        if self.metrics_port is not None and (
            isinstance(self.metrics_port, bool)
            or not isinstance(self.metrics_port, int)
            or not 0 <= self.metrics_port <= 65535
        ):
            raise ConfigError(f"metrics.port must be an integer in [0, 65535], got {self.metrics_port!r}")
        if self.metrics_port and self.metrics_port + self.workers - 1 > 65535:
            raise ConfigError(
                f"metrics.port {self.metrics_port} + {self.workers - 1} (one port a worker) is past 65535"
            )
        for name in ("deadline_headroom_ms", "min_retrieval_ms", "shutdown_grace_s", "drain_delay_s"):
            _non_negative(f"server.{name}", getattr(self, name))
        for name in ("shutdown_grace_s", "drain_delay_s"):
            v = getattr(self, name)
            if v > MAX_SHUTDOWN_S:
                raise ConfigError(f"server.{name} must be at most {MAX_SHUTDOWN_S:g} seconds, got {v!r}")
        unknown = set(self.assembly) - ASSEMBLY_KEYS
        if unknown:
            raise ConfigError(f"unknown [assembly] keys {sorted(unknown)} (allowed: {sorted(ASSEMBLY_KEYS)})")
        for k, v in self.assembly.items():
            _non_negative(f"assembly.{k}", v)
        try:
            # The settings' own bounds (a relevance floor below 0.5, ...), named as keys here.
            settings: dict[str, Any] = dict(self.assembly)
            AssemblyConfig(**settings)
        except ConfigError as exc:
            raise ConfigError(f"assembly.{exc}") from None

    @property
    def loopback(self) -> bool:
        """Whether the bind address is reachable from this machine only."""
        return is_loopback_bind(self.bind)

    @property
    def reflection_enabled(self) -> bool:
        """Reflection is served on loopback binds only, and never when turned off."""
        return self.loopback and self.reflection is not False

    def running_limit(self, embedded_store: bool) -> int:
        """Ordinary assemblies run at once (0: no limit): `max_running`, or when it is auto,
        `AUTO_MAX_RUNNING_EMBEDDED` for a server that reads the SQLite store in its own
        process (`embedded_store`) and no limit otherwise.

        >>> ServiceConfig().running_limit(True), ServiceConfig().running_limit(False)
        (1, 0)
        >>> ServiceConfig(max_running=0).running_limit(True)
        0
        """
        if self.max_running is not None:
            return self.max_running
        return AUTO_MAX_RUNNING_EMBEDDED if embedded_store else 0

    def check_start(self) -> None:
        """Fail closed: refuse configurations that would expose data without authentication.

        Raises:
            ConfigError: no authentication on a non-loopback bind; unauthenticated mode
                asked for on a non-loopback bind; neither authentication nor the explicit
                unauthenticated flag; plaintext credentials on a non-loopback bind.
        """
        a = self.auth
        if a.allow_unauthenticated:
            if not self.loopback:
                raise ConfigError(
                    f"refusing to serve unauthenticated on {self.bind}: unauthenticated mode is for loopback "
                    "binds only (127.0.0.0/8, ::1, localhost, unix:)"
                )
            if a.authenticates:
                raise ConfigError("auth.allow_unauthenticated cannot be combined with configured authentication")
            return
        if not a.authenticates:
            where = "a non-loopback address" if not self.loopback else self.bind
            raise ConfigError(
                f"refusing to serve on {where} without authentication: configure auth.jwt, auth.api_key_file or "
                "mTLS (auth.tls.client_ca_file), or pass --allow-unauthenticated on a loopback bind"
            )
        if not a.principals:
            raise ConfigError("authentication is configured but auth.principals grants nobody anything")
        if a.tls is None and not self.loopback and not a.allow_plaintext:
            raise ConfigError(
                f"refusing to accept bearer credentials in plaintext on {self.bind}: configure auth.tls, or set "
                "auth.allow_plaintext when a TLS-terminating proxy sits in front"
            )


def _non_negative(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}")


def host_port(bind: str) -> tuple[str, int | None]:
    """A bind address's host and port (None for ``unix:PATH``), read as gRPC reads it.

    Raises:
        ConfigError: any other form: a ``unix:`` without a path, a port that is not ASCII
            digits, an IPv6 address without brackets (gRPC takes ``::1:50051`` for one
            address on port 443, not ``::1`` on 50051).

    >>> host_port("[::1]:50051")
    ('::1', 50051)
    >>> host_port("::1:50051")
    Traceback (most recent call last):
    ...
    ctxcore.ConfigError: server.bind must be 'host:port', '[v6]:port' or 'unix:PATH', got '::1:50051' (an IPv6 address goes in brackets)
    """
    form = f"server.bind must be 'host:port', '[v6]:port' or 'unix:PATH', got {bind!r}"
    if not isinstance(bind, str) or not bind:
        raise ConfigError(form)
    if bind.startswith("unix:"):
        if bind == "unix:":
            raise ConfigError(f"{form} (a unix: bind needs the socket's path)")
        return bind, None
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(form)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{form} (an IPv6 address goes in brackets)")
    return host, int(port)


def is_loopback_bind(bind: str) -> bool:
    """Whether a bind address is reachable from this machine only.

    >>> [is_loopback_bind(b) for b in ("127.0.0.1:1", "[::1]:1", "localhost:1", "0.0.0.0:1", "[::]:1")]
    [True, True, True, False, False]
    """
    host, port = host_port(bind)
    if port is None:  # a unix domain socket
        return True
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def auto_workers() -> int:
    """``workers = "auto"``: one per usable CPU on Linux (at most `MAX_WORKERS`), else 1
    (elsewhere a shared port does not spread connections)."""
    if not sys.platform.startswith("linux"):
        return 1
    return min(MAX_WORKERS, usable_cpus())


# ---- TOML ---------------------------------------------------------------------------

_SECTIONS: dict[str, set[str]] = {
    "server": {
        "bind",
        "max_message_bytes",
        "max_concurrent_rpcs",
        "deadline_headroom_ms",
        "min_retrieval_ms",
        "shutdown_grace_s",
        "drain_delay_s",
        "reflection",
        "catalog",
        "max_queue",
        "cpu_workers",
        "max_running",
        "workers",
    },
    "store": {"db"},
    "assembly": set(ASSEMBLY_KEYS),
    "metrics": {"port", "bind"},
    "auth": {"allow_unauthenticated", "allow_plaintext", "api_key_file", "jwt", "tls", "principals"},
}
_JWT_KEYS = {"issuer", "audience", "algorithms", "key_file", "leeway_s", "principal_claim"}
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth"}


def _table(doc: Mapping[str, Any], name: str, allowed: set[str], where: str) -> dict[str, Any]:
    t = doc.get(name, {})
    if not isinstance(t, dict):
        raise ConfigError(f"{where}{name} must be a table")
    unknown = set(t) - allowed
    if unknown:
        raise ConfigError(f"unknown keys in [{where}{name}]: {sorted(unknown)} (allowed: {sorted(allowed)})")
    return t


def _str(where: str, v: object) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where} must be a non-empty string, got {v!r}")
    return v


def _path(where: str, v: object, base: Path) -> Path:
    p = Path(_str(where, v)).expanduser()
    return p if p.is_absolute() else base / p


def _bool(where: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where} must be true or false, got {v!r}")
    return v


def parse_jwt(t: Mapping[str, Any], base: Path) -> JwtConfig:
    """Validate an [auth.jwt] table."""
    for k in ("issuer", "audience", "algorithms", "key_file"):
        if k not in t:
            raise ConfigError(f"auth.jwt.{k} is required")
    algs = t["algorithms"]
    if not isinstance(algs, list) or not algs or not all(isinstance(a, str) and a for a in algs):
        raise ConfigError("auth.jwt.algorithms must be a non-empty list of algorithm names")
    from .algorithms import check_jwt_algorithms  # PyJWT only when a [auth.jwt] table is read

    check_jwt_algorithms(algs)
    leeway = t.get("leeway_s", 0.0)
    _non_negative("auth.jwt.leeway_s", leeway)
    return JwtConfig(
        issuer=_str("auth.jwt.issuer", t["issuer"]),
        audience=_str("auth.jwt.audience", t["audience"]),
        algorithms=tuple(algs),
        key_file=_path("auth.jwt.key_file", t["key_file"], base),
        leeway_s=float(leeway),
        principal_claim=_str("auth.jwt.principal_claim", t.get("principal_claim", "sub")),
    )


def parse_tls(t: Mapping[str, Any], base: Path) -> TlsConfig:
    """Validate an [auth.tls] table."""
    for k in ("cert_file", "key_file"):
        if k not in t:
            raise ConfigError(f"auth.tls.{k} is required")
    ca = _path("auth.tls.client_ca_file", t["client_ca_file"], base) if "client_ca_file" in t else None
    try:
        mode = ClientAuth(t.get("client_auth", "require" if ca else "none"))
    except ValueError:
        raise ConfigError(
            f"auth.tls.client_auth must be one of {[m.value for m in ClientAuth]}, got {t.get('client_auth')!r}"
        ) from None
    if mode is not ClientAuth.NONE and ca is None:
        raise ConfigError("auth.tls.client_auth needs auth.tls.client_ca_file (the CA that signs client certificates)")
    return TlsConfig(
        cert_file=_path("auth.tls.cert_file", t["cert_file"], base),
        key_file=_path("auth.tls.key_file", t["key_file"], base),
        client_ca_file=ca,
        client_auth=mode,
    )


class _EncryptedKey(Exception):
    """Raised from OpenSSL's password callback: the key file is encrypted."""


def _no_password() -> bytes:
    raise _EncryptedKey  # never a prompt on the terminal: a server starts unattended


def check_tls_files(tls: TlsConfig) -> None:
    """Check that the TLS files hold what gRPC needs: a PEM certificate chain, the
    unencrypted PEM private key of its first certificate, and (mTLS) a PEM CA bundle.

    Read with the standard library's OpenSSL (``ssl``) at start-up, so a wrong file is
    named before the server binds, instead of surfacing from gRPC as a failure to bind.
    Only the files' form is checked, not policy: keys and digests OpenSSL's default
    security level calls weak are accepted here (gRPC accepts them too).

    Raises:
        ConfigError: a file that cannot be read or does not hold what it should (named).
    """
    import ssl

    def context() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # the files' form, not OpenSSL's key-size policy
        return ctx

    def certificates(key: str, path: Path, what: str) -> None:
        try:
            context().load_verify_locations(cafile=str(path))
        except ssl.SSLError:
            raise ConfigError(f"auth.tls.{key} {path}: holds no PEM {what}") from None
        except OSError as exc:
            raise ConfigError(f"auth.tls.{key} {path}: cannot read it: {exc.strerror or exc}") from None

    certificates("cert_file", tls.cert_file, "certificate (-----BEGIN CERTIFICATE-----)")
    try:
        context().load_cert_chain(str(tls.cert_file), str(tls.key_file), password=_no_password)
    except _EncryptedKey:
        raise ConfigError(
            f"auth.tls.key_file {tls.key_file}: the key is encrypted; gRPC needs an unencrypted PEM private key"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"auth.tls.key_file {tls.key_file}: is not the private key of the certificate in "
                f"auth.tls.cert_file {tls.cert_file}"
            ) from None
        raise ConfigError(
            f"auth.tls.key_file {tls.key_file}: holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"auth.tls.key_file {tls.key_file}: cannot read it: {exc.strerror or exc}") from None
    if tls.client_ca_file is not None:
        certificates("client_ca_file", tls.client_ca_file, "CA certificate (-----BEGIN CERTIFICATE-----)")


def parse_principals(t: object) -> dict[str, tuple[Grant, ...]]:
    """Validate an [auth.principals] table: principal -> list of 'ORG/AGENT' grants."""
    if not isinstance(t, dict):
        raise ConfigError("auth.principals must be a table of principal = ['ORG/AGENT', ...]")
    out: dict[str, tuple[Grant, ...]] = {}
    for name, grants in t.items():
        if not name:
            raise ConfigError("auth.principals has an empty principal name")
        if not isinstance(grants, list) or not all(isinstance(g, str) for g in grants):
            raise ConfigError(f"auth.principals.{name!r} must be a list of 'ORG/AGENT' strings")
        out[name] = tuple(Grant.parse(g) for g in grants)
    return out


def parse_service_config(text: str, source: str = "<string>", base: Path | None = None) -> ServiceConfig:
    """Build a `ServiceConfig` from TOML text; relative paths are taken from `base`.

    Raises:
        ConfigError: not TOML, an unknown key, or a bad value (the message names it).

    >>> parse_service_config('[server]\\nbind = "127.0.0.1:7000"\\n[assembly]\\nhot_timeout_ms = 10').assembly
    {'hot_timeout_ms': 10}
    """
    base = base if base is not None else Path.cwd()
    try:
        # A byte order mark (editors on Windows write one) is not TOML, and says nothing.
        doc = tomllib.loads(text.removeprefix(BOM))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(doc) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"{source}: unknown sections {sorted(unknown)} (allowed: {sorted(_SECTIONS)})")
    try:
        srv = _table(doc, "server", _SECTIONS["server"], "")
        store = _table(doc, "store", _SECTIONS["store"], "")
        asm = _table(doc, "assembly", _SECTIONS["assembly"], "")
        met = _table(doc, "metrics", _SECTIONS["metrics"], "")
        auth = _table(doc, "auth", _SECTIONS["auth"], "")
        kw: dict[str, Any] = {}
        for k in ("bind",):
            if k in srv:
                kw[k] = _str(f"server.{k}", srv[k])
        for k in (
            "max_message_bytes",
            "max_concurrent_rpcs",
            "deadline_headroom_ms",
            "min_retrieval_ms",
            "shutdown_grace_s",
            "drain_delay_s",
            "max_queue",
            "cpu_workers",
            "max_running",
            "workers",
        ):
            if k in srv:
                kw[k] = srv[k]
        if kw.get("max_running") == "auto":
            kw["max_running"] = None
        if isinstance(kw.get("workers"), str):
            if kw["workers"] != "auto":
                raise ConfigError(f'server.workers must be a positive integer or "auto", got {kw["workers"]!r}')
            kw["workers"] = auto_workers()
        if "reflection" in srv:
            r = srv["reflection"]
            if r not in ("auto", False):
                raise ConfigError(f'server.reflection must be "auto" or false, got {r!r}')
            kw["reflection"] = None if r == "auto" else False
        if "catalog" in srv:
            kw["catalog"] = _path("server.catalog", srv["catalog"], base)
        if (
            "db" in store
            and isinstance(store["db"], str)
            and store["db"].lower().startswith(("postgresql://", "postgres://"))
        ):
            kw["db_url"] = store["db"]
        elif "db" in store:
            kw["db"] = _path("store.db", store["db"], base)
        kw["assembly"] = dict(asm)
        if "port" in met:
            kw["metrics_port"] = met["port"]
        if "bind" in met:
            kw["metrics_bind"] = _str("metrics.bind", met["bind"])
        a: dict[str, Any] = {}
        for k in ("allow_unauthenticated", "allow_plaintext"):
            if k in auth:
                a[k] = _bool(f"auth.{k}", auth[k])
        if "api_key_file" in auth:
            a["api_key_file"] = _path("auth.api_key_file", auth["api_key_file"], base)
        if "jwt" in auth:
            a["jwt"] = parse_jwt(_table(auth, "jwt", _JWT_KEYS, "auth."), base)
        if "tls" in auth:
            a["tls"] = parse_tls(_table(auth, "tls", _TLS_KEYS, "auth."), base)
        if "principals" in auth:
            a["principals"] = parse_principals(auth["principals"])
        kw["auth"] = AuthConfig(**a)
        return ServiceConfig(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_service_config(path: str | Path) -> ServiceConfig:
    """Read a TOML config file; relative paths in it are relative to the file.

    Raises:
        ConfigError: the file cannot be read or is invalid.
    """
    p = Path(path)
    text = read_utf8(p, ConfigError, what="config")
    return parse_service_config(text, str(p), p.resolve().parent)


def with_overrides(cfg: ServiceConfig, **changes: Any) -> ServiceConfig:
    """`cfg` with the given top-level fields replaced (None values are ignored)."""
    names = {f.name for f in fields(ServiceConfig)}
    bad = set(changes) - names
    if bad:
        raise TypeError(f"unknown ServiceConfig fields {sorted(bad)}")
    return replace(cfg, **{k: v for k, v in changes.items() if v is not None})
