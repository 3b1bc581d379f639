"""The conversation history: messages as the formatter takes them, the turn groups that
are trimmed together (an assistant's tool calls with their results), and trimming the
oldest groups to free a shortfall.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..request import Message, Role
from ..result import (
    HistoryDrop,
)
from .compute import Budget


def message_item(m: Message) -> dict[str, str]:
    """A message as the formatter takes it. Tool calls and tool results are part of the
    conversation the model sees, so they are written into the content (and counted); a
    result that reports a failure (`Message.is_error`) says so.

    >>> message_item(Message("tool", "not found", tool_call_id="c1", is_error=True))["content"]
    '[tool result c1 (error)] not found'
    """
    content = m.content
    if m.tool_calls:
        calls = "\n".join(f"[tool call {c.id}] {c.name}({c.arguments})" for c in m.tool_calls)
        content = f"{content}\n{calls}" if content else calls
    if m.role == Role.TOOL:
        error = " (error)" if m.is_error else ""
        content = f"[tool result {m.tool_call_id}{error}] {content}"
    return {"role": m.role.value, "content": content}


def turn_groups(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """Split messages into atomic groups [begin, end): an assistant message with tool
    calls and the tool results that answer it go together; anything else stands alone."""
    groups: list[tuple[int, int]] = []
    i = 0
    while i < len(messages):
        j = i + 1
        if messages[i].role == Role.ASSISTANT and messages[i].tool_calls:
            ids = {c.id for c in messages[i].tool_calls}
            while j < len(messages) and messages[j].role == Role.TOOL and messages[j].tool_call_id in ids:
                j += 1
        groups.append((i, j))
        i = j
    return groups


def overflow_message(budget: Budget) -> str:
    if budget.capped:
        tb = budget.token_budget
        return (
            f"the request does not fit its token budget of {tb}: directive {budget.directive_tokens} + messages "
            f"{budget.messages_tokens} + tools {budget.tool_schema_tokens} + formatting "
            f"{budget.formatter_overhead_tokens} + safety buffer {budget.safety_buffer} exceed it by "
            f"{budget.shortfall} tokens"
        )
    return (
        f"the request does not fit {budget.model}'s {budget.context_window}-token window: "
        f"directive {budget.directive_tokens} + messages {budget.messages_tokens} + tools "
        f"{budget.tool_schema_tokens} + formatting {budget.formatter_overhead_tokens} + response reserve "
        f"{budget.response_reserve} + safety buffer {budget.safety_buffer} exceed it by {budget.shortfall} tokens"
    )


def trim(
    groups: Sequence[tuple[int, int]],
    group_prefix: npt.NDArray[np.int64],
    message_costs: npt.NDArray[np.int64],
    messages: Sequence[Message],
    shortfall: int,
) -> tuple[list[int], list[HistoryDrop]]:
    """Drop the oldest droppable `groups` until `shortfall` tokens are freed: one search
    over `group_prefix`, the prefix sums of their costs. Returns the kept message indices
    and the drops."""
    if shortfall <= 0:
        return list(range(len(messages))), []
    k = int(np.searchsorted(group_prefix, shortfall, side="left")) + 1
    gone = groups[:k]
    keep = np.ones(len(messages), dtype=bool)
    # Each group's tokens from the prefix sums of the message costs: one array operation,
    # not a small numpy sum per group (20,000 of them in a long history).
    cum = np.concatenate(([0], np.cumsum(message_costs, dtype=np.int64)))
    bounds = np.asarray(gone, dtype=np.intp).reshape(-1, 2)
    tokens = (cum[bounds[:, 1]] - cum[bounds[:, 0]]).tolist()
    roles = [m.role.value for m in messages]
    drops: list[HistoryDrop] = []
    for (begin, end), t in zip(gone, tokens):
        keep[begin:end] = False
        drops.append(HistoryDrop(begin, end - begin, t, tuple(roles[begin:end])))
    return np.flatnonzero(keep).tolist(), drops
