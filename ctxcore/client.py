"""`ContextClient`: call a `ctxcore serve` replica (or several) from async Python.

The client side of ``ctxcore/v1/context_assembly.proto``. Every call carries a deadline
(45 ms by default, the client timeout of the assembly contract) and the caller's
credentials: a bearer JWT (``token``, a string or a callable that returns a fresh one),
an API key, and/or a TLS client certificate. Several replicas are one target list with
gRPC's ``round_robin`` policy; the service is stateless, so any replica answers any call.
Failures surface as `grpc.aio.AioRpcError` with the server's status code
(UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, DEADLINE_EXCEEDED, ...).

>>> client = ContextClient("127.0.0.1:50051", token="eyJ...")   # doctest: +SKIP
>>> ctx = await client.assemble(ctxcore.AssemblyRequest("org-1", "agent-7", "gpt-4o",
...                                                     ctxcore.Query("refund policy")))  # doctest: +SKIP
>>> ctx.wall.source                                                  # doctest: +SKIP
>>> payload = to_openai(ctx)  # the Chat Completions body, rebuilt from the wire  # doctest: +SKIP

`to_openai` and `to_anthropic` rebuild the payload renderings from an answer's structured
parts (directive, kept messages, tools, memories section), exactly as
`ctxcore.AssembledContext.to_openai` / `to_anthropic` write them in the server.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ._extras import require

require("client", "ctxcore.client")

import grpc

from .budget import Budget
from .catalog import ModelCapability
from .memory import is_valid_unicode
from .payloads import default_directive_role, render_anthropic, render_openai
from .request import AssemblyRequest, Message
from .retrieval import DEFAULT_CLIENT_TIMEOUT_MS
from .service.wire import (
    API_KEY_HEADER,
    AUTHORIZATION_HEADER,
    METHOD_PREFIX,
    budget_from_proto,
    capability_from_proto,
    message_from_proto,
    request_to_proto,
)
from .v1 import context_assembly_pb2 as pb

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CONNECTION_COST_DECAY_S",
    "LOAD_BALANCING_POLICIES",
    "MAX_CONNECTIONS",
    "MAX_TIMEOUT_S",
    "ContextClient",
    "answer_messages",
    "answer_tools",
    "to_anthropic",
    "to_openai",
]

#: Per-call deadline when none is given: the proxy's client timeout, 45 ms
#: ("Client/outer retrieval timeout: IBEX_CONTEXT_TIMEOUT=45ms").
DEFAULT_TIMEOUT_S = DEFAULT_CLIENT_TIMEOUT_MS / 1000
#: The gRPC load-balancing policies `ContextClient` takes (those that need no configuration
#: of their own). gRPC reads any other name only when the channel connects, and then
#: fails every call with a status that looks like the server's.
LOAD_BALANCING_POLICIES = ("round_robin", "pick_first", "weighted_round_robin")
#: Most connections one client may open (`ContextClient`'s ``connections``).
MAX_CONNECTIONS = 64
#: Longest deadline a call may be given, in seconds (about three years). grpcio turns a
#: timeout into an absolute deadline that overflows past about 2**31 seconds, and then
#: fails every call at once with DEADLINE_EXCEEDED; no call needs anything near this.
MAX_TIMEOUT_S = 1e8
#: How fast a connection's latency estimate fades while it carries no call, in seconds
#: (an e-fold): a connection passed over for answering slowly is tried again once its
#: estimate has faded below the others'.
CONNECTION_COST_DECAY_S = 1.0
#: The weight of a call's latency in its connection's estimate (an exponential average).
_COST_WEIGHT = 0.3
#: Statuses that say the process behind a connection is failing or overloaded rather than
#: the request being wrong: such a call counts as slow as its deadline (up to
#: `_MAX_PENALTY_S`), however fast it failed, so that a process refusing calls at once
#: does not look like the fastest one and draw more of them.
_SLOW_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
_MAX_PENALTY_S = 1.0


def _timeout(value: object, what: str = "timeout") -> float:
    """A deadline in seconds, checked: a finite number in (0, `MAX_TIMEOUT_S`].

    >>> _timeout(0.045)
    0.045
    >>> _timeout(float("inf"))
    Traceback (most recent call last):
    ...
    ValueError: timeout must be a finite number of seconds in (0, 1e+08], got inf
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_TIMEOUT_S
    ):
        raise ValueError(f"{what} must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}], got {value!r}")
    return float(value)


def _header_value(what: str, value: object) -> str:
    """A credential as gRPC metadata carries it: printable ASCII. The value itself is a
    secret and never quoted; the position of the first bad character is."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, got {type(value).__name__}")
    if not (value.isascii() and value.isprintable()):
        at = next(i for i, c in enumerate(value) if not (" " <= c <= "~"))
        raise ValueError(
            f"{what} must be printable ASCII (API keys and tokens are ASCII): character {at} of {len(value)} is not"
        )
    return value


def _surrogate_field(req: AssemblyRequest) -> str:
    """The first field of `req` (in wire terms) holding a lone surrogate, or ``request``."""

    def bad(text: str | None) -> bool:
        return text is not None and not is_valid_unicode(text)

    for name in ("organization_id", "agent_id", "model"):
        if bad(getattr(req, name)):
            return name
    if bad(req.query.text):
        return "query.text"
    for i, m in enumerate(req.messages):
        if bad(m.content):
            return f"messages[{i}].content"
        for j, part in enumerate(m.parts or ()):
            if bad(part):
                return f"messages[{i}].parts[{j}]"
        for j, c in enumerate(m.tool_calls):
            for name in ("id", "name", "arguments"):
                if bad(getattr(c, name)):
                    return f"messages[{i}].tool_calls[{j}].{name}"
        if bad(m.tool_call_id):
            return f"messages[{i}].tool_call_id"
    for i, t in enumerate(req.tools):
        if bad(json.dumps(t, ensure_ascii=False)):
            return f"tools_json[{i}]"
    if any(bad(k) for k in req.options.weights or ()):
        return "options.weights"
    if any(bad(k) for k in req.options.pinned_memory_ids):
        return "options.pinned_memory_ids"
    return "request"


def _text_field(what: str, value: str) -> str:
    """A name sent as a protobuf string: TypeError naming it when it is not a str,
    ValueError when it holds a lone surrogate."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not is_valid_unicode(value):
        raise ValueError(f"{what}: holds a lone surrogate (not valid Unicode; the wire carries UTF-8)")
    return value


def _method(channel: grpc.aio.Channel, name: str, request: Any, response: Any) -> Any:
    """The service's method `name` on `channel`, registered: gRPC's core resolves it once
    for the channel, not again at each call."""
    return channel.unary_unary(  # type: ignore[call-arg]  # grpc-stubs lack _registered_method
        METHOD_PREFIX + name,
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
        _registered_method=True,
    )


class ContextClient:
    """An async client of ContextAssemblyService.

    Args:
        target: a gRPC target: ``host:port``, or ``ipv4:127.0.0.1:7001,127.0.0.1:7002``
            (several replicas), or ``dns:///name:port``.
        token: a bearer JWT, or a callable returning one (called per call, so it can
            refresh).
        api_key: an API key (sent as ``x-api-key``).
        root_certificates: PEM CA bundle that signs the server's certificate; turns on TLS.
        certificate_chain: PEM client certificate (mTLS); needs `private_key`.
        private_key: PEM key of the client certificate.
        server_name: the name to verify the server certificate against, when it is not
            the target's host.
        timeout: default per-call deadline in seconds: a finite number in
            (0, `MAX_TIMEOUT_S`]; so is a call's own ``timeout``.
        load_balancing: gRPC load-balancing policy, one of `LOAD_BALANCING_POLICIES`
            (``"round_robin"``, ``"pick_first"``, ``"weighted_round_robin"``).
        options: extra channel options.
        connections: how many connections to open to the target (1 to `MAX_CONNECTIONS`;
            to every replica of a target list). A server run with ``ctxcore serve
            --workers N``, like replicas behind a balancer of connections (an L4 load
            balancer, a Kubernetes Service), answers all calls of one connection from one
            process. With several, each call goes on a connection with the fewest calls
            in flight: the next in turn among them, or another of them drawn at random
            whose recent `assemble` calls answered faster (an exponential average that
            fades while the connection is idle, `CONNECTION_COST_DECAY_S`; a call failed
            for overload counts as slow as its deadline). So calls spread over the
            processes behind them and move away from a slower or busier one. Open more
            connections than the calls you keep in flight (twice as many, say), so that a
            call has idle connections to choose from.

    Raises:
        TypeError: a `target` that is not a str.
        ValueError: an empty `target`; a timeout out of range; an `api_key` or `token`
            that is not printable ASCII (gRPC metadata cannot carry it); a certificate
            without its key; `connections` out of range; an unknown `load_balancing` policy.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | Callable[[], str] | None = None,
        api_key: str | None = None,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        server_name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        load_balancing: str = "round_robin",
        options: Sequence[tuple[str, Any]] = (),
        connections: int = 1,
    ) -> None:
        if not isinstance(target, str):
            raise TypeError(f"target must be a str (a gRPC target such as 'host:port'), got {type(target).__name__}")
        if not target.strip():
            # gRPC reads an empty target only at the first call, and fails every call UNKNOWN.
            raise ValueError("target must not be empty: a gRPC target such as 'host:port'")
        self.timeout = _timeout(timeout)
        if (
            isinstance(connections, bool)
            or not isinstance(connections, int)
            or not (1 <= connections <= MAX_CONNECTIONS)
        ):
            raise ValueError(f"connections must be an int in [1, {MAX_CONNECTIONS}], got {connections!r:.40}")
        if load_balancing not in LOAD_BALANCING_POLICIES:
            raise ValueError(
                f"load_balancing must be one of {', '.join(LOAD_BALANCING_POLICIES)}, got {load_balancing!r:.40}"
            )
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("certificate_chain and private_key go together (mTLS)")
        if api_key is not None:
            _header_value("api_key", api_key)
        if isinstance(token, str):
            _header_value("token", token)
        self._token = token
        self._api_key = api_key
        opts: list[tuple[str, Any]] = [
            ("grpc.service_config", json.dumps({"loadBalancingConfig": [{load_balancing: {}}]})),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            *options,
        ]
        if server_name is not None:
            opts.append(("grpc.ssl_target_name_override", server_name))
        if connections > 1:
            # Channels with the same target and options share gRPC's global pool of
            # connections: each needs its own to be a connection of its own.
            opts.append(("grpc.use_local_subchannel_pool", 1))
        creds = None
        if root_certificates is not None or certificate_chain is not None:
            creds = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
        self._channels = [
            grpc.aio.insecure_channel(target, options=opts)
            if creds is None
            else grpc.aio.secure_channel(target, creds, options=opts)
            for _ in range(connections)
        ]
        self._channel = self._channels[0]
        self._methods = [
            (
                _method(ch, "AssembleContext", pb.AssembleContextRequest, pb.AssembledContext),
                _method(ch, "ComputeBudget", pb.ComputeBudgetRequest, pb.Budget),
                _method(ch, "GetModelCapabilities", pb.GetModelCapabilitiesRequest, pb.GetModelCapabilitiesResponse),
            )
            for ch in self._channels
        ]
        self._in_flight = [0] * connections
        # Each connection's latency estimate (seconds; 0 before its first answer) and when
        # it was last set (time.monotonic()).
        self._cost = [0.0] * connections
        self._cost_at = [0.0] * connections
        self._turn = 0
        self._rng = random.Random()

    def _faded(self, k: int, now: float) -> float:
        c = self._cost[k]
        return c * math.exp((self._cost_at[k] - now) / CONNECTION_COST_DECAY_S) if c else 0.0

    def _pick(self) -> int:
        """The connection for the next call, among those with the fewest calls in flight:
        the next in turn, unless another of them, drawn at random, has the lower latency
        estimate. (Two choices, not the lowest of all: callers that all went for the one
        quickest process would pile onto it before its estimate caught up.)"""
        flight = self._in_flight
        n = len(flight)
        if n == 1:
            return 0
        low = min(flight)
        cands = [i for i in range(n) if flight[i] == low]
        start = self._turn
        k = next((j for j, i in enumerate(cands) if i >= start), 0)
        first = cands[k]
        self._turn = (first + 1) % n
        if len(cands) == 1:
            return first
        other = cands[(k + 1 + self._rng.randrange(len(cands) - 1)) % len(cands)]
        now = time.monotonic()
        return other if self._faded(other, now) < self._faded(first, now) else first

    async def _call(self, which: int, msg: Any, timeout: float) -> Any:
        k = self._pick()
        self._in_flight[k] += 1
        t0 = time.monotonic()
        took: float | None = None
        try:
            answer = await self._methods[k][which](msg, timeout=timeout, metadata=self._metadata())
            took = time.monotonic() - t0
            return answer
        except grpc.aio.AioRpcError as exc:
            took = time.monotonic() - t0
            if exc.code() in _SLOW_CODES:
                took = max(took, min(timeout, _MAX_PENALTY_S))
            raise
        finally:
            self._in_flight[k] -= 1
            # What a connection's process is worth is learned from assemblies only: the
            # other calls cost next to nothing on a busy process too.
            if took is not None and which == 0 and len(self._cost) > 1:
                now = time.monotonic()
                if self._cost_at[k]:
                    c = self._faded(k, now)
                    self._cost[k] = c + _COST_WEIGHT * (took - c)
                else:  # the connection's first answer
                    self._cost[k] = took
                self._cost_at[k] = now

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        md: list[tuple[str, str]] = []
        if self._token is not None:
            token = _header_value("token", self._token()) if callable(self._token) else self._token
            md.append((AUTHORIZATION_HEADER, f"Bearer {token}"))
        if self._api_key is not None:
            md.append((API_KEY_HEADER, self._api_key))
        return tuple(md)

    async def assemble(
        self, request: AssemblyRequest | pb.AssembleContextRequest, *, timeout: float | None = None
    ) -> pb.AssembledContext:
        """Assemble the context for one request.

        Args:
            request: an `AssemblyRequest` (converted) or a ready wire message.
            timeout: this call's deadline in seconds (default: the client's). The server
                caps its retrieval wall by it; the answer's ``wall`` says which limit applied.

        Returns:
            The ``ctxcore.v1.AssembledContext`` message: text, sections, budget, pack
            record, trace, branch records, wall, degradation, timings.

        Raises:
            TypeError: a request that is neither (gRPC would send it as an empty request).
            ValueError: a timeout that is not a finite number in (0, `MAX_TIMEOUT_S`]; a
                field holding a lone surrogate (named), which the wire cannot carry.
        """
        deadline = self._call_timeout(timeout)
        if isinstance(request, AssemblyRequest):
            try:
                msg = request_to_proto(request)
            except UnicodeEncodeError:
                raise ValueError(
                    f"{_surrogate_field(request)}: holds a lone surrogate (not valid Unicode; the wire carries UTF-8)"
                ) from None
        elif isinstance(request, pb.AssembleContextRequest):
            msg = request
        else:
            raise TypeError(
                f"request must be a ctxcore.AssemblyRequest or a ctxcore.v1.AssembleContextRequest, "
                f"got {type(request).__name__}"
            )
        result: pb.AssembledContext = await self._call(0, msg, deadline)
        return result

    def _call_timeout(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else _timeout(timeout)

    async def compute_budget(
        self,
        model: str,
        *,
        directive_tokens: int = 0,
        messages_tokens: int = 0,
        tool_schema_tokens: int = 0,
        formatter_overhead_tokens: int = 0,
        timeout: float | None = None,
    ) -> Budget:
        """The server's budget ledger for `model` and the given fixed costs.

        Raises:
            TypeError: a `model` that is not a str.
        """
        deadline = self._call_timeout(timeout)
        msg = pb.ComputeBudgetRequest(
            model=_text_field("model", model),
            directive_tokens=directive_tokens,
            messages_tokens=messages_tokens,
            tool_schema_tokens=tool_schema_tokens,
            formatter_overhead_tokens=formatter_overhead_tokens,
        )
        answer = await self._call(1, msg, deadline)
        return budget_from_proto(answer)

    async def model_capabilities(self, *models: str, timeout: float | None = None) -> tuple[ModelCapability, ...]:
        """Catalog entries for the named models (names or aliases), or all of them.

        Raises:
            TypeError: a name that is not a str (named by its place, ``models[1]``).
        """
        deadline = self._call_timeout(timeout)
        names = [_text_field(f"models[{i}]", m) for i, m in enumerate(models)]
        answer = await self._call(2, pb.GetModelCapabilitiesRequest(models=names), deadline)
        return tuple(capability_from_proto(m) for m in answer.models)

    async def close(self) -> None:
        """Close the connections (calls in flight are cancelled)."""
        for ch in self._channels:
            await ch.close(None)

    async def __aenter__(self) -> ContextClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


# ---- payloads from an answer ---------------------------------------------------------------


def answer_messages(answer: pb.AssembledContext) -> tuple[Message, ...]:
    """The history the server kept (after any trimming), as `ctxcore.Message` objects."""
    return tuple(message_from_proto(m) for m in answer.messages)


def answer_tools(answer: pb.AssembledContext) -> tuple[dict[str, Any], ...]:
    """The tool schemas the answer carries, as JSON objects."""
    return tuple(json.loads(t) for t in answer.tools_json)


def _memory_block(answer: pb.AssembledContext) -> str | None:
    return next((s.text for s in answer.sections if s.name == "memories"), None)


def to_openai(answer: pb.AssembledContext, *, directive_role: str | None = None) -> dict[str, Any]:
    """The Chat Completions body ``{"messages", "tools"}`` of a served assembly.

    >>> to_openai(pb.AssembledContext(model="gpt-4o", directive="Be brief.",
    ...                               messages=[pb.Message(role="user", content="hi")]))["messages"]
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
    """
    return render_openai(
        directive=answer.directive if answer.HasField("directive") else None,
        messages=answer_messages(answer),
        tools=answer_tools(answer),
        memory_block=_memory_block(answer),
        directive_role=directive_role or default_directive_role(answer.model),
    )


def to_anthropic(answer: pb.AssembledContext, *, cache_breakpoint: bool = True) -> dict[str, Any]:
    """The Messages body ``{"system", "messages", "tools"}`` of a served assembly.

    >>> to_anthropic(pb.AssembledContext(messages=[pb.Message(role="user", content="hi")]),
    ...              cache_breakpoint=False)["messages"]
    [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}]
    """
    return render_anthropic(
        directive=answer.directive if answer.HasField("directive") else None,
        messages=answer_messages(answer),
        tools=answer_tools(answer),
        memory_block=_memory_block(answer),
        cache_breakpoint=cache_breakpoint,
    )
