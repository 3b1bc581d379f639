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
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ._extras import require

require("client", "ctxcore.client")

import grpc  # noqa: E402  (after the extra's check, which names what to install)

from .budget import Budget
from .catalog import ModelCapability
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

__all__ = ["DEFAULT_TIMEOUT_S", "ContextClient", "answer_messages", "answer_tools", "to_anthropic", "to_openai"]

#: Per-call deadline when none is given: the proxy's client timeout, 45 ms
#: ("Client/outer retrieval timeout: IBEX_CONTEXT_TIMEOUT=45ms").
DEFAULT_TIMEOUT_S = DEFAULT_CLIENT_TIMEOUT_MS / 1000


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
        timeout: default per-call deadline in seconds.
        load_balancing: gRPC load-balancing policy (``"round_robin"`` or ``"pick_first"``).
        options: extra channel options.
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
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("certificate_chain and private_key go together (mTLS)")
        self.timeout = timeout
        self._token = token
        self._api_key = api_key
        opts: list[tuple[str, Any]] = [
            ("grpc.service_config", json.dumps({"loadBalancingConfig": [{load_balancing: {}}]})),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            *options,
        ]
        if server_name is not None:
            opts.append(("grpc.ssl_target_name_override", server_name))
        if root_certificates is not None or certificate_chain is not None:
            creds = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            self._channel = grpc.aio.secure_channel(target, creds, options=opts)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=opts)
        ch = self._channel
        self._assemble = ch.unary_unary(
            METHOD_PREFIX + "AssembleContext",
            request_serializer=pb.AssembleContextRequest.SerializeToString,
            response_deserializer=pb.AssembledContext.FromString,
        )
        self._budget = ch.unary_unary(
            METHOD_PREFIX + "ComputeBudget",
            request_serializer=pb.ComputeBudgetRequest.SerializeToString,
            response_deserializer=pb.Budget.FromString,
        )
        self._caps = ch.unary_unary(
            METHOD_PREFIX + "GetModelCapabilities",
            request_serializer=pb.GetModelCapabilitiesRequest.SerializeToString,
            response_deserializer=pb.GetModelCapabilitiesResponse.FromString,
        )

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        md: list[tuple[str, str]] = []
        if self._token is not None:
            token = self._token() if callable(self._token) else self._token
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
        """
        msg = request_to_proto(request) if isinstance(request, AssemblyRequest) else request
        result: pb.AssembledContext = await self._assemble(
            msg, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata()
        )
        return result

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
        """The server's budget ledger for `model` and the given fixed costs."""
        msg = pb.ComputeBudgetRequest(
            model=model,
            directive_tokens=directive_tokens,
            messages_tokens=messages_tokens,
            tool_schema_tokens=tool_schema_tokens,
            formatter_overhead_tokens=formatter_overhead_tokens,
        )
        answer = await self._budget(msg, timeout=self.timeout if timeout is None else timeout,
                                    metadata=self._metadata())
        return budget_from_proto(answer)

    async def model_capabilities(self, *models: str, timeout: float | None = None) -> tuple[ModelCapability, ...]:
        """Catalog entries for the named models (names or aliases), or all of them."""
        answer = await self._caps(
            pb.GetModelCapabilitiesRequest(models=list(models)),
            timeout=self.timeout if timeout is None else timeout,
            metadata=self._metadata(),
        )
        return tuple(capability_from_proto(m) for m in answer.models)

    async def close(self) -> None:
        """Close the channel (calls in flight are cancelled)."""
        await self._channel.close(None)

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
