"""The payload renderings: `AssembledContext.to_openai()` / `to_anthropic()`.

Every payload is checked against the official SDKs' request types (``openai`` and
``anthropic`` from PyPI; a strict structural check of their TypedDicts: unknown keys,
missing required keys and wrong literals all fail) and, for fixed examples, handed to the
SDKs' own ``create`` calls over an in-process HTTP transport (no network), which must send
exactly the payload. Random histories with tool calls (hypothesis) check the round trip,
that tool calls and their results are never split, that the latest user turn stays, and
that the exact count of the payload by the provider's rule stays within window - reserve.
The memories block inside a payload passes the strict-XML and adversarial checks of the
text rendering, and a simulated conversation shows each turn's payload starting with the
previous turn's stable prefix.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lxml import etree
from payload_support import check_anthropic, check_openai
from testkit import REPO, adversarial_corpus, load_script

import ctxcore
from ctxcore import AssemblyOptions, AssemblyRequest, MemoryRecord, Message, Query, Sources, ToolCall
from ctxcore.payloads import count_anthropic, count_openai, render_anthropic, render_openai
from ctxcore.request import HistoryPolicy, Rendering, Role, check_tool_pairs, parse_messages

ORG, AGENT = "org-1", "agent-1"
DATA = Path(__file__).resolve().parents[1] / "data"


def exact(text: str) -> int:
    return ctxcore.count_tokens(text, "cl100k_base").value


# ---- a strict check against the SDKs' request types ---------------------------------------


def test_the_checker_refuses_what_the_sdk_types_refuse() -> None:
    for bad in (
        {"messages": [{"role": "user", "content": "x", "junk": 1}]},
        {"messages": [{"role": "tool", "content": "x"}]},  # no tool_call_id
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [], "tools": [{"name": "f", "input_schema": {}}]},  # an Anthropic tool
    ):
        with pytest.raises(AssertionError):
            check_openai(bad)
    for bad in (
        {"messages": [{"role": "user", "content": [{"type": "tool_call", "id": "x"}]}]},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]},  # an OpenAI tool
    ):
        with pytest.raises(AssertionError):
            check_anthropic(bad)


# ---- helpers ---------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order by its number.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "integer", "description": "the order number"}},
                "required": ["id"],
            },
        },
    },
    {
        "name": "refund",
        "description": "Refund an order.",
        "input_schema": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "reason": {"type": "string", "enum": ["damaged", "late", "other"]},
            },
        },
    },
]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer in English."},
    {"role": "user", "content": "Where is order 7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"id": 7}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "shipped <2024-05-01> & on its way"},
    {"role": "assistant", "content": "It shipped on May 1st."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks."}, {"type": "text", "text": "Can I get a refund?"}]},
]


def memories(n: int, text: str = "Refunds take 5 business days; the customer prefers email.") -> list[MemoryRecord]:
    return [MemoryRecord(f"m{i}", ORG, AGENT, f"{text} ({i})", similarity=0.95 - 0.001 * i) for i in range(n)]


def sources(mems: Sequence[MemoryRecord] = (), directive: str | None = "You are the support agent of Acme.") -> Sources:
    async def hot(scope: Any, query: Any, limit: int) -> list[MemoryRecord]:
        return list(mems)[:limit]

    async def direct(scope: Any) -> str | None:
        return directive

    return Sources(directive=direct, hot=hot)


ROOMY = ctxcore.AssemblyConfig(
    client_timeout_ms=5000,
    server_deadline_ms=5000,
    directive_timeout_ms=5000,
    hot_timeout_ms=5000,
    cold_timeout_ms=5000,
)


def assemble(
    model: str,
    messages: Sequence[Any],
    *,
    rendering: str,
    mems: Sequence[MemoryRecord] = (),
    tools: Sequence[Any] = (),
    policy: HistoryPolicy = HistoryPolicy.STRICT,
    directive: str | None = "You are the support agent of Acme.",
) -> ctxcore.AssembledContext:
    req = AssemblyRequest(
        ORG,
        AGENT,
        model,
        Query("refund"),
        messages=tuple(messages),
        tools=tuple(tools),
        options=AssemblyOptions(rendering=rendering, history_policy=policy, max_memories=500),
    )
    return asyncio.run(ctxcore.assemble(req, sources=sources(mems, directive), config=ROOMY))


def strict_parse(fragment: str) -> Any:
    parser = etree.XMLParser(recover=False, resolve_entities=False, no_network=True, load_dtd=False, huge_tree=True)
    return etree.fromstring(fragment.encode("utf-8"), parser)


def xml_char(c: str) -> bool:
    o = ord(c)
    return o in (0x9, 0xA, 0xD) or 0x20 <= o <= 0xD7FF or 0xE000 <= o <= 0xFFFD or 0x10000 <= o <= 0x10FFFF


def expected(s: str) -> str:
    return "".join(c if xml_char(c) else "\ufffd" for c in s)


def check_memory_block(block: str, ctx: ctxcore.AssembledContext, texts: dict[str, str]) -> None:
    """The memories block parses strictly and gives back each selected memory exactly."""
    assert block == ctx.sections["memories"]
    root = strict_parse(block)
    assert root.tag == "memories"
    children = list(root)
    assert sum(1 for _ in root.iter()) == len(children) + 1  # nothing but memory elements
    if ctx.memory_format == "compact":
        assert root.text == "\n" + ctxcore.formatting.COMPACT_SAFETY_SENTENCE + "\n"
        # Each element's first attribute is its handle, holding the nonce.
        assert [el.keys()[0] for el in children] == [f"m{k + 1}" for k in range(len(children))]
        assert [ctx.handles[el.keys()[0]] for el in children] == list(ctx.selected_ids)
        tag = "m"
    else:
        assert root.text == "\n" + ctxcore.SAFETY_SENTENCE + "\n"
        assert [el.get("id") for el in children] == [expected(i) for i in ctx.selected_ids]
        tag = "memory"
    for el, mid in zip(children, ctx.selected_ids):
        nonce_attr = el.keys()[0] if ctx.memory_format == "compact" else "nonce"
        assert el.tag == tag and el.get(nonce_attr) == ctx.nonce
        assert (el.text or "") == expected(texts[mid])


def memory_block_of(payload: dict[str, Any], rendering: str) -> str | None:
    if rendering == "openai":
        last = payload["messages"][-1] if payload["messages"] else None
        return (
            last["content"]
            if last
            and last["role"] == "user"
            and isinstance(last["content"], str)
            and last["content"].startswith("<memories>")
            else None
        )
    turns = payload["messages"]
    if not turns or turns[-1]["role"] != "user":
        return None
    block = turns[-1]["content"][-1]
    return block["text"] if block["type"] == "text" and block["text"].startswith("<memories>") else None


# ---- fixed examples ---------------------------------------------------------------------------


def test_openai_payload_of_a_conversation_with_tool_calls() -> None:
    ctx = assemble("gpt-4o", CONVERSATION, rendering="openai", mems=memories(3), tools=TOOLS)
    p = ctx.to_openai()
    check_openai(p)
    assert set(p) == {"messages", "tools"}
    msgs = p["messages"]
    assert msgs[0] == {"role": "system", "content": "You are the support agent of Acme."}
    assert msgs[1:7] == [
        {"role": "developer", "content": "Answer in English."},
        {"role": "user", "content": "Where is order 7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"id": 7}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "shipped <2024-05-01> & on its way"},
        {"role": "assistant", "content": "It shipped on May 1st."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Thanks."}, {"type": "text", "text": "Can I get a refund?"}],
        },
    ]
    assert msgs[7]["role"] == "user" and len(msgs) == 8
    check_memory_block(msgs[7]["content"], ctx, {m.id: m.text for m in memories(3)})
    assert p["tools"][0] == TOOLS[0]
    assert p["tools"][1] == {
        "type": "function",
        "function": {"name": "refund", "description": "Refund an order.", "parameters": TOOLS[1]["input_schema"]},
    }
    # The reasoning models take instructions as a developer message.
    assert assemble("o3", CONVERSATION, rendering="openai").to_openai()["messages"][0]["role"] == "developer"
    assert ctx.to_openai(directive_role="developer")["messages"][0]["role"] == "developer"


def test_anthropic_payload_of_a_conversation_with_tool_calls() -> None:
    ctx = assemble("claude-sonnet-4-5", CONVERSATION, rendering="anthropic", mems=memories(3), tools=TOOLS)
    p = ctx.to_anthropic()
    check_anthropic(p)
    assert set(p) == {"system", "messages", "tools"}
    assert p["system"] == [
        {"type": "text", "text": "You are the support agent of Acme."},
        {"type": "text", "text": "Answer in English."},
    ]
    turns = p["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[1]["content"] == [{"type": "tool_use", "id": "call_1", "name": "lookup_order", "input": {"id": 7}}]
    assert turns[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "shipped <2024-05-01> & on its way"}
    ]
    last = turns[4]["content"]
    assert last[:2] == [
        {"type": "text", "text": "Thanks."},
        {"type": "text", "text": "Can I get a refund?", "cache_control": {"type": "ephemeral"}},
    ]
    assert len(last) == 3
    check_memory_block(last[2]["text"], ctx, {m.id: m.text for m in memories(3)})
    assert p["tools"][1] == TOOLS[1]
    assert p["tools"][0] == {
        "name": "lookup_order",
        "description": "Look up an order by its number.",
        "input_schema": TOOLS[0]["function"]["parameters"],
    }
    assert "cache_control" not in json.dumps(ctx.to_anthropic(cache_breakpoint=False))


def _mock_client(kind: str, sent: list[dict[str, Any]]) -> Any:
    # Each SDK's own HTTP library (the Anthropic SDK moved to httpx2), with an in-process
    # transport: the SDK's real request path, no network.
    http_lib: Any = httpx if kind == "openai" else httpx2

    def handler(request: Any) -> Any:
        sent.append(json.loads(request.content))
        if kind == "openai":
            return http_lib.Response(
                200,
                json={
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "gpt-4o",
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
                    ],
                },
            )
        return http_lib.Response(
            200,
            json={
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        )

    http = http_lib.Client(transport=http_lib.MockTransport(handler))
    if kind == "openai":
        return openai.OpenAI(api_key="test", base_url="http://sdk.test/v1", http_client=http, max_retries=0)
    return anthropic.Anthropic(api_key="test", base_url="http://sdk.test", http_client=http, max_retries=0)


def test_the_sdks_send_the_payloads_as_they_are() -> None:
    sent: list[dict[str, Any]] = []
    ctx = assemble("gpt-4o", CONVERSATION, rendering="openai", mems=memories(2), tools=TOOLS)
    answer = _mock_client("openai", sent).chat.completions.create(model="gpt-4o", **ctx.to_openai())
    assert answer.choices[0].message.content == "ok"
    assert sent[-1] == {"model": "gpt-4o", **ctx.to_openai()}
    ctx = assemble("claude-opus-4-1", CONVERSATION, rendering="anthropic", mems=memories(2), tools=TOOLS)
    with warnings.catch_warnings():
        # The SDK warns about model names it lists as deprecated; the payload is the subject here.
        warnings.simplefilter("ignore", DeprecationWarning)
        reply = _mock_client("anthropic", sent).messages.create(
            model="claude-opus-4-1", max_tokens=512, **ctx.to_anthropic()
        )
    assert reply.content[0].type == "text"
    assert sent[-1] == {"model": "claude-opus-4-1", "max_tokens": 512, **ctx.to_anthropic()}


def test_surrogates_are_written_as_utf8_can_carry_them_and_the_sdks_send_them() -> None:
    # A lone surrogate (text decoded with errors="surrogateescape", a JSON "\\ud800") has no
    # UTF-8 form: the payload carries U+FFFD, a pair the character it encodes, as tiktoken
    # counts them, so the exact count stays within the ledger.
    history = [
        Message("user", "order 4\ud800 arrived broken"),
        Message(
            "assistant", parts=("Checking \ud83d\ude00.",), tool_calls=(ToolCall("c1", "lookup", '{"q": "\\udfff"}'),)
        ),
        Message("tool", "status \udc80", tool_call_id="c1"),
        Message("user", "refund?"),
    ]
    tool = {"name": "lookup", "description": "Look \ud800 up.", "parameters": {"type": "object"}}
    for model, rendering in (("gpt-4o", "openai"), ("gpt-4", "anthropic")):
        ctx = assemble(model, history, rendering=rendering, mems=memories(2), tools=[tool], directive="Be \udbff kind.")
        payload = ctx.to_openai() if rendering == "openai" else ctx.to_anthropic()
        wire = json.dumps(payload, ensure_ascii=False)
        assert "\ufffd" in wire and "\U0001f600" in wire
        wire.encode("utf-8")  # no surrogate left
        family = ctx.budget.tokenizer_family
        count = lambda t: ctxcore.count_tokens(t, family).value  # noqa: E731
        sent: list[dict[str, Any]] = []
        if rendering == "openai":
            _mock_client("openai", sent).chat.completions.create(model=model, **payload)
            n = count_openai(payload, count, model=model).total
        else:
            _mock_client("anthropic", sent).messages.create(model="claude-sonnet-4-5", max_tokens=64, **payload)
            n = count_anthropic(payload, count, model=model).total
            assert payload["messages"][1]["content"][1]["input"] == {"q": "\ufffd"}  # a JSON "\\udfff"
        assert sent and sent[-1]["messages"] == payload["messages"]
        assert ctx.prompt_tokens is not None and n <= ctx.prompt_tokens.value


def test_anthropic_payload_has_no_whitespace_only_text_blocks() -> None:
    # The Messages API refuses a text block of whitespace alone (400 "text content blocks
    # must contain non-whitespace text"): such texts say nothing and are left out.
    history = [
        Message("system", " \n"),
        Message("user", "Where is order 7?"),
        Message("assistant", "\n\n", tool_calls=(ToolCall("c1", "lookup", '{"order": 7}'),)),
        Message("tool", "\t", tool_call_id="c1"),
        Message("user", parts=(" ", "Thanks.")),
        Message("assistant", " \t"),
        Message("user", "Refund?"),
    ]
    ctx = assemble("claude-sonnet-4-5", history, rendering="anthropic", mems=memories(1), directive="  ")
    p = ctx.to_anthropic()
    check_anthropic(p)
    assert "system" not in p
    texts = [b["text"] for t in p["messages"] for b in t["content"] if b["type"] == "text"]
    assert texts[:-1] == ["Where is order 7?", "Thanks.", "Refund?"]
    assert all(says_something(t) for t in texts)
    result = p["messages"][2]["content"][0]
    assert result == {"type": "tool_result", "tool_use_id": "c1"}
    assert [t["role"] for t in p["messages"]] == ["user", "assistant", "user"]
    assert ctx.prompt_tokens is not None


def test_anthropic_input_round_trips_and_renders_for_openai() -> None:
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Refund order 7 and 9."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking both up."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup_order", "input": {"id": 7}},
                {"type": "tool_use", "id": "toolu_2", "name": "lookup_order", "input": {"id": 9}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "delivered"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "lost"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Go ahead."},
            ],
        },
    ]
    msgs = parse_messages(history)
    assert [m.role for m in msgs] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.USER]
    assert msgs[3].is_error and msgs[3].parts == ("lost",)
    p = render_anthropic(messages=msgs, cache_breakpoint=False)
    assert p["messages"] == history  # block for block
    o = render_openai(messages=msgs)
    check_openai(o)
    assert [m["role"] for m in o["messages"]] == ["user", "assistant", "tool", "tool", "user"]
    assert o["messages"][1]["tool_calls"][1]["function"] == {"name": "lookup_order", "arguments": '{"id": 9}'}
    assert parse_messages(o["messages"])[1:] == tuple(replace(m, is_error=False) for m in msgs[1:])


# ---- wider input, refused input ------------------------------------------------------------------


def test_media_parts_are_refused_naming_the_message_and_the_part() -> None:
    with pytest.raises(ValueError, match=r"messages\[1\]: content\[1\] is a 'image_url' part"):
        AssemblyRequest(
            ORG,
            AGENT,
            "gpt-4o",
            Query("q"),
            messages=(
                {"role": "user", "content": "hi"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                    ],
                },
            ),
        )
    with pytest.raises(ValueError, match=r"messages\[0\]: content\[0\] is a 'image' part"):
        parse_messages([{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}])
    with pytest.raises(ValueError, match=r"content\[0\]\.content\[0\] is a 'image' part"):
        parse_messages(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}
                    ],
                }
            ]
        )


def test_unpaired_tool_calls_and_results_are_refused_for_payloads() -> None:
    orphan = ({"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "42"})
    AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), messages=orphan)  # the text rendering writes them as text
    with pytest.raises(ValueError, match=r"messages\[1\]: the tool result for 'c9'"):
        AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), messages=orphan, options=AssemblyOptions(rendering="openai"))
    unanswered = (
        Message("assistant", tool_calls=(ToolCall("a", "f"), ToolCall("b", "f"))),
        Message("tool", "1", tool_call_id="a"),
        Message("user", "x"),
    )
    with pytest.raises(ValueError, match=r"messages\[0\]: the tool call\(s\) \['b'\]"):
        check_tool_pairs(unanswered)
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]: arguments must be a JSON object"):
        AssemblyRequest(
            ORG,
            AGENT,
            "claude-sonnet-4",
            Query("q"),
            messages=(
                Message("assistant", tool_calls=(ToolCall("a", "f", "[1]"),)),
                Message("tool", "1", tool_call_id="a"),
            ),
            options=AssemblyOptions(rendering="anthropic"),
        )


@pytest.mark.parametrize("arguments", ['{"x": NaN}', '{"x": [1, -Infinity]}', '{"x": {"y": 1e400}}'])
def test_tool_arguments_without_a_json_form_are_refused_for_anthropic(arguments: str) -> None:
    # Python's JSON reader takes these, but the request body cannot carry them: the SDK
    # would fail at send time ("Out of range float values are not JSON compliant").
    history = (
        Message("assistant", tool_calls=(ToolCall("a", "f", arguments),)),
        Message("tool", "1", tool_call_id="a"),
        Message("user", "x"),
    )
    with pytest.raises(
        ValueError, match=r"messages\[0\]\.tool_calls\[0\]: arguments hold .* a number JSON cannot carry"
    ):
        AssemblyRequest(
            ORG, AGENT, "claude-sonnet-4", Query("q"), messages=history, options=AssemblyOptions(rendering="anthropic")
        )
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]: arguments hold"):
        render_anthropic(messages=history)
    mapped = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {"x": float("nan")}}],
    }
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]: arguments hold 'NaN'"):
        AssemblyRequest(
            ORG,
            AGENT,
            "claude-sonnet-4",
            Query("q"),
            messages=(mapped, *history[1:]),
            options=AssemblyOptions(rendering="anthropic"),
        )
    assert render_openai(messages=history)["messages"][0]["tool_calls"][0]["function"]["arguments"] == arguments


def test_tool_arguments_with_a_number_too_long_to_read_are_named() -> None:
    history = (
        Message("assistant", tool_calls=(ToolCall("a", "f", '{"x": 1' + "0" * 5000 + "}"),)),
        Message("tool", "1", tool_call_id="a"),
        Message("user", "x"),
    )
    match = r"^messages\[0\]\.tool_calls\[0\]: arguments hold a number too long to read \(integers may have at most"
    with pytest.raises(ValueError, match=match):
        AssemblyRequest(
            ORG, AGENT, "claude-sonnet-4", Query("q"), messages=history, options=AssemblyOptions(rendering="anthropic")
        )
    with pytest.raises(ValueError, match=match):
        render_anthropic(messages=history)


def test_tools_that_a_rendering_cannot_carry_are_refused() -> None:
    with pytest.raises(ValueError, match=r"tools\[0\]: an Anthropic 'web_search_20250305' tool"):
        AssemblyRequest(
            ORG,
            AGENT,
            "gpt-4o",
            Query("q"),
            tools=({"type": "web_search_20250305", "name": "w", "input_schema": {}},),
            options=AssemblyOptions(rendering="openai"),
        )
    strict = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    assert render_openai(tools=[strict])["tools"] == [strict]
    cached = {"name": "g", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}
    with pytest.raises(
        ValueError, match=r"tools\[0\] \('g'\): \['cache_control'\] cannot be carried by an OpenAI tool"
    ):
        render_openai(tools=[cached])
    with pytest.raises(ValueError, match=r"tools\[1\]: not a function tool"):
        render_openai(tools=[strict, {"type": "code_interpreter"}])


def test_tools_of_one_name_are_refused_for_anthropic() -> None:
    # The Messages API answers 400 "tools: Tool names must be unique"; in whatever shape
    # each arrived, two tools named alike are refused, naming both.
    tools = (
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"name": "g", "input_schema": {"type": "object"}},
        {"name": "f", "input_schema": {"type": "object"}},
    )
    match = r"tools\[2\] \('f'\): tools\[0\] has the same name"
    with pytest.raises(ValueError, match=match):
        AssemblyRequest(
            ORG, AGENT, "claude-sonnet-4", Query("q"), tools=tools, options=AssemblyOptions(rendering="anthropic")
        )
    with pytest.raises(ValueError, match=match):
        render_anthropic(messages=[Message("user", "hi")], tools=tools)
    assert [t["function"]["name"] for t in render_openai(messages=[Message("user", "hi")], tools=tools)["tools"]] == [
        "f",
        "g",
        "f",
    ]
    AssemblyRequest(
        ORG, AGENT, "claude-sonnet-4", Query("q"), tools=tools[:2], options=AssemblyOptions(rendering="anthropic")
    )


def test_tool_calls_of_one_id_are_refused_for_anthropic() -> None:
    # The Messages API answers 400 "`tool_use` ids must be unique" across the conversation.
    history = (
        Message("assistant", tool_calls=(ToolCall("c1", "f"),)),
        Message("tool", "1", tool_call_id="c1"),
        Message("user", "again"),
        Message("assistant", tool_calls=(ToolCall("c2", "f"), ToolCall("c1", "f"))),
        Message("tool", "2", tool_call_id="c2"),
        Message("tool", "3", tool_call_id="c1"),
        Message("user", "x"),
    )
    match = r"messages\[3\]\.tool_calls\[1\]: the tool call id 'c1' is also messages\[0\]\.tool_calls\[0\]'s"
    with pytest.raises(ValueError, match=match):
        AssemblyRequest(
            ORG, AGENT, "claude-sonnet-4", Query("q"), messages=history, options=AssemblyOptions(rendering="anthropic")
        )
    with pytest.raises(ValueError, match=match):
        render_anthropic(messages=history)
    check_openai(render_openai(messages=history))
    AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), messages=history, options=AssemblyOptions(rendering="openai"))


def test_strict_tools_keep_strict_in_both_renderings() -> None:
    # Both APIs take strict (OpenAI's function.strict, Anthropic's ToolParam.strict).
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
        "additionalProperties": False,
    }
    shapes = [
        {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}},
        {"name": "f", "parameters": schema, "strict": True},
        {"name": "f", "input_schema": schema, "strict": True},
    ]
    for tool in shapes:
        oa = render_openai(messages=[Message("user", "hi")], tools=[tool])
        check_openai(oa)
        assert oa["tools"] == [{"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}]
        an = render_anthropic(messages=[Message("user", "hi")], tools=[tool], cache_breakpoint=False)
        check_anthropic(an)
        assert an["tools"] == [{"name": "f", "input_schema": schema, "strict": True}]
        for rendering in ("openai", "anthropic"):
            ctx = assemble("gpt-4o", [Message("user", "hi")], rendering=rendering, tools=[tool])
            assert ctx.budget.tool_schema_tokens > 0
    with pytest.raises(ValueError, match=r"tools\[0\]: tool 'f': strict must be a bool, got str"):
        AssemblyRequest(
            ORG,
            AGENT,
            "gpt-4o",
            Query("q"),
            tools=({"name": "f", "input_schema": schema, "strict": "yes"},),
            options=AssemblyOptions(rendering="anthropic"),
        )


def test_developer_role_and_parts_are_messages_of_their_own() -> None:
    m = Message.from_mapping(
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    )
    assert (m.role, m.parts, m.content) == (Role.DEVELOPER, ("a", "b"), "a\nb")
    with pytest.raises(ValueError, match="parse_messages"):
        Message.from_mapping(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                    {"type": "tool_result", "tool_use_id": "b", "content": "2"},
                ],
            }
        )
    with pytest.raises(ValueError, match=r"content\[1\]: tool_result blocks must come first"):
        parse_messages(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "x"},
                        {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                    ],
                }
            ]
        )


# ---- the counting rules, on fixed examples -------------------------------------------------------

# The OpenAI Cookbook's example ("How to count tokens with tiktoken"): 129 prompt tokens
# for gpt-4 / gpt-3.5-turbo, as its num_tokens_from_messages and the API both report.
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon "
        "into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch "
        "base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]
COOKBOOK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_TOOL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


def cookbook_tools_rule(functions: list[dict[str, Any]], messages: list[dict[str, Any]], func_init: int) -> int:
    """`num_tokens_for_tools` from the cookbook, transcribed (the oracle)."""
    n = 0
    for f in functions:
        n += func_init
        fn = f["function"]
        n += exact(fn["name"] + ":" + fn["description"].removesuffix("."))
        props = fn["parameters"]["properties"]
        if props:
            n += 3
            for key, p in props.items():
                n += 3
                if "enum" in p:
                    n += -3
                    for item in p["enum"]:
                        n += 3 + exact(item)
                n += exact(f"{key}:{p['type']}:{p['description'].removesuffix('.')}")
    n += 12
    base = sum(3 + sum(exact(v) for v in m.values()) + (1 if "name" in m else 0) for m in messages) + 3
    return n + base


def test_openai_rule_reproduces_the_cookbook_figures() -> None:
    assert count_openai({"messages": COOKBOOK_MESSAGES}, exact, model="gpt-4").total == 129
    oracle = cookbook_tools_rule(COOKBOOK_TOOLS, COOKBOOK_TOOL_MESSAGES, func_init=10)
    assert oracle == 105  # the cookbook's figure for gpt-4
    ours = count_openai({"messages": COOKBOOK_TOOL_MESSAGES, "tools": COOKBOOK_TOOLS}, exact, model="gpt-4")
    assert ours.total >= oracle  # never less than the rule; more where the JSON carries more
    assert ours.framing == 3 * 2 + exact("system") + exact("user") + 3 + 10 + 12


def test_openai_rule_counts_what_the_cookbook_leaves_out_as_json() -> None:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    t = count_openai({"messages": [call]}, exact)
    assert t.messages == exact(json.dumps(call["tool_calls"], separators=(",", ":")))
    parts = {"role": "user", "content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}]}
    t = count_openai({"messages": [parts]}, exact)
    assert (t.messages, t.framing) == (exact("a b") + exact("c"), 3 + exact("user") + 1 + 3)


def test_anthropic_rule_on_a_fixed_example() -> None:
    words = lambda t: len(t.split()) + t.count("\n")  # noqa: E731 - a counter that is easy to follow
    p = {
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi there", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    }
    t = count_anthropic(p, words, model="claude-sonnet-4")
    assert t.system == 2 and t.messages == 2 + 1
    assert t.tools == words('{"name":"f","input_schema":{"type":"object"}}')
    human, assistant, reply = words("\n\nHuman: "), words("\n\nAssistant: "), words("\n\nAssistant:")
    assert t.framing == human + assistant + reply + 346  # the tool-use system prompt of Claude Sonnet 4
    assert count_anthropic(p, words, model="claude-3-opus").framing == human + assistant + reply + 530


def test_the_ledger_carries_the_framing_of_the_rendering_asked_for() -> None:
    text = assemble("gpt-4", CONVERSATION, rendering="text", tools=TOOLS)
    oa = assemble("gpt-4", CONVERSATION, rendering="openai", tools=TOOLS)
    an = assemble("gpt-4", CONVERSATION, rendering="anthropic", tools=TOOLS)
    assert text.framing_tokens == 0 and text.rendering is Rendering.TEXT
    assert oa.rendering is Rendering.OPENAI and an.rendering is Rendering.ANTHROPIC
    # Counted as the ledger counts: exactly, since cl100k_base has its tokenizer installed.
    exact = oa.budget.estimate_kind is ctxcore.TokenKind.EXACT
    est = ctxcore.payloads._counter("cl100k_base", exact)
    # Without memories the payload's own count by the rule is what the ledger holds for it.
    fixed = count_openai(oa.to_openai(), est, model="gpt-4")
    b = oa.budget
    assert b.directive_tokens == est("You are the support agent of Acme.")
    assert b.tool_schema_tokens == fixed.tools
    # The directive's role is priced as the dearer of system / developer (the caller picks).
    role_extra = max(est("system"), est("developer")) - est("system")
    assert oa.framing_tokens == fixed.framing + role_extra + 3 + est("user")  # + the memory message's framing
    # The memories section's tags and safety sentence.
    if exact:
        frame = ctxcore.formatter_overhead((), count=est, memory_format=oa.memory_format).fixed_tokens
    else:
        frame = ctxcore.formatter_overhead((), family="cl100k_base", memory_format=oa.memory_format).fixed_tokens
    assert (
        b.directive_tokens + b.messages_tokens + b.tool_schema_tokens + b.formatter_overhead_tokens
        == fixed.total + role_extra + 3 + est("user") + frame
    )
    # Each message carries its own framing in the messages term: trimming takes it off with it.
    per_message = [ctxcore.payloads.message_tokens(m, Rendering.OPENAI, est) for m in oa.messages]
    assert b.messages_tokens == sum(c + f for c, f in per_message)
    assert an.framing_tokens >= 530 > oa.framing_tokens  # gpt-4 is not in the tool-prompt table: the largest
    assert oa.stable_prefix_tokens == fixed.total - 3 + role_extra
    assert oa.record()["rendering"] == "openai" and oa.record()["framing_tokens"] == oa.framing_tokens


# ---- random histories ------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)


@st.composite
def long_text(draw: Any) -> str:
    return draw(TEXT) * draw(st.integers(1, 120))


@st.composite
def histories(draw: Any) -> list[Message]:
    """A conversation: user turns (text or parts), assistant answers, tool rounds (an
    assistant message with 1-3 calls and their results), a developer note now and then,
    ending with the latest user turn."""
    out: list[Message] = []
    ids = iter(range(10**6))
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["user", "user_parts", "assistant", "tools", "developer"]))
        if kind == "user":
            out.append(Message("user", draw(long_text())))
        elif kind == "user_parts":
            out.append(Message("user", parts=tuple(draw(st.lists(long_text(), min_size=1, max_size=3)))))
        elif kind == "assistant":
            out.append(Message("assistant", draw(long_text())))
        elif kind == "developer":
            out.append(Message("developer", draw(long_text())))
        else:
            calls = tuple(
                ToolCall(
                    f"call_{next(ids)}",
                    draw(st.sampled_from(["lookup_order", "refund"])),
                    json.dumps({"id": draw(st.integers(0, 10**6)), "note": draw(TEXT)}, ensure_ascii=False),
                )
                for _ in range(draw(st.integers(1, 3)))
            )
            out.append(Message("assistant", draw(st.sampled_from(["", "Checking."])), calls))
            for c in calls:
                out.append(Message("tool", draw(long_text()), tool_call_id=c.id, is_error=draw(st.booleans())))
    out.append(Message("user", draw(TEXT) or "?"))  # short: the latest turn alone always fits
    return out


def is_subsequence(kept: Sequence[Message], full: Sequence[Message]) -> bool:
    it = iter(full)
    return all(any(k is f or k == f for f in it) for k in kept)


def says_something(text: str) -> bool:
    """A text the Messages API takes as a text block: not empty, not whitespace only."""
    return text.strip() != ""


def anthropic_atoms(messages: Sequence[Message]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for m in messages:
        texts = m.parts if m.parts is not None else (m.content,)
        if m.role == Role.TOOL:
            if m.parts is not None:
                body: Any = tuple(t for t in m.parts if says_something(t))
            else:
                body = m.content if says_something(m.content) else ""
            out.append(("result", m.tool_call_id, body, m.is_error))
        elif m.role in (Role.USER, Role.ASSISTANT):
            out.extend(("text", m.role.value, t) for t in texts if says_something(t))
            out.extend(("call", c.id, c.name, json.loads(c.arguments)) for c in m.tool_calls)
    return out


def payload_atoms(turns: list[dict[str, Any]], memory_block: str | None) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for t in turns:
        for b in t["content"]:
            if b["type"] == "text":
                if memory_block is not None and b["text"] == memory_block:
                    continue
                out.append(("text", t["role"], b["text"]))
            elif b["type"] == "tool_use":
                out.append(("call", b["id"], b["name"], b["input"]))
            else:
                content = b.get("content", "")
                body = tuple(x["text"] for x in content) if isinstance(content, list) else content
                out.append(("result", b["tool_use_id"], body, b.get("is_error", False)))
    return out


def check_pairs_in_payload(p: dict[str, Any], rendering: str) -> None:
    msgs = p["messages"]
    if rendering == "openai":
        for i, m in enumerate(msgs):
            if m["role"] == "tool":
                j = i - 1
                while msgs[j]["role"] == "tool":
                    j -= 1
                assert m["tool_call_id"] in {c["id"] for c in msgs[j].get("tool_calls", ())}
        return
    for a, b in zip(msgs, msgs[1:]):
        assert a["role"] != b["role"]  # roles alternate
    for i, t in enumerate(msgs):
        uses = [b["id"] for b in t["content"] if b["type"] == "tool_use"]
        if uses:
            nxt = msgs[i + 1]["content"]
            assert [b["tool_use_id"] for b in nxt[: len(uses)]] == uses and all(
                b["type"] == "tool_result" for b in nxt[: len(uses)]
            )


# One model per family with an exact tokenizer on this installation (cl100k_base today;
# o200k_base joins when its tokenizer is installed): the smallest window, so trimming happens.
EXACT_MODELS = {"cl100k_base": "gpt-4", "o200k_base": "gpt-4o"}


EXACT = [f for f in EXACT_MODELS if f in ctxcore.exact_families()]
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]


@pytest.mark.parametrize("family", EXACT)
@pytest.mark.parametrize("rendering", ["openai", "anthropic"])
@settings(max_examples=40, deadline=None, suppress_health_check=_HEALTH)
@given(history=histories(), n_memories=st.integers(0, 120), data=st.data())
def test_random_histories_round_trip_within_budget(
    family: str, rendering: str, history: list[Message], n_memories: int, data: Any
) -> None:
    check_random_history(family, rendering, history, n_memories, data)


@pytest.mark.slow
@pytest.mark.parametrize("family", EXACT)
@pytest.mark.parametrize("rendering", ["openai", "anthropic"])
@settings(max_examples=2000, deadline=None, suppress_health_check=_HEALTH)
@given(history=histories(), n_memories=st.integers(0, 120), data=st.data())
def test_random_histories_round_trip_within_budget_long(
    family: str, rendering: str, history: list[Message], n_memories: int, data: Any
) -> None:
    check_random_history(family, rendering, history, n_memories, data)


def check_random_history(family: str, rendering: str, history: list[Message], n_memories: int, data: Any) -> None:
    model = EXACT_MODELS[family]
    mems = [
        MemoryRecord(f"m{i}", ORG, AGENT, data.draw(long_text(), label="memory") or "x", similarity=0.9)
        for i in range(n_memories)
    ]
    try:
        ctx = assemble(model, history, rendering=rendering, mems=mems, tools=TOOLS, policy=HistoryPolicy.TRIM_OLDEST)
    except ctxcore.ContextOverflow as exc:
        assert "nothing left to trim" in str(exc)
        assume(False)
        return
    kept = ctx.messages
    # The kept history: a subsequence of whole groups that still holds the latest user turn.
    assert is_subsequence(kept, history)
    assert kept and kept[-1] == history[-1]
    check_tool_pairs(kept)
    dropped = sum(d.count for d in ctx.history_dropped)
    assert len(kept) + dropped == len(history)
    texts = {m.id: m.text for m in mems}
    if rendering == "openai":
        p = ctx.to_openai()
        check_openai(p)
        block = memory_block_of(p, "openai")
        body = p["messages"][1:-1] if block is not None else p["messages"][1:]
        assert parse_messages(body) == tuple(replace(m, is_error=False) for m in kept)
        n = count_openai(p, lambda t: ctxcore.count_tokens(t, family).value, model=model).total
    else:
        p = ctx.to_anthropic()
        check_anthropic(p)
        block = memory_block_of(p, "anthropic")
        assert payload_atoms(p["messages"], block) == anthropic_atoms(kept)
        assert [b["text"] for b in p["system"]] == [ctx.directive] + [
            t
            for m in kept
            if m.role in (Role.SYSTEM, Role.DEVELOPER)
            for t in (m.parts or (m.content,))
            if says_something(t)
        ]
        n = count_anthropic(p, lambda t: ctxcore.count_tokens(t, family).value, model=model).total
    check_pairs_in_payload(p, rendering)
    assert (block is not None) == bool(ctx.selected_ids)
    if block is not None:
        check_memory_block(block, ctx, texts)
    # The exact count of the payload by the provider's rule stays inside the window.
    assert n <= ctx.budget.context_window - ctx.budget.response_reserve


# ---- prompt-cache friendly ---------------------------------------------------------------------------


def openai_units(p: dict[str, Any]) -> tuple[list[Any], int]:
    """The payload in cache order (tools, then messages) and the length of its stable prefix."""
    units = [("tool", t) for t in p.get("tools", ())] + [("message", m) for m in p["messages"]]
    return units, len(units) - (1 if memory_block_of(p, "openai") is not None else 0)


def anthropic_units(p: dict[str, Any]) -> tuple[list[Any], int]:
    """Blocks in cache order (tools, system, then each turn's blocks), cache markers aside,
    and the length of the prefix ending at the cache breakpoint."""
    units: list[Any] = []
    end = 0
    for kind, blocks in [("tool", p.get("tools", ())), ("system", p.get("system", ()))] + [
        (t["role"], t["content"]) for t in p["messages"]
    ]:
        for b in blocks:
            units.append((kind, {k: v for k, v in b.items() if k != "cache_control"}))
            if "cache_control" in b:
                end = len(units)
    return units, end


@pytest.mark.parametrize("rendering", ["openai", "anthropic"])
def test_each_turn_starts_with_the_previous_turns_stable_prefix(rendering: str) -> None:
    rng = __import__("random").Random(7)
    pool = memories(40)
    history: list[Any] = []
    previous: tuple[list[Any], int] | None = None
    model = "gpt-4o" if rendering == "openai" else "claude-sonnet-4-5"
    for turn in range(8):
        history.append({"role": "user", "content": f"Question {turn}: what about order {turn}?"})
        mems = rng.sample(pool, rng.randint(0, 12))
        ctx = assemble(model, history, rendering=rendering, mems=mems, tools=TOOLS)
        # Counted as the ledger counts: exactly where the family has a tokenizer.
        est = ctxcore.payloads._counter(
            ctx.budget.tokenizer_family, ctx.budget.estimate_kind is ctxcore.TokenKind.EXACT
        )
        p = ctx.to_openai() if rendering == "openai" else ctx.to_anthropic()
        units, stable = openai_units(p) if rendering == "openai" else anthropic_units(p)
        if rendering == "anthropic":
            # The breakpoint sits on the last block before the memory block.
            assert stable == len(units) - (1 if memory_block_of(p, "anthropic") is not None else 0)
            prefix = {
                "tools": p["tools"],
                "system": p["system"],
                "messages": [
                    dict(
                        t,
                        content=[
                            b for b in t["content"] if b["type"] != "text" or not b["text"].startswith("<memories>")
                        ],
                    )
                    for t in p["messages"]
                ],
            }
            n = count_anthropic(prefix, est, model=model).total - est("\n\nAssistant:")
        else:
            n = (
                count_openai(
                    {"messages": p["messages"][: stable - len(p["tools"])], "tools": p["tools"]}, est, model=model
                ).total
                - 3
                + max(est("system"), est("developer"))
                - est("system")
            )
        assert ctx.stable_prefix_tokens == n
        if previous is not None:
            old_units, old_stable = previous
            assert units[:old_stable] == old_units[:old_stable]  # the cached prefix is unchanged
            assert stable > old_stable
        previous = (units, stable)
        if turn % 3 == 1:
            call = f"call_{turn}"
            history.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call,
                            "type": "function",
                            "function": {"name": "lookup_order", "arguments": json.dumps({"id": turn})},
                        }
                    ],
                }
            )
            history.append({"role": "tool", "tool_call_id": call, "content": f"order {turn}: shipped"})
        history.append({"role": "assistant", "content": f"Answer {turn}."})


# ---- the memory block keeps every guarantee in every rendering -------------------------------------


CORPUS = adversarial_corpus()


def PACKABLE(memory_id: str) -> bool:
    """The packer refuses ids with lone surrogates (InvalidCandidate); the serializer's own
    tests cover those ids, the payload tests take the memories a store can return."""
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in memory_id)


@pytest.mark.parametrize("rendering", ["openai", "anthropic"])
def test_adversarial_corpus_inside_payloads(rendering: str) -> None:
    small = [m for m in CORPUS if len(m["text"]) < 20_000 and PACKABLE(m["id"])]
    mems = [MemoryRecord(m["id"], ORG, AGENT, m["text"], similarity=0.9) for m in small]
    # The corpus's texts as history too: the payload carries them verbatim, as messages.
    history = [{"role": "user", "content": m["text"] or "-"} for m in small[:20]]
    ctx = assemble("gpt-4.1", history, rendering=rendering, mems=mems)
    p = ctx.to_openai() if rendering == "openai" else ctx.to_anthropic()
    block = memory_block_of(p, rendering)
    assert block is not None and len(ctx.selected_ids) == len(small)
    check_memory_block(block, ctx, {m["id"]: m["text"] for m in small})
    # No memory text leaves its element: the only unescaped brackets are the serializer's.
    tag = "m" if ctx.memory_format == "compact" else "memory"
    assert block.count(f"<{tag} ") == len(small) and block.count(f"</{tag}>") == len(small)
    if rendering == "openai":
        assert [m["content"] for m in p["messages"][1:-1]] == [h["content"] for h in history]


@pytest.mark.parametrize(
    "memory",
    [m for m in CORPUS if len(m["text"]) < 200_000 and PACKABLE(m["id"])],
    ids=lambda m: m["id"].encode("unicode_escape").decode()[:40],
)
def test_adversarial_memories_one_by_one_in_both_payloads(memory: dict[str, Any]) -> None:
    mems = [
        MemoryRecord("before", ORG, AGENT, "x", similarity=0.95),
        MemoryRecord(memory["id"], ORG, AGENT, memory["text"], similarity=0.9),
        MemoryRecord("after", ORG, AGENT, "y", similarity=0.85),
    ]
    texts = {m.id: m.text for m in mems}
    for rendering in ("openai", "anthropic"):
        ctx = assemble("gpt-4.1", [{"role": "user", "content": "hi"}], rendering=rendering, mems=mems)
        p = ctx.to_openai() if rendering == "openai" else ctx.to_anthropic()
        block = memory_block_of(p, rendering)
        assert block is not None and set(ctx.selected_ids) == set(texts)
        check_memory_block(block, ctx, texts)


# ---- everywhere the context leaves the process ----------------------------------------------------


def test_cli_prints_the_payloads() -> None:
    beside = Path(sys.executable).with_name("ctxcore")
    exe = str(beside) if beside.exists() else shutil.which("ctxcore")
    assert exe is not None
    # Roomy branch timeouts: on a busy machine the 5 / 15 / 45 ms defaults can degrade the demo.
    env = {
        **os.environ,
        "CTXCORE_CONTEXT_TIMEOUT_MS": "5000",
        "CTXCORE_CONTEXT_DEADLINE_MS": "5000",
        "CTXCORE_DIRECTIVE_TIMEOUT_MS": "5000",
        "CTXCORE_HOT_TIMEOUT_MS": "5000",
        "CTXCORE_COLD_TIMEOUT_MS": "5000",
    }
    out = subprocess.run([exe, "demo", "--format", "openai"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    p = json.loads(out.stdout)
    check_openai(p)
    assert p["messages"][-1]["content"].startswith("<memories>\n" + ctxcore.formatting.COMPACT_SAFETY_SENTENCE)
    out = subprocess.run(
        [exe, "demo", "--format", "anthropic", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    check_anthropic(doc["payload"])
    assert doc["rendering"] == "anthropic" and doc["framing_tokens"] > 0 and not doc["degraded"]
    assert doc["payload"]["messages"][-1]["content"][-1]["text"].startswith("<memories>")


# ---- the payload guide's examples -----------------------------------------------------------------

EXAMPLES = REPO / "examples"


@pytest.mark.parametrize("name", ["openai_payload", "anthropic_payload"])
def test_guide_examples_build_payloads_the_sdks_take(name: str) -> None:
    path = EXAMPLES / f"{name}.py"
    guide = (REPO / "docs" / "howto" / "payloads.md").read_text(encoding="utf-8")
    assert path.read_text(encoding="utf-8") in guide  # the guide shows the file as it is
    module = load_script(path, f"example_{name}")
    payload = module.main()
    sent: list[dict[str, Any]] = []
    if name == "openai_payload":
        check_openai(payload)
        assert memory_block_of(payload, "openai") is not None
        module.OpenAI = lambda: _mock_client("openai", sent)  # the example's own send(), no network
        assert module.send(payload) == "ok"
        assert sent == [{"model": "gpt-4o", **payload}]
    else:
        check_anthropic(payload)
        assert memory_block_of(payload, "anthropic") is not None
        module.Anthropic = lambda: _mock_client("anthropic", sent)
        assert module.send(payload) == "ok"
        assert sent == [{"model": "claude-sonnet-4-20250514", "max_tokens": 1024, **payload}]


def test_sdk_response_objects_join_the_history_as_they_came() -> None:
    from anthropic.types import Message as AnthropicReply
    from openai.types.chat import ChatCompletion

    completion = ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "annotations": [],
                        "tool_calls": [
                            {
                                "id": "call_9",
                                "type": "function",
                                "function": {"name": "lookup_order", "arguments": '{"id": 9}'},
                            }
                        ],
                    },
                }
            ],
        }
    )
    (m,) = parse_messages([completion.choices[0].message])
    assert m == Message("assistant", "", (ToolCall("call_9", "lookup_order", '{"id": 9}'),))
    assert parse_messages([completion.choices[0].message.model_dump()]) == (m,)  # None and [] fields say nothing
    reply = AnthropicReply.model_validate(
        {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "claude-opus-4-1",
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "content": [
                {"type": "text", "text": "Let me check.", "citations": None},
                {"type": "tool_use", "id": "toolu_9", "name": "lookup_order", "input": {"id": 9}},
            ],
        }
    )
    (a,) = parse_messages([{"role": "assistant", "content": reply.content}])
    assert a == Message(
        "assistant", parts=("Let me check.",), tool_calls=(ToolCall("toolu_9", "lookup_order", '{"id": 9}'),)
    )
    with pytest.raises(ValueError, match=r"unsupported message fields \['name'\]"):
        parse_messages([{"role": "user", "content": "x", "name": "alice"}])
