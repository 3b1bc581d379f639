"""The optional rerank stage: a model that reads the query beside each of the best fused
candidates and orders them again, inside the request's deadline.

A reranker is any callable ``reranker(query, texts) -> scores`` (one finite number per
text, higher is better), e.g. a `CrossEncoderReranker` over a local sentence-transformers
cross-encoder. `ctxcore.assemble` calls it, when given, on the `rerank_pool` best
candidates by value, in a worker thread, for at most `rerank_timeout_ms` (and never past
the caller's deadline less the packing headroom). The reranker reorders that pool; the
pool keeps its values, handed out again in the reranker's order, so the packer's value
scale stays the value model's. A reranker that is late, fails or returns something
other than one finite score per text is skipped: the fused order stands, the result's
`RerankRecord` says why, and the assembly is marked degraded (``rerank_timeout``,
``rerank_error``, ``rerank_skipped``).
"""

from __future__ import annotations

import asyncio
import enum
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._extras import require
from ._numbers import as_int, as_real
from .errors import ConfigError

__all__ = [
    "DEFAULT_RERANK_POOL",
    "DEFAULT_RERANK_TIMEOUT_MS",
    "CrossEncoderReranker",
    "RerankRecord",
    "RerankStatus",
    "Reranker",
]

#: A reranker: ``(query text, candidate texts) -> one finite score per text``, higher better.
Reranker = Callable[[str, list[str]], Sequence[float]]
#: How many of the best candidates by value the reranker reads.
DEFAULT_RERANK_POOL = 32
#: The longest a rerank may take (a local cross-encoder reads 32 short pairs in a few ms).
DEFAULT_RERANK_TIMEOUT_MS = 15.0
#: Less time than this left under the deadline and the rerank is not started.
MIN_RERANK_MS = 1.0


class RerankStatus(enum.StrEnum):
    """How the rerank stage ended."""

    OK = "ok"  #: the pool was reordered by the reranker
    TIMEOUT = "timeout"  #: it did not answer in time; the fused order stands
    ERROR = "error"  #: it raised, or its answer was not one finite score per text
    SKIPPED = "skipped"  #: under the deadline, less than `MIN_RERANK_MS` was left for it


@dataclass(frozen=True, slots=True)
class RerankRecord:
    """What the rerank stage did.

    Attributes:
        status: how it ended (`RerankStatus`).
        candidates: how many candidates it was given (0 when skipped).
        latency_ms: how long the call took, or was waited for.
        timeout_ms: the time it was given.
        error: the exception's type and message for ``error`` (None otherwise).
    """

    status: RerankStatus
    candidates: int
    latency_ms: float
    timeout_ms: float
    error: str | None = None

    def record(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "status": self.status.value,
            "candidates": self.candidates,
            "latency_ms": round(self.latency_ms, 3),
            "timeout_ms": round(self.timeout_ms, 3),
            "error": self.error,
        }


def check_rerank_settings(pool: object, timeout_ms: object) -> tuple[int, float]:
    """The rerank pool size and timeout as a plain int and float (given as numbers of any
    type, numpy's too); `ConfigError` naming a bad one."""
    n = as_int(pool)
    if n is None or n < 1:
        raise ConfigError(f"rerank_pool must be an int >= 1, got {pool!r:.40}")
    ms = as_real(timeout_ms)
    if ms is None or not 0 < ms <= sys.float_info.max:  # NaN, inf and ints past float range fail too
        raise ConfigError(f"rerank_timeout_ms must be a finite number of milliseconds > 0, got {timeout_ms!r:.40}")
    return n, float(ms)


_THREADS: ThreadPoolExecutor | None = None
_THREADS_LOCK = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _THREADS
    with _THREADS_LOCK:
        if _THREADS is None:
            _THREADS = ThreadPoolExecutor(
                max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="ctxcore-rerank"
            )
        return _THREADS


def _scores(got: object, n: int) -> npt.NDArray[np.float64]:
    if isinstance(got, (str, bytes)):
        raise TypeError(f"the reranker returned {type(got).__name__}, not one score per text")
    try:
        arr = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the reranker returned {type(got).__name__}, not numbers: {exc}") from None
    if arr.shape != (n,):
        raise ValueError(f"the reranker returned {arr.size} scores in shape {arr.shape} for {n} texts")
    if not np.isfinite(arr).all():
        raise ValueError("the reranker returned a score that is not finite")
    return arr


async def rerank(
    reranker: Reranker,
    query: str,
    texts: Sequence[str],
    *,
    timeout_ms: float,
    deadline: float | None,
    headroom_ms: float,
) -> tuple[npt.NDArray[np.intp] | None, RerankRecord]:
    """Run `reranker` on `texts` within the time allowed: the order it gives (indices
    into `texts`, best first; None unless ``ok``) and the record."""
    allowed = float(timeout_ms)
    if deadline is not None:
        allowed = min(allowed, (deadline - time.monotonic()) * 1000.0 - headroom_ms)
    if not texts:  # nothing to rerank: the fused order is the whole answer
        return None, RerankRecord(RerankStatus.OK, 0, 0.0, max(allowed, 0.0))
    if allowed < MIN_RERANK_MS:
        return None, RerankRecord(RerankStatus.SKIPPED, 0, 0.0, max(allowed, 0.0))
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    future = loop.run_in_executor(_threads(), reranker, query, list(texts))
    try:
        got = await asyncio.wait_for(future, allowed / 1000.0)
        scores = _scores(got, len(texts))
    except TimeoutError:
        # The thread cannot be stopped: its answer, when it comes, is dropped.
        return None, RerankRecord(RerankStatus.TIMEOUT, len(texts), (time.perf_counter() - t0) * 1000.0, allowed)
    except Exception as exc:  # a user's model: any failure degrades to the fused order
        return None, RerankRecord(
            RerankStatus.ERROR,
            len(texts),
            (time.perf_counter() - t0) * 1000.0,
            allowed,
            f"{type(exc).__name__}: {exc}"[:300],
        )
    order = np.argsort(-scores, kind="stable")
    return order.astype(np.intp), RerankRecord(
        RerankStatus.OK, len(texts), (time.perf_counter() - t0) * 1000.0, allowed
    )


class CrossEncoderReranker:
    """A sentence-transformers cross-encoder from a local directory (never downloaded), as
    a `Reranker`: it scores each (query, text) pair.

    Args:
        path: the model's directory (as ``CrossEncoder.save`` writes it).
        batch_size: pairs per forward pass.
        device: ``"cpu"`` by default.
        model: an already loaded model with ``predict(pairs, ...)`` instead of ``path``.

    Raises:
        MissingExtra: sentence-transformers is not installed (with ``path``).
        ConfigError: nothing loadable at ``path``.
    """

    __slots__ = ("_batch", "_model")

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        batch_size: int = 32,
        device: str = "cpu",
        model: Any = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r:.40}")
        if (path is None) == (model is None):
            raise ValueError("give exactly one of path (a local model directory) or model (a loaded model)")
        if model is None:
            p = Path(os.fspath(path))  # type: ignore[arg-type]
            if not p.is_dir():
                raise ConfigError(f"no cross-encoder model directory at {p}")
            require("sentence-transformers", "CrossEncoderReranker")
            from sentence_transformers import CrossEncoder  # type: ignore[import-not-found,unused-ignore]

            try:
                model = CrossEncoder(str(p), device=device, local_files_only=True)
            except Exception as exc:
                raise ConfigError(f"cannot load a cross-encoder from {p}: {type(exc).__name__}: {exc}"[:400]) from None
        elif not callable(getattr(model, "predict", None)):
            raise TypeError(f"model must have a predict(pairs) method, got {type(model).__name__}")
        self._model = model
        self._batch = batch_size

    def __call__(self, query: str, texts: Sequence[str]) -> Sequence[float]:
        if not texts:
            return []
        got = self._model.predict([(query, t) for t in texts], batch_size=self._batch, show_progress_bar=False)
        return [float(v) for v in np.asarray(got, dtype=np.float64).reshape(-1)]
