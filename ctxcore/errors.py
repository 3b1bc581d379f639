"""The exceptions ctxcore raises, in one place.

`InvalidCandidate` is defined by the compiled core (so C++ validation errors arrive as
the same class) and re-exported here; the Python layer raises it through `invalid()`
so that every instance carries the offending candidate's `index` and `candidate_id`.
`InvalidFormatInput` (the formatter's) is defined by the core the same way and carries
`section`, `index` and `item_id`.
"""

from __future__ import annotations

from typing import Any

from ._core import InvalidCandidate, InvalidFormatInput

__all__ = [
    "CatalogError",
    "ConfigError",
    "ContextOverflow",
    "InvalidCandidate",
    "InvalidFormatInput",
    "InvalidTokenizerOutput",
    "TokenizerMismatch",
    "TokenizerUnavailable",
    "UnknownModel",
    "invalid",
]


def invalid(message: str, index: int = -1, candidate_id: str | None = None) -> InvalidCandidate:
    """Build an `InvalidCandidate` carrying where the problem is.

    Args:
        message: what is wrong, already naming the candidate.
        index: the candidate's input position, or -1 when no single candidate is at fault.
        candidate_id: the candidate's id when it has a usable one.

    >>> err = invalid("candidate 'a' (index 0): tokens must be >= 0", 0, "a")
    >>> (isinstance(err, ValueError), err.index, err.candidate_id)
    (True, 0, 'a')
    """
    err = InvalidCandidate(message)
    err.index = index
    err.candidate_id = candidate_id
    return err


class TokenizerMismatch(ValueError):
    """Token counts of different tokenizer families or kinds were combined."""

    __module__ = "ctxcore"


class TokenizerUnavailable(LookupError):
    """An exact count was asked for a family whose tokenizer is not installed offline."""

    __module__ = "ctxcore"


class InvalidTokenizerOutput(ValueError):
    """A registered tokenizer returned something that is not a token count.

    A negative number, a non-integer, or a batch of the wrong length. `family` names the
    registered family; `index` is the position of the text in a batch (-1 for one text).
    """

    __module__ = "ctxcore"

    def __init__(self, message: str, family: str = "", index: int = -1) -> None:
        super().__init__(message)
        self.family = family
        self.index = index


class UnknownModel(LookupError):
    """A model name is in no catalog entry. `suggestions` holds the closest names."""

    __module__ = "ctxcore"

    def __init__(self, message: str, model: str = "", suggestions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.model = model
        self.suggestions = suggestions


class CatalogError(ValueError):
    """A capability catalog file is not valid; the message names the file and the entry."""

    __module__ = "ctxcore"


class ConfigError(ValueError):
    """A policy setting makes no sense (e.g. a negative fraction, a minimum above its maximum)."""

    __module__ = "ctxcore"


class ContextOverflow(ValueError):
    """Directive, messages and tools alone do not fit the model's window, and the history
    policy does not allow trimming (or nothing is left to trim). `budget` is the ledger
    with the numbers; its `shortfall` is how far over the window the request is."""

    __module__ = "ctxcore"

    def __init__(self, message: str, budget: Any = None) -> None:
        super().__init__(message)
        self.budget = budget
