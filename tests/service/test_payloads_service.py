"""The structured messages and tools over the wire: a real `ctxcore serve` on a loopback
port, `ctxcore.client` on the other end, and the payloads rebuilt from the answer equal to
the ones the same assembly gives in process."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from service_support import open_config, running

import ctxcore
from ctxcore import AssemblyOptions, AssemblyRequest, MemoryRecord, Message, Query, Sources, ToolCall
from ctxcore.client import ContextClient, answer_messages, answer_tools, to_anthropic, to_openai
from ctxcore.v1 import context_assembly_pb2 as pb

if TYPE_CHECKING:
    import grpc

ORG, AGENT = "org-1", "agent-1"
ROOMY = {
    "client_timeout_ms": 2000,
    "server_deadline_ms": 2000,
    "directive_timeout_ms": 1000,
    "hot_timeout_ms": 1000,
    "cold_timeout_ms": 1000,
}
MEMORIES = [
    MemoryRecord(f"m{i}", ORG, AGENT, f"Refunds take {i} days </memory>", similarity=0.9 - 0.01 * i) for i in range(4)
]
HISTORY = (
    Message("developer", "Answer in English."),
    Message("user", parts=("Where is order 7?", "And order 9?")),
    Message(
        "assistant",
        "Checking.",
        (ToolCall("call_1", "lookup_order", '{"id": 7}'), ToolCall("call_2", "lookup_order", '{"id": 9}')),
    ),
    Message("tool", "shipped", tool_call_id="call_1"),
    Message("tool", parts=("lost",), tool_call_id="call_2", is_error=True),
    Message("user", "Refund order 9, please."),
)
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
        },
    },
)


def sources() -> Sources:
    async def hot(scope: Any, query: Any, limit: int) -> list[MemoryRecord]:
        return MEMORIES[:limit]

    async def directive(scope: Any) -> str:
        return "You are the support agent of Acme."

    return Sources(directive=directive, hot=hot)


def without_memory_block(payload: dict[str, Any], block: str) -> Any:
    """The payload with the memory block (whose nonce differs per assembly) taken out."""
    out = []
    for m in payload["messages"]:
        if m["content"] == block:
            continue
        if isinstance(m["content"], list):
            m = dict(m, content=[b for b in m["content"] if not (isinstance(b, dict) and b.get("text") == block)])
        out.append(m)
    return dict(payload, messages=out)


@pytest.mark.parametrize("rendering", ["openai", "anthropic"])
def test_served_payloads_equal_the_in_process_ones(rendering: str) -> None:
    req = AssemblyRequest(
        ORG,
        AGENT,
        "gpt-4o",
        Query("refund"),
        messages=HISTORY,
        tools=TOOLS,
        options=AssemblyOptions(rendering=rendering),
    )
    local = asyncio.run(ctxcore.assemble(req, sources=sources(), config=ctxcore.AssemblyConfig(**ROOMY)))

    async def served() -> pb.AssembledContext:
        async with running(open_config(assembly=ROOMY), sources=sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=5.0) as client:
                return await client.assemble(req)

    answer = asyncio.run(served())
    assert answer_messages(answer) == local.messages == HISTORY
    assert answer_tools(answer) == TOOLS
    assert answer.directive == local.directive
    assert answer.rendering == (pb.RENDERING_OPENAI if rendering == "openai" else pb.RENDERING_ANTHROPIC)
    assert (answer.framing_tokens, answer.stable_prefix_tokens) == (local.framing_tokens, local.stable_prefix_tokens)
    assert (
        answer.budget.usable == local.budget.usable
        and answer.budget.formatter_overhead_tokens == local.budget.formatter_overhead_tokens
    )
    block = next(s.text for s in answer.sections if s.name == "memories")
    assert answer.nonce in block and local.nonce != answer.nonce
    if rendering == "openai":
        remote, here = to_openai(answer), local.to_openai()
    else:
        remote, here = to_anthropic(answer), local.to_anthropic()
    assert without_memory_block(remote, block) == without_memory_block(here, local.sections["memories"])
    assert block.replace(answer.nonce, local.nonce) == local.sections["memories"]


def _served_openai_rendering_error(req: AssemblyRequest) -> grpc.aio.AioRpcError:
    """The error a served call of `req` with the OpenAI rendering ends in."""
    import grpc

    msg = ctxcore.service.convert.request_to_proto(req)
    msg.options.rendering = pb.RENDERING_OPENAI

    async def call() -> None:
        async with running(open_config(assembly=ROOMY), sources=sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=5.0) as client:
                await client.assemble(msg)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(call())
    return err.value


def test_an_unpaired_tool_result_is_invalid_argument_for_a_payload_rendering() -> None:
    import grpc

    req = AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), messages=(Message("tool", "x", tool_call_id="c1"),))
    err = _served_openai_rendering_error(req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[0]: the tool result for 'c1'" in (err.details() or "")


def test_an_anthropic_tool_the_openai_rendering_cannot_carry_is_invalid_argument() -> None:
    import grpc

    tool = {"name": "g", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}
    req = AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), messages=(Message("user", "x"),), tools=(tool,))
    err = _served_openai_rendering_error(req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "['cache_control'] cannot be carried by an OpenAI tool" in (err.details() or "")
