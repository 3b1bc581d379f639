"""Between the wire (ctxcore.v1 protobuf messages) and ctxcore's Python objects.

Inbound, a request message becomes an `AssemblyRequest`; every problem is an
INVALID_ARGUMENT that names the field in wire terms (``messages[3].role``), never a
traceback. Outbound, an assembled context, a `Budget` and catalog entries become their
messages field for field. The conversions the client shares (a request out, a budget, a
catalog entry, a message) live in `ctxcore.service.wire`, which holds no server code, and
are re-exported here, so both ends read one mapping.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc
import numpy as np

from .. import _core
from ..budget import Budget
from ..catalog import Catalog, ModelCapability, TokenizerPolicy
from ..errors import UnknownModel
from ..formatting import MEMORY_ATTRIBUTES, MEMORY_FORMATS
from ..memory import FULLTEXT_RELEVANCE_SENTINEL, MAX_RETRIEVAL_LIMIT, Query, Scope, is_valid_unicode
from ..request import (
    SECTION_BUDGETS,
    AssemblyOptions,
    AssemblyRequest,
    HistoryPolicy,
    Message,
    Rendering,
    Role,
    ToolCall,
)
from ..result import BranchRecord, HistoryDrop, StageTimings, TraceEntry, TraceReason, Wall
from ..scoring import COMPONENTS as WEIGHT_COMPONENTS
from ..tokens import TokenKind
from ..trace import TRACE_REASONS, TraceRows
from ..v1 import context_assembly_pb2 as pb
from .config import ID_CONTROL
from .errors import ServiceError
from .wire import (
    budget_from_proto,
    budget_to_proto,
    capability_from_proto,
    capability_to_proto,
    enum_from_proto,
    enum_to_proto,
    message_from_proto,
    message_to_proto,
    request_to_proto,
)

__all__ = [
    "LIMITS",
    "MAX_DETAILS_CHARS",
    "MAX_ID_CHARS",
    "MAX_MEMORIES_LIMIT",
    "MAX_MESSAGES",
    "MAX_MODELS",
    "MAX_TOOLS",
    "AssembledLike",
    "assembled_to_proto",
    "budget_from_proto",
    "budget_to_proto",
    "capabilities_to_proto",
    "capability_from_proto",
    "enum_to_proto",
    "message_from_proto",
    "message_to_proto",
    "model_name",
    "quote",
    "request_from_proto",
    "request_to_proto",
]

#: Longest organization / agent / model / memory id accepted. Ids are keys, not text;
#: anything longer is a malformed request, not a real id.
MAX_ID_CHARS = 256
#: Most memories one request may ask for. The packer handles thousands, but one context
#: window holds a few hundred memories at most; larger values are absurd, not ambitious.
MAX_MEMORIES_LIMIT = 4096
#: Longest embedding accepted (the largest common embedding models have 3,072 dims).
MAX_EMBEDDING_DIMS = 8192
#: Most messages in one request. Every stage is linear in the history, and 20,000 short
#: turns (about 2.2 MB) is far past any context window: trimming one that long is the
#: largest job a single call may bring.
MAX_MESSAGES = 20_000
#: Most tool calls on one assistant message.
MAX_TOOL_CALLS = 128
#: Most tool schemas in one request (the providers' own limit is 128 tools per call).
MAX_TOOLS = 128
#: Deepest nesting of objects and arrays in a tool schema or tool-call arguments; real
#: schemas nest a handful of levels, and deeper ones only cost recursion.
MAX_JSON_DEPTH = 64
#: Longest query text: it is embedded and searched, not put in the context.
MAX_QUERY_CHARS = 65_536
#: Most model names one GetModelCapabilities call may ask about.
MAX_MODELS = 256
#: Characters of a caller's value quoted in an error's details, at most: enough to find
#: it, never enough to echo a large input back through the status (gRPC caps trailing
#: metadata at 16 KiB by default).
QUOTE_CHARS = 48
#: Longest details string of any status the service sends.
MAX_DETAILS_CHARS = 1024

#: The documented per-request bounds, by the name errors use for them.
LIMITS: Mapping[str, int] = {
    "max_id_chars": MAX_ID_CHARS,
    "max_messages": MAX_MESSAGES,
    "max_tool_calls": MAX_TOOL_CALLS,
    "max_tools": MAX_TOOLS,
    "max_json_depth": MAX_JSON_DEPTH,
    "max_query_chars": MAX_QUERY_CHARS,
    "max_embedding_dims": MAX_EMBEDDING_DIMS,
    "max_memories": MAX_MEMORIES_LIMIT,
    "max_pinned_memory_ids": MAX_MEMORIES_LIMIT,
    "max_models": MAX_MODELS,
}


class AssembledLike(Protocol):
    """The fields of `ctxcore.AssembledContext` the wire carries."""

    @property
    def text(self) -> str: ...
    @property
    def sections(self) -> Mapping[str, str]: ...
    @property
    def nonce(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def scope(self) -> Scope: ...
    @property
    def budget(self) -> Budget: ...
    @property
    def pack(self) -> Any: ...
    @property
    def trace(self) -> Sequence[TraceEntry]: ...
    @property
    def branches(self) -> Sequence[BranchRecord]: ...
    @property
    def wall(self) -> Wall: ...
    @property
    def degraded(self) -> bool: ...
    @property
    def degradation_reasons(self) -> Sequence[str]: ...
    @property
    def constrained(self) -> bool: ...
    @property
    def history_dropped(self) -> Sequence[HistoryDrop]: ...
    @property
    def timings(self) -> StageTimings: ...
    @property
    def replaced_chars(self) -> int: ...


# ---- inbound ------------------------------------------------------------------------


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """A caller's value as error details may show it: its repr, cut to `limit`
    characters with the full length said, so that no status echoes a large input.

    >>> quote("gpt-4o")
    "'gpt-4o'"
    >>> quote("m" * 100000)
    "'mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm'... (100000 characters)"
    """
    if isinstance(value, str) and len(value) > limit:
        text = repr(value[: limit - 1])
        cut = f"{text[: 4 * limit]}..." if len(text) > 4 * limit else text  # escapes lengthen a repr
        return f"{cut}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= 4 * limit else f"{text[: 4 * limit]}..."


def _bad(field: str, why: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {why}"[:MAX_DETAILS_CHARS])


def _too_many(field: str, n: int, limit_name: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"{field}: {n} is over the per-request limit {limit_name} = {LIMITS[limit_name]}",
    )


_CONTROL = ID_CONTROL  # what `_id` refuses inside an id


def _id(field: str, value: str) -> str:
    if not value:
        raise _bad(field, "must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise _bad(field, f"{len(value)} characters, longer than max_id_chars = {MAX_ID_CHARS}")
    if value != value.strip() or _CONTROL.search(value):
        raise _bad(field, "must not contain surrounding whitespace or control characters")
    return value


def _short_key(field: str, value: str) -> str:
    if len(value) > MAX_ID_CHARS:
        raise _bad(field, f"{len(value)} characters, longer than max_id_chars = {MAX_ID_CHARS}")
    return value


def model_name(field: str, value: str) -> str:
    """A model name from the wire, checked like an id (non-empty, at most `MAX_ID_CHARS`,
    no control characters) before any catalog lookup sees it.

    Raises:
        ServiceError: INVALID_ARGUMENT naming `field` and the limit.

    >>> model_name("model", "gpt-4o")
    'gpt-4o'
    >>> model_name("model", "m" * 300)
    Traceback (most recent call last):
    ...
    ctxcore.service.errors.ServiceError: model: 300 characters, longer than max_id_chars = 256
    """
    return _id(field, value)


def unknown_model(field: str, exc: UnknownModel) -> str:
    """Details for an unknown model: a short quote of the name and the closest names.

    >>> from ctxcore import default_catalog
    >>> try:
    ...     default_catalog().get_model("gpt-4oo")
    ... except UnknownModel as exc:
    ...     print(unknown_model("model", exc))
    model: unknown model 'gpt-4oo'; did you mean 'gpt-4o', 'gpt-4', 'gpt-4.1', 'gpt-5', 'gpt-4o-mini'?
    """
    hint = f"; did you mean {', '.join(quote(s) for s in exc.suggestions)}?" if exc.suggestions else ""
    return f"{field}: unknown model {quote(exc.model)}{hint}"[:MAX_DETAILS_CHARS]


def _json_depth_ok(obj: Any) -> bool:
    """Whether `obj` nests objects and arrays at most `MAX_JSON_DEPTH` deep."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            children: Any = o.values()
        elif isinstance(o, list):
            children = o
        else:
            continue
        if d > MAX_JSON_DEPTH:
            return False
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return True


class _Refused(ValueError):
    """A value `parse_json`'s hooks refuse (as opposed to one `json` itself cannot read)."""


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON (JSON numbers are finite)")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Refused(f"the number {quote(text, 16)} is out of range (JSON numbers here must be finite doubles)")
    return v


#: A ``\uD800``-``\uDFFF`` escape (JSON allows either case of the hex digits). Only a
#: candidate: the backslash may itself be escaped (``\\ud800`` is text), and a high
#: surrogate followed by a low one is one valid character.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(obj: Any) -> bool:
    """Whether any string in `obj` (keys included) holds a lone surrogate."""
    stack: list[Any] = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            if not is_valid_unicode(o):  # a paired surrogate decodes to one character beyond U+FFFF
                return True
        elif isinstance(o, dict):
            stack.extend(o)  # the keys
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return False


def parse_json(field: str, text: str) -> Any:
    """Strict JSON from the wire: no NaN or Infinity (the formatter writes strict JSON,
    so what it could not write back is refused here), no number that overflows a double
    or an integer longer than Python reads (``sys.get_int_max_str_digits()``), no string
    escape that decodes to a lone surrogate (not Unicode: the answer could not carry it),
    nesting at most `MAX_JSON_DEPTH` deep.

    Raises:
        ServiceError: INVALID_ARGUMENT (RESOURCE_EXHAUSTED for nesting) naming `field`.

    >>> parse_json("tools_json[0]", '{"name": "t", "x": 1.5, "e": "\\\\ud83d\\\\ude00"}')
    {'name': 't', 'x': 1.5, 'e': '😀'}
    >>> parse_json("tools_json[0]", '{"name": "t", "x": NaN}')
    Traceback (most recent call last):
    ...
    ctxcore.service.errors.ServiceError: tools_json[0]: is not valid JSON: NaN is not JSON (JSON numbers are finite)
    >>> parse_json("tools_json[1]", '{"d": "\\\\udc00"}')
    Traceback (most recent call last):
    ...
    ctxcore.service.errors.ServiceError: tools_json[1]: holds a lone surrogate escape (not valid Unicode)
    """
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError:
        raise _bad(field, "is not valid JSON") from None
    except RecursionError:
        raise _too_many(field + " nesting", MAX_JSON_DEPTH + 1, "max_json_depth") from None
    except _Refused as exc:  # NaN, Infinity, 1e999
        raise _bad(field, f"is not valid JSON: {str(exc)[:200]}") from None
    except ValueError:  # int() past Python's digit limit, the only other ValueError json raises
        raise _bad(
            field,
            f"is not valid JSON: a number is too long (integers may have at most "
            f"{sys.get_int_max_str_digits()} digits)",
        ) from None
    if not _json_depth_ok(obj):
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{field}: nests deeper than the per-request limit max_json_depth = {MAX_JSON_DEPTH}",
        )
    # Text from the wire is valid UTF-8, so a lone surrogate can only come from an escape:
    # the decoded strings are walked only when the raw text holds a candidate. Without a
    # backslash that costs one memchr (0.04 us for a 2.6 KB schema, against 7 us for
    # json.loads); with escapes, one regex scan (~1 us); only a schema with a surrogate
    # escape (an emoji sent ASCII-escaped) pays for the walk (~18 us).
    if "\\" in text and _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(obj):
        raise _bad(field, "holds a lone surrogate escape (not valid Unicode)")
    return obj


_ROLES = frozenset(r.value for r in Role)


def _message(i: int, m: pb.Message) -> Message:
    # Field paths are spelled only when needed (a long history has 20,000 messages).
    if m.role not in _ROLES:
        raise _bad(f"messages[{i}]", f"message role must be one of {sorted(_ROLES)}, got {quote(m.role)}")
    calls: list[ToolCall] = []
    tool_calls = m.tool_calls
    if tool_calls:
        if len(tool_calls) > MAX_TOOL_CALLS:
            raise _too_many(f"messages[{i}].tool_calls", len(tool_calls), "max_tool_calls")
        for j, c in enumerate(tool_calls):
            at = f"messages[{i}].tool_calls[{j}]"
            # The arguments stay text: a model may have written invalid JSON, and the
            # history says what it wrote.
            try:
                calls.append(
                    ToolCall(_short_key(f"{at}.id", c.id), _short_key(f"{at}.name", c.name), c.arguments or "{}")
                )
            except (TypeError, ValueError) as exc:
                raise _bad(at, str(exc)[:200]) from None
    if len(m.tool_call_id) > MAX_ID_CHARS:
        _short_key(f"messages[{i}].tool_call_id", m.tool_call_id)
    try:
        return message_from_proto(m, tuple(calls))
    except (TypeError, ValueError) as exc:
        raise _bad(f"messages[{i}]", str(exc)[:200]) from None


def _options(o: pb.AssemblyOptions) -> AssemblyOptions:
    kw: dict[str, Any] = {}
    if o.weights:
        for k, v in o.weights.items():
            if k not in WEIGHT_COMPONENTS:
                raise _bad(f"options.weights[{quote(k)}]", f"unknown component (known: {', '.join(WEIGHT_COMPONENTS)})")
            if not math.isfinite(v) or v < 0:
                raise _bad(f"options.weights[{k!r}]", f"must be a finite number >= 0, got {v!r}")
        kw["weights"] = dict(o.weights)
    if o.HasField("relevance_floor"):
        v = o.relevance_floor
        if not (math.isfinite(v) and 0.0 <= v < FULLTEXT_RELEVANCE_SENTINEL):
            raise _bad(
                "options.relevance_floor",
                f"must be in [0, {FULLTEXT_RELEVANCE_SENTINEL}) (full-text hits "
                f"carry the fixed relevance {FULLTEXT_RELEVANCE_SENTINEL}), got {v!r}",
            )
        kw["relevance_floor"] = v
    if o.HasField("min_similarity"):
        v = o.min_similarity
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise _bad("options.min_similarity", f"must be in [0, 1], got {v!r}")
        kw["min_similarity"] = v
    if o.HasField("max_memories"):
        if o.max_memories > MAX_MEMORIES_LIMIT:
            raise _bad("options.max_memories", f"must be <= max_memories = {MAX_MEMORIES_LIMIT}, got {o.max_memories}")
        kw["max_memories"] = o.max_memories
    if o.HasField("pool"):
        if o.pool > MAX_RETRIEVAL_LIMIT:
            raise _bad("options.pool", f"must be <= {MAX_RETRIEVAL_LIMIT}, got {o.pool}")
        kw["pool"] = o.pool
    if o.value_model not in ("", "fused", "interim"):
        raise _bad("options.value_model", f"must be 'fused' or 'interim', got {quote(o.value_model[:40])}")
    kw["value_model"] = o.value_model or "fused"
    if o.memory_format not in ("", *MEMORY_FORMATS):
        raise _bad(
            "options.memory_format", f"must be one of {', '.join(MEMORY_FORMATS)}, got {quote(o.memory_format[:40])}"
        )
    kw["memory_format"] = o.memory_format or "compact"
    if len(o.memory_attributes) > len(MEMORY_ATTRIBUTES):
        raise _bad(
            "options.memory_attributes",
            f"names {len(o.memory_attributes)} attributes; there are "
            f"{len(MEMORY_ATTRIBUTES)} ({', '.join(MEMORY_ATTRIBUTES)})",
        )
    for i, name in enumerate(o.memory_attributes):
        if name not in MEMORY_ATTRIBUTES:
            raise _bad(
                f"options.memory_attributes[{i}]",
                f"must be one of {', '.join(MEMORY_ATTRIBUTES)}, got {quote(name[:40])}",
            )
    kw["memory_attributes"] = tuple(o.memory_attributes)
    if len(o.pinned_memory_ids) > MAX_MEMORIES_LIMIT:
        raise _too_many("options.pinned_memory_ids", len(o.pinned_memory_ids), "max_pinned_memory_ids")
    for i, mid in enumerate(o.pinned_memory_ids):
        _id(f"options.pinned_memory_ids[{i}]", mid)
    kw["pinned_memory_ids"] = frozenset(o.pinned_memory_ids)
    if o.history_policy != pb.HISTORY_POLICY_UNSPECIFIED:
        try:
            kw["history_policy"] = enum_from_proto(o.history_policy, pb.HistoryPolicy, "HISTORY_POLICY", HistoryPolicy)
        except ValueError:
            raise _bad("options.history_policy", f"unknown value {o.history_policy}") from None
    if o.HasField("context_enabled"):
        kw["context_enabled"] = o.context_enabled
    kw["skip_memory"] = o.skip_memory
    if o.rendering != pb.RENDERING_UNSPECIFIED:
        try:
            kw["rendering"] = enum_from_proto(o.rendering, pb.Rendering, "RENDERING", Rendering)
        except ValueError:
            raise _bad("options.rendering", f"unknown value {o.rendering}") from None
    try:
        return AssemblyOptions(**kw)
    except (TypeError, ValueError) as exc:
        raise _bad("options", str(exc)[:200]) from None


def request_from_proto(msg: pb.AssembleContextRequest) -> AssemblyRequest:
    """Validate a wire request and build the `AssemblyRequest`.

    Raises:
        ServiceError: INVALID_ARGUMENT naming the first bad field.

    >>> r = request_from_proto(pb.AssembleContextRequest(organization_id="o", agent_id="a", model="gpt-4o"))
    >>> (r.scope, r.query.text)
    (Scope(organization_id='o', agent_id='a'), '')
    >>> request_from_proto(pb.AssembleContextRequest(agent_id="a", model="gpt-4o"))
    Traceback (most recent call last):
    ...
    ctxcore.service.errors.ServiceError: organization_id: must not be empty
    """
    org = _id("organization_id", msg.organization_id)
    agent = _id("agent_id", msg.agent_id)
    model = model_name("model", msg.model)
    # Counts first: each is one length lookup, and refusing here spares the loops below.
    if len(msg.messages) > MAX_MESSAGES:
        raise _too_many("messages", len(msg.messages), "max_messages")
    if len(msg.tools_json) > MAX_TOOLS:
        raise _too_many("tools_json", len(msg.tools_json), "max_tools")
    if len(msg.query.text) > MAX_QUERY_CHARS:
        raise _too_many("query.text length", len(msg.query.text), "max_query_chars")
    if len(msg.query.embedding) > MAX_EMBEDDING_DIMS:
        raise _too_many("query.embedding dimensions", len(msg.query.embedding), "max_embedding_dims")
    emb = tuple(msg.query.embedding)
    if emb and not all(math.isfinite(x) for x in emb):
        raise _bad("query.embedding", "must hold finite numbers only")
    query = Query(msg.query.text, emb or None)
    messages = tuple(_message(i, m) for i, m in enumerate(msg.messages))
    tools: list[Mapping[str, Any]] = []
    for i, t in enumerate(msg.tools_json):
        obj = parse_json(f"tools_json[{i}]", t)
        if not isinstance(obj, dict):
            raise _bad(f"tools_json[{i}]", f"must be a JSON object, got {type(obj).__name__}")
        tools.append(obj)
    options = _options(msg.options) if msg.HasField("options") else AssemblyOptions()
    token_budget = msg.token_budget if msg.HasField("token_budget") else None
    if token_budget is not None and token_budget < 1:
        raise _bad("token_budget", f"must be >= 1 when set, got {token_budget}")
    for name, tokens in msg.section_budgets.items():
        if name not in SECTION_BUDGETS:
            raise _bad("section_budgets", f"unknown section {quote(name[:40])} (known: {', '.join(SECTION_BUDGETS)})")
        if tokens < 0:
            raise _bad(f"section_budgets[{quote(name)}]", f"must be >= 0, got {tokens}")
    try:
        return AssemblyRequest(
            org, agent, model, query, messages, tuple(tools), options, token_budget, dict(msg.section_budgets)
        )
    except (TypeError, ValueError) as exc:
        raise _request_error(str(exc)[:200]) from None


#: The item an `AssemblyRequest` refusal starts with (``tools[2]``, ``messages[4]``).
_ITEM = re.compile(r"(tools|messages)\[\d+\]")


def _request_error(message: str) -> ServiceError:
    """An `AssemblyRequest`'s refusal (what the payload renderings cannot carry) with its
    item named in wire terms: ``tools[2]`` is ``tools_json[2]``; other refusals are the
    request's.

    >>> _request_error("tools[2]: not a function tool").details
    'tools_json[2]: not a function tool'
    >>> _request_error("messages[0]: the tool result for 'c9' does not follow ...").details
    "messages[0]: the tool result for 'c9' does not follow ..."
    """
    m = _ITEM.match(message)
    if m is None:
        return _bad("request", message)
    wire = "tools_json" if m[1] == "tools" else m[1]
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, (wire + message[len(m[1]) :])[:MAX_DETAILS_CHARS])


# ---- outbound -----------------------------------------------------------------------

_ERROR_HEAD = re.compile(r"[A-Za-z_][\w .]{0,59}")


def branch_error_class(error: str | None) -> str:
    """What of a branch's error goes on the wire: its exception class or kind only.

    A source's exception message may quote the data it choked on, and that data may belong
    to another tenant, so everything after the first colon stays in the server.

    >>> branch_error_class("ValueError: bad record 'secret text'")
    'ValueError'
    >>> branch_error_class("no answer within 15.0 ms")
    'no answer within 15.0 ms'
    >>> branch_error_class(None)
    ''
    """
    if not error:
        return ""
    head = error.split(":", 1)[0].strip()
    return head if _ERROR_HEAD.fullmatch(head) else "error"


def _policy_to_proto(p: TokenizerPolicy) -> pb.TokenizerPolicy:
    out = pb.TokenizerPolicy(family=p.family)
    if TokenKind.EXACT in p.safety_fractions:
        out.exact_safety_fraction = p.safety_fractions[TokenKind.EXACT]
    if TokenKind.ESTIMATE in p.safety_fractions:
        out.estimate_safety_fraction = p.safety_fractions[TokenKind.ESTIMATE]
    return out


def capabilities_to_proto(catalog: Catalog, models: Sequence[ModelCapability]) -> pb.GetModelCapabilitiesResponse:
    """The catalog answer: the entries and the tokenizer policies they use."""
    families = sorted({m.tokenizer_family for m in models})
    return pb.GetModelCapabilitiesResponse(
        models=[capability_to_proto(m) for m in models],
        tokenizer_policies=[_policy_to_proto(catalog.policies[f]) for f in families if f in catalog.policies],
        catalog_source=catalog.source,
    )


def _pack_to_proto(pack: Any) -> pb.PackRecord:
    fields = pb.PackRecord.DESCRIPTOR.fields_by_name
    out = pb.PackRecord(**{k: v for k, v in pack.record().items() if k in fields and k != "path"})
    out.path = enum_to_proto(pack.path, pb.PackPath, "PACK_PATH")
    return out


_TRACE_CODES = {r: enum_to_proto(r, pb.TraceReason, "TRACE_REASON") for r in TraceReason}
# The wire value of each of the trace's reason codes (`ctxcore.trace`), and the
# trace's field number in the answer.
_WIRE_REASONS = np.array([_TRACE_CODES[r] for r in TRACE_REASONS], dtype=np.int32)
_TRACE_FIELD = pb.AssembledContext.DESCRIPTOR.fields_by_name["trace"].number
# Rows with this wire reason carry no memory id: another tenant's ids never leave.
_HIDDEN_ID_REASON = _TRACE_CODES[TraceReason.OUT_OF_SCOPE]


def _trace_into(ctx: AssembledLike, out: pb.AssembledContext) -> None:
    """The trace into ``out.trace``, one wire entry per candidate. From a context's columns
    (`TraceTable`), each block of rows is encoded by the compiled core straight from the
    pipeline's arrays and merged into the message (appending the entries): no per-row
    Python, ~4x faster than setting each entry's fields for 100 rows."""
    t = getattr(ctx, "trace_table", None)
    if t is None:
        rows: Any = (
            (e.memory_id, e.reason, e.origin, e.tokens, e.score, e.relevance, e.recounted, e.signal) for e in ctx.trace
        )
        _rows_into(rows, out)
        return
    for block in t.blocks():
        if isinstance(block, TraceRows):
            out.MergeFromString(
                _core.encode_trace_rows(
                    block.ids,
                    block.origins,
                    block.at,
                    _WIRE_REASONS[block.reason],
                    block.tokens,
                    block.score,
                    block.relevance,
                    block.recounted,
                    _HIDDEN_ID_REASON,
                    _TRACE_FIELD,
                    block.signal,
                )
            )
        else:
            _rows_into(((*block[:7], block[8] if len(block) > 8 else ""),), out)


def _rows_into(rows: Any, out: pb.AssembledContext) -> None:
    add, codes, foreign = out.trace.add, _TRACE_CODES, TraceReason.OUT_OF_SCOPE
    for m, r, o, k, s, rel, rc, sig in rows:
        e = add()
        # Another tenant's memory ids never cross the boundary: an out-of-scope entry says
        # only that something was dropped, and how it was found.
        if r is not foreign:
            e.memory_id = m
        e.reason = codes.get(r, 0)
        e.origin = str(o)
        e.tokens = k
        e.score = s
        e.relevance = rel
        e.recounted = rc
        e.signal = sig


def assembled_to_proto(ctx: AssembledLike, principal: str = "") -> pb.AssembledContext:
    """The wire form of an assembled context: every field, branch errors reduced to their
    class (see `branch_error_class`)."""
    out = pb.AssembledContext(
        text=ctx.text,
        sections=[pb.Section(name=str(k), text=v) for k, v in ctx.sections.items()],
        nonce=ctx.nonce,
        model=ctx.model,
        scope=pb.Scope(organization_id=ctx.scope.organization_id, agent_id=ctx.scope.agent_id),
        budget=budget_to_proto(ctx.budget),
        branches=[
            pb.BranchRecord(
                branch=enum_to_proto(b.branch, pb.Branch, "BRANCH"),
                status=enum_to_proto(b.status, pb.BranchStatus, "BRANCH_STATUS"),
                latency_ms=b.latency_ms,
                error=branch_error_class(b.error),
                items=b.items,
                dropped_out_of_scope=b.dropped_out_of_scope,
            )
            for b in ctx.branches
        ],
        wall=pb.Wall(
            limit_ms=ctx.wall.limit_ms,
            source=enum_to_proto(ctx.wall.source, pb.WallSource, "WALL_SOURCE"),
        ),
        degraded=ctx.degraded,
        degradation_reasons=list(ctx.degradation_reasons),
        constrained=ctx.constrained,
        timings=pb.StageTimings(
            budget_ms=ctx.timings.budget_ms,
            retrieval_ms=ctx.timings.retrieval_ms,
            scoring_ms=ctx.timings.scoring_ms,
            packing_ms=ctx.timings.packing_ms,
            formatting_ms=ctx.timings.formatting_ms,
            total_ms=ctx.timings.total_ms,
        ),
        replaced_chars=ctx.replaced_chars,
        principal=principal,
    )
    # One message at a time: a trimmed history of 20,000 turns has as many records, and
    # handing them to the constructor as a list copies them in one call that holds the
    # GIL for 10-30 ms (every other call waits); adding them in place takes half as long.
    add_drop = out.history_dropped.add
    for h in ctx.history_dropped:
        add_drop(first_index=h.first_index, count=h.count, tokens=h.tokens, roles=h.roles, reason=h.reason)
    _trace_into(ctx, out)
    if ctx.pack is not None:
        out.pack.CopyFrom(_pack_to_proto(ctx.pack))
    _payload_parts_to_proto(ctx, out)
    return out


def _payload_parts_to_proto(ctx: AssembledLike, out: pb.AssembledContext) -> None:
    """The parts the payload renderings are written from (older contexts lack them)."""
    directive = getattr(ctx, "directive", None)
    if directive is not None:
        out.directive = directive
    out.messages.extend(message_to_proto(m) for m in getattr(ctx, "messages", ()))
    out.tools_json.extend(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in getattr(ctx, "tools", ()))
    out.rendering = enum_to_proto(getattr(ctx, "rendering", Rendering.TEXT), pb.Rendering, "RENDERING")
    out.framing_tokens = getattr(ctx, "framing_tokens", 0)
    out.stable_prefix_tokens = getattr(ctx, "stable_prefix_tokens", 0)
    out.memory_format = getattr(ctx, "memory_format", "verbose")
    out.handles.update(getattr(ctx, "handles", {}))
