"""Directives in the SQLite store: how they are written and read (the cache in front of
the reads is the stores' shared `ctxcore.stores.directives.DirectiveCache`)."""

from __future__ import annotations

import sqlite3
import time

from ...memory import Scope
from ..directives import ORG_WIDE

__all__ = ["read_directive", "write_directive"]


def write_directive(conn: sqlite3.Connection, organization_id: str, agent_id: str | None, text: str | None) -> None:
    """Set (or with ``text=None`` remove) one directive on the writer connection, inside
    the caller's write lock."""
    key = (organization_id, ORG_WIDE if agent_id is None else agent_id)
    if text is None:
        conn.execute("DELETE FROM directives WHERE organization_id = ? AND agent_id = ?", key)
    else:
        conn.execute(
            "INSERT INTO directives VALUES (?, ?, ?, ?) ON CONFLICT (organization_id, agent_id) "
            "DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
            (*key, text, time.time()),
        )


def read_directive(conn: sqlite3.Connection, scope: Scope) -> str | None:
    """The organization's directive followed by the agent's (a blank line between), or
    whichever exists, or None."""
    rows = conn.execute(
        "SELECT text FROM directives WHERE organization_id = ? AND agent_id IN (?, ?) "
        "ORDER BY agent_id",  # '' (the organization's) sorts first
        (scope.organization_id, ORG_WIDE, scope.agent_id),
    ).fetchall()
    return "\n\n".join(r[0] for r in rows) if rows else None
