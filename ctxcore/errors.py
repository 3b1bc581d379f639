"""The exceptions ctxcore raises, in one place.

`InvalidCandidate` is defined by the compiled core (so C++ validation errors arrive as
the same class) and re-exported here; the Python layer raises it through `invalid()`
so that every instance carries the offending candidate's `index` and `candidate_id`.
"""

from __future__ import annotations

from ._core import InvalidCandidate

__all__ = ["InvalidCandidate", "invalid"]


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
