"""Writes to the SQLite store: checking a batch of new memories, inserting it (rows,
full-text entries, scope counters) and removing memories, each inside the caller's
transaction on the writer connection."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import InvalidMemory
from ..records import NewMemory, created_times
from .fulltext import fts_body
from .schema import stored_dim

__all__ = [
    "OnConflict",
    "check_dims",
    "delete_memories",
    "insert_batch",
    "insert_memory",
    "next_rowid",
    "remove_rows",
    "remove_where",
]

#: What `SqliteMemoryStore.add_many` does with an id that is already stored.
OnConflict = Literal["error", "skip", "replace"]

#: Memories prepared (counted, embedded) between two progress reports of `add_many`.
PROGRESS_CHUNK = 512

_INSERT = (
    "INSERT INTO memories (rowid, id, organization_id, agent_id, text, embedding, confidence, "
    "importance, created_at, accessed_at, token_count, token_family, token_kind, exact_tokens) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
#: The ``meta`` key holding the highest rowid of a removed memory. A rowid is never given
#: twice: a kept embedding matrix (`ctxcore.stores.sqlite.vectors`) and a resumed
#: re-embedding know a memory by its rowid, and SQLite alone would give the rowid of a
#: removed newest memory to the next one.
ROWID_HIGH = "rowid_high"


def next_rowid(conn: sqlite3.Connection) -> int:
    """The rowid the next memory takes: past every stored memory's and every removed
    one's."""
    (n,) = conn.execute(
        "SELECT max(coalesce((SELECT max(rowid) FROM memories), 0), "
        "coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = ?), 0))",
        (ROWID_HIGH,),
    ).fetchone()
    return int(n) + 1


def _note_removed(conn: sqlite3.Connection, rowids: Sequence[int]) -> None:
    """Keep the highest of `rowids` (memories about to be removed) from being given again."""
    if rowids:
        conn.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
            "value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
            (ROWID_HIGH, str(max(rowids))),
        )


def insert_memory(conn: sqlite3.Connection, rowid: int, values: tuple[Any, ...]) -> None:
    """Insert one memory row at `rowid` (`next_rowid`; `values` in the column order of
    ``_INSERT`` after the rowid) and its full-text entry."""
    conn.execute(_INSERT, (rowid, *values))
    conn.execute(
        "INSERT INTO memory_words (rowid, body) VALUES (?, ?)",
        (rowid, fts_body(values[1], values[2], values[3])),
    )


def check_dims(batch: Sequence[NewMemory], sizes: Sequence[int | None], want: int, whose: str) -> None:
    """Refuse the first memory whose embedding (of `sizes`, None: none) has another
    dimension than `want`; `whose` names where `want` comes from in the message."""
    for i, size in enumerate(sizes):
        if size is not None and size != want:
            mid = batch[i].id
            raise InvalidMemory(f"memory {mid!r} (index {i}): embedding has {size} dimensions, {whose} {want}", i, mid)


def insert_batch(
    conn: sqlite3.Connection,
    batch: list[NewMemory],
    seen: Mapping[str, int],
    counts: list[int],
    vectors: list[npt.NDArray[np.float32] | None],
    exact: list[str | None],
    *,
    family: str,
    kind: str,
    on_conflict: OnConflict,
    now: float,
    expected_dim: int | None = None,
    expected_from: str = "the store's",
) -> list[NewMemory]:
    """Insert the prepared batch (inside the caller's transaction) and bump the scopes'
    counters; returns the memories inserted (without the skipped ones).

    Every embedding must have the store's recorded dimension; a store that records none
    yet takes `expected_dim` (its embedder's, named by `expected_from`), else the first
    embedding's."""
    taken = conn.execute(
        "SELECT id, organization_id, agent_id FROM memories WHERE id IN (SELECT value FROM json_each(?))",
        (json.dumps(list(seen)),),
    ).fetchall()
    if taken and on_conflict == "error":
        first = min(seen[r[0]] for r in taken)
        mid = batch[first].id
        raise InvalidMemory(f"memory {mid!r} (index {first}): id {mid!r} is already stored", first, mid)
    if taken and on_conflict == "skip":
        keep = [i for i, m in enumerate(batch) if m.id not in {r[0] for r in taken}]
        batch, counts, vectors = [batch[i] for i in keep], [counts[i] for i in keep], [vectors[i] for i in keep]
        exact = [exact[i] for i in keep]
    elif taken:
        # Ids are unique across the store, but a replace only ever replaces a memory of
        # the same scope: another scope's memory is never touched.
        foreign = [
            seen[r[0]] for r in taken if (r[1], r[2]) != (batch[seen[r[0]]].organization_id, batch[seen[r[0]]].agent_id)
        ]
        if foreign:
            first = min(foreign)
            mid = batch[first].id
            raise InvalidMemory(
                f"memory {mid!r} (index {first}): id {mid!r} is stored in another scope; "
                "a replace only replaces a memory of the same scope",
                first,
                mid,
            )
        delete_memories(conn, [r[0] for r in taken])
    dim = stored_dim(conn)
    whose = "the store's have"
    if dim is None and expected_dim is not None and any(v is not None for v in vectors):
        dim, whose = expected_dim, expected_from
        conn.execute("INSERT INTO meta VALUES ('embedding_dim', ?)", (str(dim),))
    first_vector = next((v for v in vectors if v is not None), None)
    if dim is None and first_vector is not None:
        dim = first_vector.size
        conn.execute("INSERT INTO meta VALUES ('embedding_dim', ?)", (str(dim),))
    if dim is not None:
        check_dims(batch, [None if v is None else v.size for v in vectors], dim, whose)
    bumps: dict[tuple[str, str], list[int]] = {}
    first_rowid = next_rowid(conn)
    for k, (m, created, n_tokens, v, ex) in enumerate(zip(batch, created_times(batch, now), counts, vectors, exact)):
        insert_memory(
            conn,
            first_rowid + k,
            (
                m.id,
                m.organization_id,
                m.agent_id,
                m.text,
                None if v is None else v.tobytes(),
                m.confidence,
                m.importance,
                created,
                m.accessed_at,
                n_tokens,
                family,
                kind,
                ex,
            ),
        )
        b = bumps.setdefault((m.organization_id, m.agent_id), [0, 0])
        b[0] += 1
        b[1] += v is not None
    conn.executemany(
        "INSERT INTO scopes (organization_id, agent_id, version, memories, embedded) "
        "VALUES (?, ?, 1, ?, ?) ON CONFLICT (organization_id, agent_id) DO UPDATE SET "
        "version = version + 1, memories = memories + excluded.memories, "
        "embedded = embedded + excluded.embedded",
        [(o, a, n, e) for (o, a), (n, e) in bumps.items()],
    )
    return batch


def remove_rows(conn: sqlite3.Connection, rows: Sequence[tuple[int, str, str, int]]) -> None:
    """Delete memory rows, given as (rowid, organization_id, agent_id, has_embedding),
    with their full-text entries (inside the caller's transaction)."""
    # The scope's write counter moves and its counts drop, so every process's embedding
    # matrix of the scope is rebuilt (its cached rows + new rows no longer add up to the
    # stored count).
    _note_removed(conn, [r[0] for r in rows])
    ids = json.dumps([r[0] for r in rows])
    conn.execute("DELETE FROM memory_words WHERE rowid IN (SELECT value FROM json_each(?))", (ids,))
    conn.execute(
        "DELETE FROM memory_reads WHERE id IN (SELECT id FROM memories WHERE rowid IN "
        "(SELECT value FROM json_each(?)))",
        (ids,),
    )
    conn.execute("DELETE FROM memories WHERE rowid IN (SELECT value FROM json_each(?))", (ids,))
    drops: dict[tuple[str, str], list[int]] = {}
    for _, org, agent, emb in rows:
        d = drops.setdefault((org, agent), [0, 0])
        d[0] += 1
        d[1] += bool(emb)
    conn.executemany(
        "UPDATE scopes SET version = version + 1, memories = memories - ?, embedded = embedded - ? "
        "WHERE organization_id = ? AND agent_id = ?",
        [(n, e, o, a) for (o, a), (n, e) in drops.items()],
    )


def remove_where(conn: sqlite3.Connection, where: str, args: Sequence[object]) -> int:
    """Delete the memories matching `where` (a condition on ``memories`` written by this
    package, never by a caller; its values come as the parameters `args`), with their
    full-text entries, inside the caller's transaction; returns how many."""
    rows = conn.execute(
        f"SELECT rowid, organization_id, agent_id, embedding IS NOT NULL FROM memories WHERE {where}", tuple(args)
    ).fetchall()
    remove_rows(conn, rows)
    return len(rows)


def delete_memories(conn: sqlite3.Connection, ids: Sequence[str]) -> None:
    """Delete stored memories (inside the caller's transaction), their full-text rows and
    their share of the scope counters; the scope version moves so caches reload."""
    wanted = json.dumps(list(ids))
    rows = conn.execute(
        "SELECT rowid, organization_id, agent_id, embedding IS NOT NULL FROM memories "
        "WHERE id IN (SELECT value FROM json_each(?))",
        (wanted,),
    ).fetchall()
    _note_removed(conn, [r[0] for r in rows])
    conn.executemany("DELETE FROM memory_words WHERE rowid = ?", [(r[0],) for r in rows])
    conn.execute("DELETE FROM memory_reads WHERE id IN (SELECT value FROM json_each(?))", (wanted,))
    conn.executemany("DELETE FROM memories WHERE rowid = ?", [(r[0],) for r in rows])
    conn.executemany(
        "UPDATE scopes SET version = version + 1, memories = memories - 1, embedded = embedded - ? "
        "WHERE organization_id = ? AND agent_id = ?",
        [(int(r[3]), r[1], r[2]) for r in rows],
    )
