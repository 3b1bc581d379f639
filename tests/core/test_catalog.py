"""The capability catalog: the shipped file, users' files and their validation, the CLI."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import ctxcore
from ctxcore import TokenKind
from ctxcore.cli import main

POLICY = """
[tokenizer_policy.cl100k_base]
exact = 0.01
estimate = 0.02
"""

MODEL = """
[models."m1"]
provider = "house"
context_window = 32000
max_output_tokens = 4000
tokenizer_family = "cl100k_base"
estimate_kind = "estimate"
aliases = ["m1-latest"]
"""


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    p = tmp_path / "catalog.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_shipped_catalog_covers_the_major_providers() -> None:
    cat = ctxcore.default_catalog()
    providers = {cat[name].provider for name in cat}
    assert {"openai", "anthropic", "google", "meta", "mistral"} <= providers
    for name in cat:
        m = cat[name]
        assert m.name == name
        assert 0 < m.max_output_tokens <= m.context_window
        assert 0 <= m.safety_fraction < 1
        assert m.tokenizer_family in ctxcore.estimator_families()
        if m.estimate_kind is TokenKind.EXACT:
            assert m.tokenizer_family in ctxcore.exact_families()


@pytest.mark.parametrize(
    "name,window,max_out,family",
    [
        ("gpt-4o", 128_000, 16_384, "o200k_base"),
        ("gpt-4.1", 1_047_576, 32_768, "o200k_base"),
        ("gpt-4", 8192, 8192, "cl100k_base"),
        ("claude-sonnet-4", 200_000, 64_000, "claude"),
        ("gemini-2.5-pro", 1_048_576, 65_536, "gemini"),
        ("llama-3.1-70b-instruct", 131_072, 131_072, "llama3"),
    ],
)
def test_known_models(name: str, window: int, max_out: int, family: str) -> None:
    m = ctxcore.default_catalog()[name]
    assert (m.context_window, m.max_output_tokens, m.tokenizer_family) == (window, max_out, family)


def test_aliases_and_case_resolve_to_the_canonical_entry() -> None:
    cat = ctxcore.default_catalog()
    assert cat.get_model("claude-sonnet-4-20250514").name == "claude-sonnet-4"
    assert cat.get_model("  GPT-4o  ").name == "gpt-4o"
    assert "gpt-4o-2024-08-06" in cat and "no-such-model" not in cat and 3 not in cat


def test_unknown_model_lists_close_matches() -> None:
    with pytest.raises(ctxcore.UnknownModel) as info:
        ctxcore.default_catalog().get_model("claude-sonet-4")
    err = info.value
    assert isinstance(err, LookupError)
    assert err.model == "claude-sonet-4"
    assert "claude-sonnet-4" in err.suggestions
    assert "did you mean" in str(err)
    with pytest.raises(ctxcore.UnknownModel, match="unknown model 'zzzz'") as info2:
        ctxcore.default_catalog()["zzzz"]
    assert info2.value.suggestions == ()
    # A very long name is shown cut in the middle, with its length; `model` keeps it whole.
    long = "gpt-" + "q" * 1_000_000 + "-end"
    with pytest.raises(
        ctxcore.UnknownModel, match=r"unknown model 'gpt-q+'\.\.\.'q+-end' \(1,000,008 characters\)"
    ) as info3:
        ctxcore.default_catalog().get_model(long)
    assert len(str(info3.value)) < 400 and info3.value.model == long


def test_load_a_users_catalog(tmp_path: pathlib.Path) -> None:
    cat = ctxcore.load_catalog(write(tmp_path, POLICY + MODEL))
    m = cat["m1-latest"]
    assert (m.name, m.provider, m.context_window, m.safety_fraction) == ("m1", "house", 32000, 0.02)
    assert len(cat) == 1 and list(cat) == ["m1"]
    assert cat.policies["cl100k_base"].safety_fraction(TokenKind.EXACT) == 0.01


@pytest.mark.parametrize(
    "text,match",
    [
        ("this is = not toml [", "not valid TOML"),
        (MODEL, r"\[tokenizer_policy\] must be a table"),
        (POLICY, r"\[models\] must be a table"),
        (POLICY + MODEL + "\n[extra]\nx = 1\n", "unknown top-level keys extra"),
        ("[tokenizer_policy.gpt2]\nexact = 0.1\n" + MODEL, "tokenizer_policy.gpt2: unknown tokenizer family"),
        ("[tokenizer_policy.cl100k_base]\nexact = 1.5\n" + MODEL, r"cl100k_base.exact: safety fraction must be"),
        ("[tokenizer_policy.cl100k_base]\nexact = -0.1\n" + MODEL, "safety fraction"),
        ("[tokenizer_policy.cl100k_base]\nroughly = 0.1\n" + MODEL, "unknown kind 'roughly'"),
        ("[tokenizer_policy.cl100k_base]\nexact = 0.01\n" + MODEL, r"models.'m1'.*no safety fraction for estimate"),
        (
            POLICY + MODEL.replace("context_window = 32000", "context_window = 0"),
            r"models.'m1'.*context_window must be a positive",
        ),
        (POLICY + MODEL.replace("context_window = 32000", 'context_window = "big"'), "context_window"),
        (POLICY + MODEL.replace("max_output_tokens = 4000", "max_output_tokens = 64000"), "exceeds context_window"),
        (
            POLICY + MODEL.replace('tokenizer_family = "cl100k_base"', 'tokenizer_family = "o200k_base"'),
            "no \\[tokenizer_policy\\] entry",
        ),
        (POLICY + MODEL.replace('estimate_kind = "estimate"', 'estimate_kind = "guess"'), "estimate_kind must be"),
        (POLICY + MODEL.replace('aliases = ["m1-latest"]', "aliases = [1]"), "aliases must be a list"),
        (POLICY + MODEL.replace('provider = "house"', "colour = 'red'"), "unknown keys colour"),
        (POLICY + MODEL.replace('estimate_kind = "estimate"\n', ""), "missing estimate_kind"),
        (
            POLICY + MODEL + MODEL.replace('[models."m1"]', '[models."m2"]'),
            "'m1-latest' of model 'm2' is already used by model 'm1'",
        ),
    ],
)
def test_invalid_catalogs_name_the_bad_entry(tmp_path: pathlib.Path, text: str, match: str) -> None:
    with pytest.raises(ctxcore.CatalogError, match=match) as info:
        ctxcore.load_catalog(write(tmp_path, text))
    assert isinstance(info.value, ValueError)
    assert str(tmp_path) in str(info.value) or "TOML" in str(info.value)


def test_unreadable_catalog(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ctxcore.CatalogError, match="cannot read catalog"):
        ctxcore.load_catalog(tmp_path / "missing.toml")
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ctxcore.CatalogError, match="not UTF-8"):
        ctxcore.load_catalog(bad)


def test_cli_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    assert "gpt-4o" in out and "claude-sonnet-4" in out and "o200k_base" in out
    assert f"{len(ctxcore.default_catalog())} of {len(ctxcore.default_catalog())} models" in out


def test_cli_one_model_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "gpt-4o-mini-2024-07-18", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == [
        {
            "name": "gpt-4o-mini",
            "provider": "openai",
            "context_window": 128000,
            "max_output_tokens": 16384,
            "tokenizer_family": "o200k_base",
            "estimate_kind": "exact",
            "safety_fraction": 0.005,
            "aliases": ["gpt-4o-mini-2024-07-18"],
        }
    ]


def test_cli_errors(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "gpt4o"]) == 1
    assert "did you mean 'gpt-4o'" in capsys.readouterr().err
    assert main(["catalog", "--catalog", str(write(tmp_path, "[models]\n"))]) == 1
    assert "tokenizer_policy" in capsys.readouterr().err
    assert main(["catalog", "--catalog", str(write(tmp_path, POLICY + MODEL))]) == 0
    assert "m1-latest" in capsys.readouterr().out


# ---- OpenAI families and the exact safety fraction ------------------------------------------

OPENAI_MODELS = [
    # name, context window, max output tokens, tokenizer family
    ("gpt-5", 400_000, 128_000, "o200k_base"),
    ("gpt-5-mini", 400_000, 128_000, "o200k_base"),
    ("gpt-5-nano", 400_000, 128_000, "o200k_base"),
    ("gpt-5-chat-latest", 128_000, 16_384, "o200k_base"),
    ("gpt-4.1", 1_047_576, 32_768, "o200k_base"),
    ("gpt-4.1-mini", 1_047_576, 32_768, "o200k_base"),
    ("gpt-4.1-nano", 1_047_576, 32_768, "o200k_base"),
    ("gpt-4o", 128_000, 16_384, "o200k_base"),
    ("gpt-4o-2024-08-06", 128_000, 16_384, "o200k_base"),
    ("gpt-4o-2024-05-13", 128_000, 4_096, "o200k_base"),
    ("chatgpt-4o-latest", 128_000, 16_384, "o200k_base"),
    ("gpt-4o-mini", 128_000, 16_384, "o200k_base"),
    ("o1", 200_000, 100_000, "o200k_base"),
    ("o1-pro", 200_000, 100_000, "o200k_base"),
    ("o1-mini", 128_000, 65_536, "o200k_base"),
    ("o3", 200_000, 100_000, "o200k_base"),
    ("o3-pro", 200_000, 100_000, "o200k_base"),
    ("o3-mini", 200_000, 100_000, "o200k_base"),
    ("o4-mini", 200_000, 100_000, "o200k_base"),
    ("gpt-4-turbo", 128_000, 4_096, "cl100k_base"),
    ("gpt-4", 8_192, 8_192, "cl100k_base"),
    ("gpt-3.5-turbo", 16_385, 4_096, "cl100k_base"),
]


@pytest.mark.parametrize("name,window,max_out,family", OPENAI_MODELS)
def test_openai_models_are_budgeted_in_their_exact_tokens(name: str, window: int, max_out: int, family: str) -> None:
    cat = ctxcore.default_catalog()
    m = cat[name]
    assert (m.provider, m.context_window, m.max_output_tokens, m.tokenizer_family) == (
        "openai",
        window,
        max_out,
        family,
    )
    assert m.estimate_kind is TokenKind.EXACT and family in ctxcore.exact_families()
    assert m.safety_fraction == cat.policies[family].safety_fraction(TokenKind.EXACT)
    # counts of the model's own family and kind build its budget; others are refused
    directive = ctxcore.count_tokens("Answer in one sentence.", family)
    assert ctxcore.compute_budget(m, directive_tokens=directive).directive_tokens == directive.value
    with pytest.raises(ctxcore.TokenizerMismatch):
        ctxcore.compute_budget(m, directive_tokens=ctxcore.estimate_tokens("Answer in one sentence.", family))


def test_every_openai_model_is_exact() -> None:
    cat = ctxcore.default_catalog()
    openai = [cat[n] for n in cat if cat[n].provider == "openai"]
    assert len(openai) >= 20
    assert all(m.estimate_kind is TokenKind.EXACT for m in openai)
    assert {m.tokenizer_family for m in openai} == {"o200k_base", "cl100k_base"}


def test_one_exact_safety_fraction_for_every_family() -> None:
    # One value, in one place: the shipped catalog's exact_safety_fraction.
    text = (pathlib.Path(ctxcore.__file__).parent / "data" / "catalog.toml").read_text(encoding="utf-8")
    assigned = [line for line in text.splitlines() if line.split("=")[0].strip() in {"exact", "exact_safety_fraction"}]
    assert len(assigned) == 1 and assigned[0].startswith("exact_safety_fraction = ")
    fraction = float(assigned[0].split("=")[1])
    cat = ctxcore.default_catalog()
    assert {p.safety_fraction(TokenKind.EXACT) for p in cat.policies.values()} == {fraction}
    # held back from exact budgets: less than from any estimated one
    assert fraction < min(p.safety_fraction(TokenKind.ESTIMATE) for p in cat.policies.values())
    exact = [cat[n] for n in cat if cat[n].estimate_kind is TokenKind.EXACT]
    assert exact and {m.safety_fraction for m in exact} == {fraction}


def test_exact_safety_fraction_in_a_users_catalog(tmp_path: pathlib.Path) -> None:
    text = (
        "exact_safety_fraction = 0.003\n"
        + POLICY.replace("exact = 0.01\n", "")
        + MODEL.replace('estimate_kind = "estimate"', 'estimate_kind = "exact"')
    )
    cat = ctxcore.load_catalog(write(tmp_path, text))
    assert cat["m1"].safety_fraction == 0.003
    # a family's own `exact` overrides the catalog-wide value
    cat = ctxcore.load_catalog(write(tmp_path, "exact_safety_fraction = 0.003\n" + POLICY + MODEL))
    assert cat.policies["cl100k_base"].safety_fraction(TokenKind.EXACT) == 0.01
    for bad in ("1.0", "-0.01", '"small"', "nan"):
        with pytest.raises(ctxcore.CatalogError, match="exact_safety_fraction: safety fraction must be a number"):
            ctxcore.load_catalog(write(tmp_path, f"exact_safety_fraction = {bad}\n" + POLICY + MODEL))


# ---- numbers of any type ------------------------------------------------------------------------


def test_a_capability_takes_numpy_numbers_as_plain_ones() -> None:
    made = ctxcore.ModelCapability(
        "m", "house", np.int64(32_000), np.int32(4000), "cl100k_base", TokenKind.ESTIMATE, np.float32(0.02)
    )
    plain = ctxcore.ModelCapability("m", "house", 32_000, 4000, "cl100k_base", TokenKind.ESTIMATE, 0.02)
    assert made == plain
    assert (type(made.context_window), type(made.max_output_tokens), type(made.safety_fraction)) == (int, int, float)
    # The float32 fraction is the 0.02 it prints as, so the buffer rounds as for 0.02.
    assert ctxcore.compute_budget(made).record() == ctxcore.compute_budget(plain).record()


@pytest.mark.parametrize(
    "window, max_out, safety, match",
    [
        (np.bool_(True), 1, 0.0, "context_window must be a positive integer"),
        (True, 1, 0.0, "context_window must be a positive integer"),
        (np.float64(8192.0), 1024, 0.0, "context_window must be a positive integer"),
        (np.int64(0), 1, 0.0, "context_window must be a positive integer"),
        (8192, np.int64(-1), 0.0, "max_output_tokens must be a positive integer"),
        (8192, "1024", 0.0, "max_output_tokens must be a positive integer"),
        (8192, np.uint32(9000), 0.0, "max_output_tokens \\(9000\\) exceeds context_window \\(8192\\)"),
        (8192, 1024, np.float32("nan"), "safety fraction"),
        (8192, 1024, np.float64(1.0), "safety fraction"),
        (8192, 1024, np.bool_(False), "safety fraction"),
        (8192, 1024, "0.01", "safety fraction"),
    ],
)
def test_a_capability_refuses_what_is_not_a_count_naming_it(
    window: object, max_out: object, safety: object, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ctxcore.ModelCapability("m", "", window, max_out, "cl100k_base", TokenKind.ESTIMATE, safety)  # type: ignore[arg-type]
