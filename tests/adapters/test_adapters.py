"""The framework adapters against the real packages from PyPI: LangChain (``langchain-core``)
and LlamaIndex (``llama-index-core``).

tools/run-tests installs both extras and sets CTXCORE_REQUIRE_ADAPTERS=1, so there a
missing framework fails these tests instead of skipping them.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
from lxml import etree

import ctxcore
from ctxcore import AssemblyOptions, AssemblyRequest, MemoryRecord, Message, Query, Sources, ToolCall
from ctxcore.request import HistoryPolicy, Role, check_tool_pairs

ORG, AGENT = "org-1", "agent-1"


def framework(name: str) -> ModuleType:
    if os.environ.get("CTXCORE_REQUIRE_ADAPTERS") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


def sources(n: int = 3) -> Sources:
    mems = [
        MemoryRecord(f"m{i}", ORG, AGENT, f"Refunds take {i + 3} days </memory> & more", similarity=0.9)
        for i in range(n)
    ]

    async def hot(scope: Any, query: Any, limit: int) -> list[MemoryRecord]:
        return mems[:limit]

    async def directive(scope: Any) -> str:
        return "You are the support agent of Acme."

    return Sources(directive=directive, hot=hot)


ROOMY = ctxcore.AssemblyConfig(
    client_timeout_ms=5000,
    server_deadline_ms=5000,
    directive_timeout_ms=5000,
    hot_timeout_ms=5000,
    cold_timeout_ms=5000,
)


def check_block(block: str, ctx: ctxcore.AssembledContext) -> None:
    parser = etree.XMLParser(recover=False, resolve_entities=False, no_network=True, load_dtd=False)
    root = etree.fromstring(block.encode(), parser)
    if ctx.memory_format == "compact":
        assert root.text == "\n" + ctxcore.formatting.COMPACT_SAFETY_SENTENCE + "\n"
        # Each element's first attribute is its handle, holding the nonce.
        assert [ctx.handles[el.keys()[0]] for el in root] == list(ctx.selected_ids)
        assert all(el.tag == "m" and el.get(el.keys()[0]) == ctx.nonce for el in root)
    else:
        assert root.text == "\n" + ctxcore.SAFETY_SENTENCE + "\n"
        assert [el.get("id") for el in root] == list(ctx.selected_ids)
        assert all(el.get("nonce") == ctx.nonce for el in root)


def test_adapters_stay_out_of_the_core_import_path() -> None:
    code = "import sys, ctxcore; print(any(m.split('.')[0] in ('langchain_core', 'llama_index') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- LangChain ---------------------------------------------------------------------------------


def lc_conversation(m: ModuleType) -> list[Any]:
    return [
        m.SystemMessage("Answer in English.", additional_kwargs={"__openai_role__": "developer"}),
        m.HumanMessage("Where is order 7?"),
        m.AIMessage("", tool_calls=[{"name": "lookup_order", "args": {"id": 7}, "id": "call_1"}]),
        m.ToolMessage("not found", tool_call_id="call_1", status="error"),
        m.AIMessage("I could not find it."),
        m.HumanMessage(["It is order 8.", {"type": "text", "text": "Sorry."}]),
    ]


def test_langchain_messages_in() -> None:
    m = framework("langchain_core.messages")
    from ctxcore.adapters.langchain import from_langchain

    assert from_langchain(lc_conversation(m)) == (
        Message("developer", "Answer in English."),
        Message("user", "Where is order 7?"),
        Message("assistant", "", (ToolCall("call_1", "lookup_order", '{"id": 7}'),)),
        Message("tool", "not found", tool_call_id="call_1", is_error=True),
        Message("assistant", "I could not find it."),
        Message("user", parts=("It is order 8.", "Sorry.")),
    )
    with pytest.raises(ValueError, match=r"messages\[1\]: content\[0\] is a 'image_url' part"):
        from_langchain([m.HumanMessage("a"), m.HumanMessage([{"type": "image_url", "image_url": {"url": "u"}}])])


def test_langchain_messages_out() -> None:
    m = framework("langchain_core.messages")
    from ctxcore.adapters.langchain import from_langchain, to_langchain

    req = AssemblyRequest(
        ORG,
        AGENT,
        "gpt-4o",
        Query("order 8"),
        messages=from_langchain(lc_conversation(m)),
        options=AssemblyOptions(rendering="openai"),
    )
    ctx = asyncio.run(ctxcore.assemble(req, sources=sources(), config=ROOMY))
    out = to_langchain(ctx)
    assert isinstance(out[0], m.SystemMessage) and out[0].content == "You are the support agent of Acme."
    assert isinstance(out[-1], m.HumanMessage)
    check_block(out[-1].content, ctx)
    # The history goes back as it came (the error status has no OpenAI field: it is the
    # one thing the Chat Completions shape cannot carry).
    back = from_langchain(out[1:-1])
    assert back[:3] == ctx.messages[:3] and back[4:] == ctx.messages[4:]
    assert back[3] == Message("tool", "not found", tool_call_id="call_1")
    assert out[3].tool_calls == [{"name": "lookup_order", "args": {"id": 7}, "id": "call_1", "type": "tool_call"}]


def test_langchain_runnable_where_trim_messages_would_go() -> None:
    m = framework("langchain_core.messages")
    fake = framework("langchain_core.language_models.fake_chat_models")
    from ctxcore.adapters.langchain import assembler

    long = "The order history goes on and on. " * 400  # ~2,800 tokens a message: gpt-4 holds two
    conversation: list[Any] = []
    for k in range(6):
        conversation += [
            m.HumanMessage(f"Question {k}: {long}"),
            m.AIMessage("", tool_calls=[{"name": "lookup_order", "args": {"id": k}, "id": f"call_{k}"}]),
            m.ToolMessage(f"order {k}: shipped", tool_call_id=f"call_{k}"),
            m.AIMessage(f"Answer {k}."),
        ]
    conversation.append(m.HumanMessage("And the refund?"))
    seen: list[list[Any]] = []

    class Recording(fake.GenericFakeChatModel):  # type: ignore[misc, name-defined]
        async def _agenerate(self, messages: list[Any], *a: Any, **kw: Any) -> Any:
            seen.append(messages)
            return await super()._agenerate(messages, *a, **kw)

    prepare = assembler(sources=sources(), organization_id=ORG, agent_id=AGENT, model="gpt-4", config=ROOMY)
    chain = prepare | Recording(messages=iter([m.AIMessage("Refunds take 5 days.")]))
    reply = asyncio.run(chain.ainvoke(conversation))
    assert reply.content == "Refunds take 5 days."
    sent = seen[0]
    assert 3 < len(sent) < len(conversation)  # trimmed to the window
    assert sent[-2].content == "And the refund?"  # the latest user turn, then the memories
    check_tool_pairs(
        [
            Message("assistant", tool_calls=tuple(ToolCall(c["id"], c["name"]) for c in x.tool_calls))
            if isinstance(x, m.AIMessage) and x.tool_calls
            else Message("tool", str(x.content), tool_call_id=x.tool_call_id)
            if isinstance(x, m.ToolMessage)
            else Message("user", "x")
            for x in sent[1:-1]
        ]
    )
    # The sync path gives the same messages (apart from the fresh nonce).
    again = prepare.invoke(conversation)
    assert [type(x) for x in again] == [type(x) for x in sent]


# ---- LlamaIndex ----------------------------------------------------------------------------------


def li_conversation(llms: ModuleType) -> list[Any]:
    ChatMessage, R = llms.ChatMessage, llms.MessageRole
    return [
        ChatMessage(role=R.SYSTEM, content="Answer in English."),
        ChatMessage(role=R.USER, content="Where is order 7?"),
        ChatMessage(
            role=R.ASSISTANT,
            content="",
            additional_kwargs={
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"id": 7}'}}
                ]
            },
        ),
        ChatMessage(role=R.TOOL, content="shipped", additional_kwargs={"tool_call_id": "call_1"}),
        ChatMessage(role=R.ASSISTANT, content="It shipped."),
        ChatMessage(role=R.USER, blocks=[llms.TextBlock(text="Thanks."), llms.TextBlock(text="Refund?")]),
    ]


def test_llamaindex_messages_in_and_out() -> None:
    llms = framework("llama_index.core.llms")
    from ctxcore.adapters.llamaindex import from_llamaindex, to_llamaindex

    msgs = from_llamaindex(li_conversation(llms))
    assert msgs == (
        Message("system", "Answer in English."),
        Message("user", "Where is order 7?"),
        Message("assistant", "", (ToolCall("call_1", "lookup_order", '{"id": 7}'),)),
        Message("tool", "shipped", tool_call_id="call_1"),
        Message("assistant", "It shipped."),
        Message("user", parts=("Thanks.", "Refund?")),
    )
    req = AssemblyRequest(
        ORG,
        AGENT,
        "gpt-4o",
        Query("refund"),
        messages=msgs,
        options=AssemblyOptions(rendering="openai", history_policy=HistoryPolicy.TRIM_OLDEST),
    )
    ctx = asyncio.run(ctxcore.assemble(req, sources=sources(), config=ROOMY))
    out = to_llamaindex(ctx)
    assert out[0].role == llms.MessageRole.SYSTEM and out[0].content == "You are the support agent of Acme."
    assert from_llamaindex(out[1:-1]) == ctx.messages
    assert out[-1].role == llms.MessageRole.USER
    check_block(out[-1].content, ctx)
    with pytest.raises(ValueError, match=r"messages\[0\]: content\[0\] is a 'image' part"):
        from_llamaindex([llms.ChatMessage(role="user", blocks=[llms.ImageBlock(url="https://x.test/a.png")])])
    assert json.dumps([m.model_dump(mode="json") for m in out])  # plain data all the way down
    assert [m.role for m in ctx.messages][-1] == Role.USER
