"""The ``ctxcore serve`` and ``ctxcore api-key`` subcommands.

``ctxcore serve [--config FILE] [flags]`` runs the gRPC service: the TOML file first, then
every flag given on the command line on top of it (see `ctxcore.service.config` for the
file's shape). ``ctxcore api-key PRINCIPAL`` makes a new API key and prints the line to
add to the server's key file (which stores only the key's hash).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any, TextIO

from .._files import STDIN, decode_utf8
from .._numbers import positive_int_arg
from ..errors import ConfigError
from .config import (
    ASSEMBLY_SETTINGS,
    ClientAuth,
    JwtConfig,
    ServiceConfig,
    TlsConfig,
    auto_workers,
    load_service_config,
    parse_principals,
    parse_service_config,
)

__all__ = ["add_subcommands", "config_from_args"]


# The flags whose value is a file, an address or a JWT claim: an empty one is refused.
_TEXT_FLAGS = (
    "config",
    "bind",
    "db",
    "catalog",
    "metrics_bind",
    "api_key_file",
    "jwt_issuer",
    "jwt_audience",
    "jwt_key_file",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
)
# The [assembly] settings in milliseconds have flags of their own.
_ASSEMBLY_FLAGS = tuple(n for n in ASSEMBLY_SETTINGS if n.endswith("_ms"))


def _workers(text: str) -> int:
    """``--workers``: a count (checked with the rest of the configuration), or ``auto`` (one
    per usable CPU, see `usable_cpus`)."""
    if text == "auto":
        return auto_workers()
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a positive integer, got {text!r}") from None


def _max_running(text: str) -> int | str:
    """``--max-running``: a count >= 0, or ``auto``."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or an integer >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected auto or an integer >= 0, got {text!r}")
    return n


def add_subcommands(sub: Any) -> None:
    """Register ``serve`` and ``api-key`` on the ``ctxcore`` subparsers."""
    s = sub.add_parser(
        "serve",
        help="run the gRPC ContextAssemblyService",
        description="Run the gRPC ContextAssemblyService. Flags override the --config file.",
    )
    s.add_argument("--config", metavar="FILE", help="TOML configuration file ('-': stdin)")
    s.add_argument("--bind", help="address to listen on (default 127.0.0.1:50051)")
    s.add_argument("--db", metavar="PATH|URL", help="the SQLite memory store, or a postgresql:// URL")
    s.add_argument("--catalog", metavar="FILE", help="a capability catalog instead of the shipped one")
    s.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    s.add_argument("--metrics-bind", help="address of the metrics endpoint (default 127.0.0.1)")
    a = s.add_argument_group("authentication")
    a.add_argument("--api-key-file", metavar="FILE", help="'PRINCIPAL sha256:HEX' lines (ctxcore api-key)")
    a.add_argument("--jwt-issuer", help="required 'iss' of bearer JWTs")
    a.add_argument("--jwt-audience", help="required 'aud' of bearer JWTs")
    a.add_argument("--jwt-key-file", metavar="FILE", help="PEM public key, or HMAC secret, that signs JWTs")
    a.add_argument("--jwt-algorithm", action="append", metavar="ALG", help="allowed algorithm (repeatable)")
    a.add_argument("--tls-cert", metavar="FILE", help="server certificate chain (PEM)")
    a.add_argument("--tls-key", metavar="FILE", help="server private key (PEM)")
    a.add_argument("--tls-client-ca", metavar="FILE", help="CA of client certificates: turns on mTLS")
    a.add_argument(
        "--grant",
        action="append",
        metavar="PRINCIPAL=ORG/AGENT",
        help="let PRINCIPAL act for ORG/AGENT (ORG/* for every agent); repeatable",
    )
    a.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="trust request fields without credentials (loopback binds only)",
    )
    a.add_argument(
        "--allow-plaintext",
        action="store_true",
        help="accept credentials without TLS on a non-loopback bind (behind a TLS proxy)",
    )
    t = s.add_argument_group("deadlines (milliseconds unless noted)")
    for name in _ASSEMBLY_FLAGS:
        t.add_argument("--" + name.replace("_", "-"), type=float, metavar="MS")
    t.add_argument(
        "--deadline-headroom-ms", type=float, metavar="MS", help="kept back from the caller's deadline for the response"
    )
    t.add_argument(
        "--min-retrieval-ms",
        type=float,
        metavar="MS",
        help="less than this left for retrieval: DEADLINE_EXCEEDED at once",
    )
    t.add_argument("--shutdown-grace-s", type=float, metavar="S", help="time in-flight calls get after SIGTERM")
    t.add_argument("--drain-delay-s", type=float, metavar="S", help="NOT_SERVING this long before refusing calls")
    t.add_argument(
        "--max-queue", type=positive_int_arg, metavar="N", help="assemblies admitted at a time (admission control)"
    )
    t.add_argument(
        "--cpu-workers", type=positive_int_arg, metavar="N", help="threads for the assembly's CPU-heavy stages"
    )
    s.add_argument(
        "--workers",
        type=_workers,
        metavar="N|auto",
        help="server processes sharing the port (default 1; auto: one per usable CPU, "
        "within the affinity and the cgroup's CPU limit); a client spreads its calls "
        "over them with more than one connection",
    )
    t.add_argument(
        "--max-running",
        type=_max_running,
        metavar="N|auto",
        help="ordinary assemblies run at a time, the others wait their turn (0: no limit; "
        "auto, the default: 1 with the SQLite store, no limit with PostgreSQL)",
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=_cmd_serve)

    k = sub.add_parser("api-key", help="make an API key for a principal (prints the key-file line)")
    k.add_argument("principal", help="who the key authenticates")
    k.set_defaults(func=_cmd_api_key)


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    """The TOML file (if any) with the command line's flags on top.

    Raises:
        ConfigError: a bad file or flag (named), an empty value among them (an unset
            variable in ``--tls-cert "$CERT"``), which would otherwise be dropped.
    """
    for name in _TEXT_FLAGS:
        if getattr(args, name) == "":
            raise ConfigError(f"--{name.replace('_', '-')} must not be empty")
    if args.config == STDIN:
        # Relative paths in a configuration read from standard input are relative to here.
        text = decode_utf8(sys.stdin.buffer.read(), "<stdin>", ConfigError, what="config")
        cfg = parse_service_config(text, "<stdin>", Path.cwd())
    else:
        cfg = load_service_config(args.config) if args.config else ServiceConfig()
    top: dict[str, Any] = {}
    for name in (
        "bind",
        "metrics_port",
        "metrics_bind",
        "deadline_headroom_ms",
        "min_retrieval_ms",
        "shutdown_grace_s",
        "drain_delay_s",
        "max_queue",
        "cpu_workers",
        "max_running",
        "workers",
    ):
        v = getattr(args, name)
        if v is not None:
            top[name] = None if v == "auto" else v  # max_running: auto
    for name in ("db", "catalog"):
        if getattr(args, name):
            top[name] = Path(getattr(args, name))
    if args.db and str(args.db).lower().startswith(("postgresql://", "postgres://")):
        top.pop("db")
        top["db_url"] = args.db  # a PostgreSQL store, shared by replicas
    asm = dict(cfg.assembly)
    asm.update({n: getattr(args, n) for n in _ASSEMBLY_FLAGS if getattr(args, n) is not None})
    top["assembly"] = asm

    auth = cfg.auth
    au: dict[str, Any] = {}
    if args.allow_unauthenticated:
        au["allow_unauthenticated"] = True
    if args.allow_plaintext:
        au["allow_plaintext"] = True
    if args.api_key_file:
        au["api_key_file"] = Path(args.api_key_file)
    jwt_flags = (args.jwt_issuer, args.jwt_audience, args.jwt_key_file, args.jwt_algorithm)
    if any(f is not None for f in jwt_flags):
        if not all(f is not None for f in jwt_flags):
            raise ConfigError("--jwt-issuer, --jwt-audience, --jwt-key-file and --jwt-algorithm go together")
        from .algorithms import check_jwt_algorithms

        check_jwt_algorithms(args.jwt_algorithm)
        au["jwt"] = JwtConfig(args.jwt_issuer, args.jwt_audience, tuple(args.jwt_algorithm), Path(args.jwt_key_file))
    if args.tls_cert or args.tls_key or args.tls_client_ca:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        ca = Path(args.tls_client_ca) if args.tls_client_ca else None
        au["tls"] = TlsConfig(
            Path(args.tls_cert), Path(args.tls_key), ca, ClientAuth.REQUIRE if ca else ClientAuth.NONE
        )
    if args.grant:
        grants: dict[str, list[str]] = {}
        for g in args.grant:
            who, sep, what = g.partition("=")
            if not sep or not who:
                raise ConfigError(f"--grant {g!r} must be PRINCIPAL=ORG/AGENT")
            grants.setdefault(who, []).append(what)
        merged = dict(auth.principals)
        for who, gs in parse_principals(grants).items():
            merged[who] = merged.get(who, ()) + gs
        au["principals"] = merged
    top["auth"] = dataclasses.replace(auth, **au)
    return dataclasses.replace(cfg, **top)


def _cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    from .._extras import require

    require("service", "ctxcore serve")
    from .logs import configure_logging
    from .server import serve

    cfg = config_from_args(args)
    cfg.check_start()
    if cfg.workers > 1:
        from .workers import serve_workers

        return serve_workers(cfg, log_level=args.log_level)
    configure_logging(args.log_level)
    # The process serves and nothing else: its interpreter is tuned for it (server.tune_process).
    asyncio.run(serve(cfg, tune=True))
    return 0


def _cmd_api_key(args: argparse.Namespace, out: TextIO) -> int:
    from .._extras import require

    require("service", "ctxcore api-key")
    from .auth import hash_api_key, new_api_key

    principal = args.principal
    if not principal or any(c.isspace() for c in principal):
        raise ConfigError("the principal must be a non-empty name without spaces")
    if principal.startswith("#"):
        raise ConfigError("the principal must not start with '#': the API key file reads that line as a comment")
    key = new_api_key()
    out.write(f"key:  {key}\n")
    out.write(f"line: {principal} {hash_api_key(key)}\n")
    out.write("Give the key to the caller (it is not stored anywhere); append the line to the server's API key file.\n")
    return 0
