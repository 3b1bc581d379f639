"""Structured logs for `ctxcore serve`: one JSON object per line.

Only what an operator needs to follow a call is logged: the RPC, the status code, the
principal, the requested organization and agent, latency, branch outcomes, counts. Memory
text, directive text, message content, queries and exception messages (which may quote
the data a source choked on) are never logged; errors are logged by exception type and
stack frames only.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import traceback
from typing import Any

__all__ = ["JsonFormatter", "configure_logging", "error_frames", "log_event"]

LOGGER = logging.getLogger("ctxcore.service")
#: The line boundaries besides those JSON escapes (NEL, LINE and PARAGRAPH SEPARATOR),
#: written as JSON escapes so that each record stays one line to every reader.
_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
_NEEDS_ESCAPE = re.compile("[\x85\u2028\u2029]")
#: Fields every line of this process carries (a worker's index, see `configure_logging`).
_PROCESS_FIELDS: dict[str, Any] = {}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "event", ...fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        doc.update(_PROCESS_FIELDS)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        line = json.dumps(doc, ensure_ascii=False, default=str, separators=(",", ":"))
        # JSON leaves these raw, and a reader that splits text at every Unicode line boundary
        # (str.splitlines, say) would cut the record at one a caller sent in an id.
        return line.translate(_LINE_BREAKS) if _NEEDS_ESCAPE.search(line) else line


def configure_logging(level: str = "info", **process_fields: Any) -> None:
    """Send the service's logs to stderr as JSON lines, each with `process_fields` (e.g.
    ``worker=2`` in a worker process of `ctxcore.service.workers`)."""
    _PROCESS_FIELDS.clear()
    _PROCESS_FIELDS.update(process_fields)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("ctxcore")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with structured fields."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, event, extra={"fields": fields})


def error_frames(exc: BaseException) -> dict[str, Any]:
    """An exception's type and stack frames, without its message (which may quote data).

    >>> try:
    ...     raise ValueError("secret memory text")
    ... except ValueError as e:
    ...     info = error_frames(e)
    >>> info["error_type"], "secret" in str(info)
    ('ValueError', False)
    """
    frames = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_tb(exc.__traceback__)]
    return {"error_type": type(exc).__qualname__, "frames": frames[-12:], "at": time.time()}
