"""`ctxcore serve`: the gRPC ContextAssemblyService.

`ContextService` is one server (grpc.aio): authentication at the boundary, the deadline
contract, health, reflection on loopback, Prometheus metrics and graceful shutdown.
`ServiceConfig` / `load_service_config` read its TOML configuration; `serve` runs it
until SIGTERM; `serve_workers` runs ``workers`` of them as processes sharing one port. The wire contract is ``ctxcore/v1/context_assembly.proto``; Python callers
use `ctxcore.client.ContextClient`.

The names below load on first use, so that ``ctxcore pack`` and the other commands do not
pay for importing gRPC, and need the ``service`` extra (gRPC, PyJWT, prometheus-client):
without it they raise `ctxcore.MissingExtra` naming the pip command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # "X as X": exported to type checkers (mypy --strict reads no implicit re-export).
    from .auth import (
        Authenticator as Authenticator,
    )
    from .auth import (
        AuthMethod as AuthMethod,
    )
    from .auth import (
        Principal as Principal,
    )
    from .auth import (
        hash_api_key as hash_api_key,
    )
    from .auth import (
        new_api_key as new_api_key,
    )
    from .config import (
        AuthConfig as AuthConfig,
    )
    from .config import (
        ClientAuth as ClientAuth,
    )
    from .config import (
        Grant as Grant,
    )
    from .config import (
        JwtConfig as JwtConfig,
    )
    from .config import (
        ServiceConfig as ServiceConfig,
    )
    from .config import (
        TlsConfig as TlsConfig,
    )
    from .config import (
        load_service_config as load_service_config,
    )
    from .cpus import (
        usable_cpus as usable_cpus,
    )
    from .errors import (
        ServiceError as ServiceError,
    )
    from .server import (
        ContextService as ContextService,
    )
    from .server import (
        scoped_sources as scoped_sources,
    )
    from .server import (
        serve as serve,
    )
    from .server import (
        tune_process as tune_process,
    )
    from .wire import (
        SERVICE_NAME as SERVICE_NAME,
    )
    from .workers import (
        serve_workers as serve_workers,
    )

_WHERE = {
    "AuthMethod": "auth",
    "Authenticator": "auth",
    "Principal": "auth",
    "ServiceError": "errors",
    "hash_api_key": "auth",
    "new_api_key": "auth",
    "AuthConfig": "config",
    "ClientAuth": "config",
    "Grant": "config",
    "JwtConfig": "config",
    "ServiceConfig": "config",
    "TlsConfig": "config",
    "load_service_config": "config",
    "usable_cpus": "cpus",
    "SERVICE_NAME": "wire",
    "ContextService": "server",
    "scoped_sources": "server",
    "serve": "server",
    "tune_process": "server",
    "serve_workers": "workers",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'ctxcore.service' has no attribute {name!r}")
    if where != "config":
        from .._extras import require

        require("service", f"ctxcore.service.{name}")
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
