"""LangChain: `BaseMessage` lists in and out, and a runnable to call where an app would
call ``trim_messages``.

Thin by design: LangChain messages become OpenAI-shaped mappings that
`ctxcore.request.parse_messages` reads (so errors name ``messages[i]`` as everywhere
else), and the assembled context goes back through LangChain's own
``convert_to_messages`` from the OpenAI payload (`AssembledContext.to_openai`), whose
shape LangChain's message model mirrors. Needs ``pip install 'ctxcore-llm[langchain]'``.

>>> from langchain_core.messages import HumanMessage            # doctest: +SKIP
>>> prepare = assembler(sources=Sources.from_store(store), organization_id="acme",
...                     agent_id="support", model="gpt-4o")     # doctest: +SKIP
>>> chain = prepare | ChatOpenAI(model="gpt-4o")                # doctest: +SKIP
>>> await chain.ainvoke([HumanMessage("Can I return these shoes?")])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._extras import require

require("langchain", "ctxcore.adapters.langchain")

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)
from langchain_core.runnables import RunnableLambda

from ..assembly import AssembledContext, AssemblyConfig, assemble
from ..catalog import Catalog
from ..memory import Query, Sources
from ..request import AssemblyOptions, AssemblyRequest, HistoryPolicy, Message, Rendering, parse_messages

__all__ = ["assembler", "from_langchain", "to_langchain"]


def _content(content: Any) -> Any:
    """LangChain content (a str, or a list of str and content blocks) as OpenAI content."""
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]


def _as_mapping(m: BaseMessage) -> dict[str, Any]:
    if isinstance(m, SystemMessage):
        role = "developer" if m.additional_kwargs.get("__openai_role__") == "developer" else "system"
        return {"role": role, "content": _content(m.content)}
    if isinstance(m, HumanMessage):
        return {"role": "user", "content": _content(m.content)}
    if isinstance(m, AIMessage):
        content = m.content
        if m.tool_calls and not isinstance(content, str):
            # Anthropic chat models also keep the calls as tool_use blocks: tool_calls has them.
            content = [c for c in content if not (isinstance(c, dict) and c.get("type") == "tool_use")]
        out: dict[str, Any] = {"role": "assistant", "content": _content(content) if content else ""}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["args"], ensure_ascii=False)},
                }
                for c in m.tool_calls
            ]
        return out
    if isinstance(m, ToolMessage):
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": _content(m.content)}
    if isinstance(m, ChatMessage):
        return {"role": m.role, "content": _content(m.content)}
    raise TypeError(f"a LangChain message of type {type(m).__name__} has no ctxcore equivalent")


def from_langchain(messages: Sequence[BaseMessage]) -> tuple[Message, ...]:
    """LangChain messages as `ctxcore.Message` objects (tool calls, tool results,
    ``status="error"`` tool results and text content blocks included).

    Raises:
        ValueError, TypeError: naming the message (``messages[2]``): media blocks, a
            message type with no equivalent, unpaired fields.

    >>> from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    >>> [m.role.value for m in from_langchain([HumanMessage("hi"),
    ...     AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}]), ToolMessage("ok", tool_call_id="c1")])]
    ['user', 'assistant', 'tool']
    """
    out: list[Message] = []
    for i, m in enumerate(messages):
        try:
            mapping = _as_mapping(m)
        except TypeError as exc:
            raise TypeError(f"messages[{i}]: {exc}") from None
        try:
            (msg,) = parse_messages([mapping])
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"messages[{i}]{str(exc).removeprefix('messages[0]')}") from None
        if isinstance(m, ToolMessage) and m.status == "error":
            msg = Message(msg.role, msg.content if msg.parts is None else "", (), msg.tool_call_id, msg.parts, True)
        out.append(msg)
    return tuple(out)


def to_langchain(ctx: AssembledContext, *, directive_role: str | None = None) -> list[BaseMessage]:
    """The assembled context as LangChain messages: the directive as a `SystemMessage`, the
    kept history, and the memories block (nonce-tagged, escaped, with its safety
    sentence) as the last `HumanMessage`. Tools stay with the model (``bind_tools``).

    >>> import asyncio, ctxcore
    >>> req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", "hi", messages=[{"role": "user", "content": "hi"}])
    >>> to_langchain(asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())))
    [HumanMessage(content='hi', additional_kwargs={}, response_metadata={})]
    """
    return list(convert_to_messages(ctx.to_openai(directive_role=directive_role)["messages"]))


def _latest_user_text(messages: Sequence[Message]) -> str:
    for m in reversed(messages):
        if m.role.value == "user":
            return m.content
    return ""


def assembler(
    *,
    sources: Sources,
    organization_id: str,
    agent_id: str,
    model: str,
    tools: Sequence[Mapping[str, Any]] = (),
    options: AssemblyOptions | None = None,
    catalog: Catalog | None = None,
    config: AssemblyConfig | None = None,
) -> RunnableLambda[Sequence[BaseMessage], list[BaseMessage]]:
    """A runnable that takes the conversation (LangChain messages) and returns the
    messages to send: where an app calls ``trim_messages`` before its chat model.

    Each call assembles for the latest user message (the retrieval query) with the
    conversation as history: the history is trimmed oldest-first to what the window
    leaves (tool calls stay with their results; the latest user turn stays), and the
    memories that fit are added, priced for the OpenAI rendering unless `options` says
    otherwise. Use ``ainvoke`` inside an event loop (``invoke`` runs its own).

    Args:
        sources: the directive / hot / cold retrieval branches.
        organization_id: whose memories.
        agent_id: which agent's memories.
        model: the model name (the catalog's window and tokenizer).
        tools: the tool schemas bound to the chat model, so their tokens are paid for.
        options: assembly options; by default ``history_policy="trim_oldest"``,
            ``rendering="openai"``.
        catalog: the capability catalog; the shipped one by default.
        config: service settings (timeouts); `AssemblyConfig.from_env()` by default.
    """
    opts = (
        options
        if options is not None
        else AssemblyOptions(history_policy=HistoryPolicy.TRIM_OLDEST, rendering=Rendering.OPENAI)
    )

    async def run(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        history = from_langchain(messages)
        req = AssemblyRequest(
            organization_id,
            agent_id,
            model,
            Query(_latest_user_text(history)),
            messages=history,
            tools=tuple(tools),
            options=opts,
        )
        ctx = await assemble(req, sources=sources, catalog=catalog, config=config)
        return to_langchain(ctx)

    def run_sync(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        return asyncio.run(run(messages))

    return RunnableLambda(run_sync, afunc=run, name="ctxcore_assemble")
