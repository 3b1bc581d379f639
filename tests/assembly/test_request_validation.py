"""Input validation of requests, messages, tool calls and tools: a bad value is refused
when it is given, with an error naming the field, never dropped or deferred to `assemble`.
Valid inputs of the same kinds still round-trip through both payload renderings."""

from __future__ import annotations

import math
from typing import Any

import pytest

import ctxcore.request
from ctxcore import AssemblyOptions, AssemblyRequest, Message, Query, Scope, Sources, ToolCall
from ctxcore.payloads import render_anthropic, render_openai
from ctxcore.scoring import COMPONENTS

ToolSpec = ctxcore.request.ToolSpec


def _call(**over: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    call.update(over)
    return {"role": "assistant", "content": None, "tool_calls": [call]}


# ---- AssemblyOptions: str and bool fields ------------------------------------------------------


def test_pinned_memory_ids_refuses_a_lone_str() -> None:
    with pytest.raises(TypeError, match="pinned_memory_ids"):
        AssemblyOptions(pinned_memory_ids="m-17")


def test_pinned_memory_ids_items_must_be_str() -> None:
    with pytest.raises(TypeError, match=r"pinned_memory_ids\[1\] must be a str, got int"):
        AssemblyOptions(pinned_memory_ids=["m-1", 7])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="pinned_memory_ids"):
        AssemblyOptions(pinned_memory_ids=17)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["skip_memory", "context_enabled"])
@pytest.mark.parametrize("value", ["false", "no", 0, 1, None])
def test_bool_options_take_only_a_bool(name: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"{name} must be a bool, got {type(value).__name__}"):
        AssemblyOptions(**{name: value})  # type: ignore[arg-type]


def test_valid_options_round_trip() -> None:
    o = AssemblyOptions(
        pinned_memory_ids=["m-17", "m-18"],
        skip_memory=True,
        context_enabled=False,
        weights={"similarity": 1, "recency": 0.5},
    )
    assert o.pinned_memory_ids == frozenset({"m-17", "m-18"})
    assert o.skip_memory is True and o.context_enabled is False
    assert o.weights == {"similarity": 1, "recency": 0.5}
    assert AssemblyOptions(pinned_memory_ids=(f"m{i}" for i in range(3))).pinned_memory_ids == {"m0", "m1", "m2"}
    assert AssemblyOptions().pinned_memory_ids == frozenset()


# ---- AssemblyOptions: weights -------------------------------------------------------------------


def test_weights_refuse_an_unknown_component() -> None:
    with pytest.raises(ValueError, match=r"weights\['bogus'\]: unknown component"):
        AssemblyOptions(weights={"bogus": 1.0})


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (True, TypeError),
        ("1", TypeError),
        (None, TypeError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (10**400, ValueError),
    ],
)
def test_weights_refuse_a_bad_value_naming_the_key(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"weights\['recency'\]"):
        AssemblyOptions(weights={"recency": value})  # type: ignore[dict-item]


def test_every_documented_weight_is_accepted() -> None:
    w = {name: 1.0 for name in COMPONENTS}
    assert set(w) == {"similarity", "confidence", "recency", "importance"}
    assert AssemblyOptions(weights=w).weights == w
    assert AssemblyOptions(weights={"similarity": 1e308, "confidence": 0}).weights == {
        "similarity": 1e308,
        "confidence": 0,
    }


# ---- messages: tool calls and tool_call_id ------------------------------------------------------


def test_a_tool_call_of_another_type_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tool_calls\[0\] is a 'custom' tool call"):
        Message.from_mapping(_call(type="custom"))


def test_unknown_keys_of_a_tool_call_are_refused() -> None:
    with pytest.raises(ValueError, match=r"tool_calls\[0\]: unsupported keys \['junk2'\]"):
        Message.from_mapping(_call(junk2=2))
    with pytest.raises(ValueError, match=r"tool_calls\[0\]\.function: unsupported keys \['junk'\]"):
        Message.from_mapping(_call(function={"name": "f", "arguments": "{}", "junk": 1}))


def test_the_auditors_tool_call_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tool_calls\[0\]"):
        Message.from_mapping(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}", "junk": 1}, "junk2": 2}
                ],
            }
        )


def test_a_tool_call_function_that_is_not_a_mapping_is_named() -> None:
    with pytest.raises(TypeError, match=r"tool_calls\[0\]\.function must be a mapping, got NoneType"):
        Message.from_mapping(_call(function=None))
    with pytest.raises(TypeError, match=r"tool_calls\[0\] must be a mapping, got str"):
        Message.from_mapping({"role": "assistant", "tool_calls": ["c1"]})


def test_a_tool_call_missing_a_field_is_named() -> None:
    with pytest.raises(ValueError, match=r"tool_calls\[0\]\.function is missing the field 'name'"):
        Message.from_mapping(_call(function={"arguments": "{}"}))


def test_request_names_the_message_of_a_bad_tool_call() -> None:
    with pytest.raises(ValueError, match=r"messages\[1\]: tool_calls\[0\]: unsupported keys \['junk2'\]"):
        AssemblyRequest(
            "org-1", "agent-1", "gpt-4o", Query("q"), messages=[{"role": "user", "content": "hi"}, _call(junk2=2)]
        )


def test_tool_call_id_only_on_tool_messages() -> None:
    with pytest.raises(ValueError, match="only tool messages carry tool_call_id"):
        Message.from_mapping({"role": "user", "content": "x", "tool_call_id": "abc"})
    with pytest.raises(ValueError, match="tool_call_id"):
        Message("assistant", "x", tool_call_id="abc")
    # An empty field says nothing (an SDK dump's default) and is let go.
    assert Message.from_mapping({"role": "user", "content": "x", "tool_call_id": ""}).tool_call_id is None


def test_tool_call_id_must_be_a_str() -> None:
    with pytest.raises(TypeError, match="tool_call_id must be a str, got int"):
        Message("tool", "x", tool_call_id=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"content\[0\]: tool_call_id must be a str, got int"):
        Message.from_mapping({"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5, "content": "x"}]})


def test_valid_tool_calls_round_trip_through_both_payloads() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "where is order 7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": 7}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
    ]
    msgs = [Message.from_mapping(m) for m in history]
    assert msgs[1].tool_calls == (ToolCall("call_1", "lookup", '{"id": 7}'),)
    assert msgs[2].tool_call_id == "call_1"
    assert render_openai(messages=msgs)["messages"] == history
    turns = render_anthropic(messages=msgs, cache_breakpoint=False)["messages"]
    assert turns[1]["content"] == [{"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"id": 7}}]
    assert turns[2]["content"] == [{"type": "tool_result", "tool_use_id": "call_1", "content": "shipped"}]
    # The bare shape, without the function wrapper, and arguments given as an object.
    bare_call: dict[str, Any] = {"id": "c", "name": "f", "arguments": {"a": 1}}
    bare = Message.from_mapping({"role": "assistant", "tool_calls": [bare_call]})
    assert bare.tool_calls == (ToolCall("c", "f", '{"a": 1}'),)


# ---- tools --------------------------------------------------------------------------------------


def test_an_openai_tool_with_an_extra_top_level_key_is_refused() -> None:
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object"}},
        "cache_control": {"type": "ephemeral"},
    }
    with pytest.raises(ValueError, match=r"unsupported keys \['cache_control'\]"):
        ToolSpec.from_mapping(tool)
    for render in (render_openai, render_anthropic):
        with pytest.raises(ValueError, match=r"tools\[0\]: unsupported keys \['cache_control'\]"):
            render(tools=[tool])
    with pytest.raises(ValueError, match=r"tools\[0\]: unsupported keys \['cache_control'\]"):
        AssemblyRequest(
            "org-1", "agent-1", "gpt-4o", Query("q"), tools=[tool], options=AssemblyOptions(rendering="openai")
        )


def test_an_anthropic_tool_the_openai_rendering_cannot_carry_is_refused_by_the_request() -> None:
    tool = {"name": "g", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}
    with pytest.raises(
        ValueError, match=r"tools\[0\] \('g'\): \['cache_control'\] cannot be carried by an OpenAI tool"
    ):
        AssemblyRequest(
            "org-1", "agent-1", "gpt-4o", Query("q"), tools=[tool], options=AssemblyOptions(rendering="openai")
        )
    for rendering in ("anthropic", "text"):
        AssemblyRequest(
            "org-1", "agent-1", "gpt-4o", Query("q"), tools=[tool], options=AssemblyOptions(rendering=rendering)
        )


def test_valid_tools_round_trip() -> None:
    openai_tool = {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True},
    }
    anthropic_tool = {"name": "g", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}
    assert render_openai(tools=[openai_tool])["tools"] == [openai_tool]
    assert render_anthropic(tools=[anthropic_tool], cache_breakpoint=False)["tools"] == [anthropic_tool]
    assert render_anthropic(
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        cache_breakpoint=False,
    )["tools"] == [{"name": "f", "input_schema": {"type": "object"}}]


# ---- the request's tools and assemble's own arguments ------------------------------------------


@pytest.mark.parametrize("tools", [{"name": "x", "parameters": {}}, "x"])
def test_a_single_tool_instead_of_a_list_is_named(tools: object) -> None:
    with pytest.raises(TypeError, match=r"tools must be a sequence of tool schemas .* wrap one tool in a list"):
        AssemblyRequest("o", "a", "gpt-4o", "q", tools=tools)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["messages", "tools"])
@pytest.mark.parametrize("value", [None, 3])
def test_messages_or_tools_that_are_no_sequence_are_named(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"^{field} must be a sequence of .*, got {type(value).__name__}$"):
        AssemblyRequest("o", "a", "gpt-4o", "q", **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Sources(hot=5), r"^Sources: hot must be an async function \(scope, query, limit\) or None, got int$"),
        (lambda: Sources(directive="store.directive"), r"^Sources: directive must be an async function .* got str$"),
        (lambda: Sources(cold=[]), r"^Sources: cold must be an async function .* got list$"),
        (lambda: Sources.from_store(None), r"NoneType has no directive, hot, cold$"),
        (lambda: Sources.from_store(Scope("o", "a")), r"Scope has no directive, hot, cold$"),
    ],
)
def test_sources_that_cannot_be_called_are_refused_when_built(make: Any, match: str) -> None:
    # Else every assembly would run them and record the same branch error.
    with pytest.raises(TypeError, match=match):
        make()


def _request() -> AssemblyRequest:
    return AssemblyRequest("o", "a", "gpt-4o", "q")


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"sources": None}, TypeError, r"sources must be ctxcore\.Sources .*got NoneType"),
        ({"request": {"model": "gpt-4o"}}, TypeError, r"request must be a ctxcore\.AssemblyRequest, got dict"),
        ({"catalog": "x"}, TypeError, r"catalog must be a ctxcore\.Catalog or None, got str"),
        ({"config": {}}, TypeError, r"config must be a ctxcore\.AssemblyConfig or None, got dict"),
        ({"executor": "x"}, TypeError, r"executor must be a concurrent\.futures\.Executor or None, got str"),
        ({"reranker": 3}, TypeError, r"reranker must be a callable"),
        ({"deadline": "soon"}, TypeError, r"deadline must be an absolute time\.monotonic\(\) time .*got str"),
        ({"deadline": True}, TypeError, r"deadline must be an absolute time\.monotonic\(\) time .*got bool"),
        ({"deadline": math.nan}, ValueError, r"deadline must be a finite time\.monotonic\(\) time, got nan"),
        ({"deadline": math.inf}, ValueError, r"deadline must be a finite"),
        ({"deadline": 10**400}, ValueError, r"deadline must be a finite time\.monotonic\(\) time, got 1000"),
    ],
)
def test_assemble_names_an_argument_of_the_wrong_kind(arguments: dict[str, Any], error: type, match: str) -> None:
    import asyncio

    import ctxcore

    async def hot(scope: object, query: object, limit: int) -> list[ctxcore.MemoryRecord]:
        raise AssertionError("no branch runs for a bad call")

    given: dict[str, Any] = {"request": _request(), "sources": ctxcore.Sources(hot=hot)} | arguments
    request = given.pop("request")
    with pytest.raises(error, match=match):
        asyncio.run(ctxcore.assemble(request, **given))
