"""Assemble the context for gpt-4o and hand it to the OpenAI SDK.

pip install ctxcore-llm openai; python examples/openai_payload.py prints the payload (the
demo store, no network); send() is the call an application makes with it.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletion

import ctxcore
from ctxcore.request import HistoryPolicy, Rendering, parse_messages
from ctxcore.stores import SqliteMemoryStore, load_demo

LOOKUP_ORDER = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up a customer's latest order.",
        "parameters": {"type": "object", "properties": {"customer": {"type": "string"}}, "required": ["customer"]},
    },
}


async def build_payload(store: SqliteMemoryStore) -> dict[str, Any]:
    request = ctxcore.AssemblyRequest(
        "acme-retail",
        "support",
        "gpt-4o",
        ctxcore.Query("Can I still return the shoes?"),
        messages=parse_messages(
            [
                {"role": "user", "content": "I bought running shoes three weeks ago."},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "lookup_order", "arguments": '{"customer": "C-1042"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": '{"order": 7, "days_ago": 21}'},
                {"role": "user", "content": "Can I still return them?"},
            ]
        ),
        tools=(LOOKUP_ORDER,),
        # Price the budget for the Chat Completions framing; trim the oldest turns if needed.
        options=ctxcore.AssemblyOptions(rendering=Rendering.OPENAI, history_policy=HistoryPolicy.TRIM_OLDEST),
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
    return ctx.to_openai()  # {"messages": [...], "tools": [...]}


def send(payload: dict[str, Any]) -> str | None:
    client = OpenAI()  # reads OPENAI_API_KEY
    reply: ChatCompletion = client.chat.completions.create(model="gpt-4o", **payload)
    return reply.choices[0].message.content


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, load_demo(Path(tmp) / "demo.db") as store:
        return asyncio.run(build_payload(store))


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
