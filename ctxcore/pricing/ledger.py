"""The ledger's prices: the formatter's fixed text, directive, messages and tools in one
tokenizer family, exactly (cached by content) when the family's tokenizer is installed,
else with the estimator; and whether a request can be priced exactly in time.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np

from .. import _core, tokens
from ..catalog import Catalog, ModelCapability
from ..errors import TokenizerUnavailable
from ..formatting import FORMAT_CODES, PIECE_DIRECTIVE, PIECE_FRAME, PIECE_MESSAGE
from ..tokens import TokenKind, estimator_for, exact_families
from .units import boundary_allowance, count_exact_batch

#: Exact counting speed assumed when deciding whether a count can be had before the
#: deadline (UTF-8 bytes per millisecond; tiktoken counts ~3-10 MB/s on this machine, the
#: figure is the slow end so that a count started is a count finished).
EXACT_COUNT_BYTES_PER_MS = 2000.0
#: Tokens added to the directive's exact count: the directive is the one piece whose last
#: character is caller text, and BPE may merge it with the newline of the frame after it
#: (the property tests in tests/assembly/test_pricing.py measure the largest such effect).
DIRECTIVE_BOUNDARY_ALLOWANCE = 1


_V = TypeVar("_V")


class _CountCache(Generic[_V]):
    """Exact counts of pieces that repeat across calls (directives, tool schemas, frames,
    messages of a conversation, score/source shapes), keyed by family and content: the
    text itself when short, else its BLAKE2b digest. Bounded; least recently used first out.
    Thread-safe (assemblies may run on an executor's threads)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._data: OrderedDict[Hashable, _V] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(family: str, text: str) -> tuple[str, object]:
        if len(text) <= 128:
            return (family, text)
        return (family, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())

    def get_many(self, keys: Sequence[Hashable]) -> list[_V | None]:
        with self._lock:
            out = [self._data.get(k) for k in keys]
            for k, v in zip(keys, out):
                if v is not None:
                    self._data.move_to_end(k)
        return out

    def put_many(self, items: Sequence[tuple[Hashable, _V]]) -> None:
        with self._lock:
            for k, v in items:
                self._data[k] = v
                self._data.move_to_end(k)
            while len(self._data) > self._capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


#: Entries kept by the exact-count cache (all families together).
COUNT_CACHE_ENTRIES = 1 << 16
_COUNTS: _CountCache[int] = _CountCache(COUNT_CACHE_ENTRIES)
#: The frame's and the directive's costs per (pricing, sections present, family and directive).
_FRAMES: _CountCache[tuple[int, int]] = _CountCache(4096)


def uncached_bytes(texts: Sequence[str], family: str) -> int:
    keys = [_CountCache.key(family, t) for t in texts]
    return sum(len(t) for t, v in zip(texts, _COUNTS.get_many(keys)) if v is None)


def exact_counts(texts: Sequence[str], family: str, *, cache: bool = True) -> list[int]:
    """Exact counts of `texts`, from the cache where it has them, the rest in one batch
    (texts that never repeat, such as those holding a nonce, pass ``cache=False``)."""
    if not cache:
        return [int(v) for v in count_exact_batch(texts, family).tolist()]
    keys = [_CountCache.key(family, t) for t in texts]
    got = _COUNTS.get_many(keys)
    missing = [i for i, v in enumerate(got) if v is None]
    if missing:
        counted = count_exact_batch([texts[i] for i in missing], family).tolist()
        _COUNTS.put_many([(keys[i], n) for i, n in zip(missing, counted)])
        for i, n in zip(missing, counted):
            got[i] = n
    return [int(v) for v in got]  # type: ignore[arg-type]


def split_pieces(text: str, pieces: Sequence[tuple[int, int]]) -> tuple[list[int], list[str]]:
    kinds: list[int] = []
    texts: list[str] = []
    begin = 0
    for kind, end in pieces:
        kinds.append(kind)
        texts.append(text[begin:end])
        begin = end
    return kinds, texts


@dataclass(slots=True)
class Ledger:
    """Prices the formatter's pieces in one family, exactly or with the estimator, for
    one rendering of the memory elements (`memory_format`, as for `format_context`)."""

    family: str
    exact: bool
    memory_format: str = "verbose"

    @property
    def format_code(self) -> int:
        """The serializer's code of `memory_format`."""
        return FORMAT_CODES[self.memory_format]

    def costs(self, text: str, pieces: Sequence[tuple[int, int]], texts: Sequence[str]) -> list[int]:
        """Each piece's cost: its exact count on its own, or the estimator's price of it
        behind the character that precedes it (a message or the tools JSON always follows
        a ``>``, so either is the same wherever the piece stands)."""
        if self.exact:
            if boundary_allowance(self.family) == 0:
                # A message always follows a ``>`` (``<history>`` or the message before it),
                # and for the built-in families that ``>`` and the message's newline are one
                # chunk: a message costs what it adds behind the ``>``, as the whole text counts.
                is_message = [k == PIECE_MESSAGE for k, _ in pieces]
                counted = exact_counts([">" + t if m else t for t, m in zip(texts, is_message)], self.family)
                gt = exact_counts([">"], self.family)[0]
                return [c - gt if m else c for c, m in zip(counted, is_message)]
            return exact_counts(texts, self.family)
        ends = np.array([e for _, e in pieces], dtype=np.int64)
        priced = estimator_for(self.family).price_pieces(text, ends, np.zeros(len(pieces), dtype=bool), ">", ">")
        return list(priced.tolist())

    def price(
        self, directive: str | None, history: Sequence[Mapping[str, str]], tools_json: str | None, frame: bool
    ) -> tuple[list[int], list[int]]:
        """(kinds, costs) of every piece of the context formatted without memories."""
        text, _, _, pieces = _core.format_context(
            directive, history, (), tools_json, PRICING_NONCE, frame, True, self.format_code
        )
        kinds, texts = split_pieces(text, pieces)
        return kinds, self.costs(text, pieces, texts)

    def frame_and_directive(self, directive: str | None, has_history: bool, has_tools: bool) -> tuple[int, int]:
        """The formatter's fixed text (with the memories section) and the directive's cost.
        Placeholders stand in for the messages and tools: the frame around them is the same.
        Kept per directive (a scope's repeats on every call), least recently used first out."""
        key = (
            self.exact,
            self.format_code,
            has_history,
            has_tools,
            _CountCache.key(self.family, directive or ""),
            directive is None,
        )
        got = _FRAMES.get_many([key])[0]
        if got is None:
            got = self._frame_and_directive(directive, has_history, has_tools)
            _FRAMES.put_many([(key, got)])
        return got

    def _frame_and_directive(self, directive: str | None, has_history: bool, has_tools: bool) -> tuple[int, int]:
        kinds, costs = self.price(
            directive, _PLACEHOLDER_HISTORY if has_history else (), "[0]" if has_tools else None, True
        )
        fixed = sum(c for k, c in zip(kinds, costs) if k == PIECE_FRAME)
        dcost = sum(c for k, c in zip(kinds, costs) if k == PIECE_DIRECTIVE)
        if self.exact and directive:
            dcost += DIRECTIVE_BOUNDARY_ALLOWANCE
        return fixed, dcost


PRICING_NONCE = "0" * 32
_PLACEHOLDER_HISTORY = ({"role": "user", "content": ""},)


def ledger_capability(cat: Catalog, cap: ModelCapability, exact: bool) -> ModelCapability:
    kind = TokenKind.EXACT if exact else TokenKind.ESTIMATE
    if cap.estimate_kind is kind:
        return cap
    return replace(cap, estimate_kind=kind, safety_fraction=cat.policies[cap.tokenizer_family].safety_fraction(kind))


_loading: set[str] = set()
_loading_lock = threading.Lock()


def _tokenizer_ready(family: str) -> bool:
    """Whether `family`'s exact tokenizer is loaded (or registered), without loading it."""
    return tokens.tokenizer_loaded(family)


def _load_in_background(family: str) -> None:
    with _loading_lock:
        if family in _loading:
            return
        _loading.add(family)

    def load() -> None:
        try:
            tokens.count_tokens("", family)
        except TokenizerUnavailable:
            pass

    threading.Thread(target=load, name=f"ctxcore-load-{family}", daemon=True).start()


def warm_tokenizers() -> tuple[str, ...]:
    """Load every installed exact tokenizer now (a service calls this at start-up, so that
    no request pays for loading a vocabulary); returns `ctxcore.exact_families()`.

    >>> "cl100k_base" in warm_tokenizers()
    True
    """
    return exact_families()


def can_count_exactly(cat: Catalog, cap: ModelCapability, deadline: float | None) -> bool:
    # The catalog says which kind of count the model is budgeted in; exact needs the
    # family's tokenizer installed (or registered) too. A vocabulary not loaded yet takes
    # a second or more to load: under a deadline it loads in the background and this
    # request is priced with the estimator.
    family = cap.tokenizer_family
    if cap.estimate_kind is not TokenKind.EXACT:
        return False
    if deadline is not None and not _tokenizer_ready(family):
        _load_in_background(family)
        return False
    if family not in exact_families():
        return False
    policy = cat.policies.get(family)
    return policy is not None and TokenKind.EXACT in policy.safety_fractions


def time_left_ms(deadline: float | None) -> float:
    return math.inf if deadline is None else (deadline - time.monotonic()) * 1000.0
