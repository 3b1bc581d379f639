"""The assembly request: the input at the head of the pipeline.

request -> budget -> retrieval -> scoring -> pack -> format -> result. An
`AssemblyRequest` names who the context is for (organization and agent), which model it is
for, what the request is about (`Query`), the recent conversation (`Message`s, counted
and never fetched), the tool schemas, and per-request `AssemblyOptions`. Everything is
validated on construction so a bad request fails with a message that names the field.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, SupportsIndex, cast

from ._numbers import as_int, as_real
from .budget import check_token_budget
from .formatting import MEMORY_ATTRIBUTES, MEMORY_FORMATS
from .memory import MAX_RETRIEVAL_LIMIT, Query, Scope
from .scoring import COMPONENTS, ValueModel

#: How many memories each retrieval path returns at most by default: the candidates the
#: value model ranks. The token budget, not this, decides how many are selected.
DEFAULT_POOL = 200

__all__ = [
    "DEFAULT_POOL",
    "AssemblyOptions",
    "AssemblyRequest",
    "HistoryPolicy",
    "Message",
    "Rendering",
    "ToolCall",
    "ToolSpec",
    "check_tool_pairs",
    "check_unique_call_ids",
    "check_unique_tool_names",
    "parse_messages",
    "tool_input",
]


class HistoryPolicy(enum.StrEnum):
    """What to do when directive + messages + tools alone exceed the window."""

    STRICT = "strict"  #: raise ctxcore.ContextOverflow with the numbers
    TRIM_OLDEST = "trim_oldest"  #: drop the oldest turns (atomic groups), never the latest user turn


class Rendering(enum.StrEnum):
    """The form the assembled context is handed over in; the budget is priced for it."""

    TEXT = "text"  #: one string (`AssembledContext.text`), sections in XML-style tags
    OPENAI = "openai"  #: Chat Completions ``{"messages", "tools"}`` (`AssembledContext.to_openai`)
    ANTHROPIC = "anthropic"  #: Messages ``{"system", "messages", "tools"}`` (`AssembledContext.to_anthropic`)


class Role(enum.StrEnum):
    """Message roles."""

    SYSTEM = "system"
    DEVELOPER = "developer"  #: OpenAI's name for system instructions on reasoning models
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call made by the assistant: its id, the tool's name and JSON arguments.

    >>> ToolCall("call-1", "search", '{"q": "tea"}').name
    'search'
    """

    id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        for name in ("id", "name"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"tool call {name} must be a non-empty str")
        if not isinstance(self.arguments, str):
            raise TypeError("tool call arguments must be a JSON string")


#: The keys of an Anthropic tool that an OpenAI function tool has a place for.
_OPENAI_CARRIES = frozenset({"name", "description", "input_schema", "type", "strict"})


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool definition in the providers' common terms: name, description, JSON Schema.

    `from_mapping` reads the OpenAI Chat Completions shape (``{"type": "function",
    "function": {...}}``), the bare function shape (``{"name", "description",
    "parameters"}``) and the Anthropic shape (``{"name", "description",
    "input_schema"}``); `source` keeps the mapping as given, so a rendering for the same
    provider hands it over unchanged and a rendering for the other provider refuses keys
    it cannot carry instead of dropping them. ``strict`` (a bool, or None for unset), which
    both providers take, is carried either way.

    >>> ToolSpec.from_mapping({"name": "search", "input_schema": {"type": "object"}}).parameters
    {'type': 'object'}
    """

    name: str
    description: str | None
    parameters: Mapping[str, Any]
    shape: str  #: ``openai``, ``function`` or ``anthropic``: the shape it arrived in
    source: Mapping[str, Any]

    def uncarried(self, rendering: Rendering) -> list[str]:
        """The keys of `source` that a tool of `rendering` has no place for, sorted (the
        shape's own rendering carries them all).

        >>> ToolSpec.from_mapping({"name": "f", "input_schema": {}, "cache_control": {"type": "ephemeral"}}).uncarried(
        ...     Rendering.OPENAI
        ... )
        ['cache_control']
        """
        if rendering is Rendering.OPENAI and self.shape == "anthropic":
            return sorted(set(self.source) - _OPENAI_CARRIES)
        return []

    @classmethod
    def from_mapping(cls, tool: Mapping[str, Any]) -> ToolSpec:
        """Read one tool definition (see the class docstring for the shapes).

        Raises:
            ValueError: not one of the shapes, or a field of the wrong type.
        """
        if not isinstance(tool, Mapping):
            raise TypeError(f"a tool must be a JSON object, got {type(tool).__name__}")
        if tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
            fn, shape, schema_key = tool["function"], "openai", "parameters"
            known = {"name", "description", "parameters", "strict"}
            # Neither provider has a place for another key beside 'function' (OpenAI's
            # types refuse one, Anthropic's tool would drop it): refuse it here.
            outer = set(tool) - {"type", "function"}
            if outer:
                raise ValueError(f"unsupported keys {sorted(outer)} beside 'function' in an OpenAI tool")
        elif "input_schema" in tool:
            fn, shape, schema_key = tool, "anthropic", "input_schema"
            known = {"name", "description", "input_schema", "type", "cache_control", "strict"}
            if tool.get("type", "custom") != "custom":
                raise ValueError(f"an Anthropic {tool['type']!r} tool is not a function tool")
        elif "name" in tool and "type" not in tool:
            fn, shape, schema_key = tool, "function", "parameters"
            known = {"name", "description", "parameters", "strict"}
        else:
            raise ValueError(
                "not a function tool: expected {'type': 'function', 'function': {...}}, "
                "{'name', 'description', 'parameters'} or {'name', 'description', 'input_schema'}"
            )
        name, description = fn.get("name"), fn.get("description")
        if not isinstance(name, str) or not name:
            raise ValueError("a tool needs a non-empty str name")
        if description is not None and not isinstance(description, str):
            raise ValueError(f"tool {name!r}: description must be a str")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"tool {name!r}: strict must be a bool, got {type(strict).__name__}")
        params = fn.get(schema_key, {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ValueError(f"tool {name!r}: {schema_key} must be a JSON Schema object")
        extra = set(fn) - known
        if extra:
            raise ValueError(f"tool {name!r}: unsupported keys {sorted(extra)}")
        return cls(name, description, params, shape, tool)


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the recent conversation.

    An assistant message may carry `tool_calls`; a ``tool`` message answers one of them
    through `tool_call_id`. The pair is an atomic group when history is trimmed.

    Content that arrived as a list of text parts (OpenAI content parts, Anthropic text
    blocks) keeps the list in `parts`, so the payload renderings give it back exactly;
    `content` is then the parts joined by a newline (what the text rendering writes).

    >>> Message("user", "hello").role
    <Role.USER: 'user'>
    >>> Message("user", parts=("a", "b")).content
    'a\\nb'
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    parts: tuple[str, ...] | None = None  #: the text parts, when content came as a list
    is_error: bool = False  #: a tool result that reports a failure (Anthropic ``is_error``)

    if TYPE_CHECKING:
        # What callers may pass (the generated __init__ converts): a role's name, any
        # sequence of tool calls.
        def __init__(
            self,
            role: Role | str,
            content: str = "",
            tool_calls: Sequence[ToolCall] = (),
            tool_call_id: str | None = None,
            parts: Sequence[str] | None = None,
            is_error: bool = False,
        ) -> None: ...

    def __post_init__(self) -> None:
        try:
            if self.role.__class__ is not Role:
                object.__setattr__(self, "role", Role(self.role))
        except ValueError:
            raise ValueError(f"message role must be one of {[r.value for r in Role]}, got {self.role!r}") from None
        if self.parts is not None:
            parts = tuple(self.parts)
            for j, part in enumerate(parts):
                if not isinstance(part, str):
                    raise TypeError(f"content[{j}]: a text part must be a str, got {type(part).__name__}")
            joined = "\n".join(parts)
            if self.content and self.content != joined:
                raise ValueError("content must be empty or the parts joined by a newline when parts are given")
            object.__setattr__(self, "parts", parts)
            object.__setattr__(self, "content", joined)
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be str, got {type(self.content).__name__}")
        calls = self.tool_calls
        if calls.__class__ is not tuple:
            calls = tuple(calls)
            object.__setattr__(self, "tool_calls", calls)
        if calls and not all(isinstance(c, ToolCall) for c in calls):
            raise TypeError("tool_calls must be ToolCall objects")
        if calls and self.role != Role.ASSISTANT:
            raise ValueError("only assistant messages carry tool_calls")
        if self.tool_call_id is not None:
            if not isinstance(self.tool_call_id, str):
                raise TypeError(f"tool_call_id must be a str, got {type(self.tool_call_id).__name__}")
            if self.role != Role.TOOL:
                # Only a tool result answers a call: the payloads have nowhere else to put it.
                raise ValueError(f"only tool messages carry tool_call_id, not a {self.role.value!r} message")
        if self.role == Role.TOOL and not self.tool_call_id:
            raise ValueError("a tool message must name the tool_call_id it answers")
        if not isinstance(self.is_error, bool):
            raise TypeError(f"is_error must be a bool, got {type(self.is_error).__name__}")
        if self.is_error and self.role != Role.TOOL:
            raise ValueError("only tool results carry is_error")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> Message:
        """A message from an OpenAI Chat Completions or Anthropic Messages mapping.

        OpenAI: ``role`` (system, developer, user, assistant, tool), ``content`` (a str,
        None, or a list of text parts), assistant ``tool_calls``, tool ``tool_call_id``.
        Anthropic: ``role`` (user, assistant) and ``content`` (a str or a list of text,
        ``tool_use`` and ``tool_result`` blocks). An Anthropic user message holding more
        than one tool result is several ctxcore messages: use `parse_messages` for it.

        Raises:
            ValueError: a missing field, an unknown role or block, or a part that is not
                text (images and other media are refused: their price is not knowable
                from the request), named by its position (``content[1]``).
            TypeError: `m` is not a mapping.

        >>> Message.from_mapping({"role": "assistant", "content": "", "tool_calls": [
        ...     {"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}).tool_calls[0].name
        'f'
        >>> Message.from_mapping({"role": "assistant", "content": [
        ...     {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}}]}).tool_calls[0].arguments
        '{"x": 1}'
        """
        out = _from_mapping(m)
        if len(out) != 1:
            raise ValueError(
                f"this message holds {len(out)} tool results, which are {len(out)} ctxcore messages: "
                "pass it through parse_messages (AssemblyRequest does)"
            )
        return out[0]


def parse_messages(items: Iterable[Message | Mapping[str, Any]]) -> tuple[Message, ...]:
    """Messages from `Message` objects and OpenAI or Anthropic mappings, in order.

    An Anthropic user message whose content holds ``tool_result`` blocks becomes one
    ``tool`` message per result, then a user message for any text after them; the
    payload renderings put them back together.

    Raises:
        ValueError, TypeError: naming the message (``messages[3]``) and the part.

    >>> [m.role.value for m in parse_messages([
    ...     {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}},
    ...                                       {"type": "tool_use", "id": "b", "name": "f", "input": {}}]},
    ...     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"},
    ...                                  {"type": "tool_result", "tool_use_id": "b", "content": "2"}]}])]
    ['assistant', 'tool', 'tool']
    """
    if isinstance(items, (str, bytes, Mapping)):
        raise TypeError(f"messages must be a sequence of messages, got a single {type(items).__name__}")
    if not isinstance(items, Iterable):
        raise TypeError(f"messages must be a sequence of messages, got {type(items).__name__}")
    out: list[Message] = []
    for i, m in enumerate(items):
        if isinstance(m, Message):
            out.append(m)
            continue
        try:
            out.extend(_from_mapping(m))
        except ValueError as exc:
            raise ValueError(f"messages[{i}]: {exc}") from None
        except TypeError as exc:
            raise TypeError(f"messages[{i}]: {exc}") from None
    return tuple(out)


# ---- provider shapes -----------------------------------------------------------------------

_OPENAI_MESSAGE_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id"})


def _extra(m: Mapping[str, Any], known: set[str] | frozenset[str]) -> list[str]:
    """Keys outside `known` that carry something. A None or empty value (``refusal:
    None``, ``annotations: []`` in a dumped SDK response) says nothing and is let go;
    anything else is refused rather than dropped."""
    return sorted(k for k in set(m) - known if m[k] not in (None, [], {}, ""))


def _plain(value: Any) -> Any:
    """An SDK response object (pydantic) as the mapping it dumps to; anything else as is."""
    dump = getattr(value, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else value


_ANTHROPIC_ROLES = frozenset({"user", "assistant"})


def _text_parts(content: Sequence[Any], where: str = "content") -> tuple[str, ...]:
    """The texts of a list of text parts; anything else is refused, naming the part."""
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise TypeError(f"{where}[{j}] must be a content part (mapping), got {type(part).__name__}")
        kind = part.get("type")
        if kind != "text":
            raise ValueError(
                f"{where}[{j}] is a {kind!r} part: only text parts are accepted (an image's or file's price "
                "cannot be known from the request, so it is refused rather than under-counted)"
            )
        extra = _extra(part, {"type", "text"})
        if extra:
            raise ValueError(f"{where}[{j}]: unsupported keys {extra} on a text part")
        text = part.get("text")
        if not isinstance(text, str):
            raise TypeError(f"{where}[{j}].text must be a str, got {type(text).__name__}")
        texts.append(text)
    return tuple(texts)


def _content(m: Mapping[str, Any]) -> tuple[str, tuple[str, ...] | None]:
    content = m.get("content")
    if content is None:
        return "", None
    if isinstance(content, str):
        return content, None
    if isinstance(content, (list, tuple)):
        if not content:
            raise ValueError("content is an empty list")
        return "", _text_parts(content)
    raise TypeError(f"message content must be a str, None or a list of parts, got {type(content).__name__}")


def _is_blocks(content: object, kinds: frozenset[str]) -> bool:
    return isinstance(content, (list, tuple)) and any(
        isinstance(b, Mapping) and b.get("type") in kinds for b in content
    )


def _from_mapping(m: Mapping[str, Any]) -> tuple[Message, ...]:
    m = _plain(m)
    if not isinstance(m, Mapping):
        raise TypeError(f"a message must be a mapping, got {type(m).__name__}")
    if isinstance(m.get("content"), (list, tuple)):
        # Response content blocks appended to a history as they came (SDK objects).
        m = {**m, "content": [_plain(b) for b in m["content"]]}
    role = m.get("role")
    if role is None:
        raise ValueError(f"message is missing the field 'role': {dict(m)!r:.200}")
    content = m.get("content")
    if role == "assistant" and _is_blocks(content, frozenset({"tool_use"})):
        return (_anthropic_assistant(m),)
    if role == "user" and _is_blocks(content, frozenset({"tool_result"})):
        return _anthropic_tool_results(m)
    extra = _extra(m, _OPENAI_MESSAGE_KEYS)
    if extra:
        raise ValueError(f"unsupported message fields {extra}")
    text, parts = _content(m)
    raw_calls = m.get("tool_calls") or ()
    if not isinstance(raw_calls, (list, tuple)):
        raise TypeError(f"tool_calls must be a list, got {type(raw_calls).__name__}")
    calls = tuple(_tool_call(c, f"tool_calls[{j}]") for j, c in enumerate(raw_calls))
    call_id = m.get("tool_call_id")
    if call_id == "":  # an empty field says nothing (an SDK dump's default)
        call_id = None
    return (Message(cast(Role, role), text, calls, call_id, parts),)


_TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
_TOOL_CALL_FUNCTION_KEYS = frozenset({"name", "arguments"})
#: A call given without the ``function`` wrapper: ``{"id", "name", "arguments"}``.
_BARE_TOOL_CALL_KEYS = _TOOL_CALL_KEYS - {"function"} | _TOOL_CALL_FUNCTION_KEYS


def _tool_call(c: Any, where: str) -> ToolCall:
    """One OpenAI tool call (``{"id", "type": "function", "function": {"name",
    "arguments"}}``, or the bare ``{"id", "name", "arguments"}``); anything it would not
    carry is refused, naming the call (`where`) and the key."""
    c = _plain(c)
    if not isinstance(c, Mapping):
        raise TypeError(f"{where} must be a mapping, got {type(c).__name__}")
    kind = c.get("type")
    if kind not in (None, "function"):
        raise ValueError(f"{where} is a {kind!r} tool call: only 'function' calls are accepted")
    checks: list[tuple[Mapping[str, Any], str, frozenset[str]]]
    if "function" in c:
        fn, fn_where = _plain(c["function"]), f"{where}.function"
        if not isinstance(fn, Mapping):
            raise TypeError(f"{fn_where} must be a mapping, got {type(fn).__name__}")
        checks = [(c, where, _TOOL_CALL_KEYS), (fn, fn_where, _TOOL_CALL_FUNCTION_KEYS)]
    else:
        fn, fn_where = c, where
        checks = [(c, where, _BARE_TOOL_CALL_KEYS)]
    for obj, at, known in checks:
        extra = _extra(obj, known)
        if extra:
            raise ValueError(f"{at}: unsupported keys {extra}")
    for obj, at, key in ((c, where, "id"), (fn, fn_where, "name")):
        if key not in obj:
            raise ValueError(f"{at} is missing the field {key!r}")
    args = fn.get("arguments", "{}")
    try:
        return ToolCall(c["id"], fn["name"], args if isinstance(args, str) else json.dumps(args))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _anthropic_assistant(m: Mapping[str, Any]) -> Message:
    """An Anthropic assistant message with ``tool_use`` blocks: its text and its calls."""
    extra = _extra(m, {"role", "content"})
    if extra:
        raise ValueError(f"unsupported message fields {extra}")
    texts: list[Any] = []
    calls = []
    for j, block in enumerate(m["content"]):
        if isinstance(block, Mapping) and block.get("type") == "tool_use":
            extra = _extra(block, {"type", "id", "name", "input"})
            if extra:
                raise ValueError(f"content[{j}]: unsupported keys {extra} on a tool_use block")
            inp = block.get("input", {})
            if not isinstance(inp, Mapping):
                raise TypeError(f"content[{j}].input must be a JSON object, got {type(inp).__name__}")
            try:
                calls.append(ToolCall(block.get("id", ""), block.get("name", ""), json.dumps(inp, ensure_ascii=False)))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"content[{j}]: {exc}") from None
        else:
            if calls:
                raise ValueError(f"content[{j}]: text after a tool_use block is not supported")
            texts.append(block)
    parts = _text_parts(texts) if texts else None
    return Message(Role.ASSISTANT, "", tuple(calls), None, parts)


def _anthropic_tool_results(m: Mapping[str, Any]) -> tuple[Message, ...]:
    """An Anthropic user message with ``tool_result`` blocks: one tool message per
    result, then the user's text after them (the API wants the results first)."""
    extra = _extra(m, {"role", "content"})
    if extra:
        raise ValueError(f"unsupported message fields {extra}")
    out = []
    blocks = list(m["content"])
    j = 0
    while j < len(blocks) and isinstance(blocks[j], Mapping) and blocks[j].get("type") == "tool_result":
        block = blocks[j]
        extra = _extra(block, {"type", "tool_use_id", "content", "is_error"})
        if extra:
            raise ValueError(f"content[{j}]: unsupported keys {extra} on a tool_result block")
        inner = block.get("content", "")
        parts = None
        if isinstance(inner, (list, tuple)):
            parts = _text_parts(inner, f"content[{j}].content") if inner else ()
            inner = ""
        elif not isinstance(inner, str):
            raise TypeError(f"content[{j}].content must be a str or a list of text blocks, got {type(inner).__name__}")
        try:
            out.append(Message(Role.TOOL, inner, (), block.get("tool_use_id"), parts, block.get("is_error", False)))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"content[{j}]: {exc}") from None
        j += 1
    rest = blocks[j:]
    for k, block in enumerate(rest, start=j):
        if isinstance(block, Mapping) and block.get("type") == "tool_result":
            raise ValueError(f"content[{k}]: tool_result blocks must come first in a user message")
    if rest:
        texts = _text_parts(rest)
        out.append(Message(Role.USER, "", (), None, tuple(texts)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class AssemblyOptions:
    """Per-request knobs.

    Attributes:
        weights: optional weights for the score components that are present
            (``similarity``, ``confidence``, ``recency``, ``importance``): the weighted
            formula runs instead of the value model.
        value_model: what a memory is worth to the packer: a `ctxcore.ValueModel` (fused
            relevance with confidence, importance and recency factors), None for the
            default `ValueModel()`, or ``"interim"`` for the interim formula
            0.85 x similarity + 0.15 x confidence.
        relevance_floor: the absolute floor on relevance for this request: a memory whose
            relevance is below it is dropped (``below_relevance_floor`` in the trace).
            Under a `ctxcore.ValueModel` the relevance is the fused one (in [0, 1], 1 for
            the request's best) and this floor replaces the model's `absolute_floor`; the
            model's `relative_floor` still applies. Under ``"interim"``, and with
            `weights`, the relevance is the cosine similarity (0.5 for a full-text hit
            without one). None (the default): the model's `absolute_floor` (0.01 for
            `ValueModel()`), or `AssemblyConfig.relevance_floor` (0.15) for the interim
            and weighted formulas. Must stay below the full-text sentinel 0.5 (`assemble`
            raises `ctxcore.ConfigError` otherwise). ``AssembledContext.scoring`` reports
            the floor applied as ``relevance_floor``.
        min_similarity: the ANN cutoff passed to cold retrieval.
        pool: how many memories each retrieval path returns at most (the candidates the
            value model ranks).
        max_memories: at most this many memories are selected; None (the default): the
            token budget alone decides.
        pinned_memory_ids: memories taken first (while they fit) when retrieved: they
            pass the relevance floor whatever their relevance, and `max_memories` counts
            them first.
        history_policy: what to do when the fixed parts alone overflow the window.
        context_enabled: False skips retrieval: directive-only/history-only context.
        skip_memory: True skips the memory branches but still fetches the directive.
        rendering: the form the context is handed over in (``text``, ``openai``,
            ``anthropic``); the budget counts that rendering's framing.
        memory_format: how memory elements are written: ``"compact"`` (the default:
            ``<m m1="NONCE">``, ids as per-assembly handles mapped back in
            `AssembledContext.handles`) or ``"verbose"`` (``<memory nonce=".." id="STORE ID"
            score=".." source="..">``); see `ctxcore.format_context`.
        memory_attributes: for the compact rendering, the optional attributes to write
            (from ``("score", "source", "created_at")``); none by default. The verbose
            rendering writes the score and the source.
    """

    weights: Mapping[str, float] | None = None
    relevance_floor: float | None = None
    min_similarity: float | None = None
    max_memories: int | None = None
    pinned_memory_ids: frozenset[str] = field(default_factory=frozenset)
    history_policy: HistoryPolicy = HistoryPolicy.STRICT
    context_enabled: bool = True
    skip_memory: bool = False
    rendering: Rendering = Rendering.TEXT
    value_model: ValueModel | str = field(default_factory=ValueModel)
    pool: int = DEFAULT_POOL
    memory_format: str = "compact"
    memory_attributes: tuple[str, ...] = ()

    if TYPE_CHECKING:
        # What callers may pass (the generated __init__ converts): any iterable of ids,
        # the enums by their values.
        def __init__(
            self,
            weights: Mapping[str, float] | None = None,
            relevance_floor: float | None = None,
            min_similarity: float | None = None,
            max_memories: SupportsIndex | None = None,
            pinned_memory_ids: Iterable[str] = frozenset(),
            history_policy: HistoryPolicy | str = HistoryPolicy.STRICT,
            context_enabled: bool = True,
            skip_memory: bool = False,
            rendering: Rendering | str = Rendering.TEXT,
            value_model: ValueModel | str | None = None,
            pool: SupportsIndex = DEFAULT_POOL,
            memory_format: str = "compact",
            memory_attributes: Iterable[str] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "history_policy", HistoryPolicy(self.history_policy))
        try:
            object.__setattr__(self, "rendering", Rendering(self.rendering))
        except ValueError:
            raise ValueError(
                f"rendering must be one of {[r.value for r in Rendering]}, got {self.rendering!r}"
            ) from None
        ids: Any = self.pinned_memory_ids
        if isinstance(ids, (str, bytes)):
            # frozenset("m-17") would be its characters
            raise TypeError(f"pinned_memory_ids must be a collection of ids, not a single {type(ids).__name__}")
        try:
            ids = tuple(ids)
        except TypeError:
            raise TypeError(f"pinned_memory_ids must be an iterable of str, got {type(ids).__name__}") from None
        for i, mid in enumerate(ids):
            if not isinstance(mid, str):
                raise TypeError(f"pinned_memory_ids[{i}] must be a str, got {type(mid).__name__}")
        object.__setattr__(self, "pinned_memory_ids", frozenset(ids))
        if self.memory_format not in MEMORY_FORMATS:
            raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}, got {self.memory_format!r:.40}")
        attrs: Any = self.memory_attributes
        if isinstance(attrs, (str, bytes)):
            raise TypeError(f"memory_attributes must be a collection of names, not a single {type(attrs).__name__}")
        try:
            attrs = tuple(attrs)
        except TypeError:
            raise TypeError(f"memory_attributes must be an iterable of str, got {type(attrs).__name__}") from None
        for name in attrs:
            if name not in MEMORY_ATTRIBUTES:
                raise ValueError(f"memory_attributes: unknown attribute {name!r:.40}; known: {MEMORY_ATTRIBUTES}")
        # One order whatever order they were named in: the rendering does not depend on it.
        object.__setattr__(self, "memory_attributes", tuple(a for a in MEMORY_ATTRIBUTES if a in attrs))
        for name in ("context_enabled", "skip_memory"):
            if not isinstance(getattr(self, name), bool):  # "false" would be truthy
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        # Counts and fractions of any numeric type (numpy's too) are kept as plain ints
        # and floats; bools are refused.
        if self.max_memories is not None:
            n = as_int(self.max_memories)
            if n is None or not 0 <= n <= MAX_RETRIEVAL_LIMIT:
                raise ValueError(
                    f"max_memories must be None or an int in [0, 2**31 - 1], got {self.max_memories!r:.40}"
                )
            object.__setattr__(self, "max_memories", n)
        pool = as_int(self.pool)
        if pool is None or not 0 <= pool <= MAX_RETRIEVAL_LIMIT:
            raise ValueError(f"pool must be an int in [0, 2**31 - 1], got {self.pool!r:.40}")
        object.__setattr__(self, "pool", pool)
        vm: Any = self.value_model
        if vm is None:
            object.__setattr__(self, "value_model", ValueModel())
        elif isinstance(vm, str) and not isinstance(vm, enum.Enum):
            if vm == "fused":
                object.__setattr__(self, "value_model", ValueModel())
            elif vm != "interim":
                raise ValueError(f"value_model must be a ValueModel, 'fused' or 'interim', got {vm!r:.40}")
        elif not isinstance(vm, ValueModel):
            raise TypeError(f"value_model must be a ValueModel or str, got {type(vm).__name__}")
        for name in ("relevance_floor", "min_similarity"):
            v = getattr(self, name)
            if v is not None:
                x = as_real(v)
                if x is None or not 0.0 <= x <= 1.0:  # NaN fails the comparison too
                    raise ValueError(f"{name} must be in [0, 1], got {v!r}")
                object.__setattr__(self, name, x)
        if self.weights is not None:
            if not isinstance(self.weights, Mapping):
                raise TypeError(f"weights must be a mapping of component to weight, got {type(self.weights).__name__}")
            w = dict(self.weights)
            for k, v in w.items():
                if k not in COMPONENTS:
                    raise ValueError(f"weights[{k!r}]: unknown component (known: {', '.join(COMPONENTS)})")
                x = as_real(v)
                if x is None:
                    raise TypeError(f"weights[{k!r}] must be a number, got {type(v).__name__}")
                if not 0 <= x <= sys.float_info.max:  # NaN, inf and ints past float range fail too
                    raise ValueError(f"weights[{k!r}] must be a finite number >= 0, got {v!r:.40}")
                w[k] = x
            object.__setattr__(self, "weights", w)


#: The sections a request may cap (`AssemblyRequest.section_budgets`).
SECTION_BUDGETS: tuple[str, ...] = ("history", "memories")


def check_section_budgets(budgets: object) -> Mapping[str, int]:
    """The caps as a read-only mapping, or a `TypeError` / `ValueError` naming the bad
    entry: keys from `SECTION_BUDGETS`, values integers >= 0 (of any type but bool,
    kept as plain ints).

    >>> dict(check_section_budgets({"history": 500}))
    {'history': 500}
    >>> check_section_budgets({"tools": 10})
    Traceback (most recent call last):
    ...
    ValueError: section_budgets: unknown section 'tools' (known: history, memories)
    """
    if budgets is None:
        return MappingProxyType({})
    if not isinstance(budgets, Mapping):
        raise TypeError(f"section_budgets must be a mapping of section to tokens, got {type(budgets).__name__}")
    out: dict[str, int] = {}
    for k, v in budgets.items():
        if k not in SECTION_BUDGETS:
            raise ValueError(f"section_budgets: unknown section {k!r:.40} (known: {', '.join(SECTION_BUDGETS)})")
        n = as_int(v)
        if n is None:
            raise TypeError(f"section_budgets[{k!r}] must be an int >= 0, got {type(v).__name__}")
        if n < 0:
            raise ValueError(f"section_budgets[{k!r}] must be an int >= 0, got {n}")
        out[k] = n
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class AssemblyRequest:
    """Everything one assembly needs from the caller.

    ``token_budget`` caps the whole assembled payload (directive, messages, tools,
    formatting and memories) in the model's tokens, independent of its window: the
    payload's count never exceeds it; history is trimmed oldest first (tool calls with
    their results) to make room, and the result's ``history_dropped`` says what went.

    ``section_budgets`` caps sections within that, in the same tokens: ``"history"`` (the
    kept messages, trimmed oldest first as above, the latest user turn always kept; such
    drops carry the reason ``history_budget``) and ``"memories"`` (the memory elements
    the packer may select).

    >>> r = AssemblyRequest("org-1", "agent-7", "gpt-4o", Query("what is our refund policy?"))
    >>> r.scope
    Scope(organization_id='org-1', agent_id='agent-7')
    """

    organization_id: str
    agent_id: str
    model: str
    query: Query
    messages: tuple[Message, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    options: AssemblyOptions = field(default_factory=AssemblyOptions)
    token_budget: int | None = None
    section_budgets: Mapping[str, int] = field(default_factory=dict)

    if TYPE_CHECKING:
        # What callers may pass (the generated __init__ converts): any sequence (a list,
        # say) of messages or OpenAI-style message mappings and of tool schemas; the query
        # as a str.
        def __init__(
            self,
            organization_id: str,
            agent_id: str,
            model: str,
            query: Query | str,
            messages: Sequence[Message | Mapping[str, Any]] = (),
            tools: Sequence[Mapping[str, Any]] = (),
            options: AssemblyOptions = ...,
            token_budget: SupportsIndex | None = None,
            section_budgets: Mapping[str, SupportsIndex] | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        Scope(self.organization_id, self.agent_id)  # validates both ids
        object.__setattr__(self, "token_budget", check_token_budget(self.token_budget))
        object.__setattr__(self, "section_budgets", check_section_budgets(self.section_budgets))
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty str, got {self.model!r}")
        if isinstance(self.query, str):
            object.__setattr__(self, "query", Query(self.query))
        if not isinstance(self.query, Query):
            raise TypeError(f"query must be a Query or str, got {type(self.query).__name__}")
        msgs = parse_messages(self.messages)
        object.__setattr__(self, "messages", msgs)
        if isinstance(self.tools, (Mapping, str, bytes)):
            raise TypeError(
                f"tools must be a sequence of tool schemas (JSON objects), got a single "
                f"{type(self.tools).__name__}: wrap one tool in a list"
            )
        if not isinstance(self.tools, Iterable):
            raise TypeError(f"tools must be a sequence of tool schemas (JSON objects), got {type(self.tools).__name__}")
        tools = tuple(self.tools)
        for i, t in enumerate(tools):
            if not isinstance(t, Mapping):
                raise TypeError(f"tools[{i}] must be a JSON object (mapping), got {type(t).__name__}")
            try:
                json.dumps(t, allow_nan=False)  # strict, as the formatter writes it
            except (TypeError, ValueError, RecursionError) as exc:
                raise ValueError(f"tools[{i}] is not JSON-serializable: {exc}") from None
        object.__setattr__(self, "tools", tools)
        if not isinstance(self.options, AssemblyOptions):
            raise TypeError("options must be an AssemblyOptions")
        if self.options.rendering is not Rendering.TEXT:
            # The payload renderings take tools and tool calls apart: refuse here, naming
            # the item, what they could not carry.
            check_tool_pairs(msgs)
            specs = []
            for i, t in enumerate(tools):
                try:
                    spec = ToolSpec.from_mapping(t)
                except ValueError as exc:
                    raise ValueError(f"tools[{i}]: {exc}") from None
                extra = spec.uncarried(self.options.rendering)
                if extra:
                    raise ValueError(f"tools[{i}] ({spec.name!r}): {extra} cannot be carried by an OpenAI tool")
                specs.append(spec)
            if self.options.rendering is Rendering.ANTHROPIC:
                check_unique_tool_names(specs)
                check_unique_call_ids(msgs)
                for i, m in enumerate(msgs):
                    for j, c in enumerate(m.tool_calls):
                        tool_input(c, f"messages[{i}].tool_calls[{j}]")

    @property
    def scope(self) -> Scope:
        """The (organization, agent) every memory must match."""
        return Scope(self.organization_id, self.agent_id)


def check_tool_pairs(messages: Sequence[Message]) -> None:
    """Check that tool calls and results pair up as the chat APIs require.

    Every ``tool`` message must directly follow (with its siblings) the assistant message
    whose call it answers, and every call must be answered there: both APIs reject a
    payload otherwise. `AssemblyRequest` checks this for the payload renderings.

    Raises:
        ValueError: naming the message (``messages[4]``) and the call id.

    >>> check_tool_pairs([Message("tool", "42", tool_call_id="c9")])
    Traceback (most recent call last):
    ...
    ValueError: messages[0]: the tool result for 'c9' does not follow the assistant message that made that call
    """
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role == Role.TOOL:
            raise ValueError(
                f"messages[{i}]: the tool result for {m.tool_call_id!r} does not follow the assistant message "
                "that made that call"
            )
        i += 1
        if m.role == Role.ASSISTANT and m.tool_calls:
            at = i - 1
            pending = [c.id for c in m.tool_calls]
            if len(set(pending)) != len(pending):
                raise ValueError(f"messages[{at}]: two tool calls share an id")
            while i < len(messages) and messages[i].role == Role.TOOL and messages[i].tool_call_id in pending:
                pending.remove(cast(str, messages[i].tool_call_id))
                i += 1
            if pending:
                raise ValueError(
                    f"messages[{at}]: the tool call(s) {pending} of this assistant message are not answered by "
                    "the tool results right after it"
                )


def check_unique_tool_names(specs: Sequence[ToolSpec]) -> None:
    """Check that no two tools share a name, as the Anthropic Messages API requires (it
    refuses such a request: "tools: Tool names must be unique").

    Raises:
        ValueError: naming both tools by index, and the name.

    >>> check_unique_tool_names([ToolSpec.from_mapping({"name": "f", "input_schema": {}})] * 2)
    Traceback (most recent call last):
    ...
    ValueError: tools[1] ('f'): tools[0] has the same name; the Anthropic Messages API takes tools of distinct names
    """
    first: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in first:
            raise ValueError(
                f"tools[{i}] ({spec.name!r}): tools[{first[spec.name]}] has the same name; "
                "the Anthropic Messages API takes tools of distinct names"
            )
        first[spec.name] = i


def check_unique_call_ids(messages: Sequence[Message]) -> None:
    """Check that no two tool calls of the conversation share an id, as the Anthropic
    Messages API requires (it refuses such a request: "`tool_use` ids must be unique").

    Raises:
        ValueError: naming both calls (``messages[2].tool_calls[0]``) and the id.

    >>> calls = [Message("assistant", tool_calls=(ToolCall("c1", "f"),)), Message("tool", "1", tool_call_id="c1")]
    >>> check_unique_call_ids(calls * 2)
    Traceback (most recent call last):
    ...
    ValueError: messages[2].tool_calls[0]: the tool call id 'c1' is also messages[0].tool_calls[0]'s; the Anthropic Messages API takes tool_use ids unique in the conversation
    """
    first: dict[str, str] = {}
    for i, m in enumerate(messages):
        for j, call in enumerate(m.tool_calls):
            where = f"messages[{i}].tool_calls[{j}]"
            if call.id in first:
                raise ValueError(
                    f"{where}: the tool call id {call.id!r} is also {first[call.id]}'s; "
                    "the Anthropic Messages API takes tool_use ids unique in the conversation"
                )
            first[call.id] = where


class _NoJsonForm(ValueError):
    """A number in tool arguments that strict JSON cannot write."""


def _no_constant(name: str) -> Any:
    raise _NoJsonForm(name)


def _finite(text: str) -> float:
    x = float(text)
    if x in (math.inf, -math.inf):
        raise _NoJsonForm(text)
    return x


def tool_input(call: ToolCall, where: str = "tool call") -> dict[str, Any]:
    """A tool call's arguments as the JSON object the Anthropic Messages API takes.

    Strict JSON: ``NaN``, ``Infinity`` and numbers beyond a double's range, which
    Python's reader takes but no request body can carry, are refused.

    Raises:
        ValueError: arguments that are not a strict JSON object, naming `where`.

    >>> tool_input(ToolCall("c1", "f", '{"q": 1}'))
    {'q': 1}
    """
    try:
        value = json.loads(call.arguments, parse_constant=_no_constant, parse_float=_finite)
    except _NoJsonForm as exc:
        raise ValueError(
            f"{where}: arguments hold {str(exc)[:40]!r}, a number JSON cannot carry (NaN, Infinity or beyond "
            "a double's range)"
        ) from None
    except (json.JSONDecodeError, RecursionError):
        raise ValueError(f"{where}: arguments are not valid JSON") from None
    except ValueError:  # int() past Python's digit limit, the only other ValueError json raises
        raise ValueError(
            f"{where}: arguments hold a number too long to read (integers may have at most "
            f"{sys.get_int_max_str_digits()} digits)"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: arguments must be a JSON object, got {type(value).__name__}")
    return value
