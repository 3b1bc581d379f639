"""The wire both ends of the service read: the gRPC service's name and metadata keys, and
the conversions between ctxcore's Python objects and their ctxcore.v1 protobuf messages
that the client and the server share (a request out, a budget, a catalog entry, a message).

It imports no server code, so `ctxcore.client` loads it without the server, its
authentication or its configuration. The server's side (validating an inbound request,
writing an assembled context) is `ctxcore.service.convert`.
"""

from __future__ import annotations

import enum
import json
from typing import Any, TypeVar, cast

from ..budget import Budget
from ..catalog import ModelCapability
from ..request import DEFAULT_POOL, AssemblyRequest, Message, ToolCall
from ..scoring import ValueModel
from ..tokens import TokenKind
from ..v1 import context_assembly_pb2 as pb

__all__ = [
    "API_KEY_HEADER",
    "AUTHORIZATION_HEADER",
    "METHOD_PREFIX",
    "SERVICE_NAME",
    "budget_from_proto",
    "budget_to_proto",
    "capability_from_proto",
    "capability_to_proto",
    "enum_from_proto",
    "enum_to_proto",
    "message_from_proto",
    "message_to_proto",
    "request_to_proto",
]

#: The gRPC service's full name, as ``ctxcore/v1/context_assembly.proto`` declares it.
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["ContextAssemblyService"].full_name
#: What a method's path starts with: ``METHOD_PREFIX + "AssembleContext"``.
METHOD_PREFIX = f"/{SERVICE_NAME}/"
#: Metadata key of a bearer token (``authorization: Bearer <JWT>``).
AUTHORIZATION_HEADER = "authorization"
#: Metadata key of an API key.
API_KEY_HEADER = "x-api-key"


E = TypeVar("E", bound=enum.Enum)


def enum_to_proto(member: enum.Enum, proto_enum: Any, prefix: str) -> Any:
    """The wire number of a Python enum member: ``PREFIX_`` + its value in capitals;
    a member the wire does not know yet goes as UNSPECIFIED (0) rather than failing a call.
    The result is typed Any because the generated stubs type each wire enum as its own
    int subclass.

    >>> from ctxcore.result import BranchStatus
    >>> enum_to_proto(BranchStatus.TIMEOUT, pb.BranchStatus, "BRANCH_STATUS")
    2
    """
    key = (prefix, member)
    number = _ENUM_CACHE.get(key)
    if number is None:
        try:
            number = int(proto_enum.Value(f"{prefix}_{str(member.value).upper()}"))
        except ValueError:
            number = 0
        _ENUM_CACHE[key] = number
    return number


_ENUM_CACHE: dict[tuple[str, enum.Enum], int] = {}
#: (wire enum, prefix, Python enum) -> wire number -> member, for `enum_from_proto`.
_ENUM_MEMBERS: dict[tuple[Any, str, type[enum.Enum]], dict[int, enum.Enum]] = {}


def enum_from_proto(number: int, proto_enum: Any, prefix: str, py_enum: type[E]) -> E:
    """The Python member for a wire number (ValueError for UNSPECIFIED or unknown).

    >>> from ctxcore.request import Rendering
    >>> enum_from_proto(pb.RENDERING_ANTHROPIC, pb.Rendering, "RENDERING", Rendering)
    <Rendering.ANTHROPIC: 'anthropic'>
    >>> enum_from_proto(99, pb.Rendering, "RENDERING", Rendering)
    Traceback (most recent call last):
    ...
    ValueError: unknown rendering 99
    """
    members = _ENUM_MEMBERS.get((proto_enum, prefix, py_enum))
    if members is None:
        # Each enum's members read once: a request names one or two per call.
        members = {}
        for name, value in proto_enum.items():
            if name.startswith(prefix + "_") and name != prefix + "_UNSPECIFIED":
                try:
                    members[value] = py_enum(name[len(prefix) + 1 :].lower())
                except ValueError:
                    pass  # a wire value this version has no member for: unknown here
        _ENUM_MEMBERS[(proto_enum, prefix, py_enum)] = members
    try:
        return cast(E, members[number])
    except KeyError:
        raise ValueError(f"unknown {prefix.lower()} {number}") from None


def message_from_proto(m: pb.Message, calls: tuple[ToolCall, ...] | None = None) -> Message:
    """A `Message` from its wire form (ValueError / TypeError when it is not a valid one).

    >>> message_from_proto(message_to_proto(Message("user", parts=("a", "b")))).parts
    ('a', 'b')
    >>> message_from_proto(pb.Message(role="user", content="c", parts=["a"], has_parts=True))
    Traceback (most recent call last):
    ...
    ValueError: content must be empty or the parts joined by a newline when parts are given
    """
    if calls is None:
        calls = tuple(ToolCall(c.id, c.name, c.arguments or "{}") for c in m.tool_calls)
    parts = tuple(m.parts) if m.has_parts or m.parts else None
    # With parts, `content` is empty or their join (the form `message_to_proto` writes):
    # `Message` refuses any other, which the parts would otherwise silently replace.
    return Message(cast(Any, m.role), m.content, calls, m.tool_call_id or None, parts, m.is_error)


def message_to_proto(m: Message) -> pb.Message:
    """The wire form of a `Message`."""
    return pb.Message(
        role=m.role.value,
        content=m.content,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in m.tool_calls],
        tool_call_id=m.tool_call_id or "",
        parts=list(m.parts or ()),
        has_parts=m.parts is not None,
        is_error=m.is_error,
    )


def request_to_proto(req: AssemblyRequest) -> pb.AssembleContextRequest:
    """The wire form of an `AssemblyRequest` (the client's side of `request_from_proto`).

    >>> from ctxcore.memory import Query
    >>> request_to_proto(AssemblyRequest("o", "a", "gpt-4o", Query("hi"))).query.text
    'hi'
    """
    o = req.options
    opts = pb.AssemblyOptions(
        weights=dict(o.weights or {}),
        pinned_memory_ids=sorted(o.pinned_memory_ids),
        history_policy=enum_to_proto(o.history_policy, pb.HistoryPolicy, "HISTORY_POLICY"),
        context_enabled=o.context_enabled,
        skip_memory=o.skip_memory,
        rendering=enum_to_proto(o.rendering, pb.Rendering, "RENDERING"),
    )
    if o.max_memories is not None:
        opts.max_memories = o.max_memories
    if o.pool != DEFAULT_POOL:
        opts.pool = o.pool
    if o.value_model == "interim":
        opts.value_model = "interim"
    elif o.value_model != ValueModel():
        raise ValueError(
            "a ValueModel with other parameters than the defaults cannot cross the wire: "
            "the service runs 'fused' (the defaults) or 'interim'"
        )
    if o.memory_format != "compact":
        opts.memory_format = o.memory_format
    opts.memory_attributes.extend(o.memory_attributes)
    if o.relevance_floor is not None:
        opts.relevance_floor = o.relevance_floor
    if o.min_similarity is not None:
        opts.min_similarity = o.min_similarity
    return pb.AssembleContextRequest(
        organization_id=req.organization_id,
        agent_id=req.agent_id,
        model=req.model,
        query=pb.Query(text=req.query.text, embedding=list(req.query.embedding or ())),
        messages=[message_to_proto(m) for m in req.messages],
        tools_json=[json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in req.tools],
        options=opts,
        token_budget=req.token_budget,
        section_budgets=dict(req.section_budgets),
    )


def budget_to_proto(b: Budget) -> pb.Budget:
    """The wire form of a `Budget`."""
    rec = b.record()
    rec["estimate_kind"] = enum_to_proto(b.estimate_kind, pb.EstimateKind, "ESTIMATE_KIND")
    if rec["token_budget"] is None:
        del rec["token_budget"]
    return pb.Budget(**rec)


def budget_from_proto(m: pb.Budget) -> Budget:
    """A `Budget` from its wire form.

    >>> from ctxcore import compute_budget
    >>> b = compute_budget("gpt-4o", directive_tokens=100)
    >>> budget_from_proto(budget_to_proto(b)) == b
    True
    """
    return Budget(
        model=m.model,
        tokenizer_family=m.tokenizer_family,
        estimate_kind=enum_from_proto(m.estimate_kind, pb.EstimateKind, "ESTIMATE_KIND", TokenKind),
        context_window=m.context_window,
        max_output_tokens=m.max_output_tokens,
        response_reserve=m.response_reserve,
        safety_fraction=m.safety_fraction,
        safety_buffer=m.safety_buffer,
        directive_tokens=m.directive_tokens,
        messages_tokens=m.messages_tokens,
        tool_schema_tokens=m.tool_schema_tokens,
        formatter_overhead_tokens=m.formatter_overhead_tokens,
        shortfall=m.shortfall,
        usable=m.usable,
        constrained=m.constrained,
        token_budget=m.token_budget if m.HasField("token_budget") else None,
    )


def capability_to_proto(c: ModelCapability) -> pb.ModelCapability:
    """The wire form of a catalog entry."""
    return pb.ModelCapability(
        name=c.name,
        provider=c.provider,
        context_window=c.context_window,
        max_output_tokens=c.max_output_tokens,
        tokenizer_family=c.tokenizer_family,
        estimate_kind=enum_to_proto(c.estimate_kind, pb.EstimateKind, "ESTIMATE_KIND"),
        safety_fraction=c.safety_fraction,
        aliases=list(c.aliases),
    )


def capability_from_proto(m: pb.ModelCapability) -> ModelCapability:
    """A `ModelCapability` from its wire form.

    >>> from ctxcore import default_catalog
    >>> c = default_catalog()["gpt-4o"]
    >>> capability_from_proto(capability_to_proto(c)) == c
    True
    """
    return ModelCapability(
        name=m.name,
        provider=m.provider,
        context_window=m.context_window,
        max_output_tokens=m.max_output_tokens,
        tokenizer_family=m.tokenizer_family,
        estimate_kind=enum_from_proto(m.estimate_kind, pb.EstimateKind, "ESTIMATE_KIND", TokenKind),
        safety_fraction=m.safety_fraction,
        aliases=tuple(m.aliases),
    )
