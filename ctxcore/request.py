"""The assembly request: the input at the head of the pipeline.

request -> budget -> retrieval -> scoring -> pack -> format -> result. An
`AssemblyRequest` names who the context is for (organization and agent), which model it is
for, what the request is about (`Query`), the recent conversation (`Message`s, counted
and never fetched), the tool schemas, and per-request `AssemblyOptions`. Everything is
validated on construction so a bad request fails with a message that names the field.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .memory import Query, Scope

__all__ = [
    "AssemblyOptions",
    "AssemblyRequest",
    "HistoryPolicy",
    "Message",
    "ToolCall",
]


class HistoryPolicy(enum.StrEnum):
    """What to do when directive + messages + tools alone exceed the window."""

    STRICT = "strict"  #: raise ctxcore.ContextOverflow with the numbers
    TRIM_OLDEST = "trim_oldest"  #: drop the oldest turns (atomic groups), never the latest user turn


class Role(enum.StrEnum):
    """Message roles."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call made by the assistant: its id, the tool's name and JSON arguments.

    >>> ToolCall("call-1", "search", '{"q": "tea"}').name
    'search'
    """

    id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        for name in ("id", "name"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"tool call {name} must be a non-empty str")
        if not isinstance(self.arguments, str):
            raise TypeError("tool call arguments must be a JSON string")


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the recent conversation.

    An assistant message may carry `tool_calls`; a ``tool`` message answers one of them
    through `tool_call_id`. The pair is an atomic group when history is trimmed.

    >>> Message("user", "hello").role
    <Role.USER: 'user'>
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    if TYPE_CHECKING:
        # What callers may pass (the generated __init__ converts): a role's name, any
        # sequence of tool calls.
        def __init__(
            self,
            role: Role | str,
            content: str,
            tool_calls: Sequence[ToolCall] = (),
            tool_call_id: str | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "role", Role(self.role))
        except ValueError:
            raise ValueError(
                f"message role must be one of {[r.value for r in Role]}, got {self.role!r}"
            ) from None
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be str, got {type(self.content).__name__}")
        calls = tuple(self.tool_calls)
        if not all(isinstance(c, ToolCall) for c in calls):
            raise TypeError("tool_calls must be ToolCall objects")
        object.__setattr__(self, "tool_calls", calls)
        if calls and self.role != Role.ASSISTANT:
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == Role.TOOL and not self.tool_call_id:
            raise ValueError("a tool message must name the tool_call_id it answers")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> Message:
        """A message from an OpenAI-style mapping (role, content, tool_calls, tool_call_id).

        >>> Message.from_mapping({"role": "assistant", "content": "", "tool_calls": [
        ...     {"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}).tool_calls[0].name
        'f'
        """
        try:
            calls = []
            for c in m.get("tool_calls") or ():
                fn = c.get("function", c)
                args = fn.get("arguments", "{}")
                calls.append(ToolCall(c["id"], fn["name"], args if isinstance(args, str) else json.dumps(args)))
            return cls(m["role"], m.get("content") or "", tuple(calls), m.get("tool_call_id"))
        except KeyError as exc:
            raise ValueError(f"message is missing the field {exc.args[0]!r}: {dict(m)!r:.200}") from None
        except AttributeError:
            raise TypeError(f"a message must be a mapping, got {type(m).__name__}") from None


@dataclass(frozen=True, slots=True)
class AssemblyOptions:
    """Per-request knobs.

    Attributes:
        weights: optional weights for the score components that are present
            (``similarity``, ``confidence``, ``recency``, ``importance``); None keeps the
            interim formula.
        relevance_floor: drop memories whose relevance is below this (default from
            `ctxcore.scoring`); must stay below the full-text sentinel 0.5.
        min_similarity: the ANN cutoff passed to cold retrieval.
        max_memories: at most this many memories are retrieved per branch and selected.
        pinned_memory_ids: memories taken first (while they fit) when retrieved.
        history_policy: what to do when the fixed parts alone overflow the window.
        context_enabled: False skips retrieval: directive-only/history-only context.
        skip_memory: True skips the memory branches but still fetches the directive.
    """

    weights: Mapping[str, float] | None = None
    relevance_floor: float | None = None
    min_similarity: float | None = None
    max_memories: int = 64
    pinned_memory_ids: frozenset[str] = field(default_factory=frozenset)
    history_policy: HistoryPolicy = HistoryPolicy.STRICT
    context_enabled: bool = True
    skip_memory: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "history_policy", HistoryPolicy(self.history_policy))
        object.__setattr__(self, "pinned_memory_ids", frozenset(self.pinned_memory_ids))
        if isinstance(self.max_memories, bool) or not isinstance(self.max_memories, int) or self.max_memories < 0:
            raise ValueError(f"max_memories must be an int >= 0, got {self.max_memories!r}")
        for name in ("relevance_floor", "min_similarity"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
        if self.weights is not None:
            w = dict(self.weights)
            for k, v in w.items():
                if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise ValueError(f"weight {k!r} must be a finite number >= 0, got {v!r}")
            object.__setattr__(self, "weights", w)


@dataclass(frozen=True, slots=True)
class AssemblyRequest:
    """Everything one assembly needs from the caller.

    >>> r = AssemblyRequest("org-1", "agent-7", "gpt-4o", Query("what is our refund policy?"))
    >>> r.scope
    Scope(organization_id='org-1', agent_id='agent-7')
    """

    organization_id: str
    agent_id: str
    model: str
    query: Query
    messages: tuple[Message, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    options: AssemblyOptions = field(default_factory=AssemblyOptions)

    if TYPE_CHECKING:
        # What callers may pass (the generated __init__ converts): any sequence (a list,
        # say) of messages or OpenAI-style message mappings and of tool schemas; the query
        # as a str.
        def __init__(
            self,
            organization_id: str,
            agent_id: str,
            model: str,
            query: Query | str,
            messages: Sequence[Message | Mapping[str, Any]] = (),
            tools: Sequence[Mapping[str, Any]] = (),
            options: AssemblyOptions = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        Scope(self.organization_id, self.agent_id)  # validates both ids
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty str, got {self.model!r}")
        if isinstance(self.query, str):
            object.__setattr__(self, "query", Query(self.query))
        if not isinstance(self.query, Query):
            raise TypeError(f"query must be a Query or str, got {type(self.query).__name__}")
        msgs = tuple(m if isinstance(m, Message) else Message.from_mapping(m) for m in self.messages)
        object.__setattr__(self, "messages", msgs)
        tools = tuple(self.tools)
        for i, t in enumerate(tools):
            if not isinstance(t, Mapping):
                raise TypeError(f"tools[{i}] must be a JSON object (mapping), got {type(t).__name__}")
            try:
                json.dumps(t)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"tools[{i}] is not JSON-serializable: {exc}") from None
        object.__setattr__(self, "tools", tools)
        if not isinstance(self.options, AssemblyOptions):
            raise TypeError("options must be an AssemblyOptions")

    @property
    def scope(self) -> Scope:
        """The (organization, agent) every memory must match."""
        return Scope(self.organization_id, self.agent_id)
