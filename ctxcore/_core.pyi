from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

__version__: str
_T = TypeVar("_T")

MAX_TOKENS: int
MAX_CANDIDATES: int

class InvalidCandidate(ValueError):
    index: int
    candidate_id: str | None

class PackOutput:
    @property
    def ids(self) -> tuple[str, ...]: ...
    @property
    def candidate_ids(self) -> tuple[str, ...]: ...
    @property
    def summary(self) -> tuple[int, float, float, int, int, int, bool, bool, int, int, int, int]: ...
    @property
    def indices(self) -> npt.NDArray[np.int64]: ...
    @property
    def reasons(self) -> npt.NDArray[np.uint8]: ...
    @property
    def tokens_used(self) -> int: ...
    @property
    def total_score(self) -> float: ...
    @property
    def upper_bound(self) -> float: ...
    @property
    def path(self) -> int: ...
    @property
    def evaluated(self) -> int: ...
    @property
    def excluded_for_budget(self) -> int: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def proven_optimal(self) -> bool: ...
    @property
    def dp_cells(self) -> int: ...
    @property
    def search_nodes(self) -> int: ...
    @property
    def dominated(self) -> int: ...
    @property
    def free_items(self) -> int: ...
    @property
    def rank_order(self) -> bool: ...
    @property
    def redundant(self) -> int: ...

def pack_arrays(
    ids: Sequence[str],
    tokens: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    pinned: npt.NDArray[np.bool_] | None,
    budget: int,
    bucket_tokens: int,
    cell_ceiling: int,
    search_node_limit: int,
    core_cell_limit: int,
    rank_tolerance: float = ...,
    groups: npt.NDArray[np.int64] | None = ...,
) -> PackOutput: ...

MIN_NONCE_HEX_DIGITS: int
SAFETY_SENTENCE: str
MIN_COMPACT_NONCE_DIGITS: int
MIN_COMPACT_NONCE_WORDS: int
MAX_COMPACT_NONCE_WORD_LETTERS: int
COMPACT_SAFETY_SENTENCE: str
FORMAT_SECTIONS: tuple[str, ...]

class InvalidFormatInput(ValueError):
    section: str | None
    index: int
    item_id: str | None

def format_context(
    directive: str | None,
    history: Sequence[object],
    memories: Sequence[object],
    tools_json: str | None,
    nonce: str,
    memories_frame: bool,
    record_pieces: bool,
    memory_format: int = 0,
) -> tuple[str, list[tuple[int, int, int]], int, list[tuple[int, int]]]: ...

ESTIMATOR_BLOCKS: int
ESTIMATOR_LATIN_PAIRS: int
ESTIMATOR_COST_UNIT: float
ESTIMATOR_UNSEEN_PAIR: int
ESTIMATOR_CLASS_LIMIT: int

def fast_estimate(
    counters: dict[str, Callable[[str], _T]], fallback: Callable[[str, str], _T]
) -> Callable[[str, str], _T]: ...

class Estimator:
    def __init__(
        self,
        pair_bits: int,
        latin_costs: npt.NDArray[np.uint16],
        pair_entries: npt.NDArray[np.uint32],
        block_costs: npt.NDArray[np.uint16],
        scale: float,
        spread: float,
        *,
        word_mode: int = 0,
        char_classes: npt.NDArray[np.uint8] = ...,
        words: bytes = b"",
        word_cost: int = 0,
        word_scale: float = 1.0,
    ) -> None: ...
    def estimate(self, text: str) -> int: ...
    def raw_batch(self, texts: Sequence[str]) -> npt.NDArray[np.uint64]: ...
    def words(self, text: str) -> npt.NDArray[np.int64]: ...
    @property
    def word_mode(self) -> int: ...
    def estimate_batch(self, texts: Sequence[str]) -> npt.NDArray[np.int64]: ...
    def counter(self, make: Callable[[int], _T]) -> Callable[[str], _T]: ...
    def price_pieces(
        self,
        text: str,
        ends: npt.NDArray[np.int64],
        any_prefix: npt.NDArray[np.bool_],
        prefix_a: str,
        prefix_b: str,
    ) -> npt.NDArray[np.int64]: ...
    @property
    def pair_bits(self) -> int: ...
    @property
    def scale(self) -> float: ...
    @property
    def spread(self) -> float: ...
    @property
    def word_scale(self) -> float: ...

def estimator_buckets(text: str, bits: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint32]]: ...
def split_scope(
    records: Sequence[object], record_type: type, organization: str, agent: str
) -> tuple[list[Any], list[Any]]: ...
def first_outside(values: npt.NDArray[np.float64], low: float, high: float, allow_nan: bool = True) -> int: ...
def memory_columns(
    records: Sequence[object], record_type: type, family: str
) -> tuple[
    list[str],
    list[str],
    list[str],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.int64],
    list[str],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
]: ...
def format_columns(
    directive: str | None,
    history: Sequence[object],
    ids: list[str],
    texts: list[str],
    scores: npt.NDArray[np.float64],
    sources: list[str],
    order: npt.NDArray[np.int64],
    tools_json: str | None,
    nonce: str,
    memories_frame: bool = False,
    record_pieces: bool = False,
    memory_format: int = 0,
    attributes: int = 3,
    handles: bool = False,
    created: list[str | None] | None = None,
) -> tuple[str, list[tuple[int, int, int]], int, list[tuple[int, int]]]: ...
def encode_trace_rows(
    ids: Sequence[str],
    origins: Sequence[str],
    at: npt.NDArray[np.int64] | npt.NDArray[np.intp],
    reasons: npt.NDArray[np.int32],
    tokens: npt.NDArray[np.int64] | None,
    score: npt.NDArray[np.float64] | None,
    relevance: npt.NDArray[np.float64] | None,
    recounted: npt.NDArray[np.bool_] | None,
    hide_id_reason: int,
    field: int,
    signals: Sequence[str] | None = None,
) -> bytes: ...
