"""Bulk ingest from JSON Lines, and the shipped demo database.

One JSON object per line: a memory (the fields of `NewMemory`; ``"type": "memory"`` is
optional) or a directive (``"type": "directive"``, ``organization_id``, optional
``agent_id``, ``text``). `ingest_jsonl` stores a whole file in one transaction or
nothing, and every error names the file and line. `load_demo` builds a database from
the dataset shipped in the package (``ctxcore/data/demo_memories.jsonl``: several
organizations, agents and languages), with `HashingEmbedder` embeddings; ``ctxcore
demo`` runs an assembly against it. A demo database records ``demo_dataset`` in its
``meta`` table; `load_demo` rebuilds over such a file and over nothing else, so a user's own
store or any other file at the path is never replaced.
"""

from __future__ import annotations

import importlib.resources
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._files import decode_utf8, jsonl_objects
from .embedding import HashingEmbedder
from .errors import InvalidMemory
from .records import Directive, NewMemory
from .sqlite import OnConflict, SqliteMemoryStore

if TYPE_CHECKING:
    from .postgres import PostgresMemoryStore

__all__ = ["DEMO_DATASET", "IngestReport", "ingest_jsonl", "is_demo_store", "load_demo", "read_jsonl"]

#: The demo dataset, inside the installed package.
DEMO_DATASET = "data/demo_memories.jsonl"
#: The ``meta`` key a demo database records (its value: `DEMO_DATASET`).
DEMO_MARK = "demo_dataset"
# The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"


@dataclass(frozen=True, slots=True)
class IngestReport:
    """What an ingest stored."""

    source: str
    memories: int
    directives: int
    #: Memories whose id was already stored, kept as they were (``on_conflict="skip"``).
    skipped: int = 0


def read_jsonl(path: str | os.PathLike[str], text: str | None = None) -> list[tuple[int, NewMemory | Directive]]:
    """Parse a JSON Lines file of memories and directives into ``(line, record)`` pairs.

    Blank lines are skipped. `text`, when given, is parsed instead of reading `path`
    (which then only names the source in messages).

    Raises:
        InvalidMemory: ``"PATH:LINE: ..."`` for the first bad line (invalid JSON, not an
            object, an unknown ``type``, an invalid record).
        OSError: the file cannot be read.

    >>> [type(r).__name__ for _, r in read_jsonl("x.jsonl", text='{"type": "directive", '
    ...     '"organization_id": "o", "text": "Be brief."}\\n')]
    ['Directive']
    """
    name = os.fspath(path)
    if text is None:
        text = decode_utf8(Path(path).read_bytes(), name, InvalidMemory)
    out: list[tuple[int, NewMemory | Directive]] = []
    for lineno, obj in jsonl_objects(text, name, InvalidMemory, column=True):
        kind = obj.pop("type", "memory")
        try:
            if kind == "memory":
                out.append((lineno, NewMemory.from_mapping(obj)))
            elif kind == "directive":
                out.append((lineno, Directive.from_mapping(obj)))
            else:
                raise InvalidMemory(f"unknown type {kind!r}: expected 'memory' or 'directive'")
        except InvalidMemory as exc:
            raise InvalidMemory(f"{name}:{lineno}: {exc}", -1, exc.memory_id) from None
    return out


def ingest_jsonl(
    store: SqliteMemoryStore | PostgresMemoryStore,
    path: str | os.PathLike[str],
    text: str | None = None,
    *,
    on_conflict: OnConflict = "error",
    progress: Callable[[int], object] | None = None,
) -> IngestReport:
    """Store every memory and directive of a JSON Lines file in one transaction: all of
    them, or (on error) none.

    Args:
        store: where to store them.
        path: the file (names the source in messages when `text` is given).
        text: the file's content, when already read (e.g. from standard input).
        on_conflict: an id that is already stored: ``"error"`` fails the file, ``"skip"``
            keeps the stored memory, ``"replace"`` replaces it.
        progress: called with the number of memories just prepared, a chunk at a time.

    Raises:
        InvalidMemory: naming ``PATH:LINE`` of the first bad record, including ids used
            twice or already stored.

    >>> import tempfile, os
    >>> with SqliteMemoryStore(os.path.join(tempfile.mkdtemp(), "m.db")) as s:
    ...     ingest_jsonl(s, "in.jsonl", text='{"id": "m1", "organization_id": "o", '
    ...                  '"agent_id": "a", "text": "likes tea"}')
    IngestReport(source='in.jsonl', memories=1, directives=0, skipped=0)
    """
    name = os.fspath(path)
    records = read_jsonl(path, text)
    memories = [(line, r) for line, r in records if isinstance(r, NewMemory)]
    directives = [r for _, r in records if isinstance(r, Directive)]
    try:
        if isinstance(store, SqliteMemoryStore):
            stored = store.add_many(
                [m for _, m in memories], directives=directives, on_conflict=on_conflict, progress=progress
            )
        else:
            if on_conflict != "error":
                raise ValueError(f"on_conflict={on_conflict!r} is supported by the SQLite store only")
            stored = store.add_many([m for _, m in memories], directives=directives)
    except InvalidMemory as exc:
        if 0 <= exc.index < len(memories):
            raise InvalidMemory(f"{name}:{memories[exc.index][0]}: {exc}", exc.index, exc.memory_id) from None
        raise
    return IngestReport(name, len(stored), len(directives), len(memories) - len(stored))


def is_demo_store(db_path: str | os.PathLike[str]) -> bool:
    """Whether `db_path` is a database `load_demo` built (it records `DEMO_MARK`). Reads
    the file only: a file that is not a SQLite database, or not a demo one, is left as it is.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp(), "notes.txt")
    >>> _ = path.write_text("my notes")
    >>> is_demo_store(path)
    False
    """
    target = Path(db_path)
    try:
        with target.open("rb") as f:
            if f.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                return False
    except OSError:
        return False
    try:
        conn = sqlite3.connect(f"{target.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (DEMO_MARK,)).fetchone()
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return row is not None


def load_demo(db_path: str | os.PathLike[str], *, overwrite: bool = False) -> SqliteMemoryStore:
    """Build the demo database at `db_path` from the shipped dataset and return it open
    (with the `HashingEmbedder` its embeddings were made with). Close it when done.

    Args:
        db_path: where to create the database.
        overwrite: rebuild an existing demo database at `db_path` (one `load_demo` built,
            `is_demo_store`). Any other file there is never replaced.

    Raises:
        FileExistsError: something exists at `db_path` and it is not a demo database, or
            it is one and `overwrite` is false; nothing is changed.

    >>> import asyncio, tempfile, os
    >>> from ctxcore.memory import Scope
    >>> with load_demo(os.path.join(tempfile.mkdtemp(), "demo.db")) as store:
    ...     asyncio.run(store.directive(Scope("acme-retail", "support"))) is not None
    True
    """
    target = Path(db_path)
    if target.exists() or target.is_symlink():
        if not is_demo_store(target) or target.is_symlink():
            raise FileExistsError(
                f"{target} exists and is not a demo database built by `ctxcore demo`; "
                "it is left as it is (choose another path)"
            )
        if not overwrite:
            raise FileExistsError(f"{target} exists; pass overwrite=True to rebuild it")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
    text = importlib.resources.files("ctxcore").joinpath(DEMO_DATASET).read_text(encoding="utf-8")
    store = SqliteMemoryStore(target, embedder=HashingEmbedder())
    try:
        ingest_jsonl(store, f"ctxcore/{DEMO_DATASET}", text)
        # The mark that lets a later `load_demo` rebuild this file (and no other).
        store._write(lambda conn: conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (DEMO_MARK, DEMO_DATASET)))
    except BaseException:
        store.close()
        # Nothing of a half-built demo stays behind (the path held no file, or a demo one).
        for suffix in ("", "-wal", "-shm"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        raise
    return store
