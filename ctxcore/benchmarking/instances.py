"""Random packing instances in named families: the sets the packer's property tests, its
benchmark gates and ``tools/pack_stress.py`` draw, defined once.

Families: ``uniform`` (1-400 tokens, uniform scores), ``correlated`` and ``strong``
(1-400 tokens, score tracking size weakly / strongly), ``small`` (1-40 tokens),
``memory`` (log-normal memory-sized texts around ~100 tokens, scores in [0, 1]),
``large`` (1,000-9,000 tokens: against 16k or 32k only a few fit among thousands),
``large-correlated`` (the same, scores tracking size) and ``skewed`` (10% large
high-score items among many small ones, where a score-descending greedy loses most of
the value).

>>> import numpy as np
>>> tokens, scores = pack_instance("large", 3, np.random.default_rng(0))
>>> tokens.dtype, scores.dtype, bool(((1000 <= tokens) & (tokens <= 9000)).all())
(dtype('int64'), dtype('float64'), True)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["PACK_FAMILIES", "memory_instance", "pack_instance"]

#: The families `pack_instance` draws.
PACK_FAMILIES = ("uniform", "correlated", "strong", "small", "memory", "large", "large-correlated", "skewed")


def pack_instance(
    family: str, n: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Token costs and scores of `n` candidates of `family`, drawn from `rng`.

    Raises:
        ValueError: an unknown family.
    """
    tokens: npt.NDArray[Any]
    scores: npt.NDArray[Any]
    if family == "memory":
        tokens = (rng.lognormal(4.6, 0.7, n) + 1).astype(np.int64)
        scores = np.round(0.85 * rng.random(n) + 0.15 * rng.random(n), 6)
    elif family in ("large", "large-correlated"):
        tokens = rng.integers(1000, 9001, n)
        scores = rng.random(n) if family == "large" else tokens / 9000 + 0.2 * rng.random(n)
    elif family == "skewed":
        big = rng.random(n) < 0.1
        tokens = np.where(big, rng.integers(1500, 3000, n), rng.integers(20, 80, n))
        scores = np.where(big, 0.9 + 0.1 * rng.random(n), 0.5 + 0.3 * rng.random(n))
    elif family in ("uniform", "correlated", "strong", "small"):
        tokens = rng.integers(1, 41 if family == "small" else 401, n)
        if family == "correlated":
            scores = tokens / 100 + 0.1
        elif family == "strong":
            scores = tokens + 10.0
        else:
            scores = rng.random(n)
    else:
        raise ValueError(f"unknown family {family!r} (one of {', '.join(PACK_FAMILIES)})")
    return tokens.astype(np.int64), np.asarray(scores, dtype=np.float64)


def memory_instance(n: int, seed: int) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Ids, token costs and scores of `n` memory-sized candidates (the ``memory`` family),
    seeded: the instance the packing gates and the README's packing figures use.

    >>> ids, tokens, scores = memory_instance(1000, 42)
    >>> ids[0], len(tokens), bool((scores <= 1).all())
    ('mem-00000', 1000, True)
    """
    tokens, scores = pack_instance("memory", n, np.random.default_rng(seed))
    return [f"mem-{i:05d}" for i in range(n)], tokens, scores
