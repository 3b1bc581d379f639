"""What a ``--db`` value names: a PostgreSQL URL or a SQLite file."""

from __future__ import annotations

__all__ = ["is_postgres_url"]


def is_postgres_url(value: object) -> bool:
    """Whether `value` names a PostgreSQL database (``postgresql://`` or ``postgres://``)
    rather than a SQLite file.

    >>> is_postgres_url("postgresql://app@db/memories"), is_postgres_url("memories.db")
    (True, False)
    """
    return isinstance(value, str) and value.lower().startswith(("postgresql://", "postgres://"))
