"""Full-text entries stay in their scope whatever characters a memory holds: FTS5's
tokenizer (Unicode 6.1 tables) separates some characters that are letters to Python, and
a memory that places another scope's tag after one must not index that scope's words."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from ctxcore.memory import Query, Scope
from ctxcore.stores import NewMemory, SqliteMemoryStore
from ctxcore.stores.sqlite.fulltext import FTS_TOKENIZER, scope_tag
from ctxcore.stores.text import search_word

VICTIM = Scope("victim-org", "support")


def _fts5_separators(chars: str) -> list[str]:
    """Which of `chars` an FTS5 table with the store's tokenizer splits at (asked here of
    SQLite directly, independently of the store)."""
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(x, tokenize = '{FTS_TOKENIZER}')")
    out = []
    for c in chars:
        conn.execute("DELETE FROM t")
        conn.execute("INSERT INTO t VALUES (?)", (f"x{c}y",))
        if conn.execute("SELECT count(*) FROM t WHERE t MATCH 'x'").fetchone()[0]:
            out.append(c)
    return out


def test_a_memory_cannot_index_words_under_another_scopes_tag(tmp_path: Path) -> None:
    # Letters and digits to Python that this SQLite's FTS5 separates.
    candidates = "\u19b0\u19c8\u1cf2\U0001e900\u08be\u0d54"
    seps = [c for c in _fts5_separators(candidates) if c.isalnum()]
    if not seps:
        pytest.skip("this SQLite's FTS5 tokenizer splits none of these characters")
    tag = scope_tag(VICTIM.organization_id, VICTIM.agent_id)
    with SqliteMemoryStore(tmp_path / "m.db") as s:
        s.add_many(
            [NewMemory(f"v{k}", VICTIM.organization_id, VICTIM.agent_id, f"note {k} about orders") for k in range(100)]
        )
        s.add(NewMemory("v-secret", VICTIM.organization_id, VICTIM.agent_id, "the refund code is kettle"))
        assert [m.id for m in asyncio.run(s.cold(VICTIM, Query("kettle"), 5, 0.7))] == ["v-secret"]
        # Another tenant's memories: a separator FTS5 splits at, the victim's tag, a word.
        s.add_many([NewMemory(f"x{k}", "attacker-org", "bot", f"zz{seps[k % len(seps)]}{tag}kettle") for k in range(3)])
        indexed = tag + search_word("kettle")  # the word as the index holds it (stemmed)
        counts = dict(
            sqlite3.connect(tmp_path / "m.db")
            .execute("SELECT term, doc FROM memory_words_vocab WHERE term = ?", (indexed,))
            .fetchall()
        )
        assert counts == {indexed: 1}  # the victim's own memory only
        assert [m.id for m in asyncio.run(s.cold(VICTIM, Query("kettle"), 5, 0.7))] == ["v-secret"]
        # The attacker's text is still found in its own scope, by the pieces FTS5 sees.
        found = asyncio.run(s.cold(Scope("attacker-org", "bot"), Query(f"zz{seps[0]}{tag}kettle"), 20, 0.7))
        assert {m.id for m in found} == {"x0", "x1", "x2"}
