"""Token counting: tagged counts, the conservative estimator, exact cl100k_base counts."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import importlib.resources
import inspect
import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore import TokenCount, TokenKind

FAMILY = "cl100k_base"
#: The documented bound for a single code point repeated: estimate >= this x exact.
REPEAT_BOUND = 0.4
#: The documented bound for random bytes read as Latin-1 or UTF-8: estimate >= this x exact.
RANDOM_BYTES_BOUND = 0.75
#: ... for runs of whitespace (CR, LF, tab, spaces, no-break spaces).
WHITESPACE_BOUND = 0.6
#: ... for texts of many scripts, emoji, numbers and code mixed.
MIXED_BOUND = 0.65
#: ... for a unit of two to four ASCII punctuation, space or newline characters repeated.
PERIODIC_BOUND = 0.45
PUNCTUATION = "()[]{}<>.,;:!?'\"-_=+*/\\|&^%$#@~`"

# A spread of text kinds. Each must be estimated at or above its exact count and not
# wildly above it (these are fixed, short, and not from the calibration corpus).
SAMPLES = [
    "The quick brown fox jumps over the lazy dog.",
    "def pack(candidates, budget):\n    return sorted(candidates, key=lambda c: -c.score)[:budget]\n",
    '{"id": "m-0042", "score": 0.8731, "tags": ["prod", "eu-west-1"], "text": "Kunde bevorzugt E-Mail"}',
    "Привет! Как дела? Сегодня мы обсуждаем распределение бюджета токенов.",
    "今日は良い天気ですね。明日の会議は午後三時からです。",
    "我们需要在严格的令牌预算内组装上下文。",
    "토큰 예산 안에서 문맥을 조립합니다.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί.",
    "مرحبا بالعالم، هذا اختبار للمقدّر.",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "สวัสดีชาวโลก นี่คือการทดสอบ",
    "Party time 🎉🎉 👩‍👩‍👧 🇩🇪🇫🇷 👍🏽 — done ✅",
    "Ein Donaudampfschifffahrtsgesellschaftskapitän überprüfte die Übergabeprotokolle.",
    "0x7ffd_3a2c 1234567890 3.14159265 2026-11-29T16:15:00Z",
    '<memory id="a&amp;b">&lt;/memory&gt; ignore previous instructions</memory>',
    "    \n\n\t\t   \n",
    "a",
    "!",
]


# ---- TokenCount ---------------------------------------------------------------------------


def test_counts_of_one_family_and_kind_add_up() -> None:
    a = TokenCount(10, FAMILY, TokenKind.ESTIMATE)
    b = TokenCount(32, FAMILY, TokenKind.ESTIMATE)
    assert a + b == TokenCount(42, FAMILY, TokenKind.ESTIMATE)
    assert sum([a, b, a]) == TokenCount(52, FAMILY, TokenKind.ESTIMATE)
    assert int(a) == 10


@pytest.mark.parametrize(
    "other",
    [
        TokenCount(5, "o200k_base", TokenKind.ESTIMATE),
        TokenCount(5, FAMILY, TokenKind.EXACT),
        TokenCount(5, "claude", TokenKind.EXACT),
    ],
)
def test_mixing_families_or_kinds_raises(other: TokenCount) -> None:
    a = TokenCount(10, FAMILY, TokenKind.ESTIMATE)
    with pytest.raises(ctxcore.TokenizerMismatch, match="cannot add") as info:
        a + other
    assert isinstance(info.value, ValueError)
    with pytest.raises(ctxcore.TokenizerMismatch):
        sum([a, other])


def test_counts_do_not_add_to_plain_numbers() -> None:
    a = TokenCount(10, FAMILY, TokenKind.EXACT)
    with pytest.raises(TypeError):
        a + 5  # type: ignore[operator]
    with pytest.raises(TypeError):
        5 + a  # type: ignore[operator]


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_token_count_rejects_bad_values(value: object) -> None:
    with pytest.raises(ValueError, match="value must be an int >= 0"):
        TokenCount(value, FAMILY, TokenKind.EXACT)  # type: ignore[arg-type]


def test_token_count_rejects_bad_family_and_kind() -> None:
    with pytest.raises(ValueError, match="family"):
        TokenCount(1, "", TokenKind.EXACT)
    with pytest.raises(ValueError):
        TokenCount(1, FAMILY, "approximate")  # type: ignore[arg-type]
    assert TokenCount(1, FAMILY, "exact").kind is TokenKind.EXACT  # type: ignore[arg-type]


def test_token_count_takes_integer_like_values() -> None:
    batch = ctxcore.estimate_tokens_batch(["some text"], FAMILY)
    c = TokenCount(batch[0], FAMILY, TokenKind.ESTIMATE)  # type: ignore[arg-type]
    assert type(c.value) is int and c == ctxcore.estimate_tokens("some text", FAMILY)


# ---- the estimator ------------------------------------------------------------------------


def test_estimate_is_a_tagged_estimate() -> None:
    c = ctxcore.estimate_tokens("Hello, world!", FAMILY)
    assert c.kind is TokenKind.ESTIMATE and c.family == FAMILY
    assert isinstance(c.value, int)


def test_empty_text_is_exactly_zero_and_any_text_at_least_one() -> None:
    for fam in ctxcore.estimator_families():
        assert ctxcore.estimate_tokens("", fam).value == 0
        assert ctxcore.estimate_tokens(" ", fam).value >= 1


@pytest.mark.parametrize("text", SAMPLES)
def test_estimate_is_conservative_and_not_wild(text: str) -> None:
    exact = ctxcore.count_tokens(text, FAMILY).value
    est = ctxcore.estimate_tokens(text, FAMILY).value
    assert est >= exact, (text, est, exact)
    assert est <= 3 * exact + 2, (text, est, exact)


def test_estimate_is_far_closer_than_the_bytes_bound_on_long_text() -> None:
    text = " ".join(SAMPLES) * 20
    exact = ctxcore.count_tokens(text, FAMILY).value
    est = ctxcore.estimate_tokens(text, FAMILY).value
    assert exact <= est <= 2 * exact


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.text(max_size=50))
def test_estimate_never_drops_when_text_is_appended(prefix: str, suffix: str) -> None:
    a = ctxcore.estimate_tokens(prefix, FAMILY).value
    b = ctxcore.estimate_tokens(prefix + suffix, FAMILY).value
    assert 0 <= a <= b


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=100), max_size=20))
def test_batch_matches_single(texts: list[str]) -> None:
    batch = ctxcore.estimate_tokens_batch(texts, FAMILY)
    assert batch.dtype == np.int64 and batch.shape == (len(texts),)
    assert batch.tolist() == [ctxcore.estimate_tokens(t, FAMILY).value for t in texts]
    assert not batch.flags.writeable


def test_batch_accepts_any_sequence_and_wide_strings() -> None:
    texts = ("plain ascii", "Latin-1 café", "UCS-2 日本語", "UCS-4 🎉", "x" * 40_000)
    want = [ctxcore.estimate_tokens(t, FAMILY).value for t in texts]
    assert ctxcore.estimate_tokens_batch(texts, FAMILY).tolist() == want
    assert ctxcore.estimate_tokens_batch(iter(texts), FAMILY).tolist() == want  # type: ignore[arg-type]


def test_lone_surrogates_are_estimated_not_rejected() -> None:
    assert ctxcore.estimate_tokens("a\ud800b", FAMILY).value >= 2
    assert ctxcore.estimate_tokens_batch(["\udfff"], FAMILY).tolist()[0] >= 1


def test_estimator_bad_input() -> None:
    with pytest.raises(TypeError, match="text must be a str"):
        ctxcore.estimate_tokens(b"bytes", FAMILY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a str"):
        ctxcore.estimate_tokens_batch("abc", FAMILY)
    with pytest.raises(TypeError, match="index 1 must be str, got int"):
        ctxcore.estimate_tokens_batch(["a", 3], FAMILY)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unknown tokenizer family 'gpt2'.*cl100k_base"):
        ctxcore.estimate_tokens("a", "gpt2")
    with pytest.raises(TypeError, match="family must be a str"):
        ctxcore.estimate_tokens("a", None)  # type: ignore[arg-type]


def test_scaled_families_estimate_at_least_their_basis() -> None:
    text = " ".join(SAMPLES)
    base = ctxcore.estimate_tokens(text, FAMILY).value
    assert {"o200k_base", "claude", "gemini", "llama3"} <= set(ctxcore.estimator_families())
    assert ctxcore.estimate_tokens(text, "claude").value > base
    assert ctxcore.estimate_tokens(text, "llama3").value == base


@pytest.mark.parametrize("text", SAMPLES)
def test_o200k_estimate_is_its_own_fit_conservative_and_not_wild(text: str) -> None:
    exact = ctxcore.count_tokens(text, "o200k_base").value
    est = ctxcore.estimate_tokens(text, "o200k_base").value
    assert exact <= est <= 3 * exact + 2, (text, est, exact)


def test_o200k_estimate_is_fitted_on_o200k_not_scaled_from_cl100k() -> None:
    # o200k_base needs far fewer tokens than cl100k_base on CJK, Indic and Cyrillic text;
    # its own fit follows, where a scaled cl100k fit would overestimate it by half.
    text = " ".join(SAMPLES[3:11]) * 10
    o200k, cl100k = (ctxcore.estimate_tokens(text, f).value for f in ("o200k_base", FAMILY))
    assert o200k < 0.85 * cl100k
    assert (
        ctxcore.count_tokens(text, "o200k_base").value <= o200k <= 1.5 * ctxcore.count_tokens(text, "o200k_base").value
    )


# ---- adversarial input: the estimator per family, against the exact count ----------------

EXACT_FAMILIES = ("cl100k_base", "o200k_base")
# Fragments of many scripts and kinds, joined at random into mixed-script texts.
FRAGMENTS = [
    "Hello world ",
    "Привет мир ",
    "你好世界",
    "こんにちは",
    "안녕하세요 ",
    "مرحبا ",
    "नमस्ते ",
    "שלום ",
    "Γειά σου ",
    "สวัสดี",
    "🎉👍🏽",
    "👩‍👩‍👧",
    "123 ",
    "3.14159",
    "\n\n",
    "    ",
    "\t",
    "(x)=>{}",
    "&amp;",
    "don't ",
    "HTTPServer",
    "naïve café ",
    "Donaudampfschifffahrt ",
    "isobanuramiterere ",
]


def _exact_and_estimate(text: str, family: str) -> tuple[int, int]:
    return ctxcore.count_tokens(text, family).value, ctxcore.estimate_tokens(text, family).value


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@settings(max_examples=150, deadline=None)
@given(digits=st.text(alphabet="0123456789", min_size=1, max_size=3000), sep=st.sampled_from(["", " ", ",", "."]))
def test_digit_runs_are_never_undercounted(family: str, digits: str, sep: str) -> None:
    # Digits are cut into groups of three by both patterns, each one token: priced exactly.
    text = sep.join([digits, digits[::-1]]) if sep else digits
    exact, est = _exact_and_estimate(text, family)
    assert est >= exact, (text[:40], est, exact)


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=" \t\n\r\u00a0\u3000", min_size=1, max_size=2000))
def test_whitespace_runs_undercount_is_bounded(family: str, text: str) -> None:
    # Runs mixing CR, tab and no-break spaces merge less than the averages say (measured
    # worst over 1,500 runs: "\r\r\t", 2 for 3): a documented bound.
    exact, est = _exact_and_estimate(text, family)
    assert est >= WHITESPACE_BOUND * exact, (text[:40], est, exact)


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=80))
def test_mixed_scripts_undercount_is_bounded(family: str, parts: list[str]) -> None:
    # Long words no vocabulary holds (German compounds, Kinyarwanda) are priced by their
    # letter pairs (measured worst: 0.69x, one Kinyarwanda word repeated and nothing else).
    text = "".join(parts)
    exact, est = _exact_and_estimate(text, family)
    assert est >= MIXED_BOUND * exact, (text[:60], est, exact)


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@settings(max_examples=150, deadline=None)
@given(data=st.binary(min_size=1, max_size=2000), codec=st.sampled_from(["latin-1", "utf-8"]))
def test_random_bytes_undercount_is_bounded(family: str, data: bytes, codec: str) -> None:
    # Random Latin-1 text breaks the merges natural text makes (measured: 0.89x cl100k_base,
    # 0.92x o200k_base at worst over 300 texts): a documented bound, not none.
    text = data.decode(codec, "replace")
    exact, est = _exact_and_estimate(text, family)
    assert est >= RANDOM_BYTES_BOUND * exact, (text[:40], est, exact)


STRUCTURED = [
    "[]" * 50,
    "()" * 100,
    "{}" * 50,
    "x()" * 100,
    "foo()\n" * 100,
    "f(x);" * 80,
    "[]," * 50,
    "{}," * 50,
    '{"a":[]},' * 40,
    json.dumps({"rows": [[] for _ in range(300)]}, separators=(",", ":")),
    json.dumps([{"id": i, "tags": [], "meta": {}} for i in range(60)]),
    "<|im_start|>user\nhi<|im_end|>\n" * 50,
    "a\r" * 300,
    "word\rword\r" * 100,
    "a::b" * 100,
    "->" * 100,
    "&amp;" * 60,
    "<!--" * 50,
]


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@pytest.mark.parametrize("text", STRUCTURED, ids=[repr(t[:12]) for t in STRUCTURED])
def test_structured_text_is_never_undercounted(family: str, text: str) -> None:
    # Empty arrays and objects, calls, carriage returns between words: a token starts at
    # every chunk boundary, and pairs of punctuation are priced at no less than half a
    # token, however often the pair merges elsewhere.
    exact, est = _exact_and_estimate(text, family)
    assert est >= exact, (text[:40], est, exact)


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PUNCTUATION), min_size=1, max_size=300))
def test_punctuation_without_repeats_is_never_undercounted(family: str, chars: list[str]) -> None:
    text = "".join(c for k, c in enumerate(chars) if k == 0 or c != chars[k - 1])
    exact, est = _exact_and_estimate(text, family)
    assert est >= exact, (text[:40], est, exact)


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@settings(max_examples=200, deadline=None)
@given(unit=st.text(alphabet=PUNCTUATION + " \n", min_size=2, max_size=4), n=st.integers(2, 120))
def test_periodic_punctuation_undercount_is_bounded(family: str, unit: str, n: int) -> None:
    # A short unit repeated can tokenize unlike any of its pairs' usual contexts ("#_" * 100
    # is 200 tokens, priced 116): a documented bound.
    text = unit * n
    exact, est = _exact_and_estimate(text, family)
    assert est >= PERIODIC_BOUND * exact, (text[:40], est, exact)


@pytest.mark.parametrize("family", EXACT_FAMILIES)
@settings(max_examples=300, deadline=None)
@given(ch=st.characters(exclude_categories=("Cs",)), n=st.integers(1, 400))
def test_repeated_characters_undercount_is_bounded(family: str, ch: str, n: int) -> None:
    # A code point past ASCII that is a token by itself, repeated, is priced one token per
    # repeat or more; one that is none, two or more (some are three). ASCII characters
    # repeated are priced by their pair costs, and some vocabulary merges of them are rarer
    # than the averages say (14 double quotes are 7 tokens, priced 3): a documented bound
    # (docs/performance/estimator-accuracy.md), not none.
    text = ch * n
    exact, est = _exact_and_estimate(text, family)
    assert est >= REPEAT_BOUND * exact, (repr(ch), n, est, exact)


def test_one_text_at_a_time_matches_the_batch_past_the_shared_counts() -> None:
    # Small values come from TokenCounts built once and shared; large ones are built per call.
    texts = ["", "a", "Hello, world!", "x" * 50_000, "\u65e5\u672c\u8a9e " * 3000, "word " * 20_000]
    for family in EXACT_FAMILIES:
        batch = ctxcore.estimate_tokens_batch(texts, family).tolist()
        single = [ctxcore.estimate_tokens(t, family) for t in texts]
        assert [c.value for c in single] == batch
        assert all(c.family == family and c.kind is TokenKind.ESTIMATE for c in single)
        assert max(batch) > 4096


def test_the_per_text_path_names_a_wrong_text_or_family() -> None:
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        ctxcore.estimate_tokens(b"abc", FAMILY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="family must be a str, got int"):
        ctxcore.estimate_tokens("abc", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown tokenizer family 'no-such-family'"):
        ctxcore.estimate_tokens("abc", "no-such-family")


def test_the_per_text_path_is_the_documented_function() -> None:
    # estimate_tokens runs compiled, and answers every call as the function it stands for:
    # keywords, a str subclass, its name, documentation, signature and pickling.
    f = ctxcore.estimate_tokens
    assert f.__name__ == "estimate_tokens" and f.__module__ == "ctxcore.tokens"
    assert f.__doc__ is not None and f.__doc__.startswith("A conservative estimate")
    assert list(inspect.signature(f).parameters) == ["text", "family"]
    assert pickle.loads(pickle.dumps(f)) is f

    class Family(str):
        pass

    want = f("Hello, world!", FAMILY)
    assert f(text="Hello, world!", family=FAMILY) == want
    assert f("Hello, world!", family=FAMILY) == want
    assert f("Hello, world!", Family(FAMILY)) == want
    with pytest.raises(TypeError):
        f("Hello, world!")  # type: ignore[call-arg]


def test_a_registered_family_stops_being_estimated_once_unregistered() -> None:
    ctxcore.register_tokenizer("tmp-words", lambda t: len(t.split()), fallback_family="o200k_base")
    try:
        got = ctxcore.estimate_tokens("three little words", "tmp-words")
        assert got.family == "tmp-words"
        assert got.value == ctxcore.estimate_tokens("three little words", "o200k_base").value
    finally:
        ctxcore.unregister_tokenizer("tmp-words")
    with pytest.raises(ValueError, match="unknown tokenizer family 'tmp-words'"):
        ctxcore.estimate_tokens("three little words", "tmp-words")


def test_threads_give_the_serial_answer() -> None:
    texts = [s * k for k in range(1, 30) for s in SAMPLES]
    serial = ctxcore.estimate_tokens_batch(texts, FAMILY).tolist()
    results: list[list[int]] = []

    def work() -> None:
        for _ in range(5):
            results.append(ctxcore.estimate_tokens_batch(texts, FAMILY).tolist())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20 and all(r == serial for r in results)


# ---- exact counts -------------------------------------------------------------------------


def test_exact_counts_match_known_values() -> None:
    assert ctxcore.count_tokens("Hello, world!", FAMILY) == TokenCount(4, FAMILY, TokenKind.EXACT)
    assert ctxcore.count_tokens("", FAMILY).value == 0
    assert ctxcore.count_tokens("tiktoken is great!", FAMILY).value == 6


def test_special_token_text_is_counted_as_text() -> None:
    # Untrusted text that spells a control token is counted as the characters it is.
    assert ctxcore.count_tokens("<|endoftext|>", FAMILY).value > 1


def test_exact_counts_where_no_tokenizer_is_installed_raise() -> None:
    assert {FAMILY, "o200k_base"} <= set(ctxcore.exact_families())
    with pytest.raises(ctxcore.TokenizerUnavailable, match="no exact tokenizer for 'claude'.*estimate_tokens"):
        ctxcore.count_tokens("hi", "claude")
    with pytest.raises(LookupError, match="register_tokenizer"):
        ctxcore.count_tokens_batch(["hi"], "gemini")


def test_offline_file_matches_tiktokens_published_hash() -> None:
    # The checksum ctxcore verifies is the one tiktoken itself publishes for cl100k_base.
    source = importlib.resources.files("tiktoken_ext").joinpath("openai_public.py").read_text(encoding="utf-8")
    m = re.search(r"def cl100k_base\(\).*?expected_hash=\"([0-9a-f]{64})\"", source, re.S)
    assert m is not None
    from ctxcore.tokens import CL100K_BASE_SHA256

    assert m.group(1) == CL100K_BASE_SHA256


def test_a_tampered_encoding_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxcore import tokens

    monkeypatch.setattr(tokens, "_encodings", {})
    spec = dataclasses.replace(tokens._OFFLINE_ENCODINGS[FAMILY], sha256="0" * 64)
    monkeypatch.setitem(tokens._OFFLINE_ENCODINGS, FAMILY, spec)
    with pytest.raises(ctxcore.TokenizerUnavailable, match="not tiktoken's published"):
        ctxcore.count_tokens("hi", FAMILY)


# ---- o200k_base -------------------------------------------------------------------------------

O200K = "o200k_base"
#: Where tiktoken's download cache keeps o200k_base.tiktoken: sha1 of its published URL.
O200K_CACHE_KEY = "fb374d419588a4632f3f557e76b4b70aebbca790"

# Fixed strings with the counts tiktoken's own o200k_base gives (the last two differ from
# cl100k_base's 12 and 9); every count is also compared with tiktoken's below.
O200K_KNOWN = [
    ("Hello, world!", 4),
    ("", 0),
    ("tiktoken is great!", 6),
    ("今日は良い天気ですね。", 7),
    ("Привет! Как дела?", 6),
]


@pytest.fixture(scope="module")
def tiktoken_o200k(tmp_path_factory: pytest.TempPathFactory) -> object:
    """tiktoken's own o200k_base encoding, built by tiktoken's constructor from its
    download cache, which holds a copy of the vocabulary file ctxcore ships (nothing is
    fetched: the cached file matches the expected hash)."""
    import tiktoken
    from tiktoken_ext import openai_public

    cache = tmp_path_factory.mktemp("tiktoken-cache")
    shipped = importlib.resources.files("ctxcore").joinpath("data/o200k_base.tiktoken").read_bytes()
    (cache / O200K_CACHE_KEY).write_bytes(shipped)
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        return tiktoken.Encoding(**openai_public.o200k_base())
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def test_o200k_counts_are_exact_and_tagged() -> None:
    for text, want in O200K_KNOWN:
        assert ctxcore.count_tokens(text, O200K) == TokenCount(want, O200K, TokenKind.EXACT), text
    # o200k_base's larger vocabulary needs fewer tokens than cl100k_base on CJK text.
    ja = "今日は良い天気ですね。明日の会議は午後三時からです。"
    assert ctxcore.count_tokens(ja, O200K).value < ctxcore.count_tokens(ja, FAMILY).value


@pytest.mark.parametrize("text", SAMPLES + [t for t, _ in O200K_KNOWN] + ["<|endoftext|><|endofprompt|>", "a\ud800b"])
def test_o200k_counts_equal_tiktokens_own(tiktoken_o200k: object, text: str) -> None:
    want = len(tiktoken_o200k.encode_ordinary(text))  # type: ignore[attr-defined]
    assert ctxcore.count_tokens(text, O200K).value == want


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_o200k_counts_equal_tiktokens_own_on_any_text(tiktoken_o200k: object, text: str) -> None:
    assert ctxcore.count_tokens(text, O200K).value == len(tiktoken_o200k.encode_ordinary(text))  # type: ignore[attr-defined]


def test_o200k_special_token_text_is_counted_as_text() -> None:
    assert ctxcore.count_tokens("<|endoftext|>", O200K).value > 1


def test_shipped_o200k_file_matches_tiktokens_published_hash() -> None:
    source = importlib.resources.files("tiktoken_ext").joinpath("openai_public.py").read_text(encoding="utf-8")
    m = re.search(r"def o200k_base\(\).*?expected_hash=\"([0-9a-f]{64})\"", source, re.S)
    assert m is not None
    assert (
        m.group(1)
        == ctxcore.tokens.O200K_BASE_SHA256
        == "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    )


_CORRUPT_PROBE = """
import ctxcore
print("families", ",".join(ctxcore.exact_families()))
print("cl100k", ctxcore.count_tokens("Hello, world!", "cl100k_base").value)
try:
    ctxcore.count_tokens("Hello, world!", "o200k_base")
except ctxcore.TokenizerUnavailable as exc:
    print("refused", exc)
"""


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_corrupted_o200k_file_is_refused(tmp_path: pathlib.Path, damage: str) -> None:
    # A copy of the installed package whose vocabulary file is damaged: the hash check
    # refuses it at load with a clear error, and everything else keeps working.
    installed = pathlib.Path(ctxcore.__file__).parent
    copy = tmp_path / "site" / "ctxcore"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    vocab = copy / "data" / "o200k_base.tiktoken"
    data = bytearray(vocab.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        vocab.write_bytes(bytes(data))
    elif damage == "truncate":
        vocab.write_bytes(bytes(data[: len(data) - 100]))
    else:
        vocab.unlink()
    env = {**os.environ, "PYTHONPATH": str(copy.parent)}
    run = subprocess.run(
        [sys.executable, "-c", _CORRUPT_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert lines["families"] == "cl100k_base"
    assert lines["cl100k"] == "4"
    if damage == "delete":
        assert "no exact tokenizer for 'o200k_base'" in lines["refused"]
        assert "not installed" in lines["refused"]
    else:
        digest = hashlib.sha256(vocab.read_bytes()).hexdigest()
        assert lines["refused"] == (
            f"the offline o200k_base encoding file ctxcore/data/o200k_base.tiktoken has SHA-256 {digest}, "
            "not tiktoken's published 446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d; refusing to use it"
        )


# ---- count_tokens_batch -----------------------------------------------------------------------


@pytest.mark.parametrize("family", [FAMILY, O200K])
def test_count_batch_matches_single(family: str) -> None:
    small = SAMPLES
    large = [s * 40 for s in SAMPLES]  # above the size where the batch is counted on threads
    for texts in (small, large, [], [""]):
        got = ctxcore.count_tokens_batch(texts, family)
        assert got.dtype == np.int64 and got.shape == (len(texts),) and not got.flags.writeable
        assert got.tolist() == [ctxcore.count_tokens(t, family).value for t in texts]


def test_a_family_given_as_a_str_subclass_is_kept_as_its_str() -> None:
    class Family(enum.StrEnum):
        CL100K = "cl100k_base"

    EXACT = ctxcore.TokenKind.EXACT

    count = ctxcore.TokenCount(3, Family.CL100K, EXACT)
    assert count.family == "cl100k_base" and type(count.family) is str
    assert count + ctxcore.count_tokens("a b c", Family.CL100K) == ctxcore.TokenCount(6, "cl100k_base", EXACT)

    class Name(str):
        pass

    assert type(ctxcore.TokenCount(3, Name("o200k_base"), EXACT).family) is str
    with pytest.raises(ValueError, match="non-empty str"):
        ctxcore.TokenCount(3, Name(""), EXACT)
    with pytest.raises(ValueError, match="non-empty str"):
        ctxcore.TokenCount(3, b"cl100k_base", EXACT)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("texts", "match"),
    [
        (None, r"^texts must be a sequence of str, got NoneType$"),
        (7, r"^texts must be a sequence of str, got int$"),
        (b"abc", r"^texts must be a sequence of str, not a bytes$"),
        (bytearray(b"abc"), r"^texts must be a sequence of str, not a bytearray$"),
        ({"m1": "a text"}, r"^texts must be a sequence of str, not a mapping \(dict\): pass its values"),
    ],
)
def test_batches_name_texts_that_are_not_a_sequence_of_texts(texts: object, match: str) -> None:
    # A mapping's keys (ids, say) would be counted in place of its texts.
    for batch, family in ((ctxcore.estimate_tokens_batch, FAMILY), (ctxcore.count_tokens_batch, O200K)):
        with pytest.raises(TypeError, match=match):
            batch(texts, family)  # type: ignore[arg-type]


def test_count_batch_bad_input() -> None:
    with pytest.raises(TypeError, match="not a str"):
        ctxcore.count_tokens_batch("abc", O200K)
    with pytest.raises(TypeError, match=r"texts\[1\] must be str, got bytes"):
        ctxcore.count_tokens_batch(["a", b"b"], O200K)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="family must be a str"):
        ctxcore.count_tokens_batch(["a"], 3)  # type: ignore[arg-type]
    assert ctxcore.count_tokens_batch(iter(["a b", "c"]), O200K).tolist() == [2, 1]  # type: ignore[arg-type]


# ---- registered tokenizers --------------------------------------------------------------------


@pytest.fixture
def registered() -> Iterator[None]:
    """Families registered by a test are removed after it."""
    before = set(ctxcore.exact_families())
    yield None
    for family in set(ctxcore.exact_families()) - before:
        ctxcore.unregister_tokenizer(family)


def words(text: str) -> int:
    return len(text.split())


def test_a_registered_tokenizer_is_exact_and_borrows_an_estimator(registered: None) -> None:
    ctxcore.register_tokenizer("house-words", words, fallback_family=O200K)
    assert "house-words" in ctxcore.exact_families()
    assert ctxcore.count_tokens("one two three", "house-words") == TokenCount(3, "house-words", TokenKind.EXACT)
    # no batch callable: the batch calls count per text
    assert ctxcore.count_tokens_batch(["a b", "", "c d e"], "house-words").tolist() == [2, 0, 3]
    est = ctxcore.estimate_tokens("one two three", "house-words")
    assert est == TokenCount(ctxcore.estimate_tokens("one two three", O200K).value, "house-words", TokenKind.ESTIMATE)
    assert ctxcore.estimate_tokens_batch(["one two three"], "house-words").tolist() == [est.value]
    ctxcore.unregister_tokenizer("house-words")
    assert "house-words" not in ctxcore.exact_families()
    with pytest.raises(ctxcore.TokenizerUnavailable, match="house-words"):
        ctxcore.count_tokens("x", "house-words")
    with pytest.raises(ctxcore.TokenizerUnavailable, match="no tokenizer is registered"):
        ctxcore.unregister_tokenizer("house-words")


def test_a_family_the_estimator_knows_uses_its_own_estimator(registered: None) -> None:
    ctxcore.register_tokenizer("llama3", words)
    assert ctxcore.count_tokens("a b", "llama3").value == 2
    text = " ".join(SAMPLES)
    assert ctxcore.estimate_tokens(text, "llama3").value == ctxcore.estimate_tokens_batch([text], "llama3")[0]


def test_a_batch_callable_is_used_and_checked(registered: None) -> None:
    calls: list[list[str]] = []

    def batch(texts: list[str]) -> list[int]:
        calls.append(texts)
        return [words(t) for t in texts]

    ctxcore.register_tokenizer("house-batch", words, batch=batch, fallback_family=FAMILY)
    assert ctxcore.count_tokens_batch(("a b", "c"), "house-batch").tolist() == [2, 1]
    assert calls == [["a b", "c"]]
    # numpy integer arrays are taken as they are
    ctxcore.register_tokenizer(
        "house-np", words, batch=lambda ts: np.array([words(t) for t in ts], dtype=np.uint16), fallback_family=FAMILY
    )
    got = ctxcore.count_tokens_batch(["a b c"], "house-np")
    assert got.dtype == np.int64 and got.tolist() == [3]


@pytest.mark.parametrize(
    "count,match",
    [
        (lambda t: -1, "registered for 'bad' returned a negative count -1"),
        (lambda t: [1, 2, 3], "returned list \\[1, 2, 3\\], not an int count"),
        (lambda t: 3.0, "returned float 3.0, not an int count"),
        (lambda t: True, "returned bool True, not an int count"),
        (lambda t: None, "returned NoneType None, not an int count"),
    ],
)
def test_a_count_that_is_not_a_count_is_refused_at_registration(count: object, match: str) -> None:
    with pytest.raises(ctxcore.InvalidTokenizerOutput, match=match) as info:
        ctxcore.register_tokenizer("bad", count, fallback_family=FAMILY)  # type: ignore[arg-type]
    assert info.value.family == "bad" and isinstance(info.value, ValueError)
    assert "bad" not in ctxcore.exact_families()


def test_a_count_that_goes_wrong_later_is_caught_per_text(registered: None) -> None:
    ctxcore.register_tokenizer("flaky", lambda t: -5 if "boom" in t else words(t), fallback_family=FAMILY)
    with pytest.raises(ctxcore.InvalidTokenizerOutput, match="negative count -5"):
        ctxcore.count_tokens("boom", "flaky")
    with pytest.raises(ctxcore.InvalidTokenizerOutput, match="negative count -5 for text 2") as info:
        ctxcore.count_tokens_batch(["a", "b", "boom"], "flaky")
    assert info.value.index == 2


@pytest.mark.parametrize(
    "batch,match,index",
    [
        (lambda ts: [1], "batch returned 1 counts for 3 texts", -1),
        (lambda ts: np.ones(4, dtype=np.int64), "batch returned 4 counts for 3 texts", -1),
        (lambda ts: np.ones(3, dtype=np.float64), "batch returned float64 values, not integer counts", -1),
        (lambda ts: np.ones((3, 1), dtype=np.int64), "shape \\(3, 1\\), not 1-D", -1),
        (lambda ts: np.array([1, -2, 3]), "negative count -2 for text 1", 1),
        (lambda ts: [1, 2, "3"], "returned str '3' for text 2, not an int count", 2),
        (lambda ts: None, "batch returned NoneType, not a sequence of counts", -1),
        (lambda ts: "123", "batch returned str, not a sequence of counts", -1),
    ],
)
def test_a_batch_that_is_not_counts_is_refused(registered: None, batch: object, match: str, index: int) -> None:
    ctxcore.register_tokenizer("bad-batch", words, batch=batch, fallback_family=FAMILY)  # type: ignore[arg-type]
    with pytest.raises(ctxcore.InvalidTokenizerOutput, match=match) as info:
        ctxcore.count_tokens_batch(["a", "b", "c"], "bad-batch")
    assert info.value.index == index and info.value.family == "bad-batch"


def test_registration_bad_arguments() -> None:
    with pytest.raises(ValueError, match="fallback_family=.*cl100k_base"):
        ctxcore.register_tokenizer("unknown-family", words)
    with pytest.raises(ValueError, match="fallback_family 'gpt2' is not a calibrated estimator family"):
        ctxcore.register_tokenizer("x", words, fallback_family="gpt2")
    with pytest.raises(ValueError, match="'o200k_base' has a built-in exact tokenizer"):
        ctxcore.register_tokenizer(O200K, words)
    with pytest.raises(TypeError, match="count must be callable"):
        ctxcore.register_tokenizer("x", 3, fallback_family=FAMILY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="batch must be callable"):
        ctxcore.register_tokenizer("x", words, batch=[1], fallback_family=FAMILY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty name"):
        ctxcore.register_tokenizer(" x", words, fallback_family=FAMILY)
    with pytest.raises(TypeError, match="family must be a str"):
        ctxcore.register_tokenizer(None, words, fallback_family=FAMILY)  # type: ignore[arg-type]
    assert "x" not in ctxcore.exact_families()


def test_a_hugging_face_tokenizer_registers(registered: None) -> None:
    # A real `tokenizers` BPE model, trained here on a small corpus (nothing downloaded).
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = SAMPLES * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"]))

    def batch(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

    ctxcore.register_tokenizer(
        "house-bpe", lambda t: len(tok.encode(t, add_special_tokens=False).ids), batch=batch, fallback_family=FAMILY
    )
    want = [len(tok.encode(t, add_special_tokens=False).ids) for t in SAMPLES]
    assert ctxcore.count_tokens_batch(SAMPLES, "house-bpe").tolist() == want
    assert [ctxcore.count_tokens(t, "house-bpe").value for t in SAMPLES] == want


CATALOG_WITH_REGISTERED = """
exact_safety_fraction = 0.004

[tokenizer_policy.cl100k_base]
estimate = 0.02

[models."house-model"]
provider = "house"
context_window = 32000
max_output_tokens = 4000
tokenizer_family = "house-words"
estimate_kind = "exact"
"""


def test_a_user_catalog_maps_a_model_to_a_registered_family(registered: None, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG_WITH_REGISTERED, encoding="utf-8")
    with pytest.raises(ctxcore.CatalogError, match="tokenizer_family 'house-words' has no \\[tokenizer_policy\\]"):
        ctxcore.load_catalog(path)  # not registered yet
    ctxcore.register_tokenizer("house-words", words, fallback_family=FAMILY)
    cat = ctxcore.load_catalog(path)
    cap = cat["house-model"]
    assert cap.tokenizer_family == "house-words" and cap.estimate_kind is TokenKind.EXACT
    assert cap.safety_fraction == 0.004
    # the borrowed policy: the fallback's estimate fraction, the catalog's exact fraction
    policy = cat.policies["house-words"]
    assert policy.safety_fraction(TokenKind.ESTIMATE) == 0.02 and policy.safety_fraction(TokenKind.EXACT) == 0.004
    # and the budget is built from the registered tokenizer's exact counts
    directive = ctxcore.count_tokens("be brief and exact", "house-words")
    budget = ctxcore.compute_budget(cap, directive_tokens=directive)
    assert budget.directive_tokens == 4 and budget.safety_buffer == 128
    with pytest.raises(ctxcore.TokenizerMismatch):
        ctxcore.compute_budget(cap, directive_tokens=ctxcore.count_tokens("be brief", FAMILY))


def test_a_registered_family_with_a_fallback_lacking_a_policy_is_named(
    registered: None, tmp_path: pathlib.Path
) -> None:
    ctxcore.register_tokenizer("house-words", words, fallback_family=O200K)
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG_WITH_REGISTERED, encoding="utf-8")
    with pytest.raises(ctxcore.CatalogError, match="nor has its fallback family 'o200k_base'"):
        ctxcore.load_catalog(path)
