"""LlamaIndex: `ChatMessage` lists in and out.

Needs ``pip install 'ctxcore-llm[llamaindex]'``, which brings ``llama-index-core``: the lightest
official package that defines ``ChatMessage`` (LlamaIndex has no smaller types-only
package; the adapter imports nothing else from it). Tool calls are read from
``additional_kwargs["tool_calls"]`` (the OpenAI shape LlamaIndex's OpenAI integration
keeps there) or from ``ToolCallBlock`` blocks, tool results from
``additional_kwargs["tool_call_id"]``; text blocks become text parts. Going out, messages
carry the same keys, so LlamaIndex's chat models send them on as they came.

>>> history = from_llamaindex(memory.get())                  # doctest: +SKIP
>>> ctx = await ctxcore.assemble(AssemblyRequest(..., messages=history), sources=...)  # doctest: +SKIP
>>> llm.chat(to_llamaindex(ctx))                             # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .._extras import require

require("llamaindex", "ctxcore.adapters.llamaindex")

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock

from ..assembly import AssembledContext
from ..request import Message, parse_messages

__all__ = ["from_llamaindex", "to_llamaindex"]

_KNOWN_KWARGS = {"tool_calls", "tool_call_id"}


def _plain(call: Any) -> Any:
    """An OpenAI tool call as a plain mapping (LlamaIndex may hold the SDK's objects)."""
    return call.model_dump() if hasattr(call, "model_dump") else call


def _as_mapping(m: ChatMessage) -> dict[str, Any]:
    extra = set(m.additional_kwargs) - _KNOWN_KWARGS
    if extra:
        raise ValueError(f"additional_kwargs {sorted(extra)} have no ctxcore equivalent")
    texts: list[str] = []
    calls = [_plain(c) for c in m.additional_kwargs.get("tool_calls") or ()]
    for j, b in enumerate(m.blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolCallBlock):
            args = b.tool_kwargs if isinstance(b.tool_kwargs, str) else json.dumps(b.tool_kwargs, ensure_ascii=False)
            calls.append(
                {"id": b.tool_call_id, "type": "function", "function": {"name": b.tool_name, "arguments": args}}
            )
        else:
            raise ValueError(
                f"content[{j}] is a {getattr(b, 'block_type', type(b).__name__)!r} part: only text parts are "
                "accepted (an image's or file's price cannot be known from the request)"
            )
    out: dict[str, Any] = {"role": m.role.value}
    out["content"] = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts] if texts else ""
    if calls:
        out["tool_calls"] = calls
    if "tool_call_id" in m.additional_kwargs:
        out["tool_call_id"] = m.additional_kwargs["tool_call_id"]
    return out


def from_llamaindex(messages: Sequence[ChatMessage]) -> tuple[Message, ...]:
    """LlamaIndex chat messages as `ctxcore.Message` objects.

    Raises:
        ValueError, TypeError: naming the message (``messages[2]``): media blocks,
            unknown roles, additional_kwargs with no equivalent.

    >>> from llama_index.core.llms import ChatMessage
    >>> from_llamaindex([ChatMessage(role="user", content="hi")])[0].content
    'hi'
    """
    out: list[Message] = []
    for i, m in enumerate(messages):
        try:
            (msg,) = parse_messages([_as_mapping(m)])
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"messages[{i}]: {str(exc).removeprefix('messages[0]: ')}") from None
        out.append(msg)
    return tuple(out)


def _chat_message(m: dict[str, Any]) -> ChatMessage:
    kwargs: dict[str, Any] = {}
    if m.get("tool_calls"):
        kwargs["tool_calls"] = m["tool_calls"]
    if "tool_call_id" in m:
        kwargs["tool_call_id"] = m["tool_call_id"]
    content = m.get("content")
    if isinstance(content, list):
        blocks: list[Any] = [TextBlock(text=p["text"]) for p in content]
        return ChatMessage(role=MessageRole(m["role"]), blocks=blocks, additional_kwargs=kwargs)
    return ChatMessage(role=MessageRole(m["role"]), content=content or "", additional_kwargs=kwargs)


def to_llamaindex(ctx: AssembledContext, *, directive_role: str | None = None) -> list[ChatMessage]:
    """The assembled context as LlamaIndex chat messages, in the order of the OpenAI
    payload (`AssembledContext.to_openai`): the directive, the kept history, and the
    memories block (nonce-tagged, escaped, with its safety sentence) as the last user
    message.

    >>> import asyncio, ctxcore
    >>> req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", "hi", messages=[{"role": "user", "content": "hi"}])
    >>> [m.content for m in to_llamaindex(asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())))]
    ['hi']
    """
    return [_chat_message(m) for m in ctx.to_openai(directive_role=directive_role)["messages"]]
