"""Assemble one request from the demo memory store and print the context and its record.

pip install ctxcore-llm; python examples/assemble_demo.py builds the demo store (SQLite, the
dataset shipped in the package) in a temporary directory, assembles one request for gpt-4o
inside a 2,000-token budget, and prints the context, the budget ledger, the branch records
and what was selected. No network, no API key.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import ctxcore
from ctxcore.stores import load_demo


async def assemble(store: ctxcore.MemoryStore) -> ctxcore.AssembledContext:
    request = ctxcore.AssemblyRequest(
        organization_id="acme-retail",
        agent_id="support",
        model="gpt-4o",
        query=ctxcore.Query("Can I return shoes bought three weeks ago?"),
        messages=[ctxcore.Message("user", "Hi, I'd like to return my shoes.")],
        token_budget=2000,
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
    return await ctxcore.assemble(request, sources=ctxcore.Sources.from_store(store), config=config)


def main() -> ctxcore.AssembledContext:
    with tempfile.TemporaryDirectory() as tmp, load_demo(Path(tmp) / "demo.db") as store:
        return asyncio.run(assemble(store))


if __name__ == "__main__":
    ctx = main()
    print(ctx.text)
    print()
    b, prompt = ctx.budget, ctx.prompt_tokens
    priced = f"{prompt.value} tokens ({prompt.kind.value})" if prompt is not None else "not priced"
    print(f"window {b.context_window}, usable for memories {b.usable}, prompt {priced}, degraded: {ctx.degraded}")
    for branch in ctx.branches:
        print(f"  {branch.branch.value:<9} {branch.status.value:<8} {branch.latency_ms:7.2f} ms  {branch.items} items")
    selected = [t.memory_id for t in ctx.trace if t.reason == ctxcore.TraceReason.SELECTED]
    print(f"selected {len(selected)} memories: {', '.join(selected)}")
    # The memory elements carry per-assembly handles (m1, m2, ...); this maps them back.
    print("handles: " + ", ".join(f"{h}={mid}" for h, mid in ctx.handles.items()))
