"""Payloads: the assembled context in the shapes the model APIs take, and what they cost.

The last stage of the pipeline has several renderings of one assembly. The text rendering
is `AssembledContext.text`; this module writes the other two from the same parts (the
directive, the kept history, the tool schemas and the memories section):

- `render_openai` -> ``{"messages", "tools"}`` for Chat Completions: the directive as the
  system (or developer) message, the history as real messages with assistant
  ``tool_calls`` and ``tool`` results, tools in the function-tool shape;
- `render_anthropic` -> ``{"system", "messages", "tools"}`` for Messages: ``tool_use`` /
  ``tool_result`` blocks, consecutive turns of one side merged so the roles alternate.

Both put the stable parts first (tools, directive, then the history, which only grows
between turns of a conversation) and the per-assembly part last: the nonce-tagged,
escaped memories section with its safety sentence, as its own user message (OpenAI) or
as a text block after the latest user turn (Anthropic), so consecutive turns share a
prompt-cache prefix. The Anthropic rendering marks the end of that prefix with a
``cache_control`` breakpoint. Keys whose value would be empty (``tools``, ``system``)
are left out, so a payload unpacks into the SDK call as it is (the OpenAI API refuses an
empty ``tools`` array).

`count_openai` and `count_anthropic` count a rendered payload the way the provider bills
it (the rules and their sources are next to the constants below); `price_rendering` is
the hook through which `ctxcore.assemble` puts that framing into the budget ledger.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .formatting import FormatterOverhead, formatter_overhead
from .request import (
    Message,
    Rendering,
    Role,
    ToolSpec,
    check_tool_pairs,
    check_unique_call_ids,
    check_unique_tool_names,
    tool_input,
)
from .tokens import count_tokens, estimator_of

__all__ = [
    "ANTHROPIC_ASSISTANT_TURN",
    "ANTHROPIC_HUMAN_TURN",
    "ANTHROPIC_REPLY_PRIMING",
    "ANTHROPIC_TOOL_SYSTEM_PROMPT_TOKENS",
    "OPENAI_REPLY_PRIMING_TOKENS",
    "OPENAI_TOKENS_PER_MESSAGE",
    "PayloadTokens",
    "RenderingCosts",
    "RenderingPrice",
    "count_anthropic",
    "count_openai",
    "default_directive_role",
    "message_tokens",
    "price_rendering",
    "render_anthropic",
    "render_openai",
    "rendering_costs",
]

# ---- the providers' counting rules ----------------------------------------------------------
#
# OpenAI, Chat Completions. Source: the OpenAI Cookbook, "How to count tokens with
# tiktoken" (examples/How_to_count_tokens_with_tiktoken.ipynb), `num_tokens_from_messages`
# and `num_tokens_for_tools`:
#   every message costs 3 tokens of framing plus the tokens of each of its values (role
#   included); every reply is primed with <|start|>assistant<|message|>, 3 tokens;
#   tools cost, per function, a start (7 for gpt-4o / gpt-4o-mini, 10 for gpt-4 /
#   gpt-3.5-turbo) + tokens("name:description"), then 3 for the properties and per
#   property 3 + tokens("key:type:description") (an enum: -3, then 3 + tokens(item) per
#   item), and 12 once at the end.
# The cookbook covers string values and flat schemas. For what it leaves out ctxcore
# counts more, never less: a value that is not a string (``tool_calls``) costs the tokens
# of its compact JSON; a list of text parts costs its texts plus one token per join; a
# function's properties cost the larger of the cookbook's rule and the tokens of the
# parameters' compact JSON (which carries every nested key the rule does not see).

#: Framing tokens of every message ("every message follows <|start|>{role/name}\n{content}<|end|>\n").
OPENAI_TOKENS_PER_MESSAGE = 3
#: Framing tokens of the reply ("every reply is primed with <|start|>assistant<|message|>").
OPENAI_REPLY_PRIMING_TOKENS = 3
#: Extra tokens of a message's ``name`` ("if there's a name, the role is omitted" in the
#: old rule; 1 token in the current one).
_OPENAI_TOKENS_PER_NAME = 1
#: Per-function start tokens by model, from `num_tokens_for_tools`; other models pay the larger.
OPENAI_FUNCTION_INIT_TOKENS: Mapping[str, int] = {"gpt-4o": 7, "gpt-4o-mini": 7, "gpt-4": 10, "gpt-3.5-turbo": 10}
_OPENAI_FUNCTION_INIT_DEFAULT = max(OPENAI_FUNCTION_INIT_TOKENS.values())
_OPENAI_PROPERTIES_INIT = 3
_OPENAI_PROPERTY_KEY = 3
_OPENAI_ENUM_INIT = -3
_OPENAI_ENUM_ITEM = 3
_OPENAI_FUNCTIONS_END = 12

# Anthropic, Messages. Anthropic publishes no tokenizer and no per-message count (its
# token-counting endpoint is a network call). Its published rules that apply here: the
# tool-use system prompt it adds whenever tools are present, in tokens per model
# (docs.anthropic.com, "Tool use with Claude", pricing table: the larger of the
# auto/none and any/tool columns), and tool definitions billed as their names,
# descriptions and schemas. For the turns ctxcore uses the turn markers of Anthropic's
# published prompt format ("\n\nHuman: " / "\n\nAssistant: ", and the reply primed with
# "\n\nAssistant:"), counted in the model's family like everything else; a text block
# costs its text, any other block (tool_use, tool_result) the tokens of its compact JSON.

#: The tool-use system prompt, in tokens, by model (Anthropic's tool-use pricing table).
ANTHROPIC_TOOL_SYSTEM_PROMPT_TOKENS: Mapping[str, int] = {
    "claude-opus-4-1": 346,
    "claude-opus-4": 346,
    "claude-sonnet-4-5": 346,
    "claude-sonnet-4": 346,
    "claude-haiku-4-5": 346,
    "claude-3-7-sonnet": 346,
    "claude-3-5-haiku": 340,
    "claude-3-opus": 530,
    "claude-3-sonnet": 235,
    "claude-3-haiku": 340,
}
_ANTHROPIC_TOOL_PROMPT_DEFAULT = max(ANTHROPIC_TOOL_SYSTEM_PROMPT_TOKENS.values())
#: Turn markers of Anthropic's published prompt format.
ANTHROPIC_HUMAN_TURN = "\n\nHuman: "
ANTHROPIC_ASSISTANT_TURN = "\n\nAssistant: "
ANTHROPIC_REPLY_PRIMING = "\n\nAssistant:"

#: OpenAI models whose instructions go in a ``developer`` message (the reasoning models).
_DEVELOPER_ROLE_PREFIXES = ("o1", "o3", "o4", "gpt-5")
_CACHE_BREAKPOINT = {"type": "ephemeral"}
_JSON = {"ensure_ascii": False, "separators": (",", ":")}
_SURROGATE = re.compile("[\ud800-\udfff]")


def default_directive_role(model: str) -> str:
    """The role the directive takes in an OpenAI payload: ``developer`` for the reasoning
    models (o1, o3, o4, gpt-5 families), which take instructions that way, else ``system``.

    >>> default_directive_role("gpt-4o"), default_directive_role("o3-mini")
    ('system', 'developer')
    """
    return "developer" if model.startswith(_DEVELOPER_ROLE_PREFIXES) else "system"


# ---- rendering ---------------------------------------------------------------------------


def _content_value(m: Message) -> str | list[dict[str, str]]:
    if m.parts is not None:
        return [{"type": "text", "text": p} for p in m.parts]
    return m.content


def _openai_message(m: Message) -> dict[str, Any]:
    if m.role == Role.TOOL:
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": _content_value(m)}
    out: dict[str, Any] = {"role": m.role.value, "content": _content_value(m)}
    if m.tool_calls:
        if m.parts is None and not m.content:
            out["content"] = None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    return out


def _utf8(value: Any) -> Any:
    """`value` with every str made writable as UTF-8, the form the SDKs send: a surrogate
    pair read as the character it encodes and a lone surrogate replaced by U+FFFD, which
    is how tiktoken reads such text, so the payload is the text the ledger counted."""
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8(v) for v in value]
    return value


def _has_surrogate(directive: str | None, messages: Sequence[Message]) -> bool:
    """Whether the directive or a message holds a surrogate: one scan of their texts, so
    that a history without any (nearly every one) is not walked again."""
    texts = [directive or ""]
    for m in messages:
        texts.append(m.content)  # the parts joined, when there are parts
        if m.tool_call_id is not None:
            texts.append(m.tool_call_id)
        for c in m.tool_calls:
            texts += (c.id, c.name, c.arguments)
    return _SURROGATE.search("".join(texts)) is not None


def _copy(value: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a JSON object: the payload is the caller's to change."""
    out: dict[str, Any] = json.loads(json.dumps(value))
    return out


def _openai_tool(spec: ToolSpec, i: int) -> dict[str, Any]:
    if spec.shape == "openai":
        return _copy(spec.source)
    extra = spec.uncarried(Rendering.OPENAI)
    if extra:
        raise ValueError(f"tools[{i}] ({spec.name!r}): {extra} cannot be carried by an OpenAI tool")
    fn: dict[str, Any] = {"name": spec.name}
    if spec.description is not None:
        fn["description"] = spec.description
    fn["parameters"] = _copy(spec.parameters)
    if spec.source.get("strict") is not None:
        fn["strict"] = spec.source["strict"]
    return {"type": "function", "function": fn}


def _anthropic_tool(spec: ToolSpec, i: int) -> dict[str, Any]:
    if spec.shape == "anthropic":
        return _copy(spec.source)
    fn = spec.source["function"] if spec.shape == "openai" else spec.source
    out: dict[str, Any] = {"name": spec.name}
    if spec.description is not None:
        out["description"] = spec.description
    out["input_schema"] = _copy(spec.parameters)
    # Both APIs hold a function to its schema with the same key.
    if fn.get("strict") is not None:
        out["strict"] = fn["strict"]
    return out


def _specs(tools: Sequence[Mapping[str, Any]]) -> list[ToolSpec]:
    out = []
    for i, t in enumerate(tools):
        try:
            out.append(ToolSpec.from_mapping(t))
        except ValueError as exc:
            raise ValueError(f"tools[{i}]: {exc}") from None
    return out


def render_openai(
    *,
    directive: str | None = None,
    messages: Sequence[Message] = (),
    tools: Sequence[Mapping[str, Any]] = (),
    memory_block: str | None = None,
    directive_role: str = "system",
) -> dict[str, Any]:
    """The Chat Completions request body (``messages``, and ``tools`` when there are any).

    Args:
        directive: the operator's directive, the first message; None or "" for none.
        messages: the history, in order; tool calls and their results must pair up.
        tools: tool definitions in any shape `ToolSpec` reads.
        memory_block: the memories section (``AssembledContext.sections["memories"]``),
            sent as the last message, a user message: the memories are data, and a
            system message would lend them the operator's authority.
        directive_role: ``system`` or ``developer`` (see `default_directive_role`).

    Every text is written as UTF-8 can carry it, as tiktoken reads it: a pair of surrogates
    is the character it encodes, and a lone surrogate, which no request body can hold,
    becomes U+FFFD.

    Raises:
        ValueError: tool calls and results that do not pair up, or a tool that is not a
            function tool, named by index.

    >>> p = render_openai(directive="Be brief.", messages=[Message("user", "hi")])
    >>> p["messages"]
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
    """
    if directive_role not in ("system", "developer"):
        raise ValueError(f"directive_role must be 'system' or 'developer', got {directive_role!r}")
    check_tool_pairs(messages)
    out: list[dict[str, Any]] = []
    if directive:
        out.append({"role": directive_role, "content": directive})
    out.extend(_openai_message(m) for m in messages)
    if memory_block:
        out.append({"role": "user", "content": memory_block})
    payload: dict[str, Any] = {"messages": out}
    if _has_surrogate(directive, messages):
        payload = _utf8(payload)
    if tools:
        payload["tools"] = _utf8([_openai_tool(s, i) for i, s in enumerate(_specs(tools))])
    return payload


def _says_something(text: str) -> bool:
    """Whether a text goes into the Messages API as a text block: the API refuses empty
    and whitespace-only ones (400 "text content blocks must contain non-whitespace
    text"), and such a text says nothing."""
    return bool(text) and not text.isspace()


def _anthropic_blocks(m: Message, i: int) -> list[dict[str, Any]]:
    texts = m.parts if m.parts is not None else (m.content,)
    if m.role == Role.TOOL:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id}
        if m.parts is not None:
            block["content"] = [{"type": "text", "text": t} for t in m.parts if _says_something(t)]
        elif _says_something(m.content):
            block["content"] = m.content
        if m.is_error:
            block["is_error"] = True
        return [block]
    out: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts if _says_something(t)]
    for j, c in enumerate(m.tool_calls):
        out.append(
            {
                "type": "tool_use",
                "id": c.id,
                "name": c.name,
                # A JSON escape of a lone surrogate ("\\ud800") becomes one when read.
                "input": _utf8(tool_input(c, f"messages[{i}].tool_calls[{j}]")),
            }
        )
    return out


def render_anthropic(
    *,
    directive: str | None = None,
    messages: Sequence[Message] = (),
    tools: Sequence[Mapping[str, Any]] = (),
    memory_block: str | None = None,
    cache_breakpoint: bool = True,
) -> dict[str, Any]:
    """The Messages request body (``messages``; ``system`` and ``tools`` when non-empty).

    The directive, and any system or developer messages of the history, become the
    ``system`` text blocks (the Messages API has no system turns). Consecutive messages
    of one side are merged into one turn of content blocks, so roles alternate; tool
    results are ``tool_result`` blocks of a user turn, first in it as the API requires.
    Texts with nothing to say (empty or whitespace only, which the API refuses as text
    blocks) are left out, and so are messages left with no blocks. The memory block
    is a text block after the latest user turn's content (or a user turn of its own).

    Args:
        directive: the operator's directive, or None.
        messages: the history, in order; tool calls and their results must pair up.
        tools: tool definitions in any shape `ToolSpec` reads.
        memory_block: the memories section, or None.
        cache_breakpoint: mark the last block before the memory block (the end of the
            part that stays the same from one turn to the next) with
            ``cache_control: {"type": "ephemeral"}``.

    Surrogates are written as in `render_openai` (a lone one becomes U+FFFD).

    Raises:
        ValueError: unpaired tool calls or results, tool arguments that are not a JSON
            object, a tool that is not a function tool, two tools of one name, or two
            tool calls of one id, named by index.

    >>> p = render_anthropic(directive="Be brief.", messages=[Message("user", "hi")], cache_breakpoint=False)
    >>> p["system"], p["messages"]
    ([{'type': 'text', 'text': 'Be brief.'}], [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}])
    """
    check_tool_pairs(messages)
    check_unique_call_ids(messages)
    system: list[dict[str, Any]] = []
    if directive is not None and _says_something(directive):
        system.append({"type": "text", "text": directive})
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m.role in (Role.SYSTEM, Role.DEVELOPER):
            texts = m.parts if m.parts is not None else (m.content,)
            system.extend({"type": "text", "text": t} for t in texts if _says_something(t))
            continue
        blocks = _anthropic_blocks(m, i)
        if not blocks:
            continue
        role = "assistant" if m.role == Role.ASSISTANT else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    specs = _specs(tools)
    check_unique_tool_names(specs)
    rendered_tools = [_anthropic_tool(s, i) for i, s in enumerate(specs)]
    if cache_breakpoint:
        last = turns[-1]["content"] if turns else system or rendered_tools
        if last:
            last[-1]["cache_control"] = dict(_CACHE_BREAKPOINT)
    if memory_block:
        block = {"type": "text", "text": memory_block}
        if turns and turns[-1]["role"] == "user":
            turns[-1]["content"].append(block)
        else:
            turns.append({"role": "user", "content": [block]})
    payload: dict[str, Any] = {}
    if system:
        payload["system"] = system
    payload["messages"] = turns
    if _has_surrogate(directive, messages):
        payload = _utf8(payload)
    if rendered_tools:
        payload["tools"] = _utf8(rendered_tools)
    return payload


# ---- counting ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PayloadTokens:
    """A payload's prompt tokens by the provider's rule, split into what it says and how
    the API frames it.

    Attributes:
        system: the directive (and other system text).
        messages: the messages' contents (text, tool calls, tool results).
        tools: the tool definitions.
        framing: per-message framing, reply priming and the tools' fixed framing (for
            Anthropic, the tool-use system prompt).
    """

    system: int
    messages: int
    tools: int
    framing: int

    @property
    def total(self) -> int:
        """Everything the API bills as prompt tokens."""
        return self.system + self.messages + self.tools + self.framing


def _json(value: Any) -> str:
    return json.dumps(value, **_JSON)  # type: ignore[arg-type]


def _openai_properties(params: Mapping[str, Any], count: Callable[[str], int]) -> int:
    """The cookbook's rule for a function's properties (flat schemas)."""
    props = params.get("properties")
    if not isinstance(props, Mapping) or not props:
        return 0
    n = _OPENAI_PROPERTIES_INIT
    for key, prop in props.items():
        n += _OPENAI_PROPERTY_KEY
        prop = prop if isinstance(prop, Mapping) else {}
        kind = prop.get("type", "")
        desc = prop.get("description", "")
        desc = desc if isinstance(desc, str) else _json(desc)
        if isinstance(prop.get("enum"), list):
            n += _OPENAI_ENUM_INIT
            for item in prop["enum"]:
                n += _OPENAI_ENUM_ITEM + count(item if isinstance(item, str) else _json(item))
        n += count(f"{key}:{kind if isinstance(kind, str) else _json(kind)}:{desc.removesuffix('.')}")
    return n


def count_openai(payload: Mapping[str, Any], count: Callable[[str], int], *, model: str | None = None) -> PayloadTokens:
    """The prompt tokens of a Chat Completions payload by OpenAI's published rule.

    Args:
        payload: ``{"messages", "tools"?}`` as `render_openai` writes it.
        count: tokens of a text, e.g. ``lambda t: ctxcore.count_tokens(t, "cl100k_base").value``.
        model: picks the per-function constant; unknown or None pays the larger one.

    >>> n = lambda t: len(t.split())
    >>> count_openai({"messages": [{"role": "user", "content": "a b"}]}, n)
    PayloadTokens(system=0, messages=2, tools=0, framing=7)
    """
    system = content = framing = 0
    for m in payload.get("messages", ()):
        framing += OPENAI_TOKENS_PER_MESSAGE
        for key, value in m.items():
            if value is None:
                continue
            if key == "role":
                framing += count(value)
                continue
            if key == "name":
                framing += _OPENAI_TOKENS_PER_NAME
            if key == "content" and isinstance(value, list):
                n = sum(count(p.get("text", "")) if p.get("type") == "text" else count(_json(p)) for p in value)
                framing += max(0, len(value) - 1)
            else:
                n = count(value if isinstance(value, str) else _json(value))
            if m.get("role") in ("system", "developer"):
                system += n
            else:
                content += n
    framing += OPENAI_REPLY_PRIMING_TOKENS
    tools = 0
    specs = payload.get("tools") or ()
    if specs:
        init = OPENAI_FUNCTION_INIT_TOKENS.get(model or "", _OPENAI_FUNCTION_INIT_DEFAULT)
        framing += _OPENAI_FUNCTIONS_END + init * len(specs)
        for t in specs:
            fn = t["function"]
            desc = (fn.get("description") or "").removesuffix(".")
            params = fn.get("parameters") or {}
            tools += count(f"{fn['name']}:{desc}") + max(_openai_properties(params, count), count(_json(params)))
    return PayloadTokens(system, content, tools, framing)


def count_anthropic(
    payload: Mapping[str, Any], count: Callable[[str], int], *, model: str | None = None
) -> PayloadTokens:
    """The prompt tokens of a Messages payload by Anthropic's published rules (see the
    module's constants for the rules and where they come from).

    Args:
        payload: ``{"system"?, "messages", "tools"?}`` as `render_anthropic` writes it.
        count: tokens of a text in the model's family.
        model: picks the tool-use system prompt's size; unknown or None pays the largest.

    >>> n = lambda t: len(t.split())
    >>> count_anthropic({"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]}, n)
    PayloadTokens(system=0, messages=2, tools=0, framing=2)
    """

    def blocks(value: Any) -> int:
        if isinstance(value, str):
            return count(value)
        total = 0
        for b in value:
            if b.get("type") == "text":
                total += count(b["text"])
            else:
                total += count(_json({k: v for k, v in b.items() if k != "cache_control"}))
        return total

    system = blocks(payload.get("system") or ())
    content = framing = 0
    for m in payload.get("messages", ()):
        framing += count(ANTHROPIC_ASSISTANT_TURN if m["role"] == "assistant" else ANTHROPIC_HUMAN_TURN)
        content += blocks(m["content"])
    framing += count(ANTHROPIC_REPLY_PRIMING)
    tools = 0
    specs = payload.get("tools") or ()
    if specs:
        framing += ANTHROPIC_TOOL_SYSTEM_PROMPT_TOKENS.get(model or "", _ANTHROPIC_TOOL_PROMPT_DEFAULT)
        tools = sum(count(_json({k: v for k, v in t.items() if k != "cache_control"})) for t in specs)
    return PayloadTokens(system, content, tools, framing)


# ---- the budget hook ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RenderingPrice:
    """What the rendering asked for adds to the ledger.

    Attributes:
        rendering: the rendering priced.
        framing_tokens: the provider's framing (per-message, reply priming, tools'
            framing, the memory message's own framing), included in the ledger's
            ``formatter_overhead_tokens``.
        stable_prefix_tokens: the tokens of the part that stays the same from one turn of
            a conversation to the next (tools, directive, history), which a provider's
            prompt cache can bill at a discount.
    """

    rendering: Rendering
    framing_tokens: int
    stable_prefix_tokens: int


def _counter(family: str, exact: bool) -> Callable[[str], int]:
    if exact:
        return lambda text: count_tokens(text, family).value
    est = estimator_of(family)
    return est.estimate


@dataclass(frozen=True, slots=True)
class RenderingCosts:
    """The fixed parts of a payload rendering, priced so that they add up over messages
    (a ledger that trims history by prefix sums takes a dropped group's cost off as is).

    Attributes:
        rendering: the payload rendering priced.
        directive_tokens: the directive's text.
        directive_framing: the directive message's framing (OpenAI; 0 for Anthropic).
        message_tokens: each history message's cost, its framing included (`message_tokens`).
        message_framing: the framing part of each message's cost.
        tools_tokens: the tool definitions.
        tools_framing: the tools' fixed framing (OpenAI's function framing; Anthropic's
            tool-use system prompt).
        memory_frame: the memories section's own text (tags, safety sentence).
        memory_framing: the framing of the message that carries the memories.
        reply_tokens: the reply priming.
    """

    rendering: Rendering
    directive_tokens: int
    directive_framing: int
    message_tokens: tuple[int, ...]
    message_framing: tuple[int, ...]
    tools_tokens: int
    tools_framing: int
    memory_frame: int
    memory_framing: int
    reply_tokens: int

    @property
    def fixed_tokens(self) -> int:
        """What belongs to no message: the ledger's formatter-overhead term."""
        return self.memory_frame + self.directive_framing + self.tools_framing + self.memory_framing + self.reply_tokens

    def framing_tokens(self, kept: Sequence[int] | None = None) -> int:
        """All the chat framing, for the kept messages (all by default)."""
        msgs = self.message_framing if kept is None else [self.message_framing[i] for i in kept]
        return sum(msgs) + self.directive_framing + self.tools_framing + self.memory_framing + self.reply_tokens

    def stable_prefix_tokens(self, kept: Sequence[int] | None = None) -> int:
        """Tools, directive and the kept messages (all by default), framing included."""
        msgs = self.message_tokens if kept is None else [self.message_tokens[i] for i in kept]
        return self.directive_tokens + self.directive_framing + self.tools_tokens + self.tools_framing + sum(msgs)


def rendering_costs(
    rendering: Rendering,
    *,
    model: str,
    family: str,
    exact: bool,
    directive: str | None,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    count: Callable[[str], int] | None = None,
    memory_format: str = "verbose",
) -> RenderingCosts:
    """Price the fixed parts of a payload rendering by the provider's rule, in the
    model's family (exact counts when `exact`, else the estimator; or `count`), with the
    memories section's frame in `memory_format` (as for `ctxcore.format_context`).

    >>> c = rendering_costs(Rendering.OPENAI, model="gpt-4", family="cl100k_base", exact=True,
    ...                     directive="Be brief.", messages=[Message("user", "hi")], tools=())
    >>> c.message_tokens, c.directive_tokens, c.reply_tokens
    ((5,), 3, 3)
    """
    if rendering is Rendering.TEXT:
        raise ValueError("rendering_costs prices the payload renderings; the text rendering is the formatter's")
    check_tool_pairs(messages)
    if count is None:
        count = _counter(family, exact)
        # The estimator prices the frame's pieces behind what precedes them (the formatter's
        # own pricing), which keeps the memory block's estimate within frame + memories.
        memory_frame = (
            formatter_overhead((), family=family, memory_format=memory_format).fixed_tokens if not exact else None
        )
    else:
        memory_frame = None
    if memory_frame is None:
        memory_frame = formatter_overhead((), count=count, memory_format=memory_format).fixed_tokens
    priced = [message_tokens(m, rendering, count, index=i) for i, m in enumerate(messages)]
    if rendering is Rendering.OPENAI:
        t = count_openai({"messages": [], "tools": render_openai(tools=tools).get("tools", [])}, count, model=model)
        reply = OPENAI_REPLY_PRIMING_TOKENS
        memory_framing = OPENAI_TOKENS_PER_MESSAGE + count("user")
        # Either role the caller may pick for the directive: the dearer one.
        directive_framing = OPENAI_TOKENS_PER_MESSAGE + max(count("system"), count("developer")) if directive else 0
    else:
        t = count_anthropic(
            {"messages": [], "tools": render_anthropic(tools=tools).get("tools", [])}, count, model=model
        )
        reply = count(ANTHROPIC_REPLY_PRIMING)
        memory_framing = count(ANTHROPIC_HUMAN_TURN)
        directive_framing = 0
    return RenderingCosts(
        rendering=rendering,
        directive_tokens=count(directive) if directive else 0,
        directive_framing=directive_framing,
        message_tokens=tuple(c + f for c, f in priced),
        message_framing=tuple(f for _, f in priced),
        tools_tokens=t.tools,
        tools_framing=t.framing - reply,
        memory_frame=memory_frame,
        memory_framing=memory_framing,
        reply_tokens=reply,
    )


def price_rendering(
    overhead: FormatterOverhead,
    rendering: Rendering,
    *,
    model: str,
    family: str,
    exact: bool,
    directive: str | None,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    memory_format: str = "verbose",
) -> tuple[FormatterOverhead, RenderingPrice]:
    """Reprice the fixed parts of an assembly for the rendering asked for (`memory_format`:
    the rendering of the memory elements `overhead` was priced for).

    For ``text`` the formatter's prices stand. For a payload (`rendering_costs`) the
    directive and tools terms become their tokens in the payload by the provider's rule,
    the messages term each message's tokens with its own framing (so the term adds up
    over messages and trimming takes a group's cost off as is), and the formatter's fixed
    term the memories section's own frame (tags and safety sentence) plus the framing
    that belongs to no message (the directive's, the tools', the memory message's, the
    reply priming). The memories keep their prices (the memory block is the same
    memories section), so whatever subset is packed, the payload's count stays within
    the ledger.

    >>> from ctxcore import formatter_overhead, Message
    >>> ov = formatter_overhead((), family="cl100k_base", history=[{"role": "user", "content": "hi"}])
    >>> ov2, price = price_rendering(ov, Rendering.OPENAI, model="gpt-4", family="cl100k_base", exact=False,
    ...                              directive=None, messages=[Message("user", "hi")], tools=())
    >>> price.framing_tokens > 0 and ov2.history_tokens < ov.history_tokens
    True
    """
    if rendering is Rendering.TEXT:
        return overhead, RenderingPrice(rendering, 0, overhead.directive_tokens + overhead.history_tokens)
    c = rendering_costs(
        rendering,
        model=model,
        family=family,
        exact=exact,
        directive=directive,
        messages=messages,
        tools=tools,
        memory_format=memory_format,
    )
    repriced = replace(
        overhead,
        directive_tokens=c.directive_tokens,
        history_tokens=sum(c.message_tokens),
        tools_tokens=c.tools_tokens,
        fixed_tokens=c.fixed_tokens,
    )
    return repriced, RenderingPrice(rendering, c.framing_tokens(), c.stable_prefix_tokens())


def message_tokens(m: Message, rendering: Rendering, count: Callable[[str], int], *, index: int = 0) -> tuple[int, int]:
    """One message's (content, framing) tokens in a payload rendering, by the provider's rule.

    Additive over messages, so trimming can take a dropped group's cost off the ledger
    without pricing the history again. For Anthropic each message is priced as a turn of
    its own: merging consecutive messages into one turn only saves turn markers, so the
    sum bounds the merged payload's count from above. System and developer messages cost
    their text there (they go into ``system``).

    >>> message_tokens(Message("user", "a b"), Rendering.OPENAI, lambda t: len(t.split()))
    (2, 4)
    """
    if rendering is Rendering.OPENAI:
        t = count_openai({"messages": [_openai_message(m)]}, count)
        return t.system + t.messages, t.framing - OPENAI_REPLY_PRIMING_TOKENS
    if rendering is not Rendering.ANTHROPIC:
        raise ValueError(f"message_tokens prices the payload renderings, not {rendering.value!r}")
    if m.role in (Role.SYSTEM, Role.DEVELOPER):
        return sum(count(t) for t in (m.parts if m.parts is not None else (m.content,)) if _says_something(t)), 0
    blocks = _anthropic_blocks(m, index)
    if not blocks:
        return 0, 0
    role = "assistant" if m.role == Role.ASSISTANT else "user"
    t = count_anthropic({"messages": [{"role": role, "content": blocks}]}, count)
    return t.messages, t.framing - count(ANTHROPIC_REPLY_PRIMING)
