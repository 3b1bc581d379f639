"""ctxcore: assemble the context for one LLM request inside a hard token budget.

This module is the public API; everything importable from here is supported, nothing
else is (``ctxcore._core`` in particular is private).

>>> import ctxcore
>>> res = ctxcore.pack([ctxcore.Candidate("a", 120, 0.9), ctxcore.Candidate("b", 90, 0.4)], 150)
>>> res.ids
('a',)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    from . import _core
except ImportError as _exc:  # pragma: no cover - only without a built extension
    _exc.add_note(
        "ctxcore's compiled core (ctxcore._core) could not be imported. Install the package "
        "(`pip install .` from a checkout builds it with CMake and a C++17 compiler) and "
        "import it from outside the source tree."
    )
    raise

from .errors import (
    CatalogError,
    ConfigError,
    InvalidCandidate,
    TokenizerMismatch,
    TokenizerUnavailable,
    UnknownModel,
)
from .packing import (
    DEFAULT_BUCKET_TOKENS,
    DEFAULT_CELL_CEILING,
    DEFAULT_SEARCH_NODE_LIMIT,
    Candidate,
    Decision,
    PackPath,
    PackResult,
    Reason,
    pack,
    pack_arrays,
)
from .tokens import (
    TokenCount,
    TokenKind,
    count_tokens,
    estimate_tokens,
    estimate_tokens_batch,
    estimator_families,
    exact_families,
)

try:
    __version__ = version("ctxcore")
except PackageNotFoundError:  # pragma: no cover - running from an unusual layout
    __version__ = _core.__version__

__all__ = [
    "DEFAULT_BUCKET_TOKENS",
    "DEFAULT_CELL_CEILING",
    "DEFAULT_SEARCH_NODE_LIMIT",
    "Candidate",
    "CatalogError",
    "ConfigError",
    "Decision",
    "InvalidCandidate",
    "PackPath",
    "PackResult",
    "Reason",
    "TokenCount",
    "TokenKind",
    "TokenizerMismatch",
    "TokenizerUnavailable",
    "UnknownModel",
    "__version__",
    "count_tokens",
    "estimate_tokens",
    "estimate_tokens_batch",
    "estimator_families",
    "exact_families",
    "pack",
    "pack_arrays",
]
