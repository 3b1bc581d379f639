# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Rendering(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RENDERING_UNSPECIFIED: _ClassVar[Rendering]
    RENDERING_TEXT: _ClassVar[Rendering]
    RENDERING_OPENAI: _ClassVar[Rendering]
    RENDERING_ANTHROPIC: _ClassVar[Rendering]

class HistoryPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HISTORY_POLICY_UNSPECIFIED: _ClassVar[HistoryPolicy]
    HISTORY_POLICY_STRICT: _ClassVar[HistoryPolicy]
    HISTORY_POLICY_TRIM_OLDEST: _ClassVar[HistoryPolicy]

class EstimateKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ESTIMATE_KIND_UNSPECIFIED: _ClassVar[EstimateKind]
    ESTIMATE_KIND_EXACT: _ClassVar[EstimateKind]
    ESTIMATE_KIND_ESTIMATE: _ClassVar[EstimateKind]

class PackPath(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PACK_PATH_UNSPECIFIED: _ClassVar[PackPath]
    PACK_PATH_TRIVIAL: _ClassVar[PackPath]
    PACK_PATH_DP: _ClassVar[PackPath]
    PACK_PATH_GREEDY: _ClassVar[PackPath]

class TraceReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRACE_REASON_UNSPECIFIED: _ClassVar[TraceReason]
    TRACE_REASON_SELECTED: _ClassVar[TraceReason]
    TRACE_REASON_PINNED: _ClassVar[TraceReason]
    TRACE_REASON_BUDGET_EXHAUSTED: _ClassVar[TraceReason]
    TRACE_REASON_BELOW_RELEVANCE_FLOOR: _ClassVar[TraceReason]
    TRACE_REASON_OUT_OF_SCOPE: _ClassVar[TraceReason]
    TRACE_REASON_DUPLICATE: _ClassVar[TraceReason]
    TRACE_REASON_OVER_MAX_MEMORIES: _ClassVar[TraceReason]
    TRACE_REASON_NON_POSITIVE_SCORE: _ClassVar[TraceReason]
    TRACE_REASON_REDUNDANT: _ClassVar[TraceReason]

class Branch(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BRANCH_UNSPECIFIED: _ClassVar[Branch]
    BRANCH_DIRECTIVE: _ClassVar[Branch]
    BRANCH_HOT: _ClassVar[Branch]
    BRANCH_COLD: _ClassVar[Branch]

class BranchStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BRANCH_STATUS_UNSPECIFIED: _ClassVar[BranchStatus]
    BRANCH_STATUS_OK: _ClassVar[BranchStatus]
    BRANCH_STATUS_TIMEOUT: _ClassVar[BranchStatus]
    BRANCH_STATUS_ERROR: _ClassVar[BranchStatus]
    BRANCH_STATUS_SKIPPED: _ClassVar[BranchStatus]

class WallSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WALL_SOURCE_UNSPECIFIED: _ClassVar[WallSource]
    WALL_SOURCE_CLIENT_TIMEOUT: _ClassVar[WallSource]
    WALL_SOURCE_SERVER_DEADLINE: _ClassVar[WallSource]
    WALL_SOURCE_CALLER_DEADLINE: _ClassVar[WallSource]
RENDERING_UNSPECIFIED: Rendering
RENDERING_TEXT: Rendering
RENDERING_OPENAI: Rendering
RENDERING_ANTHROPIC: Rendering
HISTORY_POLICY_UNSPECIFIED: HistoryPolicy
HISTORY_POLICY_STRICT: HistoryPolicy
HISTORY_POLICY_TRIM_OLDEST: HistoryPolicy
ESTIMATE_KIND_UNSPECIFIED: EstimateKind
ESTIMATE_KIND_EXACT: EstimateKind
ESTIMATE_KIND_ESTIMATE: EstimateKind
PACK_PATH_UNSPECIFIED: PackPath
PACK_PATH_TRIVIAL: PackPath
PACK_PATH_DP: PackPath
PACK_PATH_GREEDY: PackPath
TRACE_REASON_UNSPECIFIED: TraceReason
TRACE_REASON_SELECTED: TraceReason
TRACE_REASON_PINNED: TraceReason
TRACE_REASON_BUDGET_EXHAUSTED: TraceReason
TRACE_REASON_BELOW_RELEVANCE_FLOOR: TraceReason
TRACE_REASON_OUT_OF_SCOPE: TraceReason
TRACE_REASON_DUPLICATE: TraceReason
TRACE_REASON_OVER_MAX_MEMORIES: TraceReason
TRACE_REASON_NON_POSITIVE_SCORE: TraceReason
TRACE_REASON_REDUNDANT: TraceReason
BRANCH_UNSPECIFIED: Branch
BRANCH_DIRECTIVE: Branch
BRANCH_HOT: Branch
BRANCH_COLD: Branch
BRANCH_STATUS_UNSPECIFIED: BranchStatus
BRANCH_STATUS_OK: BranchStatus
BRANCH_STATUS_TIMEOUT: BranchStatus
BRANCH_STATUS_ERROR: BranchStatus
BRANCH_STATUS_SKIPPED: BranchStatus
WALL_SOURCE_UNSPECIFIED: WallSource
WALL_SOURCE_CLIENT_TIMEOUT: WallSource
WALL_SOURCE_SERVER_DEADLINE: WallSource
WALL_SOURCE_CALLER_DEADLINE: WallSource

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "parts", "has_parts", "is_error")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    HAS_PARTS_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    parts: _containers.RepeatedScalarFieldContainer[str]
    has_parts: bool
    is_error: bool
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., parts: _Optional[_Iterable[str]] = ..., has_parts: _Optional[bool] = ..., is_error: _Optional[bool] = ...) -> None: ...

class Query(_message.Message):
    __slots__ = ("text", "embedding")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    text: str
    embedding: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, text: _Optional[str] = ..., embedding: _Optional[_Iterable[float]] = ...) -> None: ...

class AssemblyOptions(_message.Message):
    __slots__ = ("weights", "relevance_floor", "min_similarity", "max_memories", "pinned_memory_ids", "history_policy", "context_enabled", "skip_memory", "rendering", "pool", "value_model", "memory_format", "memory_attributes")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FLOOR_FIELD_NUMBER: _ClassVar[int]
    MIN_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    MAX_MEMORIES_FIELD_NUMBER: _ClassVar[int]
    PINNED_MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_POLICY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    SKIP_MEMORY_FIELD_NUMBER: _ClassVar[int]
    RENDERING_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    VALUE_MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    weights: _containers.ScalarMap[str, float]
    relevance_floor: float
    min_similarity: float
    max_memories: int
    pinned_memory_ids: _containers.RepeatedScalarFieldContainer[str]
    history_policy: HistoryPolicy
    context_enabled: bool
    skip_memory: bool
    rendering: Rendering
    pool: int
    value_model: str
    memory_format: str
    memory_attributes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, weights: _Optional[_Mapping[str, float]] = ..., relevance_floor: _Optional[float] = ..., min_similarity: _Optional[float] = ..., max_memories: _Optional[int] = ..., pinned_memory_ids: _Optional[_Iterable[str]] = ..., history_policy: _Optional[_Union[HistoryPolicy, str]] = ..., context_enabled: _Optional[bool] = ..., skip_memory: _Optional[bool] = ..., rendering: _Optional[_Union[Rendering, str]] = ..., pool: _Optional[int] = ..., value_model: _Optional[str] = ..., memory_format: _Optional[str] = ..., memory_attributes: _Optional[_Iterable[str]] = ...) -> None: ...

class AssembleContextRequest(_message.Message):
    __slots__ = ("organization_id", "agent_id", "model", "query", "messages", "tools_json", "options", "token_budget", "section_budgets")
    class SectionBudgetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ORGANIZATION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    SECTION_BUDGETS_FIELD_NUMBER: _ClassVar[int]
    organization_id: str
    agent_id: str
    model: str
    query: Query
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    tools_json: _containers.RepeatedScalarFieldContainer[str]
    options: AssemblyOptions
    token_budget: int
    section_budgets: _containers.ScalarMap[str, int]
    def __init__(self, organization_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., model: _Optional[str] = ..., query: _Optional[_Union[Query, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., tools_json: _Optional[_Iterable[str]] = ..., options: _Optional[_Union[AssemblyOptions, _Mapping]] = ..., token_budget: _Optional[int] = ..., section_budgets: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ComputeBudgetRequest(_message.Message):
    __slots__ = ("model", "directive_tokens", "messages_tokens", "tool_schema_tokens", "formatter_overhead_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_SCHEMA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORMATTER_OVERHEAD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    directive_tokens: int
    messages_tokens: int
    tool_schema_tokens: int
    formatter_overhead_tokens: int
    def __init__(self, model: _Optional[str] = ..., directive_tokens: _Optional[int] = ..., messages_tokens: _Optional[int] = ..., tool_schema_tokens: _Optional[int] = ..., formatter_overhead_tokens: _Optional[int] = ...) -> None: ...

class GetModelCapabilitiesRequest(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, models: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelCapability(_message.Message):
    __slots__ = ("name", "provider", "context_window", "max_output_tokens", "tokenizer_family", "estimate_kind", "safety_fraction", "aliases")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FAMILY_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_KIND_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    name: str
    provider: str
    context_window: int
    max_output_tokens: int
    tokenizer_family: str
    estimate_kind: EstimateKind
    safety_fraction: float
    aliases: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., provider: _Optional[str] = ..., context_window: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., tokenizer_family: _Optional[str] = ..., estimate_kind: _Optional[_Union[EstimateKind, str]] = ..., safety_fraction: _Optional[float] = ..., aliases: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenizerPolicy(_message.Message):
    __slots__ = ("family", "exact_safety_fraction", "estimate_safety_fraction")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    EXACT_SAFETY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_SAFETY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    family: str
    exact_safety_fraction: float
    estimate_safety_fraction: float
    def __init__(self, family: _Optional[str] = ..., exact_safety_fraction: _Optional[float] = ..., estimate_safety_fraction: _Optional[float] = ...) -> None: ...

class GetModelCapabilitiesResponse(_message.Message):
    __slots__ = ("models", "tokenizer_policies", "catalog_source")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_POLICIES_FIELD_NUMBER: _ClassVar[int]
    CATALOG_SOURCE_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelCapability]
    tokenizer_policies: _containers.RepeatedCompositeFieldContainer[TokenizerPolicy]
    catalog_source: str
    def __init__(self, models: _Optional[_Iterable[_Union[ModelCapability, _Mapping]]] = ..., tokenizer_policies: _Optional[_Iterable[_Union[TokenizerPolicy, _Mapping]]] = ..., catalog_source: _Optional[str] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("model", "tokenizer_family", "estimate_kind", "context_window", "max_output_tokens", "response_reserve", "safety_fraction", "safety_buffer", "directive_tokens", "messages_tokens", "tool_schema_tokens", "formatter_overhead_tokens", "shortfall", "usable", "constrained", "token_budget")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FAMILY_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_KIND_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_RESERVE_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SAFETY_BUFFER_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_SCHEMA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORMATTER_OVERHEAD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHORTFALL_FIELD_NUMBER: _ClassVar[int]
    USABLE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    model: str
    tokenizer_family: str
    estimate_kind: EstimateKind
    context_window: int
    max_output_tokens: int
    response_reserve: int
    safety_fraction: float
    safety_buffer: int
    directive_tokens: int
    messages_tokens: int
    tool_schema_tokens: int
    formatter_overhead_tokens: int
    shortfall: int
    usable: int
    constrained: bool
    token_budget: int
    def __init__(self, model: _Optional[str] = ..., tokenizer_family: _Optional[str] = ..., estimate_kind: _Optional[_Union[EstimateKind, str]] = ..., context_window: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., response_reserve: _Optional[int] = ..., safety_fraction: _Optional[float] = ..., safety_buffer: _Optional[int] = ..., directive_tokens: _Optional[int] = ..., messages_tokens: _Optional[int] = ..., tool_schema_tokens: _Optional[int] = ..., formatter_overhead_tokens: _Optional[int] = ..., shortfall: _Optional[int] = ..., usable: _Optional[int] = ..., constrained: _Optional[bool] = ..., token_budget: _Optional[int] = ...) -> None: ...

class Section(_message.Message):
    __slots__ = ("name", "text")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    name: str
    text: str
    def __init__(self, name: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class Scope(_message.Message):
    __slots__ = ("organization_id", "agent_id")
    ORGANIZATION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    organization_id: str
    agent_id: str
    def __init__(self, organization_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class PackRecord(_message.Message):
    __slots__ = ("path", "budget", "tokens_used", "total_score", "upper_bound", "evaluated", "selected", "excluded_for_budget", "truncated", "proven_optimal", "dp_cells", "search_nodes", "redundant")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_FIELD_NUMBER: _ClassVar[int]
    SELECTED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FOR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PROVEN_OPTIMAL_FIELD_NUMBER: _ClassVar[int]
    DP_CELLS_FIELD_NUMBER: _ClassVar[int]
    SEARCH_NODES_FIELD_NUMBER: _ClassVar[int]
    REDUNDANT_FIELD_NUMBER: _ClassVar[int]
    path: PackPath
    budget: int
    tokens_used: int
    total_score: float
    upper_bound: float
    evaluated: int
    selected: int
    excluded_for_budget: int
    truncated: bool
    proven_optimal: bool
    dp_cells: int
    search_nodes: int
    redundant: int
    def __init__(self, path: _Optional[_Union[PackPath, str]] = ..., budget: _Optional[int] = ..., tokens_used: _Optional[int] = ..., total_score: _Optional[float] = ..., upper_bound: _Optional[float] = ..., evaluated: _Optional[int] = ..., selected: _Optional[int] = ..., excluded_for_budget: _Optional[int] = ..., truncated: _Optional[bool] = ..., proven_optimal: _Optional[bool] = ..., dp_cells: _Optional[int] = ..., search_nodes: _Optional[int] = ..., redundant: _Optional[int] = ...) -> None: ...

class TraceEntry(_message.Message):
    __slots__ = ("memory_id", "reason", "origin", "tokens", "score", "relevance", "recounted", "signal")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    RECOUNTED_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    reason: TraceReason
    origin: str
    tokens: int
    score: float
    relevance: float
    recounted: bool
    signal: str
    def __init__(self, memory_id: _Optional[str] = ..., reason: _Optional[_Union[TraceReason, str]] = ..., origin: _Optional[str] = ..., tokens: _Optional[int] = ..., score: _Optional[float] = ..., relevance: _Optional[float] = ..., recounted: _Optional[bool] = ..., signal: _Optional[str] = ...) -> None: ...

class BranchRecord(_message.Message):
    __slots__ = ("branch", "status", "latency_ms", "error", "items", "dropped_out_of_scope")
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_OUT_OF_SCOPE_FIELD_NUMBER: _ClassVar[int]
    branch: Branch
    status: BranchStatus
    latency_ms: float
    error: str
    items: int
    dropped_out_of_scope: int
    def __init__(self, branch: _Optional[_Union[Branch, str]] = ..., status: _Optional[_Union[BranchStatus, str]] = ..., latency_ms: _Optional[float] = ..., error: _Optional[str] = ..., items: _Optional[int] = ..., dropped_out_of_scope: _Optional[int] = ...) -> None: ...

class Wall(_message.Message):
    __slots__ = ("limit_ms", "source")
    LIMIT_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    limit_ms: float
    source: WallSource
    def __init__(self, limit_ms: _Optional[float] = ..., source: _Optional[_Union[WallSource, str]] = ...) -> None: ...

class HistoryDrop(_message.Message):
    __slots__ = ("first_index", "count", "tokens", "roles", "reason")
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    first_index: int
    count: int
    tokens: int
    roles: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, first_index: _Optional[int] = ..., count: _Optional[int] = ..., tokens: _Optional[int] = ..., roles: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class StageTimings(_message.Message):
    __slots__ = ("budget_ms", "retrieval_ms", "scoring_ms", "packing_ms", "formatting_ms", "total_ms")
    BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_MS_FIELD_NUMBER: _ClassVar[int]
    SCORING_MS_FIELD_NUMBER: _ClassVar[int]
    PACKING_MS_FIELD_NUMBER: _ClassVar[int]
    FORMATTING_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    budget_ms: float
    retrieval_ms: float
    scoring_ms: float
    packing_ms: float
    formatting_ms: float
    total_ms: float
    def __init__(self, budget_ms: _Optional[float] = ..., retrieval_ms: _Optional[float] = ..., scoring_ms: _Optional[float] = ..., packing_ms: _Optional[float] = ..., formatting_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class AssembledContext(_message.Message):
    __slots__ = ("text", "sections", "nonce", "model", "scope", "budget", "pack", "trace", "branches", "wall", "degraded", "degradation_reasons", "constrained", "history_dropped", "timings", "replaced_chars", "principal", "directive", "messages", "tools_json", "rendering", "framing_tokens", "stable_prefix_tokens", "memory_format", "handles")
    class HandlesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    PACK_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    WALL_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_REASONS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_DROPPED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REPLACED_CHARS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    RENDERING_FIELD_NUMBER: _ClassVar[int]
    FRAMING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STABLE_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    text: str
    sections: _containers.RepeatedCompositeFieldContainer[Section]
    nonce: str
    model: str
    scope: Scope
    budget: Budget
    pack: PackRecord
    trace: _containers.RepeatedCompositeFieldContainer[TraceEntry]
    branches: _containers.RepeatedCompositeFieldContainer[BranchRecord]
    wall: Wall
    degraded: bool
    degradation_reasons: _containers.RepeatedScalarFieldContainer[str]
    constrained: bool
    history_dropped: _containers.RepeatedCompositeFieldContainer[HistoryDrop]
    timings: StageTimings
    replaced_chars: int
    principal: str
    directive: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    tools_json: _containers.RepeatedScalarFieldContainer[str]
    rendering: Rendering
    framing_tokens: int
    stable_prefix_tokens: int
    memory_format: str
    handles: _containers.ScalarMap[str, str]
    def __init__(self, text: _Optional[str] = ..., sections: _Optional[_Iterable[_Union[Section, _Mapping]]] = ..., nonce: _Optional[str] = ..., model: _Optional[str] = ..., scope: _Optional[_Union[Scope, _Mapping]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., pack: _Optional[_Union[PackRecord, _Mapping]] = ..., trace: _Optional[_Iterable[_Union[TraceEntry, _Mapping]]] = ..., branches: _Optional[_Iterable[_Union[BranchRecord, _Mapping]]] = ..., wall: _Optional[_Union[Wall, _Mapping]] = ..., degraded: _Optional[bool] = ..., degradation_reasons: _Optional[_Iterable[str]] = ..., constrained: _Optional[bool] = ..., history_dropped: _Optional[_Iterable[_Union[HistoryDrop, _Mapping]]] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ..., replaced_chars: _Optional[int] = ..., principal: _Optional[str] = ..., directive: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., tools_json: _Optional[_Iterable[str]] = ..., rendering: _Optional[_Union[Rendering, str]] = ..., framing_tokens: _Optional[int] = ..., stable_prefix_tokens: _Optional[int] = ..., memory_format: _Optional[str] = ..., handles: _Optional[_Mapping[str, str]] = ...) -> None: ...
