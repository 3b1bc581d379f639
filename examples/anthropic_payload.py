"""Assemble the context for Claude and hand it to the Anthropic SDK.

pip install ctxcore-llm anthropic; python examples/anthropic_payload.py prints the payload
(the demo store, no network); send() is the call an application makes with it.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from anthropic import Anthropic
from anthropic.types import Message

import ctxcore
from ctxcore.request import HistoryPolicy, Rendering, parse_messages
from ctxcore.stores import SqliteMemoryStore, load_demo

LOOKUP_ORDER = {
    "name": "lookup_order",
    "description": "Look up a customer's latest order.",
    "input_schema": {"type": "object", "properties": {"customer": {"type": "string"}}, "required": ["customer"]},
}


async def build_payload(store: SqliteMemoryStore) -> dict[str, Any]:
    request = ctxcore.AssemblyRequest(
        "acme-retail",
        "support",
        "claude-sonnet-4",
        ctxcore.Query("Can I still return the shoes?"),
        messages=parse_messages(
            [
                {"role": "user", "content": "I bought running shoes three weeks ago."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "lookup_order", "input": {"customer": "C-1042"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"order": 7, "days_ago": 21}'},
                        {"type": "text", "text": "Can I still return them?"},
                    ],
                },
            ]
        ),
        tools=(LOOKUP_ORDER,),
        # Price the budget for the Messages framing; trim the oldest turns if needed.
        options=ctxcore.AssemblyOptions(rendering=Rendering.ANTHROPIC, history_policy=HistoryPolicy.TRIM_OLDEST),
    )
    # A service warms its store at start-up and times each branch in milliseconds; here the
    # one-off script gives the branches a roomy wall instead.
    config = ctxcore.AssemblyConfig(
        client_timeout_ms=2000,
        server_deadline_ms=2000,
        directive_timeout_ms=1000,
        hot_timeout_ms=1000,
        cold_timeout_ms=1000,
    )
    ctx = await ctxcore.assemble(request, sources=ctxcore.Sources.from_store(store), config=config)
    assert not ctx.degraded, ctx.degradation_reasons
    return ctx.to_anthropic()  # {"system": [...], "messages": [...], "tools": [...]}, cache breakpoint set


def send(payload: dict[str, Any]) -> str:
    client = Anthropic()  # reads ANTHROPIC_API_KEY
    reply: Message = client.messages.create(model="claude-sonnet-4-20250514", max_tokens=1024, **payload)
    return "".join(block.text for block in reply.content if block.type == "text")


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, load_demo(Path(tmp) / "demo.db") as store:
        return asyncio.run(build_payload(store))


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
