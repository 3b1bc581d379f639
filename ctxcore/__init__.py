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

from .assembly import AssembledContext, AssemblyConfig, assemble
from .budget import (
    CONSTRAINED_BELOW,
    RESPONSE_FRACTION,
    RESPONSE_MAX,
    RESPONSE_MIN,
    Budget,
    BudgetPolicy,
    compute_budget,
)
from .catalog import Catalog, ModelCapability, TokenizerPolicy, default_catalog, load_catalog
from .degradation import DegradationReason
from .errors import (
    CatalogError,
    ConfigError,
    ContextOverflow,
    InvalidCandidate,
    InvalidFormatInput,
    InvalidTokenizerOutput,
    MissingExtra,
    TokenizerMismatch,
    TokenizerUnavailable,
    UnknownModel,
)
from .formatting import (
    MIN_NONCE_HEX_DIGITS,
    NONCE_BYTES,
    SAFETY_SENTENCE,
    FormatSection,
    FormattedContext,
    FormatterOverhead,
    format_context,
    formatter_overhead,
)
from .memory import LATER, MemoryBatch, MemoryOrigin, MemoryRecord, MemoryStore, NowOrLater, Query, Scope, Sources
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
from .redundancy import DEFAULT_DUPLICATE_THRESHOLD, near_duplicate_groups, normalized_text_key
from .request import DEFAULT_POOL, AssemblyOptions, AssemblyRequest, HistoryPolicy, Message, Role, ToolCall
from .rerank import CrossEncoderReranker, Reranker, RerankRecord, RerankStatus
from .result import (
    Branch,
    BranchRecord,
    BranchStatus,
    HistoryDrop,
    Pricing,
    StageTimings,
    TraceEntry,
    TraceReason,
    Wall,
    WallSource,
)
from .retrieval import BranchTimeouts, Retrieved, compute_wall, retrieve
from .scoring import (
    DEFAULT_MIN_SIMILARITY,
    DEFAULT_RELEVANCE_FLOOR,
    FULL_TEXT_RELEVANCE,
    INTERIM_CONFIDENCE_WEIGHT,
    INTERIM_SIMILARITY_WEIGHT,
    FusionMethod,
    ScoredCandidates,
    ScoreFormula,
    ScoreWeights,
    ScoringConfig,
    ValueModel,
    interim_score,
    relevance_gate,
    score_candidates,
)
from .tokens import (
    TokenCount,
    TokenKind,
    count_tokens,
    count_tokens_batch,
    estimate_tokens,
    estimate_tokens_batch,
    estimator_families,
    exact_families,
    register_tokenizer,
    unregister_tokenizer,
)

try:
    __version__ = version("ctxcore-llm")
except PackageNotFoundError:  # pragma: no cover - running from an unusual layout
    __version__ = _core.__version__

__all__ = [
    "AssembledContext",
    "AssemblyConfig",
    "AssemblyOptions",
    "AssemblyRequest",
    "Branch",
    "BranchRecord",
    "BranchStatus",
    "BranchTimeouts",
    "ContextOverflow",
    "HistoryDrop",
    "HistoryPolicy",
    "Pricing",
    "MemoryBatch",
    "MemoryOrigin",
    "MemoryRecord",
    "MemoryStore",
    "Message",
    "NowOrLater",
    "LATER",
    "Query",
    "Retrieved",
    "Role",
    "Scope",
    "Sources",
    "StageTimings",
    "ToolCall",
    "TraceEntry",
    "TraceReason",
    "Wall",
    "WallSource",
    "assemble",
    "compute_wall",
    "retrieve",
    "CONSTRAINED_BELOW",
    "DEFAULT_MIN_SIMILARITY",
    "DEFAULT_RELEVANCE_FLOOR",
    "FULL_TEXT_RELEVANCE",
    "INTERIM_CONFIDENCE_WEIGHT",
    "INTERIM_SIMILARITY_WEIGHT",
    "RESPONSE_FRACTION",
    "RESPONSE_MAX",
    "RESPONSE_MIN",
    "Budget",
    "BudgetPolicy",
    "Catalog",
    "ModelCapability",
    "ScoreFormula",
    "ScoreWeights",
    "DEFAULT_POOL",
    "FusionMethod",
    "ValueModel",
    "CrossEncoderReranker",
    "DegradationReason",
    "Reranker",
    "RerankRecord",
    "RerankStatus",
    "ScoredCandidates",
    "ScoringConfig",
    "TokenizerPolicy",
    "compute_budget",
    "default_catalog",
    "interim_score",
    "load_catalog",
    "relevance_gate",
    "score_candidates",
    "DEFAULT_BUCKET_TOKENS",
    "DEFAULT_CELL_CEILING",
    "DEFAULT_SEARCH_NODE_LIMIT",
    "Candidate",
    "CatalogError",
    "ConfigError",
    "Decision",
    "FormatSection",
    "FormattedContext",
    "FormatterOverhead",
    "InvalidCandidate",
    "InvalidFormatInput",
    "MIN_NONCE_HEX_DIGITS",
    "MissingExtra",
    "NONCE_BYTES",
    "PackPath",
    "PackResult",
    "Reason",
    "SAFETY_SENTENCE",
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
    "count_tokens_batch",
    "register_tokenizer",
    "unregister_tokenizer",
    "InvalidTokenizerOutput",
    "format_context",
    "formatter_overhead",
    "pack",
    "pack_arrays",
    "DEFAULT_DUPLICATE_THRESHOLD",
    "near_duplicate_groups",
    "normalized_text_key",
]
