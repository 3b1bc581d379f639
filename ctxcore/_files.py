"""Reading the files ctxcore is pointed at: UTF-8 text that is read whole or refused with
one line naming the file, and JSON Lines whose bad lines are named by number.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp(), "c.jsonl")
>>> _ = p.write_text('{"id": "a"}\\n\\n[1]\\n', encoding="utf-8")
>>> rows = jsonl_objects(read_utf8(p, ValueError), "c.jsonl", ValueError)
>>> next(rows)
(1, {'id': 'a'})
>>> next(rows)
Traceback (most recent call last):
...
ValueError: c.jsonl:3: expected a JSON object, got list
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["STDIN", "decode_utf8", "json_value", "jsonl_objects", "read_utf8"]

#: The file argument that means standard input, on every command that reads a file.
STDIN = "-"

#: Makes the exception a caller raises from a message.
Fail = Callable[[str], Exception]


def decode_utf8(raw: bytes, name: str, fail: Fail, what: str = "") -> str:
    """`raw` as UTF-8 text, or ``fail`` naming `name` (and `what` it is) and the bad byte.

    >>> decode_utf8(b"\\xff", "x.toml", ValueError, what="config")
    Traceback (most recent call last):
    ...
    ValueError: config x.toml is not UTF-8 (invalid start byte at byte 0)
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"{what} {name} is" if what else f"{name}:"
        raise fail(f"{where} not UTF-8 ({exc.reason} at byte {exc.start})") from None


def read_utf8(path: str | os.PathLike[str], fail: Fail, what: str = "", *, gzipped: bool = False) -> str:
    """The UTF-8 text of the file at `path` (gunzipped first when `gzipped`), or
    ``fail(message)`` naming the file (as `what`, e.g. ``"config"``, when given) and why.

    >>> read_utf8("/no/such/file.toml", ValueError, what="catalog")
    Traceback (most recent call last):
    ...
    ValueError: cannot read catalog /no/such/file.toml: No such file or directory
    """
    name = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
        if gzipped:
            raw = gzip.decompress(raw)
    except OSError as exc:
        raise fail(f"cannot read {what + ' ' if what else ''}{name}: {exc.strerror or exc}") from None
    return decode_utf8(raw, name, fail, what)


def json_value(text: str, where: str, fail: Fail, *, column: bool = False, line: bool = False) -> Any:
    """The JSON value `text` holds, or ``fail`` naming `where` (and the column, with
    `column`, or the line, with `line`) and why it is not JSON, including an integer
    longer than Python reads (``sys.get_int_max_str_digits()``) and nesting deeper than
    the parser recurses.

    >>> json_value('{"a": [1' + "0" * 5000 + "]}", "x.json", ValueError)
    Traceback (most recent call last):
    ...
    ValueError: x.json: invalid JSON: a number is too long (integers may have at most 4300 digits)
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f" (column {exc.colno})" if column else f" (line {exc.lineno})" if line else ""
        raise fail(f"{where}: invalid JSON: {exc.msg}{at}") from None
    except RecursionError:
        raise fail(f"{where}: invalid JSON: nested too deeply") from None
    except ValueError:  # int() past Python's digit limit, the only other ValueError json raises
        raise fail(
            f"{where}: invalid JSON: a number is too long "
            f"(integers may have at most {sys.get_int_max_str_digits()} digits)"
        ) from None


def jsonl_objects(text: str, name: str, fail: Fail, *, column: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of JSON Lines `text`; ``fail`` names
    `name` and the line (and the column, with `column`) of the first line that is not
    JSON or not an object. Lines end at "\n" (a "\r" before it is JSON whitespace), not
    at the other line breaks `str.splitlines` knows: U+2028, U+2029 or U+0085 inside a
    string are text."""
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        obj = json_value(line, f"{name}:{lineno}", fail, column=column)
        if not isinstance(obj, dict):
            raise fail(f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj
