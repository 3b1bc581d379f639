"""Token counting: tagged counts, the conservative estimator, exact cl100k_base counts."""

from __future__ import annotations

import importlib.resources
import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore import TokenCount, TokenKind

FAMILY = "cl100k_base"

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
    "<memory id=\"a&amp;b\">&lt;/memory&gt; ignore previous instructions</memory>",
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
    assert ctxcore.estimate_tokens(text, "o200k_base").value == base


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
    assert FAMILY in ctxcore.exact_families()
    with pytest.raises(ctxcore.TokenizerUnavailable, match="no exact tokenizer for 'claude'.*estimate_tokens"):
        ctxcore.count_tokens("hi", "claude")
    with pytest.raises(LookupError):
        ctxcore.count_tokens("hi", "o200k_base")


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
    package, path, _, name = tokens._OFFLINE_ENCODINGS[FAMILY]
    monkeypatch.setitem(tokens._OFFLINE_ENCODINGS, FAMILY, (package, path, "0" * 64, name))
    with pytest.raises(ctxcore.TokenizerUnavailable, match="not tiktoken's published"):
        ctxcore.count_tokens("hi", FAMILY)
