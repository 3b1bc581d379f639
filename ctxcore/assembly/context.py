"""`AssembledContext`: the assembled text with the record of how it was made, and its
renderings as the OpenAI and Anthropic SDKs take them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..budget import Budget
from ..memory import Scope
from ..packing import PackResult
from ..payloads import default_directive_role, render_anthropic, render_openai
from ..request import Message, Rendering
from ..rerank import RerankRecord
from ..result import (
    BranchRecord,
    HistoryDrop,
    StageTimings,
    TraceEntry,
    Wall,
)
from ..tokens import TokenCount
from ..trace import TraceTable


@dataclass(frozen=True, slots=True)
class AssembledContext:
    """The assembled context and the record of how it was made.

    Attributes:
        text: the context to send to the model.
        sections: each non-empty section's text, in order (each a substring of `text`).
        nonce: the per-assembly nonce on every memory element.
        model: the canonical model name.
        scope: the organization and agent the context is for.
        budget: the budget ledger (every term, `usable`, `constrained`), in the model's
            tokenizer family: exact counts where the family's tokenizer is installed
            (``budget.estimate_kind``), else the estimator's.
        pack: the pack record, or None when there was nothing to pack.
        trace_table: the trace as columns (cheap to build); `trace` gives it as entries.
        branches: the directive, hot and cold branch records.
        wall: the retrieval wall that applied.
        degraded: True when context was disabled, skipped, or a branch failed or timed out.
        degradation_reasons: why, e.g. ``("hot_timeout", "cold_error")``.
        constrained: the usable budget is below the policy's threshold (256 by default).
        history_dropped: groups of turns dropped, oldest first, each with its reason
            (`HistoryDrop`).
        timings: milliseconds per stage.
        replaced_chars: characters XML 1.0 cannot carry, replaced by U+FFFD.
        scoring: which score formula ran, with which weights.
        prompt_tokens: the priced size of `text`: directive, messages, tools, fixed text
            and the selected memories, in the ledger's family and kind. For an exact ledger
            it is an upper bound on the exact count of `text` (the tests measure how tight).
        directive: the directive as retrieved (None when there was none).
        messages: the history as kept, after any trimming (`history_dropped` says what went).
        tools: the tool schemas as given.
        rendering: the rendering the budget was priced for (`AssemblyOptions.rendering`).
        framing_tokens: the provider's chat framing in the ledger (0 for ``text``).
        stable_prefix_tokens: tokens of the part that stays the same between turns of a
            conversation (tools, directive, history), which prompt caches can reuse.
        memory_format: the rendering of the memory elements (`AssemblyOptions.memory_format`).
        handles: in the compact rendering, each selected memory's handle (``m1``..``mN``, in
            the order of `text`) -> its store id; empty in the verbose rendering, whose
            elements carry the store ids.
        rerank: what the rerank stage did, when `assemble` was given a reranker (None
            otherwise).
    """

    text: str
    sections: Mapping[str, str]
    nonce: str
    model: str
    scope: Scope
    budget: Budget
    pack: PackResult | None
    trace_table: TraceTable = field(repr=False)
    branches: tuple[BranchRecord, ...]
    wall: Wall
    degraded: bool
    degradation_reasons: tuple[str, ...]
    constrained: bool
    history_dropped: tuple[HistoryDrop, ...]
    timings: StageTimings
    replaced_chars: int
    scoring: Mapping[str, Any] = field(default_factory=dict)
    prompt_tokens: TokenCount | None = None
    directive: str | None = None
    messages: tuple[Message, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    rendering: Rendering = Rendering.TEXT
    framing_tokens: int = 0
    stable_prefix_tokens: int = 0
    memory_format: str = "verbose"
    handles: Mapping[str, str] = field(default_factory=dict)
    rerank: RerankRecord | None = None

    def to_openai(self, *, directive_role: str | None = None) -> dict[str, Any]:
        """The context as a Chat Completions request body: ``{"messages", "tools"}``.

        The directive is the system message (``developer`` for reasoning models, or as
        `directive_role` says), the kept history follows as real messages with native
        ``tool_calls`` / ``tool`` results, and the memories section (nonce-tagged,
        escaped, with its safety sentence) is the last message. ``tools`` is present when
        the request had tools. Unpack it into the SDK call:
        ``client.chat.completions.create(model=..., **ctx.to_openai())``. The budget
        holds for it when the request asked for ``rendering="openai"``.

        >>> import asyncio, ctxcore
        >>> req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", "hi", messages=[{"role": "user", "content": "hi"}])
        >>> asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())).to_openai()
        {'messages': [{'role': 'user', 'content': 'hi'}]}
        """
        return render_openai(
            directive=self.directive,
            messages=self.messages,
            tools=self.tools,
            memory_block=self.sections.get("memories"),
            directive_role=directive_role or default_directive_role(self.model),
        )

    def to_anthropic(self, *, cache_breakpoint: bool = True) -> dict[str, Any]:
        """The context as a Messages request body: ``{"system", "messages", "tools"}``.

        ``tool_use`` / ``tool_result`` blocks, alternating roles, the memories section as
        a text block after the latest user turn; ``system`` and ``tools`` are present
        when non-empty. With `cache_breakpoint` the last block before the memories
        carries ``cache_control``, so the stable prefix is cached from turn to turn.
        ``client.messages.create(model=..., max_tokens=..., **ctx.to_anthropic())``.

        >>> import asyncio, ctxcore
        >>> req = ctxcore.AssemblyRequest("org", "agent", "claude-sonnet-4", "hi", messages=[{"role": "user", "content": "hi"}])
        >>> asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())).to_anthropic()["messages"]
        [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi', 'cache_control': {'type': 'ephemeral'}}]}]
        """
        return render_anthropic(
            directive=self.directive,
            messages=self.messages,
            tools=self.tools,
            memory_block=self.sections.get("memories"),
            cache_breakpoint=cache_breakpoint,
        )

    @property
    def trace(self) -> tuple[TraceEntry, ...]:
        """One `TraceEntry` per memory candidate (why it is in or out), built on access."""
        return self.trace_table.entries()

    @property
    def selected_ids(self) -> tuple[str, ...]:
        """Ids of the memories in the context, in the order they appear."""
        return self.pack.ids if self.pack is not None else ()

    def record(self) -> dict[str, Any]:
        """Everything but the text, as JSON-ready values: budget ledger, pack record,
        branch records, trace, wall, degradation, timings (memory text never included).

        >>> import asyncio, ctxcore
        >>> req = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", ctxcore.Query("hi"))
        >>> rec = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources())).record()
        >>> rec["degradation_reasons"], rec["branches"][1]["status"]
        (['no_memory_source'], 'skipped')
        """
        t = self.trace_table
        return {
            "model": self.model,
            "organization_id": self.scope.organization_id,
            "agent_id": self.scope.agent_id,
            "nonce": self.nonce,
            "memory_format": self.memory_format,
            "handles": dict(self.handles),
            "rerank": self.rerank.record() if self.rerank is not None else None,
            "sections": list(self.sections),
            "budget": self.budget.record(),
            "pack": self.pack.record() if self.pack is not None else None,
            "selected": list(self.selected_ids),
            "branches": [
                {
                    "branch": b.branch.value,
                    "status": b.status.value,
                    "latency_ms": round(b.latency_ms, 3),
                    "items": b.items,
                    "dropped_out_of_scope": b.dropped_out_of_scope,
                    "error": b.error,
                }
                for b in self.branches
            ],
            "trace": [
                {
                    "memory_id": mid,
                    "reason": reason.value,
                    "origin": origin,
                    "tokens": tokens,
                    "score": score,
                    "relevance": rel,
                    "recounted": rc,
                    "pricing": how,
                }
                for mid, reason, origin, tokens, score, rel, rc, how in zip(
                    t.memory_id, t.reason, t.origin, t.tokens, t.score, t.relevance, t.recounted, t.pricing
                )
            ],
            "wall": {"limit_ms": self.wall.limit_ms, "source": self.wall.source.value},
            "degraded": self.degraded,
            "degradation_reasons": list(self.degradation_reasons),
            "constrained": self.constrained,
            "history_dropped": [
                {
                    "first_index": d.first_index,
                    "count": d.count,
                    "tokens": d.tokens,
                    "roles": list(d.roles),
                    "reason": d.reason,
                }
                for d in self.history_dropped
            ],
            "scoring": dict(self.scoring),
            "timings_ms": {
                "retrieval": self.timings.retrieval_ms,
                "scoring": self.timings.scoring_ms,
                "budget": self.timings.budget_ms,
                "packing": self.timings.packing_ms,
                "formatting": self.timings.formatting_ms,
                "total": self.timings.total_ms,
            },
            "replaced_chars": self.replaced_chars,
            "prompt_tokens": None if self.prompt_tokens is None else self.prompt_tokens.value,
            "rendering": self.rendering.value,
            "framing_tokens": self.framing_tokens,
            "stable_prefix_tokens": self.stable_prefix_tokens,
        }
