"""The gRPC ContextAssemblyService on grpc.aio, and the process that runs it.

The boundary of the pipeline: a call is decoded (undecodable bytes are INVALID_ARGUMENT,
not an exception), authenticated (`ctxcore.service.auth`), validated
(`ctxcore.service.convert`, fields named), authorized for its organization and agent, and
only then assembled, with retrieval bound to the authorized scope. The caller's gRPC
deadline caps the retrieval wall:

    wall = min(client_timeout_ms, server_deadline_ms,
               time_remaining - deadline_headroom_ms - packing_headroom_ms)

(``deadline_headroom_ms`` is kept for the response, ``packing_headroom_ms`` for scoring,
packing and formatting), and a call arriving with less than the two headrooms plus
``min_retrieval_ms`` left fails at once with DEADLINE_EXCEEDED. The response's ``wall.source`` says which limit applied.

Health (grpc.health.v1) is NOT_SERVING until the store is open and again from the moment
SIGTERM arrives; then, after ``drain_delay_s``, new calls are refused and in-flight calls
get ``shutdown_grace_s`` to finish. A second SIGTERM or SIGINT cuts the drain short: calls
in flight are cancelled and the process exits with 128 + the signal's number. Reflection
is registered on loopback binds only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import gc
import inspect
import logging
import math
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..budget import compute_budget
from ..catalog import Catalog, ModelCapability, default_catalog, load_catalog
from ..errors import ConfigError, ContextOverflow, InvalidFormatInput, TokenizerMismatch, UnknownModel
from ..memory import NowOrLater, Query, Scope, Sources
from ..request import AssemblyRequest
from ..v1 import context_assembly_pb2 as pb
from .admission import ADMISSION_KEY, RETRY_PUSHBACK_KEY, Admission, Turns
from .auth import Authenticator, Principal
from .config import ServiceConfig, check_tls_files
from .convert import (
    MAX_DETAILS_CHARS,
    MAX_MODELS,
    assembled_to_proto,
    budget_to_proto,
    capabilities_to_proto,
    model_name,
    request_from_proto,
    unknown_model,
)
from .errors import ServiceError
from .fullgc import FULL_COLLECTIONS
from .logs import error_frames, log_event
from .metrics import ServiceMetrics
from .tracing import CallTracer
from .wire import SERVICE_NAME

__all__ = ["SERVICE_NAME", "ContextService", "scoped_sources", "serve"]

#: Largest token count ComputeBudget accepts for one term: the packer's own bound on a
#: token count (2**40, see ctxcore.pack); beyond it the number is not a count.
MAX_TOKEN_TERM = 1 << 40

#: Requests with more messages plus tool schemas than this are decoded and validated in
#: the CPU executor rather than on the event loop (20,000 messages take tens of ms).
OFFLOAD_ITEMS = 256
#: AssembleContext requests larger than this are decoded on the executor too (decoding
#: 20,000 messages takes tens of milliseconds).
OFFLOAD_BYTES = 256 * 1024
#: An AssembleContext request larger than this (encoded) is not an ordinary one even with
#: few messages: pricing its text exactly can take tens of milliseconds or more, so it is
#: decoded and validated off the loop and does not take a turn (`server.max_running`).
TYPICAL_BYTES = 64 * 1024

#: The interpreter's thread switch interval in a process that serves (Python's default is
#: 5 ms; set by `tune_process`, which ``ctxcore serve`` runs). The CPU-heavy stages of
#: large calls run on executor threads and hold the GIL in their Python parts; the event
#: loop, which answers health checks and refuses calls at arrival, waits up to one interval
#: for the GIL at every callback, so a shorter one keeps the loop prompt.
SWITCH_INTERVAL_S = 0.0005
#: The cyclic collector's oldest-generation threshold in a process that serves (Python's
#: default is 10; set by `tune_process`): a full collection at most once every this many
#: collections of the middle generation. With the startup heap frozen, the oldest
#: generation holds only what the caches kept since (the store's row cache: some 100,000
#: rows on the 100,000-memory store), and Python runs a full collection once the objects
#: promoted since the last one reach a quarter of that generation: every few seconds under
#: load. Each walks the kept rows in one step, 13-25 ms here, which every call queued
#: behind it waits out (with 16 callers at a 45 ms deadline, most of the calls left
#: `DEADLINE_EXCEEDED`). The young generations, where cyclic garbage mostly dies, still
#: collect as usual.
SERVING_FULL_COLLECTION_THRESHOLD = 100


class _LoopPass:
    """Scheduled with ``loop.call_soon`` at some point of a call: `seen` once the event
    loop has run it, i.e. once the call has let the loop run (it waited for something)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False

    def __call__(self) -> None:
        self.seen = True


#: Statuses that say something is wrong with the server rather than the call: logged as
#: warnings. The rest (OK, deadline, auth, bad input) are the caller's business: info.
_SERVER_FAULTS = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS}
)

AssembleFn = Callable[..., Awaitable[Any]]
#: Opens the memory store when the server starts: returns a `ctxcore.memory.MemoryStore`
#: (closed at shutdown when it has a ``close`` method).
StoreOpener = Callable[[], Awaitable[Any]]


@dataclasses.dataclass(slots=True)
class _CallState:
    """What a call's handler shares with the RPC body: its log fields and its span."""

    fields: dict[str, Any]
    span: Any


_CALL: contextvars.ContextVar[_CallState] = contextvars.ContextVar("ctxcore_service_call")


class _Undecodable:
    """Stands in for a request whose bytes are not the expected message."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


class _Deferred:
    """A large request's bytes, decoded later on the CPU executor rather than on the loop."""

    __slots__ = ("data", "parse")

    def __init__(self, data: bytes, parse: Callable[[bytes], Any]) -> None:
        self.data = data
        self.parse = parse


def _deserializer(cls: Any, defer: bool = False) -> Callable[[bytes], Any]:
    name = cls.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception:  # DecodeError, or RecursionError on absurd nesting
            return _Undecodable(name)

    def parse_or_defer(data: bytes) -> Any:
        return _Deferred(data, parse) if len(data) > OFFLOAD_BYTES else parse(data)

    return parse_or_defer if defer else parse


def scoped_sources(sources: Sources, scope: Scope) -> Sources:
    """`sources` bound to `scope`: whatever scope the pipeline passes, every branch
    queries the authorized one. The pipeline still checks each memory's scope."""
    return Sources(
        directive=_scoped(sources.directive, scope),
        hot=_scoped(sources.hot, scope),
        cold=_scoped(sources.cold, scope),
    )


def _scoped(fn: Callable[..., Awaitable[Any]] | None, scope: Scope) -> Any:
    """`fn` with `scope` in place of the scope it is called with (a `NowOrLater` stays one)."""
    if fn is None:
        return None

    def call(_: Scope, *args: Any) -> Awaitable[Any]:
        return fn(scope, *args)

    if not isinstance(fn, NowOrLater):
        return call
    now = fn.now

    def at_once(_: Scope, *args: Any) -> Any:
        return now(scope, *args)

    return NowOrLater(call, at_once)


async def _open_postgres(db_url: str) -> Any:
    """The PostgreSQL store `ctxcore serve` serves, opened and warmed off the event loop;
    ``ConfigError`` names the database with its password redacted."""
    from ..stores import MemoryStoreError
    from ..stores.postgres_cli import shown_db

    t0 = time.perf_counter()
    try:
        from ..stores.postgres import PostgresMemoryStore

        store = await asyncio.to_thread(PostgresMemoryStore, db_url)
    except (ImportError, MemoryStoreError, ValueError) as exc:
        raise ConfigError(f"cannot open the memory store {shown_db(db_url)}: {exc}") from None
    await asyncio.to_thread(store.warm)
    log_event("store_open", db=shown_db(db_url), scopes_loaded=0, ms=round((time.perf_counter() - t0) * 1000, 1))
    return store


async def _open_sqlite(cfg: ServiceConfig) -> Any:
    from ..stores import MemoryStoreError, SqliteMemoryStore

    if cfg.db_url is not None:
        return await _open_postgres(cfg.db_url)

    if cfg.db is None:
        raise ConfigError("store.db (or --db) is required: the SQLite memory store to serve")
    if not cfg.db.exists():
        raise ConfigError(f"store.db {cfg.db} does not exist (create it with `ctxcore memories add FILE --db PATH`)")
    # Opening checks the schema and starts the reader threads, and warming loads every
    # scope's embedding matrix so that no caller's cold query pays for it: blocking work,
    # off the loop, done before health says SERVING.
    t0 = time.perf_counter()
    try:
        store = await asyncio.to_thread(SqliteMemoryStore, cfg.db)
    except (MemoryStoreError, ValueError) as exc:
        raise ConfigError(f"cannot open the memory store {cfg.db}: {exc}") from None
    scopes = await asyncio.to_thread(store.warm)
    log_event("store_open", db=str(cfg.db), scopes_loaded=scopes, ms=round((time.perf_counter() - t0) * 1000, 1))
    return store


def _default_assemble() -> tuple[AssembleFn, Any]:
    from .. import assembly

    return assembly.assemble, assembly


def _warm_tokenizers() -> tuple[str, ...]:
    from ..tokens import count_tokens, exact_families

    families = exact_families()
    for family in families:
        count_tokens("warm", family)
    return families


def _takes_executor(fn: Callable[..., Any]) -> bool:
    """Whether an assembly function takes the ``executor`` keyword (to run its CPU-heavy
    stages off the event loop)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "executor" in params


class ContextService:
    """One ContextAssemblyService server.

    Args:
        config: the validated service configuration.
        sources: retrieval branches to serve instead of opening ``config.db`` (tests,
            embedding in another process).
        catalog: the capability catalog (default: ``config.catalog`` or the shipped one).
        assemble: the assembly function (default: `ctxcore.assemble`).
        store_opener: opens the store when `start` runs (default: the SQLite store at
            ``config.db``); health stays NOT_SERVING until it returns.
        tracer_provider: an OpenTelemetry tracer provider for the call and stage spans
            (default: the global one; nothing without the ``otel`` extra).
    """

    def __init__(
        self,
        config: ServiceConfig,
        *,
        sources: Sources | None = None,
        catalog: Catalog | None = None,
        assemble: AssembleFn | None = None,
        store_opener: StoreOpener | None = None,
        tracer_provider: Any = None,
    ) -> None:
        config.check_start()
        self.config = config
        self.auth = Authenticator(config.auth)
        self.catalog = (
            catalog
            if catalog is not None
            else (load_catalog(config.catalog) if config.catalog is not None else default_catalog())
        )
        self.metrics = ServiceMetrics()
        self.tracing = CallTracer(tracer_provider)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        if sources is None and store_opener is None and config.db_url is None:
            if config.db is None:
                raise ConfigError("store.db (or --db) is required: the SQLite memory store to serve")
            if not config.db.exists():
                raise ConfigError(
                    f"store.db {config.db} does not exist (create it with `ctxcore memories add FILE --db PATH`)"
                )
        self._sources = sources
        self._store_opener = store_opener
        self._store: Any = None
        # The served store's embedding dimension once known (it is fixed from then on,
        # re-read only when a query disagrees with it: a re-embedding may have changed it).
        self._store_dims: int | None = None
        if assemble is None:
            assemble, module = _default_assemble()
            base = module.AssemblyConfig.from_env()
            self._assembly_config: Any = dataclasses.replace(base, **dict(config.assembly)) if config.assembly else base
            self._packing_headroom_ms = float(self._assembly_config.packing_headroom_ms)
        else:
            self._assembly_config = None
            self._packing_headroom_ms = 0.0
        self._assemble = assemble
        self._pass_executor = _takes_executor(assemble)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.admission = Admission(
            max_queue=config.max_queue,
            min_retrieval_ms=config.min_retrieval_ms,
            response_headroom_ms=config.deadline_headroom_ms,
            floor_tail_ms=self._packing_headroom_ms,
        )
        # The SQLite store read in this process: its assemblies are CPU-bound here.
        embedded = sources is None and store_opener is None and config.db_url is None
        limit = config.running_limit(embedded)
        #: Ordinary assemblies running at once, at most `config.running_limit` (None: no limit).
        self.turns = Turns(limit) if limit else None
        self._newest_first = 0  # of the turns' newest_first, what the metrics counted
        self._server: grpc.aio.Server | None = None
        self._ready = False
        self._stopping: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None  # set by `stop_now`: cut the drain short
        self._draining: grpc.aio.Server | None = None  # the server while `stop` waits on it
        self._stop_begun = False
        self.port = 0
        self.metrics_port: int | None = None

    # ---- lifecycle ------------------------------------------------------------------

    async def start(self) -> int:
        """Bind, register the services, open the store, then report SERVING.

        Returns:
            The bound port (useful with port 0).
        """
        cfg = self.config
        tls = cfg.auth.tls
        creds: grpc.ServerCredentials | None = None
        if tls is not None:
            # The files' form is checked first: gRPC reports a bad certificate or key only
            # as a failure to bind.
            check_tls_files(tls)
            try:
                creds = grpc.ssl_server_credentials(
                    [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
                    root_certificates=tls.client_ca_file.read_bytes() if tls.client_ca_file else None,
                    require_client_auth=tls.client_auth.value == "require",
                )
            except OSError as exc:
                raise ConfigError(f"cannot read a TLS file: {exc}") from None
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self._stop_begun = False
        # Bounded: at most cpu_workers stages run at once, the rest wait their turn here
        # (admission control keeps that queue short).
        self._executor = concurrent.futures.ThreadPoolExecutor(cfg.cpu_workers, thread_name_prefix="ctxcore-cpu")
        self.admission.start()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.max_send_message_length", max(cfg.max_message_bytes, 64 * 1024 * 1024)),
                # A second server on the same port must fail, not share it; the processes of
                # one `workers` group share it (ctxcore.service.workers checks it is free).
                ("grpc.so_reuseport", int(cfg.workers > 1)),
            ],
            maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
        )
        handlers = self._handlers()
        # Registered methods are matched in gRPC's core when a call arrives, before any
        # Python runs (~5% less server CPU a call than a generic handler's lookup); the
        # generic handler stays for what the core does not match.
        server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]  # not in grpc-stubs
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if cfg.reflection_enabled:
            reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        # A worker of a group (``workers`` > 1) binds the shared port only once it can
        # answer: a worker started again after one died would otherwise be given new
        # connections by the kernel while it loads, and fail their calls UNAVAILABLE. A
        # single process binds first, so that a port in use fails the start at once.
        if cfg.workers > 1:
            families, warm_ms = await self._load()
            await self._listen(server, creds)
        else:
            await self._listen(server, creds)
            families, warm_ms = await self._load()
        self._ready = True
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log_event("serving", port=self.port, tokenizers=list(families), tokenizers_ms=warm_ms)
        return self.port

    async def _listen(self, server: grpc.aio.Server, creds: grpc.ServerCredentials | None) -> None:
        """Bind the port, start serving it (calls are refused UNAVAILABLE until `_ready`)
        and the metrics endpoint."""
        cfg = self.config
        try:
            if creds is None:
                self.port = server.add_insecure_port(cfg.bind)
            else:
                self.port = server.add_secure_port(cfg.bind, creds)
        except RuntimeError as exc:
            raise ConfigError(f"cannot bind {cfg.bind}: {exc}") from None
        if self.port == 0 and not cfg.bind.startswith("unix:"):
            raise ConfigError(f"cannot bind {cfg.bind}")
        await server.start()
        self._server = server
        if cfg.metrics_port is not None:
            try:
                self.metrics_port = self.metrics.serve(cfg.metrics_port, cfg.metrics_bind)
            except OSError as exc:
                await server.stop(0)
                raise ConfigError(f"cannot serve metrics on {cfg.metrics_bind}:{cfg.metrics_port}: {exc}") from None
        log_event(
            "starting",
            bind=cfg.bind,
            port=self.port,
            tls=cfg.auth.tls is not None,
            reflection=cfg.reflection_enabled,
            metrics_port=self.metrics_port,
        )

    async def _load(self) -> tuple[tuple[str, ...], float]:
        """Open the store and warm the tokenizers and the pipeline; the tokenizer families
        warmed and the warm-up's milliseconds."""
        cfg = self.config
        if self._sources is None:
            opener = self._store_opener or (lambda: _open_sqlite(cfg))
            self._store = await opener()
            self._sources = Sources.from_store(self._store)
        # Load the exact tokenizers' vocabularies (about a second each) and run the
        # pipeline once per tokenizer family, so that no caller's call pays for the first
        # use of anything, and admission control does not learn from such a call.
        t0 = time.perf_counter()
        families = await asyncio.to_thread(_warm_tokenizers)
        await self._warm_pipeline()
        return families, round((time.perf_counter() - t0) * 1000, 1)

    async def _warm_pipeline(self) -> None:
        if self._assembly_config is None:
            return  # an assembly function of the caller's: nothing of ours to warm
        models: dict[str, str] = {}
        for name in self.catalog:
            models.setdefault(self.catalog[name].tokenizer_family, name)
        for model in models.values():
            req = AssemblyRequest("ctxcore-warm-up", "ctxcore-warm-up", model, Query("warm up"))
            kwargs: dict[str, Any] = {"sources": Sources(), "catalog": self.catalog, "config": self._assembly_config}
            if self._pass_executor:
                kwargs["executor"] = self._executor
            await self._assemble(req, **kwargs)

    async def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING at once, refuse new calls after ``drain_delay_s``, give the
        calls in flight `grace` seconds (default ``shutdown_grace_s``), then stop."""
        if self._server is None:
            return
        self._stop_begun = True
        grace = self.config.shutdown_grace_s if grace is None else grace
        log_event("draining", grace_s=grace, drain_delay_s=self.config.drain_delay_s)
        await self.health.enter_graceful_shutdown()
        hurry = self._hurry
        assert hurry is not None  # made by `start`, as the server is
        if self.config.drain_delay_s > 0 and not hurry.is_set():
            # Over at the delay, or at once when `stop_now` sets the event.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hurry.wait(), self.config.drain_delay_s)
        server, self._server = self._server, None
        if server is None:
            await self.wait_stopped()  # another `stop` got here first: its end is this one's
            return
        self._draining = server
        try:
            # gRPC keeps the smallest grace of concurrent stops: `stop_now` shortens this one.
            await server.stop(None if hurry.is_set() else grace)
        finally:
            self._draining = None
        await self.admission.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self.metrics.close()
        if self._store is not None and hasattr(self._store, "close"):
            await asyncio.to_thread(self._store.close)
            self._store = None
        self._ready = False
        if self._stopping is not None:
            self._stopping.set()
        log_event("stopped")

    async def stop_now(self) -> None:
        """Stop at once (a second SIGTERM or SIGINT): end the drain delay and abort the
        calls in flight (they get CANCELLED). A `stop` under way is cut short and
        finishes its clean-up; with none under way, one runs without the drain. Returns
        once the server is stopped."""
        if self._hurry is not None:
            self._hurry.set()
        server = self._server or self._draining
        if server is not None:
            await server.stop(None)  # gRPC keeps the smallest grace: this ends any stop's
        if self._server is not None:
            await self.stop()  # none under way: the event set above skips the drain
        if self._stop_begun:
            await self.wait_stopped()

    async def wait_stopped(self) -> None:
        """Return once `stop` has finished."""
        if self._stopping is not None:
            await self._stopping.wait()

    # ---- calls ----------------------------------------------------------------------

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        def unary(
            rpc: str,
            fn: Callable[[Any, grpc.aio.ServicerContext[Any, Any], Principal], Awaitable[Any]],
            req_cls: Any,
            resp_cls: Any,
        ) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap(rpc, fn),
                request_deserializer=_deserializer(req_cls, defer=rpc == "AssembleContext"),
                response_serializer=resp_cls.SerializeToString,
            )

        return {
            "AssembleContext": unary(
                "AssembleContext", self._assemble_context, pb.AssembleContextRequest, pb.AssembledContext
            ),
            "ComputeBudget": unary("ComputeBudget", self._compute_budget, pb.ComputeBudgetRequest, pb.Budget),
            "GetModelCapabilities": unary(
                "GetModelCapabilities",
                self._capabilities,
                pb.GetModelCapabilitiesRequest,
                pb.GetModelCapabilitiesResponse,
            ),
        }

    def _wrap(
        self, rpc: str, fn: Callable[[Any, grpc.aio.ServicerContext[Any, Any], Principal], Awaitable[Any]]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        metrics = self.metrics

        async def handler(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            t0 = time.perf_counter()
            code = grpc.StatusCode.OK
            fields: dict[str, Any] = {}
            span = self.tracing.start(rpc, context.invocation_metadata())
            # Each call runs in its own task, so the context variable is the call's own.
            _CALL.set(_CallState(fields, span))
            metrics.in_flight.inc()
            try:
                if not self._ready:
                    raise ServiceError(grpc.StatusCode.UNAVAILABLE, "the service is not serving (starting or draining)")
                principal = self.auth.authenticate(context.invocation_metadata(), context.auth_context())
                fields["principal"] = principal.name
                if isinstance(request, _Deferred):
                    request = await asyncio.get_running_loop().run_in_executor(
                        self._executor, request.parse, request.data
                    )
                if isinstance(request, _Undecodable):
                    raise ServiceError(
                        grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {request.type_name}"
                    )
                return await fn(request, context, principal)
            except ServiceError as exc:
                code = exc.code
                details = exc.details[:MAX_DETAILS_CHARS]
                fields["details"] = details
                if exc.trailing_metadata:
                    context.set_trailing_metadata(exc.trailing_metadata)
                await context.abort(exc.code, details)
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except Exception as exc:
                code = grpc.StatusCode.INTERNAL
                ref = secrets.token_hex(6)
                log_event("internal_error", logging.ERROR, rpc=rpc, ref=ref, **error_frames(exc))
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error (ref {ref})")
            finally:
                elapsed = time.perf_counter() - t0
                metrics.in_flight.dec()
                metrics.observe_call(rpc, code, elapsed)
                self.tracing.end(span, code.name, code.value[0], fields)
                log_event(
                    "call",
                    logging.WARNING if code in _SERVER_FAULTS else logging.INFO,
                    rpc=rpc,
                    code=code.name,
                    ms=round(elapsed * 1000, 3),
                    **fields,
                )

        return handler

    def _admit(self, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[float | None, float]:
        """Admission control (`ctxcore.service.admission`): refuse at arrival a call that
        cannot finish inside its deadline or finds the queue full; else count it in and
        return its remaining time in ms (None without a deadline) and the tail kept
        for it after retrieval."""
        remaining = context.time_remaining()
        remaining_ms = None if remaining is None else remaining * 1000.0
        d = self.admission.decide(remaining_ms)
        m = self.metrics
        m.tail_estimate.set(d.tail_ms / 1000.0)
        m.loop_lag.set(self.admission.lag_ms / 1000.0)
        if remaining is not None:
            m.time_left.observe(max(0.0, remaining))
        call = _CALL.get(None)
        if call is not None:
            call.fields["admission"] = d.reason
            call.fields["remaining_ms"] = None if remaining_ms is None else round(remaining_ms, 2)
            call.fields["tail_ms"] = round(d.tail_ms, 2)
        if not d.admitted:
            m.refused.labels(d.reason).inc()
            marks: tuple[tuple[str, str], ...] = ((ADMISSION_KEY, d.reason),)
            if d.retry_after_ms:
                marks += ((RETRY_PUSHBACK_KEY, str(d.retry_after_ms)),)
            # Shed for load: RESOURCE_EXHAUSTED, which a client may retry elsewhere at once;
            # DEADLINE_EXCEEDED only for a deadline too short for any assembly.
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if d.overload else grpc.StatusCode.DEADLINE_EXCEEDED
            raise ServiceError(code, d.details, marks)
        m.admitted.set(self.admission.admitted)
        return remaining_ms, d.tail_ms

    async def _take_turn(
        self, context: grpc.aio.ServicerContext[Any, Any], tail_ms: float, call: _CallState | None
    ) -> Turns:
        """Wait for a turn to run (`server.max_running`), for as long as the deadline
        leaves room for a retrieval and the estimated tail; else refuse the call for load,
        RESOURCE_EXHAUSTED (``refused-wait``), before it has done any work."""
        turns = self.turns
        assert turns is not None
        cfg = self.config
        need_ms = cfg.min_retrieval_ms + max(tail_ms, self._packing_headroom_ms) + cfg.deadline_headroom_ms
        remaining = context.time_remaining()
        timeout = None if remaining is None else remaining - need_ms / 1000.0
        line = ""
        if remaining is not None and turns.running >= turns.limit and not turns.lifo:
            # The waiters ahead, at recent turns' length each: when they alone are expected
            # to outlast the deadline, waiting is in vain (refused now, before it waits). In
            # a congested line the newest goes first, so nobody is ahead of this call.
            ahead_ms = turns.line_ms()
            if ahead_ms >= remaining * 1000.0:
                timeout = 0.0
                turns.turned_away()
                line = f" (the line ahead is expected to take {ahead_ms:.1f} ms)"
        t0 = time.perf_counter()
        self.metrics.waiting.inc()
        try:
            got = await turns.take(timeout)
        finally:
            m = self.metrics
            m.waiting.dec()
            m.turn.set(turns.turn_ms() / 1000.0)
            if turns.newest_first > self._newest_first:
                m.newest_first.inc(turns.newest_first - self._newest_first)
                self._newest_first = turns.newest_first
        if got:
            return turns
        waited_ms = (time.perf_counter() - t0) * 1000.0
        if call is not None:
            call.fields["admission"] = "refused-wait"
        self.metrics.refused.labels("refused-wait").inc()
        self.admission.shed()
        left = "" if remaining is None else f"{remaining * 1000.0 - waited_ms:.2f} ms left"
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"waited {waited_ms:.1f} ms for one of the {turns.limit} running assemblies (server.max_running) "
            f"to finish, {turns.waiting} still waiting{line}; {left}, an assembly needs about {need_ms:.2f} ms",
            ((ADMISSION_KEY, "refused-wait"),),
        )

    @staticmethod
    def _authorize(principal: Principal, req: AssemblyRequest, call: _CallState | None) -> Scope:
        if call is not None:
            call.fields["organization_id"] = req.organization_id
            call.fields["agent_id"] = req.agent_id
        return principal.authorize(req.organization_id, req.agent_id)

    async def _check_query_dimensions(self, req: AssemblyRequest) -> None:
        """A query embedding of another dimension than the served store's is the caller's
        error (INVALID_ARGUMENT naming ``query.embedding``), not a degraded answer."""
        emb = req.query.embedding
        if not emb or self._store is None:
            return
        if self._store_dims is None or self._store_dims != len(emb):
            dims = getattr(self._store, "dimensions", None)
            if dims is None or isinstance(dims, bool) or not isinstance(dims, int):
                return
            self._store_dims = dims
        if len(emb) != self._store_dims:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"query.embedding: has {len(emb)} dimensions, the store's embeddings have {self._store_dims}",
            )

    def _wall_deadline(self, context: grpc.aio.ServicerContext[Any, Any], tail_ms: float) -> float | None:
        """The deadline handed to the assembly: the caller's, less the response headroom
        and whatever of the estimated tail the assembly's own packing headroom does not
        cover, so that retrieval stops in time for the rest to finish. Checked again here:
        validation may have used up what admission saw."""
        remaining = context.time_remaining()
        if remaining is None:
            return None
        cfg = self.config
        extra = max(0.0, tail_ms - self._packing_headroom_ms)
        left_ms = remaining * 1000.0 - cfg.deadline_headroom_ms - extra
        if left_ms - self._packing_headroom_ms < cfg.min_retrieval_ms:
            details = (
                f"{remaining * 1000.0:.2f} ms left after validation; an assembly needs at least "
                f"{cfg.deadline_headroom_ms + self._packing_headroom_ms + extra + cfg.min_retrieval_ms:.2f} ms"
            )
            if not self.admission.busy_besides_one():
                raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, details)
            # Other calls ran or waited meanwhile (its turn came late, or validation ran
            # behind them): refused for load, as at arrival.
            self.metrics.refused.labels("refused-deadline").inc()
            self.admission.shed()
            call = _CALL.get(None)
            if call is not None:
                call.fields["admission"] = "refused-deadline"
            wait = max(1, math.ceil(tail_ms))
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{details}; refused for load, retry in {wait} ms",
                ((ADMISSION_KEY, "refused-deadline"), (RETRY_PUSHBACK_KEY, str(wait))),
            )
        # The assembly subtracts its packing headroom from this deadline itself.
        return time.monotonic() + left_ms / 1000.0

    async def _assemble_context(
        self, request: pb.AssembleContextRequest, context: grpc.aio.ServicerContext[Any, Any], principal: Principal
    ) -> pb.AssembledContext:
        # An ordinary request is validated and authorized before admission (a few
        # microseconds), so that bad input and foreign scopes get their own status under
        # any load; a large one only once admitted, and off the loop.
        typical = (
            len(request.messages) + len(request.tools_json) <= OFFLOAD_ITEMS and request.ByteSize() <= TYPICAL_BYTES
        )
        call = _CALL.get(None)
        req: AssemblyRequest | None = None
        scope: Scope | None = None
        if typical:
            req = request_from_proto(request)
            scope = self._authorize(principal, req, call)
        ahead = self.admission.admitted
        remaining_ms, tail_ms = self._admit(context)
        t_admit = time.perf_counter()
        # Whether the call lets the loop run from here to its end (see Admission.waited_share).
        loop_pass = _LoopPass()
        asyncio.get_running_loop().call_soon(loop_pass)
        # What the tail model learns from (ordinary calls only: a long history costs more
        # after retrieval in proportion, and would make ordinary calls look slow): the time
        # from the end of retrieval, or from its wall when retrieval overran it, to the answer.
        t_asm = 0.0
        retrieval_ms: float | None = None
        turn: Turns | None = None
        waited_in_vain = False
        if not typical:
            FULL_COLLECTIONS.hold()
        try:
            if req is None or scope is None:
                # Linear, but long enough to hold up every other call if run on the loop.
                req = await asyncio.get_running_loop().run_in_executor(self._executor, request_from_proto, request)
                scope = self._authorize(principal, req, call)
            elif self.turns is not None:
                # An ordinary call runs in its turn; a large one (rare, and long) does not
                # hold up the ordinary ones behind it.
                waited_in_vain = True  # until a turn comes
                turn = await self._take_turn(context, tail_ms, call)
                waited_in_vain = False
            await self._check_query_dimensions(req)
            deadline = self._wall_deadline(context, tail_ms)
            assert self._sources is not None
            kwargs: dict[str, Any] = {
                "sources": scoped_sources(self._sources, scope),
                "catalog": self.catalog,
                "deadline": deadline,
            }
            if self._assembly_config is not None:
                kwargs["config"] = self._assembly_config
            if self._pass_executor:
                # An ordinary call's stages (well under a millisecond of CPU) run on the
                # loop's thread: handing them to the executor and back costs more CPU than
                # they take (about 0.3 ms of served CPU per call), and their Python parts
                # hold the GIL wherever they run. A large call's run on the executor.
                kwargs["executor"] = None if typical else self._executor
            started_ns = self.tracing.now_ns()
            t_asm = time.perf_counter()
            try:
                ctx = await self._assemble(req, **kwargs)
            except UnknownModel as exc:
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, unknown_model("model", exc)) from None
            except (TokenizerMismatch, ConfigError) as exc:
                # Per-request settings the pipeline rejects (e.g. a weight set it cannot use).
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"options: {str(exc)[:300]}") from None
            except ContextOverflow as exc:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{_overflowing_fields(exc)}: {str(exc)[:500]}"
                ) from None
            except InvalidFormatInput as exc:
                section = getattr(exc, "section", "")
                if section not in ("history", "tools"):
                    raise  # the store's data, not the caller's: a server fault
                field = "messages" if section == "history" else "tools_json"
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {str(exc)[:300]}") from None
            except TimeoutError:
                # A stage that gave up on the caller's deadline.
                raise ServiceError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed during the assembly"
                ) from None
            if turn is not None:
                # A turn covers the assembly only: the answer's bookkeeping and wire
                # conversion run beside the next call's assembly.
                turn.give_back()
                turn = None
            retrieval_ms = min(float(ctx.timings.retrieval_ms), float(ctx.wall.limit_ms))
            self.metrics.observe_assembly(ctx)
            if call is not None:
                call.fields["degraded"] = bool(ctx.degraded)
                self.tracing.assembly(call.span, ctx, started_ns)
            if typical and len(ctx.history_dropped) <= OFFLOAD_ITEMS:
                return assembled_to_proto(ctx, principal.name)
            # A trimmed long history answers with one record per dropped group.
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, assembled_to_proto, ctx, principal.name
            )
        finally:
            if not typical:
                FULL_COLLECTIONS.release()
            if turn is not None:
                turn.give_back()
            t_end = time.perf_counter()
            # A large call runs beside the turns: its time says nothing of the time an
            # ordinary call takes in its turn (the line's estimates).
            self.admission.release(
                ahead,
                (t_end - t_asm) * 1000.0 if t_asm and typical else 0.0,
                retrieval_ms if typical else None,
                loop_pass.seen,
            )
            self.metrics.admitted.set(self.admission.admitted)
            if remaining_ms is not None and not waited_in_vain:  # a call refused in line did no work
                in_time = (t_end - t_admit) * 1000.0 <= remaining_ms
                self.metrics.admitted_calls.labels("yes" if in_time else "no").inc()

    async def _compute_budget(
        self, request: pb.ComputeBudgetRequest, context: grpc.aio.ServicerContext[Any, Any], principal: Principal
    ) -> pb.Budget:
        model = model_name("model", request.model)
        terms: dict[str, int] = {}
        for name in ("directive_tokens", "messages_tokens", "tool_schema_tokens", "formatter_overhead_tokens"):
            v = getattr(request, name)
            if not 0 <= v <= MAX_TOKEN_TERM:
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: must be in [0, 2**40], got {v}")
            terms[name] = v
        try:
            b = compute_budget(
                model,
                directive_tokens=terms["directive_tokens"],
                messages_tokens=terms["messages_tokens"],
                tool_schema_tokens=terms["tool_schema_tokens"],
                formatter_overhead_tokens=terms["formatter_overhead_tokens"],
                catalog=self.catalog,
            )
        except UnknownModel as exc:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, unknown_model("model", exc)) from None
        return budget_to_proto(b)

    async def _capabilities(
        self,
        request: pb.GetModelCapabilitiesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
        principal: Principal,
    ) -> pb.GetModelCapabilitiesResponse:
        if len(request.models) > MAX_MODELS:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"models: {len(request.models)} is over the per-request limit max_models = {MAX_MODELS}",
            )
        models: list[ModelCapability] = []
        for i, name in enumerate(request.models):
            where = f"models[{i}]"
            try:
                models.append(self.catalog.get_model(model_name(where, name)))
            except UnknownModel as exc:
                raise ServiceError(grpc.StatusCode.NOT_FOUND, unknown_model(where, exc)) from None
        if not request.models:
            models = [self.catalog[n] for n in self.catalog]
        return capabilities_to_proto(self.catalog, models)


def _overflowing_fields(exc: ContextOverflow) -> str:
    """The request fields a `ContextOverflow` is about, by its ledger: those of
    ``messages`` and ``tools_json`` that carry tokens (``request`` when neither does, or
    when the overflow has no ledger).

    >>> from ctxcore import compute_budget
    >>> _overflowing_fields(ContextOverflow("too big", compute_budget("gpt-4o", tool_schema_tokens=200_000)))
    'tools_json'
    >>> both = compute_budget("gpt-4o", messages_tokens=1, tool_schema_tokens=9)
    >>> _overflowing_fields(ContextOverflow("too big", both))
    'messages and tools_json'
    """
    b = exc.budget
    if b is None:
        return "request"
    parts = [
        name
        for name, tokens in (
            ("messages", getattr(b, "messages_tokens", 0)),
            ("tools_json", getattr(b, "tool_schema_tokens", 0)),
        )
        if tokens
    ]
    return " and ".join(parts) or "request"


def tune_process() -> Callable[[], None]:
    """Set the process-wide interpreter settings of a process that does nothing but serve,
    and return what puts them back. ``ctxcore serve`` (each of its workers too) calls it
    once its service reports SERVING; `serve` does only with ``tune_process=True``, since
    a library call must not change its host process's interpreter.

    - The thread switch interval becomes `SWITCH_INTERVAL_S` (the event loop waits less
      for the GIL that executor threads hold).
    - Everything loaded so far (catalog, tokenizer tables, the store's caches) lives as
      long as the process: it is frozen (``gc.freeze``), which keeps the cyclic collector
      from walking it on every full collection. Those walks measured 20-50 ms here, longer
      than the 40 ms retrieval wall, and cost well under a millisecond once frozen.
    - The oldest generation is collected less often (`SERVING_FULL_COLLECTION_THRESHOLD`,
      unless the process has set a higher threshold itself).

    >>> import gc, sys
    >>> before = sys.getswitchinterval(), gc.get_threshold()
    >>> restore = tune_process()
    >>> sys.getswitchinterval() == SWITCH_INTERVAL_S
    True
    >>> gc.get_threshold()[2] >= SERVING_FULL_COLLECTION_THRESHOLD
    True
    >>> restore(); (sys.getswitchinterval(), gc.get_threshold()) == before
    True
    """
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    thresholds = gc.get_threshold()
    if len(thresholds) == 3 and 0 < thresholds[2] < SERVING_FULL_COLLECTION_THRESHOLD:
        gc.set_threshold(thresholds[0], thresholds[1], SERVING_FULL_COLLECTION_THRESHOLD)
    gc.collect()
    gc.freeze()

    def restore() -> None:
        gc.unfreeze()
        sys.setswitchinterval(switch_interval)
        now = gc.get_threshold()
        # Only the threshold set here is put back (not one set meanwhile by the application).
        if len(now) == 3 and len(thresholds) == 3 and now[2] == SERVING_FULL_COLLECTION_THRESHOLD:
            gc.set_threshold(now[0], now[1], thresholds[2])

    return restore


async def serve(
    config: ServiceConfig,
    *,
    on_serving: Callable[[ContextService], None] | None = None,
    tune: bool = False,
    **kwargs: Any,
) -> None:
    """Run a `ContextService` until SIGTERM or SIGINT, then drain and stop.

    A second SIGTERM or SIGINT during the drain stops at once (`ContextService.stop_now`:
    calls in flight are cancelled) and ends with ``SystemExit(128 + signal number)``,
    so the process exits with the status of one killed by that signal (143 or 130).
    `on_serving` is called with the service once it reports SERVING. With `tune`, the
    interpreter settings of `tune_process` apply from then until `serve` returns (as
    ``ctxcore serve`` runs it); without, the process's interpreter settings are left as
    they are.
    """
    service = ContextService(config, **kwargs)
    loop = asyncio.get_running_loop()
    stop_task: list[asyncio.Task[None]] = []
    forced: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if not stop_task:
            log_event("signal", signal=sig.name)
            stop_task.append(loop.create_task(service.stop()))
        elif not forced:
            forced.append(sig)
            log_event(
                "signal",
                logging.WARNING,
                signal=sig.name,
                action="stop_now",
                details="second signal while draining: calls in flight are cancelled",
            )
            stop_task.append(loop.create_task(service.stop_now()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    restore: Callable[[], None] | None = None
    try:
        await service.start()
        if tune:
            restore = tune_process()
        if on_serving is not None:
            on_serving(service)
        await service.wait_stopped()
    finally:
        if restore is not None:
            restore()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if not stop_task:
            await service.stop(0)
    if forced:
        for task in stop_task:
            await task  # `stop_now` returns once the stop's clean-up is done
        raise SystemExit(128 + forced[0].value)
