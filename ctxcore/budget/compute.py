"""The budget: how many tokens are left for retrieved memories, by subtraction.

The first stage of an assembly (request -> budget -> retrieval -> scoring -> pack ->
format). Every obligation is paid from the model's context window before memory gets
anything::

    usable = min(context_window - response_reserve - window_safety,
                 token_budget - budget_safety)
             - directive_tokens - messages_tokens - tool_schema_tokens
             - formatter_overhead_tokens                                     (>= 0)
    response_reserve = min(max_output_tokens, clamp(ceil(0.15 * window), 500, 4096))
    window_safety    = ceil(context_window * the tokenizer policy's safety fraction)
    budget_safety    = ceil(token_budget * the same fraction)

where ``token_budget`` is the caller's optional cap on the whole payload (every part but
the response), independent of the window; without one, the window's side alone counts.
The cap binds when its side is the smaller: then the payload's terms and its safety
buffer are paid from it, and a payload priced this way never exceeds it. Either way the
payload leaves the window's reserve and buffer free too, and a tighter cap never leaves
more for memories (``t - ceil(t * f)`` does not fall as ``t`` grows, for ``f`` <= 1).

A budget whose usable part is below 256 tokens is marked constrained. The fraction and
bounds are a `BudgetPolicy`; the window, output limit and safety fraction come from the
capability catalog. Token terms may be integers of any type (numpy's among them) or
`TokenCount` values; counts in another tokenizer family or of another kind than the
model's raise `TokenizerMismatch`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, SupportsIndex

from .._numbers import as_int, as_real
from ..catalog import Catalog, ModelCapability, default_catalog
from ..errors import ConfigError, TokenizerMismatch
from ..tokens import TokenCount, TokenKind

__all__ = [
    "CONSTRAINED_BELOW",
    "RESPONSE_FRACTION",
    "RESPONSE_MAX",
    "RESPONSE_MIN",
    "Budget",
    "BudgetPolicy",
    "check_token_budget",
    "compute_budget",
]

#: Default share of the window reserved for the response ("by default 15% of the context
#: window", from the budget design).
RESPONSE_FRACTION = 0.15
#: Bounds on the response reserve ("a minimum of 500 tokens, a maximum of 4,096").
RESPONSE_MIN = 500
RESPONSE_MAX = 4096
#: Below this many usable tokens an assembly is marked constrained ("below 256 tokens").
CONSTRAINED_BELOW = 256

_TERMS = ("directive_tokens", "messages_tokens", "tool_schema_tokens", "formatter_overhead_tokens")


@functools.lru_cache(maxsize=1024)
def _ceil_product(n: int, fraction: float) -> int:
    # Exact: Fraction(str(x)) is the decimal the user wrote, so 0.15 * 128000 is 19200,
    # never 19201 from binary rounding. Cached: windows and fractions are few.
    return math.ceil(n * Fraction(str(fraction)))


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """How the response reserve is sized and when a budget counts as constrained.

    Attributes:
        response_fraction: share of the window reserved for the response, a real
            number in [0, 1] (numpy's float types too; kept as a plain float).
        response_min: smallest reserve, >= 0 (still capped by the model's output limit).
        response_max: largest reserve, >= response_min.
        constrained_below: usable budgets below this are marked constrained, >= 0.

    The three counts are integers of any type (numpy's too), kept as plain ints.

    Raises:
        ConfigError: a value out of range or of the wrong type, or min > max.

    >>> BudgetPolicy(response_min=800, response_max=2000).response_max
    2000
    >>> BudgetPolicy(response_min=5000)
    Traceback (most recent call last):
    ...
    ctxcore.ConfigError: response_min (5000) must not exceed response_max (4096)
    """

    response_fraction: float = RESPONSE_FRACTION
    response_min: int = RESPONSE_MIN
    response_max: int = RESPONSE_MAX
    constrained_below: int = CONSTRAINED_BELOW

    def __post_init__(self) -> None:
        f = as_real(self.response_fraction)
        if f is None or not 0 <= f <= 1:  # NaN fails the comparison too
            raise ConfigError(f"response_fraction must be a number in [0, 1], got {self.response_fraction!r}")
        object.__setattr__(self, "response_fraction", float(f))
        for name in ("response_min", "response_max", "constrained_below"):
            v = as_int(getattr(self, name))
            if v is None or v < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
            object.__setattr__(self, name, v)
        if self.response_min > self.response_max:
            raise ConfigError(f"response_min ({self.response_min}) must not exceed response_max ({self.response_max})")

    def response_reserve(self, context_window: int, max_output_tokens: int) -> int:
        """min(max_output_tokens, clamp(ceil(fraction * window), min, max)).

        >>> BudgetPolicy().response_reserve(128_000, 16_384)
        4096
        """
        share = _ceil_product(context_window, self.response_fraction)
        return min(max_output_tokens, max(self.response_min, min(self.response_max, share)))


@dataclass(frozen=True, slots=True)
class Budget:
    """Every term of one request's token budget, and what is left for memory.

    Attributes:
        model: the canonical model name.
        tokenizer_family: the family every term is counted in.
        estimate_kind: the kind of count the terms are.
        context_window: the model's window.
        max_output_tokens: the model's output limit.
        response_reserve: tokens kept for the response.
        safety_fraction: the tokenizer policy's fraction.
        safety_buffer: ceil(context_window * safety_fraction), or
            ceil(token_budget * safety_fraction) when the token budget binds.
        directive_tokens: the directive's cost.
        messages_tokens: the recent messages' cost.
        tool_schema_tokens: the tool schemas' cost.
        formatter_overhead_tokens: the formatter's fixed overhead.
        shortfall: how far the obligations exceed the window, or the token budget when
            it binds (0 when they fit).
        usable: what is left for memories, >= 0.
        constrained: usable < the policy's ``constrained_below`` (256 by default).
        token_budget: the caller's cap on the whole payload, or None. It binds (see
            `capped`) when it leaves less than the window does:
            ``token_budget - ceil(token_budget * safety_fraction)`` below
            ``context_window - response_reserve - ceil(context_window * safety_fraction)``;
            then the payload's terms and the safety buffer are paid from it instead of
            from the window.

    Whichever binds, the ledger balances on its side: ``usable - shortfall`` (one of
    them is 0) is ``context_window - response_reserve``, or ``token_budget`` when
    capped, less the safety buffer and the four terms.

    >>> b = compute_budget("gpt-4", directive_tokens=300, messages_tokens=1200)
    >>> (b.response_reserve, b.safety_buffer, b.usable, b.constrained)
    (1229, 41, 5422, False)
    """

    model: str
    tokenizer_family: str
    estimate_kind: TokenKind
    context_window: int
    max_output_tokens: int
    response_reserve: int
    safety_fraction: float
    safety_buffer: int
    directive_tokens: int
    messages_tokens: int
    tool_schema_tokens: int
    formatter_overhead_tokens: int
    shortfall: int
    usable: int
    constrained: bool
    token_budget: int | None = None

    @property
    def capped(self) -> bool:
        """Whether the token budget, not the window, sets `usable` (and the safety buffer).

        >>> compute_budget("gpt-4o", token_budget=2000).capped
        True
        >>> compute_budget("gpt-4o", token_budget=123_903).capped
        False
        """
        if self.token_budget is None:
            return False
        return _cap_binds(self.context_window, self.response_reserve, self.safety_fraction, self.token_budget)

    @property
    def usable_count(self) -> TokenCount:
        """`usable` as a tagged count in the model's family and kind.

        >>> compute_budget("gpt-4").usable_count.family
        'cl100k_base'
        """
        return TokenCount(self.usable, self.tokenizer_family, self.estimate_kind)

    def record(self) -> dict[str, Any]:
        """Every field as plain JSON-ready values (for logs, traces and the service).

        >>> compute_budget("gpt-4").record()["usable"]
        6922
        """
        return {
            "model": self.model,
            "tokenizer_family": self.tokenizer_family,
            "estimate_kind": self.estimate_kind.value,
            "context_window": self.context_window,
            "max_output_tokens": self.max_output_tokens,
            "response_reserve": self.response_reserve,
            "safety_fraction": self.safety_fraction,
            "safety_buffer": self.safety_buffer,
            "directive_tokens": self.directive_tokens,
            "messages_tokens": self.messages_tokens,
            "tool_schema_tokens": self.tool_schema_tokens,
            "formatter_overhead_tokens": self.formatter_overhead_tokens,
            "shortfall": self.shortfall,
            "usable": self.usable,
            "constrained": self.constrained,
            "token_budget": self.token_budget,
        }


def _cap_binds(context_window: int, response_reserve: int, safety_fraction: float, token_budget: int) -> bool:
    # The cap binds when it leaves less than the window does, each side less its own
    # safety buffer; on a tie the window's ledger stands, so a cap that changes nothing
    # shows nothing.
    window_left = context_window - response_reserve - _ceil_product(context_window, safety_fraction)
    return token_budget - _ceil_product(token_budget, safety_fraction) < window_left


def _term(name: str, value: object, cap: ModelCapability) -> int:
    if isinstance(value, TokenCount):
        if value.family != cap.tokenizer_family or value.kind is not cap.estimate_kind:
            raise TokenizerMismatch(
                f"{name} is a {value.family} ({value.kind.value}) count, but the budget for {cap.name!r} is in "
                f"{cap.tokenizer_family} ({cap.estimate_kind.value}) counts"
            )
        return value.value
    n = as_int(value)
    if n is None:
        raise TypeError(f"{name} must be an int or a TokenCount, got {type(value).__name__}")
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def compute_budget(
    model_or_capability: str | ModelCapability,
    *,
    directive_tokens: SupportsIndex | TokenCount = 0,
    messages_tokens: SupportsIndex | TokenCount = 0,
    tool_schema_tokens: SupportsIndex | TokenCount = 0,
    formatter_overhead_tokens: SupportsIndex | TokenCount = 0,
    catalog: Catalog | None = None,
    policy: BudgetPolicy | None = None,
    token_budget: SupportsIndex | None = None,
) -> Budget:
    """Divide a model's context window and return what is left for memories.

    Token terms and the token budget are integers of any type (a numpy integer such as
    ``count_tokens_batch(...).sum()`` too) other than bool; the `Budget` holds plain ints.
    Without a token budget, ``usable`` is what the window leaves; with one, the smaller of
    that and what the token budget leaves less its own safety buffer, so lowering the
    token budget never raises ``usable``.

    Args:
        model_or_capability: a model name or alias in `catalog`, or a `ModelCapability`.
        directive_tokens: cost of the directive (system prompt).
        messages_tokens: cost of the recent messages carried in the request.
        tool_schema_tokens: cost of the tool schemas.
        formatter_overhead_tokens: the formatter's fixed overhead, estimated before packing.
        catalog: where to look the model up; the shipped catalog by default.
        policy: the response-reserve and constrained settings; `BudgetPolicy()` by default.
        token_budget: a cap on the whole payload (directive, messages, tools, formatting
            and memories), an int >= 1, or None for the window alone.

    Returns:
        A `Budget` with every term, ``usable`` (clamped at 0) and ``constrained``.

    Raises:
        UnknownModel: the name is not in the catalog (with close matches).
        TokenizerMismatch: a `TokenCount` term is of another family or kind than the model's.
        TypeError, ValueError: a term is not an integer / `TokenCount`, or is negative;
            the token budget is not an integer >= 1.

    >>> b = compute_budget("gpt-4o", directive_tokens=1500, messages_tokens=6000)
    >>> (b.response_reserve, b.safety_buffer, b.usable)
    (4096, 640, 115764)
    >>> compute_budget("gpt-4", messages_tokens=7000).usable
    0
    >>> b = compute_budget("gpt-4o", directive_tokens=100, token_budget=2000)
    >>> (b.safety_buffer, b.usable, b.capped)
    (10, 1890, True)
    >>> b = compute_budget("gpt-4o", token_budget=123_903)  # leaves more than the window
    >>> (b.safety_buffer, b.usable, b.capped)
    (640, 123264, False)
    """
    if isinstance(model_or_capability, ModelCapability):
        cap = model_or_capability
    elif isinstance(model_or_capability, str):
        if catalog is not None and not isinstance(catalog, Catalog):
            raise TypeError(f"catalog must be a ctxcore Catalog, got {type(catalog).__name__}")
        cap = (catalog if catalog is not None else default_catalog()).get_model(model_or_capability)
    else:
        raise TypeError(
            f"model_or_capability must be a model name or a ModelCapability, got {type(model_or_capability).__name__}"
        )
    if policy is None:
        policy = BudgetPolicy()
    elif not isinstance(policy, BudgetPolicy):
        raise TypeError(f"policy must be a BudgetPolicy, got {type(policy).__name__}")
    values = dict(
        zip(
            _TERMS,
            (
                _term(n, v, cap)
                for n, v in zip(
                    _TERMS, (directive_tokens, messages_tokens, tool_schema_tokens, formatter_overhead_tokens)
                )
            ),
        )
    )
    limit = check_token_budget(token_budget)
    reserve = policy.response_reserve(cap.context_window, cap.max_output_tokens)
    if limit is not None and _cap_binds(cap.context_window, reserve, cap.safety_fraction, limit):
        room, safety = limit, _ceil_product(limit, cap.safety_fraction)
    else:
        room, safety = cap.context_window - reserve, _ceil_product(cap.context_window, cap.safety_fraction)
    remaining = room - safety - sum(values.values())
    usable = max(0, remaining)
    return Budget(
        model=cap.name,
        tokenizer_family=cap.tokenizer_family,
        estimate_kind=cap.estimate_kind,
        context_window=cap.context_window,
        max_output_tokens=cap.max_output_tokens,
        response_reserve=reserve,
        safety_fraction=cap.safety_fraction,
        safety_buffer=safety,
        directive_tokens=values["directive_tokens"],
        messages_tokens=values["messages_tokens"],
        tool_schema_tokens=values["tool_schema_tokens"],
        formatter_overhead_tokens=values["formatter_overhead_tokens"],
        shortfall=max(0, -remaining),
        usable=usable,
        constrained=usable < policy.constrained_below,
        token_budget=limit,
    )


def check_token_budget(token_budget: object) -> int | None:
    """``token_budget`` (a cap on a payload's tokens) as a plain int, or None; raise
    unless it is None or an integer >= 1 (of any type but bool: numpy's too).

    >>> import numpy as np
    >>> check_token_budget(np.int64(2000))
    2000
    >>> check_token_budget(0)
    Traceback (most recent call last):
    ...
    ValueError: token_budget must be an int >= 1 or None, got 0
    """
    if token_budget is None:
        return None
    n = as_int(token_budget)
    if n is None:
        raise TypeError(f"token_budget must be an int >= 1 or None, got {type(token_budget).__name__}")
    if n < 1:
        raise ValueError(f"token_budget must be an int >= 1 or None, got {n!r}")
    return n
