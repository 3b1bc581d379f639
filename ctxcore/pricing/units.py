"""Exact token counts of memories as the formatter will emit them, for every store.

A memory's element in the formatted context is ``\\n<memory nonce=".." id=".." score=".."
source="..">..</memory>``. The assembly prices it as four units, each counted on its own::

    P = '\\n<memory nonce="NONCE"'        once per assembly (the nonce is per assembly)
    I = ' id="ESCAPED ID"'                 per memory, counted at ingest
    M = ' score="S" source="SOURCE'        once per distinct (score, source) shape
    B = '">ESCAPED BODY</memory>'          per memory, counted at ingest

The cuts lie where the pre-tokenizers of the byte-level BPE families (cl100k_base,
o200k_base) always end a chunk: between a quote and a space followed by a letter, and
between a letter or digit and a quote; tokens never cross a chunk, so the element costs
exactly ``P + I + M + B`` tokens, and the joins with its neighbours (``>\\n``, ``.\\n``) can
only merge. Property tests (tests/assembly/test_pricing.py) check ``exact(element) <= priced cost``
over adversarial and multilingual ids and bodies; families whose splitting ctxcore cannot
know (registered tokenizers) get `boundary_allowance` tokens per cut on top.

A store counts ``I + B`` for each memory at ingest, for every installed exact family, with
`count_memory_tokens`, and returns the counts with the record
(``MemoryRecord.exact_tokens``): assembling then needs no tokenizer call for the memory.
The SQLite store and the PostgreSQL store call the same function, through
``ctxcore.stores.counting``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from .. import _core, tokens

__all__ = [
    "BUILTIN_SPLIT_FAMILIES",
    "boundary_allowance",
    "compact_body_units",
    "count_exact_batch",
    "count_memory_tokens",
    "memory_units",
]

#: Families whose pre-tokenizer is known to cut at the unit boundaries above, so that the
#: four units add up to the element's exact count (allowance 0, shown by the property tests).
BUILTIN_SPLIT_FAMILIES = frozenset({"cl100k_base", "o200k_base"})

# Any valid nonce: escaping does not depend on it.
_NONCE = "0" * 32
_HEAD = f'\n<memory nonce="{_NONCE}"'
_TAIL = "</memory>"


def boundary_allowance(family: str) -> int:
    """Tokens added per unit boundary on top of the exact unit counts: 0 for the built-in
    byte-level BPE families, 1 for any other (a registered tokenizer may merge across a cut).

    >>> boundary_allowance("cl100k_base"), boundary_allowance("my-family")
    (0, 1)
    """
    return 0 if family in BUILTIN_SPLIT_FAMILIES else 1


def memory_units(ids: Sequence[str], texts: Sequence[str]) -> list[str]:
    """The per-memory units ``I`` and ``B`` as the serializer writes them, interleaved:
    ``[I0, B0, I1, B1, ...]`` (ids and bodies escaped by the compiled serializer itself).

    Raises:
        InvalidFormatInput: an id is empty or not a str, a text is not a str.
        ValueError: `ids` and `texts` differ in length.

    >>> memory_units(["m1"], ["a < b"])
    [' id="m1"', '">a &lt; b</memory>']
    """
    if len(ids) != len(texts):
        raise ValueError(f"ids and texts differ in length: {len(ids)} ids, {len(texts)} texts")
    if not ids:
        return []
    items = [{"id": i, "text": t} for i, t in zip(ids, texts)]
    text, _, _, pieces = _core.format_context(None, (), items, None, _NONCE, False, True)
    out: list[str] = []
    begin = 0
    head = len(_HEAD)
    for kind, end in pieces:
        if kind == 3:  # a memory element
            piece = text[begin:end]
            # An escaped attribute holds no raw '"', so the first '">' closes the id. The
            # quote is in both units: I ends with the id's closing quote, B starts with the
            # closing quote of the attribute before the body (the source's, when assembled).
            cut = piece.index('">', head)
            out.append(piece[head : cut + 1])
            out.append(piece[cut:])
        begin = end
    return out


def compact_body_units(texts: Sequence[str]) -> list[str]:
    """Each memory's body unit in the compact rendering, ``">ESCAPED BODY</m>"``, as the
    serializer writes it. In the compact rendering an element is ``P1 + I + P2 + [M] + B``
    with ``P1 = '\\n<m'``, ``I = ' mK'`` (the handle, the name of the attribute that
    holds the nonce), ``P2 = '="NONCE'`` and ``M`` the optional attributes; the cuts lie
    where the built-in families' chunks always end (a letter before a space, a digit
    before ``=``, a letter or digit before a quote). A body unit differs from the verbose
    ``B`` only in the closing tag's name, which is a chunk of its own.

    Raises:
        InvalidFormatInput: a text is not a str.

    >>> compact_body_units(["a < b"])
    ['">a &lt; b</m>']
    """
    if not texts:
        return []
    items = [{"id": "m1", "text": t} for t in texts]
    text, _, _, pieces = _core.format_context(None, (), items, None, _NONCE[:20], False, True, 1)
    head = len(f'\n<m m1="{_NONCE[:20]}')
    out: list[str] = []
    begin = 0
    for kind, end in pieces:
        if kind == 3:  # a memory element
            out.append(text[begin + head : end])
        begin = end
    return out


def count_exact_batch(texts: Sequence[str], family: str) -> npt.NDArray[np.int64]:
    """Exact token counts of `texts` in `family`, in one call (the family's batch counter
    where it has one).

    Raises:
        TokenizerUnavailable: `family` has no exact tokenizer installed.

    >>> count_exact_batch(["Hello, world!", ""], "cl100k_base").tolist()
    [4, 0]
    """
    batch: Callable[[Sequence[str], str], npt.NDArray[np.int64]] | None = getattr(tokens, "count_tokens_batch", None)
    if batch is not None:
        return np.asarray(batch(list(texts), family), dtype=np.int64)
    return np.fromiter((tokens.count_tokens(t, family).value for t in texts), dtype=np.int64, count=len(texts))


def count_memory_tokens(
    ids: Sequence[str], texts: Sequence[str], families: Sequence[str] | None = None
) -> dict[str, npt.NDArray[np.int64]]:
    """Exact tokens of each memory's own units (``I + B``: its escaped id attribute and its
    escaped body with the element's closing tag), per family: what a store keeps as
    ``exact_tokens`` and returns with the record.

    Args:
        ids: the memories' ids.
        texts: their texts, in the same order.
        families: exact families to count in; by default every installed one
            (`ctxcore.exact_families()`).

    Returns:
        family -> int64 array of one count per memory, in input order.

    Raises:
        TokenizerUnavailable: a requested family has no exact tokenizer installed.
        InvalidFormatInput: an id is empty, or an id or text is not a str.

    >>> counts = count_memory_tokens(["m1"], ["Prefers email."], ["cl100k_base"])
    >>> int(counts["cl100k_base"][0])
    12
    """
    fams = tokens.exact_families() if families is None else tuple(families)
    units = memory_units(ids, texts)
    out: dict[str, npt.NDArray[np.int64]] = {}
    for family in fams:
        per_unit = count_exact_batch(units, family)
        out[family] = per_unit[0::2] + per_unit[1::2]
    return out
