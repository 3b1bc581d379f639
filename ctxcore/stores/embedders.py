"""Semantic embedders for the stores: a static model that ships in its wheel, a
sentence-transformers model from a local path, and an OpenAI-compatible endpoint.

Every embedder here is an `ctxcore.stores.Embedder` (a ``name`` for its embedding space,
``embed(text)``) and also embeds in batches (``embed_batch(texts)`` → an ``(n, dim)``
float32 array), which the stores use when they ingest. Their names record the model and
the dimension, so a store built with one refuses another at open, naming both.

- `WordLlamaEmbedder` (extra ``wordllama``): WordLlama's static token embeddings, whose
  small models are inside the ``wordllama`` wheel; nothing is downloaded, about 20 ms per
  1,000 short memories on one core. Finds paraphrases and synonyms that a lexical
  embedder cannot.
- `SentenceTransformerEmbedder` (extra ``sentence-transformers``): any
  sentence-transformers model in a local directory (never fetched from a hub).
- `OpenAIEmbedder` (extra ``http``): ``POST {base_url}/embeddings`` of any
  OpenAI-compatible server, batched, each call bounded by a timeout, retries only while
  time is left.

`embedder_from_name` rebuilds the embedder a store recorded, where that needs no
configuration (the hashing and WordLlama embedders).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._extras import require
from .embedding import Embedder, HashingEmbedder, unit
from .errors import MemoryStoreError

__all__ = [
    "EmbedderError",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "WordLlamaEmbedder",
    "embed",
    "embed_many",
    "embedder_from_name",
]

#: Texts per call to a model or an endpoint when a store ingests.
DEFAULT_BATCH = 256
_WORDLLAMA_NAME = re.compile(r"wordllama/([a-z0-9_]{1,40})/dim=([0-9]{2,5})")


class EmbedderError(MemoryStoreError):
    """An embedder could not embed: a model that does not load, an endpoint that refuses
    or does not answer in time, an answer of the wrong shape."""


def _texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of str, not one str")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
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
        raise EmbedderError(f"embedder {embedder.name!r} returned {v.shape} values, not a 1-D vector of "
                            "finite numbers")
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
            self._model = WordLlama.load(config=config, dim=256, trunc_dim=None if dim == 256 else dim,
                                         cache_dir=here, disable_download=True)
        except Exception as exc:  # the library raises several kinds for a missing file
            raise EmbedderError(f"WordLlama model {config!r} (dim {dim}) is not in the installed wordllama "
                                f"package at {here}: {type(exc).__name__}: {exc}"[:400]) from None
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

    def __init__(self, path: str | os.PathLike[str] | None = None, *, batch_size: int = 64, device: str = "cpu",
                 model: Any = None, name: str | None = None) -> None:
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
                raise EmbedderError(f"cannot load a sentence-transformers model from {p}: "
                                    f"{type(exc).__name__}: {exc}"[:400]) from None
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
        return np.asarray(self._model.encode(items, batch_size=self._batch, convert_to_numpy=True,
                                             show_progress_bar=False), dtype=np.float64)

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

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 dimensions: int | None = None, batch_size: int = DEFAULT_BATCH, timeout: float = 10.0,
                 deadline: float = 60.0, retries: int = 3, transport: Any = None) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty str")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r:.40}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r:.40}")
        for nm, f in (("timeout", timeout), ("deadline", deadline)):
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1e6:
                raise ValueError(f"{nm} must be a number of seconds > 0, got {f!r:.40}")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or dimensions < 1):
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
            chunk = items[b:b + self._batch]
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
            raise EmbedderError(f"{self._url}/embeddings answered without {n} embeddings: "
                                f"{type(exc).__name__}: {exc}"[:300]) from None


def embedder_from_name(name: str) -> Embedder | None:
    """The embedder a store recorded, rebuilt, when its name is all it needs (the hashing
    and WordLlama embedders); None for the others (the caller passes them).

    >>> embedder_from_name("hashing-v1/dim=64/seed=0")
    HashingEmbedder(dim=64, seed=0)
    >>> embedder_from_name("openai/text-embedding-3-small/dim=1536") is None
    True
    """
    h = HashingEmbedder.from_name(name)
    if h is not None:
        return h
    m = _WORDLLAMA_NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        return None
    return WordLlamaEmbedder(m.group(1), int(m.group(2)))

