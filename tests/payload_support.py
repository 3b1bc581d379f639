"""Checking a payload against the providers' SDK request types (no network): `conforms`,
and `check_openai` / `check_anthropic` for a whole request. Imported by name by the
payload and token-budget tests (pyproject.toml puts tests/ on the pytest path).
"""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin

import typing_extensions
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from typing_extensions import get_type_hints, is_typeddict

__all__ = ["check_anthropic", "check_openai", "conforms"]

_REQUIRED = {Required, typing.Required}
_NOT_REQUIRED = {NotRequired, typing.NotRequired}


def conforms(value: Any, tp: Any, path: str = "$") -> None:
    """`value` against an SDK annotation: TypedDicts refuse unknown keys and need their
    required ones, Literals match exactly, Iterables are lists, unions need one match."""
    origin = get_origin(tp)
    if tp is Any or tp is object:
        return
    if origin in _REQUIRED | _NOT_REQUIRED or origin in (typing.Annotated, typing_extensions.Annotated):
        return conforms(value, get_args(tp)[0], path)
    if origin in (Union, types.UnionType):
        errors = []
        for arg in get_args(tp):
            try:
                conforms(value, arg, path)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{path}: {value!r:.120} matches none of the union: {errors}")
    if origin in (Literal, typing_extensions.Literal):
        assert value in get_args(tp), f"{path}: {value!r} not in {get_args(tp)}"
        return
    if tp is type(None):
        assert value is None, f"{path}: expected None, got {value!r:.80}"
        return
    if origin in (collections.abc.Iterable, collections.abc.Sequence, list):
        assert isinstance(value, list), f"{path}: expected a list, got {type(value).__name__}"
        (item,) = get_args(tp)
        for i, v in enumerate(value):
            conforms(v, item, f"{path}[{i}]")
        return
    if origin in (dict, collections.abc.Mapping):
        assert isinstance(value, dict), f"{path}: expected a dict, got {type(value).__name__}"
        kt, vt = get_args(tp)
        for k, v in value.items():
            conforms(k, kt, f"{path}.<key>")
            conforms(v, vt, f"{path}.{k}")
        return
    if is_typeddict(tp):
        assert isinstance(value, dict), f"{path}: expected a {tp.__name__} dict, got {type(value).__name__}"
        hints = get_type_hints(tp, include_extras=True)
        unknown = set(value) - set(hints)
        assert not unknown, f"{path}: {tp.__name__} has no keys {sorted(unknown)}"
        for key, hint in hints.items():
            required = get_origin(hint) in _REQUIRED or (tp.__total__ and get_origin(hint) not in _NOT_REQUIRED)
            if key not in value:
                assert not required, f"{path}: {tp.__name__} needs {key!r}"
                continue
            conforms(value[key], hint, f"{path}.{key}")
        return
    if tp is float:
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{path}: expected a number"
        return
    if isinstance(tp, type):
        ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
        assert ok, f"{path}: expected {tp.__name__}, got {type(value).__name__}"
        return
    raise AssertionError(f"{path}: the checker does not know the annotation {tp!r}")


def check_openai(payload: dict[str, Any]) -> None:
    conforms({"model": "gpt-4o", **payload}, CompletionCreateParamsNonStreaming)


def check_anthropic(payload: dict[str, Any]) -> None:
    conforms({"model": "claude-sonnet-4-5", "max_tokens": 1024, **payload}, MessageCreateParamsNonStreaming)
