"""Numbers from callers, read where they enter the package: an integer of any type
(``int``, a numpy integer such as the sum of `count_tokens_batch`'s array, anything
`operator.index` takes) becomes a plain ``int``, a real number of any type a plain
``int`` or ``float``, so no numpy scalar travels further in. Bools are not numbers here:
``True`` as a token count is a mistake, not a 1. What is not a number gives None, and
the caller raises its own error naming the field.

>>> import numpy as np
>>> as_int(np.int64(7)), as_int(7.0), as_int(True)
(7, None, None)
>>> as_real(np.float32(0.15)), as_real("0.15")
(0.15, None)
"""

from __future__ import annotations

import argparse
import numbers
import operator

import numpy as np

__all__ = ["as_int", "as_real", "non_negative_int_arg", "positive_int_arg"]


def as_int(value: object) -> int | None:
    """``value`` as a plain int when it is an integer other than a bool, else None.

    >>> as_int(12), as_int(12.5)
    (12, None)
    """
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):
        return None
    try:
        return operator.index(value)
    except TypeError:  # an array of more than one element has __index__ and refuses it
        return None


def as_real(value: object) -> int | float | None:
    """``value`` as a plain int or float when it is a real number other than a bool,
    else None. NaN and infinities come through: ranges are the caller's to check.

    A numpy float of another precision than a double is read as the decimal it prints
    as: ``np.float32(0.15)`` is the 0.15 its caller wrote, not 0.15000000596046448, so a
    fraction of a window rounds the same whichever type it came in.

    >>> as_real(3), as_real(float("inf")), as_real(None)
    (3, inf, None)
    """
    if type(value) is int or type(value) is float:
        return value
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, float):  # np.float64 and other subclasses
        return float(value)
    if isinstance(value, np.floating):
        return float(str(value))
    whole = as_int(value)
    if whole is not None:
        return whole
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except (OverflowError, ValueError):
            return None
    return None


def non_negative_int_arg(text: str) -> int:
    """Argparse type: an integer >= 0 (budgets, token counts).

    >>> non_negative_int_arg("12")
    12
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int_arg(text: str) -> int:
    """Argparse type: an integer >= 1 (counts, dimensions).

    >>> positive_int_arg("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be >= 1, got 0
    """
    value = non_negative_int_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
