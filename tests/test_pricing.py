"""The formatter's pricing (`ctxcore.formatter_overhead` with the estimator) against its
definition: each piece estimated as its own string behind the character that precedes it,
and a memory behind whichever of its two possible predecessors costs more."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxcore

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
