"""The capability catalog: what each model can take and how its tokens are counted.

The first input of the budget stage. A catalog maps model names and aliases to a
`ModelCapability` (context window, output limit, tokenizer family, the kind of count its
budget is built from) and holds the tokenizer policies (the safety fraction of the window
held back, per family and kind of count: one catalog-wide ``exact_safety_fraction`` for
exact counts, a per-family ``estimate`` fraction). A model may name a family added with
`ctxcore.register_tokenizer`; without a policy table of its own, that family takes the
table of the calibrated family it falls back to. One catalog ships with the package
(``ctxcore/data/catalog.toml``); `load_catalog` reads a user's own file of the same shape,
validating every entry and naming the bad one. Looking up a model that is not there raises
`UnknownModel` with the closest names.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ._files import read_utf8
from ._numbers import as_int, as_real
from .errors import CatalogError, UnknownModel
from .tokens import TokenKind, estimator_families, fallback_family_of

__all__ = [
    "Catalog",
    "ModelCapability",
    "TokenizerPolicy",
    "default_catalog",
    "load_catalog",
]

#: How many close names an `UnknownModel` error offers (difflib's default cutoff 0.6).
_SUGGESTIONS = 5

_MODEL_KEYS = {"provider", "context_window", "max_output_tokens", "tokenizer_family", "estimate_kind", "aliases"}
_REQUIRED_MODEL_KEYS = _MODEL_KEYS - {"provider", "aliases"}


@dataclass(frozen=True, slots=True)
class TokenizerPolicy:
    """The safety fractions of one tokenizer family, per kind of count.

    Attributes:
        family: the tokenizer family.
        safety_fractions: `TokenKind` -> fraction of the context window held back when
            counts of that kind are used; only the kinds the policy allows are present.

    >>> p = TokenizerPolicy("cl100k_base", {TokenKind.ESTIMATE: 0.02})
    >>> p.safety_fraction(TokenKind.ESTIMATE)
    0.02
    """

    family: str
    safety_fractions: Mapping[TokenKind, float]

    def __post_init__(self) -> None:
        object.__setattr__(self, "safety_fractions", MappingProxyType(dict(self.safety_fractions)))

    def safety_fraction(self, kind: TokenKind) -> float:
        """The fraction for `kind`; `CatalogError` when this family has no policy for it.

        >>> default_catalog().policies["cl100k_base"].safety_fraction(TokenKind.EXACT)
        0.005
        """
        try:
            return self.safety_fractions[kind]
        except KeyError:
            raise CatalogError(
                f"tokenizer policy {self.family!r} has no safety fraction for {kind.value} counts"
            ) from None


@dataclass(frozen=True, slots=True)
class ModelCapability:
    """What one model can take, and how its tokens are counted.

    Attributes:
        name: the canonical model name.
        provider: who serves it (``"openai"``, ``"anthropic"``, ...), or ``""``.
        context_window: total tokens the model accepts, prompt and response together.
        max_output_tokens: the most tokens it will generate in one response.
        tokenizer_family: the family its token counts are in.
        estimate_kind: the kind of count a budget for it is built from.
        safety_fraction: share of the window held back for that family and kind.
        aliases: other names that resolve to it.

    The window and output limit are positive integers of any type but bool (numpy's
    too), the fraction a real number in [0, 1); all are kept as plain ints and floats.

    >>> cap = default_catalog()["gpt-4o"]
    >>> (cap.context_window, cap.max_output_tokens, cap.tokenizer_family)
    (128000, 16384, 'o200k_base')
    """

    name: str
    provider: str
    context_window: int
    max_output_tokens: int
    tokenizer_family: str
    estimate_kind: TokenKind
    safety_fraction: float
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        window, max_output, safety = _check_capability(
            self.name, self.context_window, self.max_output_tokens, self.safety_fraction, ValueError
        )
        object.__setattr__(self, "context_window", window)
        object.__setattr__(self, "max_output_tokens", max_output)
        object.__setattr__(self, "safety_fraction", safety)
        object.__setattr__(self, "estimate_kind", TokenKind(self.estimate_kind))


def _check_capability(
    where: str, window: object, max_output: object, safety: object, error: type[ValueError]
) -> tuple[int, int, float]:
    """The window, output limit and safety fraction as plain numbers, or `error` naming
    the bad one."""
    counts: list[int] = []
    for key, value in (("context_window", window), ("max_output_tokens", max_output)):
        n = as_int(value)
        if n is None or n <= 0:
            raise error(f"{where}: {key} must be a positive integer, got {value!r}")
        counts.append(n)
    n_window, n_output = counts
    if n_output > n_window:
        raise error(f"{where}: max_output_tokens ({n_output}) exceeds context_window ({n_window})")
    fraction = as_real(safety)
    if fraction is None or not 0 <= fraction < 1:  # NaN fails the comparison too
        raise error(f"{where}: safety fraction must be a number in [0, 1), got {safety!r}")
    return n_window, n_output, float(fraction)


class Catalog(Mapping[str, ModelCapability]):
    """Model capabilities by canonical name, with aliases and case-insensitive lookup.

    A read-only mapping over canonical names; `get_model` (and ``catalog[name]``) also
    accept aliases in any letter case, and raise `UnknownModel` with close matches.

    >>> cat = default_catalog()
    >>> cat["GPT-4o-2024-08-06"].name
    'gpt-4o'
    >>> "gpt-4o" in cat
    True
    """

    __slots__ = ("_models", "_index", "_policies", "source")

    def __init__(
        self, models: Mapping[str, ModelCapability], policies: Mapping[str, TokenizerPolicy], source: str
    ) -> None:
        self._models = dict(models)
        self._policies = MappingProxyType(dict(policies))
        self.source = source
        index: dict[str, str] = {}
        for name, cap in self._models.items():
            for key in (name, *cap.aliases):
                folded = key.casefold()
                if folded in index and index[folded] != name:
                    raise CatalogError(
                        f"{source}: name {key!r} of model {name!r} is already used by model {index[folded]!r}"
                    )
                index[folded] = name
        self._index = index

    @property
    def policies(self) -> Mapping[str, TokenizerPolicy]:
        """Tokenizer policies by family.

        >>> sorted(default_catalog().policies)[:2]
        ['cl100k_base', 'claude']
        """
        return self._policies

    def get_model(self, name: str) -> ModelCapability:
        """The capability of a model, by canonical name or alias (any letter case).

        Raises:
            UnknownModel: no such name; `suggestions` holds the closest names.

        >>> default_catalog().get_model("claude-sonnet-4-20250514").name
        'claude-sonnet-4'
        """
        if not isinstance(name, str):
            raise TypeError(f"model name must be a str, got {type(name).__name__}")
        canonical = self._index.get(name.strip().casefold())
        if canonical is not None:
            return self._models[canonical]
        close = difflib.get_close_matches(name.strip().casefold(), list(self._index), n=_SUGGESTIONS)
        suggestions = tuple(dict.fromkeys(close))
        hint = f"; did you mean {', '.join(repr(s) for s in suggestions)}?" if suggestions else ""
        raise UnknownModel(
            f"unknown model {_shown(name)} in catalog {self.source}{hint} (`ctxcore catalog` lists the models)",
            model=name,
            suggestions=suggestions,
        )

    def __getitem__(self, name: str) -> ModelCapability:
        return self.get_model(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.strip().casefold() in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def __repr__(self) -> str:
        return f"Catalog({len(self)} models from {self.source})"


def _fraction(value: object, where: str) -> float:
    fraction = as_real(value)
    if fraction is None or not 0 <= fraction < 1:  # NaN fails the comparison too
        raise CatalogError(f"{where}: safety fraction must be a number in [0, 1), got {value!r}")
    return float(fraction)


def _parse_policies(data: Any, exact_fraction: float | None, source: str) -> dict[str, TokenizerPolicy]:
    if not isinstance(data, dict) or not data:
        raise CatalogError(f"{source}: [tokenizer_policy] must be a table with one entry per tokenizer family")
    known = set(estimator_families())
    out: dict[str, TokenizerPolicy] = {}
    for family, entry in data.items():
        where = f"{source}: tokenizer_policy.{family}"
        if family not in known and fallback_family_of(family) is None:
            raise CatalogError(
                f"{where}: unknown tokenizer family; the estimator knows {', '.join(sorted(known))} "
                "(register_tokenizer adds others)"
            )
        if not isinstance(entry, dict) or not entry:
            raise CatalogError(f"{where}: must be a table with 'exact' and/or 'estimate' fractions")
        # Exact counts hold back the catalog's one exact_safety_fraction, unless the
        # family's own table sets `exact`.
        fractions: dict[TokenKind, float] = {}
        if exact_fraction is not None:
            fractions[TokenKind.EXACT] = exact_fraction
        for kind_name, value in entry.items():
            try:
                kind = TokenKind(kind_name)
            except ValueError:
                raise CatalogError(f"{where}: unknown kind {kind_name!r} (expected 'exact' or 'estimate')") from None
            fractions[kind] = _fraction(value, f"{where}.{kind_name}")
        out[family] = TokenizerPolicy(family, fractions)
    return out


def _borrow_policies(models: Any, policies: dict[str, TokenizerPolicy]) -> None:
    """Give each registered family that models use, and that has no policy of its own,
    the policy of the calibrated family it falls back to."""
    if not isinstance(models, dict):
        return
    for entry in models.values():
        family = entry.get("tokenizer_family") if isinstance(entry, dict) else None
        if not isinstance(family, str) or family in policies:
            continue
        fallback = fallback_family_of(family)
        if fallback is not None and fallback in policies:
            policies[family] = TokenizerPolicy(family, policies[fallback].safety_fractions)


def _parse_model(name: str, entry: Any, policies: Mapping[str, TokenizerPolicy], source: str) -> ModelCapability:
    where = f"{source}: models.{name!r}"
    if not name.strip():
        raise CatalogError(f"{source}: a model has an empty name")
    if not isinstance(entry, dict):
        raise CatalogError(f"{where}: must be a table")
    unknown = set(entry) - _MODEL_KEYS
    if unknown:
        raise CatalogError(
            f"{where}: unknown keys {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(_MODEL_KEYS))})"
        )
    missing = _REQUIRED_MODEL_KEYS - set(entry)
    if missing:
        raise CatalogError(f"{where}: missing {', '.join(sorted(missing))}")
    family = entry["tokenizer_family"]
    if not isinstance(family, str) or family not in policies:
        fallback = fallback_family_of(family) if isinstance(family, str) else None
        borrowed = f", nor has its fallback family {fallback!r}" if fallback is not None else ""
        raise CatalogError(
            f"{where}: tokenizer_family {family!r} has no [tokenizer_policy] entry{borrowed} "
            f"(have: {', '.join(sorted(policies))})"
        )
    try:
        kind = TokenKind(entry["estimate_kind"])
    except ValueError:
        raise CatalogError(
            f"{where}: estimate_kind must be 'exact' or 'estimate', got {entry['estimate_kind']!r}"
        ) from None
    if kind not in policies[family].safety_fractions:
        raise CatalogError(f"{where}: tokenizer policy {family!r} has no safety fraction for {kind.value} counts")
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        raise CatalogError(f"{where}: aliases must be a list of non-empty strings")
    provider = entry.get("provider", "")
    if not isinstance(provider, str):
        raise CatalogError(f"{where}: provider must be a string")
    safety = policies[family].safety_fractions[kind]
    _check_capability(where, entry["context_window"], entry["max_output_tokens"], safety, CatalogError)
    return ModelCapability(
        name=name,
        provider=provider,
        context_window=entry["context_window"],
        max_output_tokens=entry["max_output_tokens"],
        tokenizer_family=family,
        estimate_kind=kind,
        safety_fraction=safety,
        aliases=tuple(aliases),
    )


def parse_catalog(text: str, source: str = "<string>") -> Catalog:
    """Build a `Catalog` from TOML text (the shape of ``ctxcore/data/catalog.toml``).

    Raises:
        CatalogError: the text is not TOML, or an entry is invalid (the message names it).

    >>> cat = parse_catalog('''
    ... [tokenizer_policy.cl100k_base]
    ... exact = 0.01
    ... [models."my-model"]
    ... context_window = 8192
    ... max_output_tokens = 1024
    ... tokenizer_family = "cl100k_base"
    ... estimate_kind = "exact"
    ... ''')
    >>> cat["my-model"].safety_fraction
    0.01
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(data) - {"exact_safety_fraction", "tokenizer_policy", "models"}
    if unknown:
        raise CatalogError(
            f"{source}: unknown top-level keys {', '.join(sorted(unknown))} "
            "(expected exact_safety_fraction, tokenizer_policy, models)"
        )
    exact_fraction = None
    if "exact_safety_fraction" in data:
        exact_fraction = _fraction(data["exact_safety_fraction"], f"{source}: exact_safety_fraction")
    policies = _parse_policies(data.get("tokenizer_policy"), exact_fraction, source)
    models_data = data.get("models")
    _borrow_policies(models_data, policies)
    if not isinstance(models_data, dict) or not models_data:
        raise CatalogError(f"{source}: [models] must be a table with at least one model")
    models = {name: _parse_model(name, entry, policies, source) for name, entry in models_data.items()}
    return Catalog(models, policies, source)


def load_catalog(path: str | Path) -> Catalog:
    """Load a capability catalog from a TOML file.

    Args:
        path: a file of the same shape as the shipped ``ctxcore/data/catalog.toml``: an
            optional top-level ``exact_safety_fraction``, ``[tokenizer_policy.FAMILY]``
            tables with ``estimate`` (and optionally ``exact``) safety fractions, and
            ``[models."NAME"]`` tables. Register your own tokenizers before loading a
            catalog whose models use them.

    Raises:
        CatalogError: the file cannot be read, is not TOML, or has an invalid entry.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "cat.toml"
    >>> _ = p.write_text('[tokenizer_policy.claude]\\nestimate = 0.05\\n[models.m]\\n'
    ...                  'context_window = 1000\\nmax_output_tokens = 100\\n'
    ...                  'tokenizer_family = "claude"\\nestimate_kind = "estimate"\\n')
    >>> load_catalog(p)["m"].context_window
    1000
    """
    p = Path(path)
    text = read_utf8(p, CatalogError, what="catalog")
    return parse_catalog(text, str(p))


@functools.cache
def default_catalog() -> Catalog:
    """The catalog shipped with ctxcore (``ctxcore/data/catalog.toml``), loaded once.

    >>> len(default_catalog()) > 20
    True
    """
    text = importlib.resources.files("ctxcore").joinpath("data/catalog.toml").read_text(encoding="utf-8")
    return parse_catalog(text, "ctxcore/data/catalog.toml")


#: The longest model name an error message shows whole.
_SHOWN_NAME_CHARS = 120


def _shown(name: str) -> str:
    """`name` as an error message shows it: its repr, a long one cut in the middle.

    >>> _shown("gpt-4o"), len(_shown("x" * 10_000)) < 200
    ("'gpt-4o'", True)
    """
    if len(name) <= _SHOWN_NAME_CHARS:
        return repr(name)
    half = _SHOWN_NAME_CHARS // 2
    return f"{name[:half]!r}...{name[-half:]!r} ({len(name):,} characters)"
