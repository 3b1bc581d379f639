"""What only the PostgreSQL store has: row-level security as a second wall, the roles,
versioned migrations, a clear error without pgvector, and credentials that never show.
A real server (tests/pg_support.py); the behaviour shared with SQLite is in
test_store_conformance.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pg_support import PgServer

from ctxcore.memory import Query, Scope
from ctxcore.stores import (
    HashingEmbedder,
    MemoryStoreError,
    NewMemory,
    PostgresMemoryStore,
    is_postgres_url,
    open_store,
)
from ctxcore.stores.postgres import PG_SCHEMA_VERSION, redact_dsn


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    server = PgServer().start()
    yield server
    server.stop()


def test_row_level_security_is_a_second_wall(pg_server: PgServer) -> None:
    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(), grant_to=db.app) as s:
        s.add_many([NewMemory("a1", "acme", "support", "acme note"), NewMemory("a2", "acme", "sales", "sales note"),
                    NewMemory("g1", "globex", "support", "GLOBEX note")])
        s.set_directive("globex", None, "GLOBEX directive")
    # A query with no WHERE at all, as the app role: without a scope it sees nothing; with
    # a scope only that scope's rows, whatever the statement asks for.
    with psycopg.connect(db.app_url) as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM directives").fetchone() == (0,)
        conn.execute("SELECT set_config('ctxcore.organization_id', 'acme', true), "
                     "set_config('ctxcore.agent_id', 'support', true)")
        assert conn.execute("SELECT id FROM memories").fetchall() == [("a1",)]
        # Setting the admin flag does nothing for a role that is not the owner.
        conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
        assert conn.execute("SELECT id FROM memories").fetchall() == [("a1",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor can it write elsewhere
            conn.execute("INSERT INTO memories (id, organization_id, agent_id, text, fts, confidence, created_at, "
                         "token_count, token_family, token_kind) VALUES ('x', 'globex', 'support', 't', '', 1, 0, 1, "
                         "'cl100k_base', 'exact')")
        conn.rollback()
        # The scope was transaction-local: the next transaction sees nothing again.
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (0,)
    # FORCE ROW LEVEL SECURITY: the table owner is bound too (outside its admin flag).
    with psycopg.connect(db.owner_url) as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (0,)
    with PostgresMemoryStore(db.app_url, migrate=False) as app:
        with pytest.raises(MemoryStoreError, match="schema owner"):
            app.stats()
        assert app.stats("globex").memories == 1
        assert [r.id for r in asyncio.run(app.hot(Scope("acme", "support"), Query(""), 10))] == ["a1"]


def test_migrations_are_versioned_and_idempotent(pg_server: PgServer) -> None:
    db = pg_server.new_database()
    for _ in range(2):  # a second open applies nothing
        PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(64)).close()
    with psycopg.connect(db.owner_url) as conn:
        assert conn.execute("SELECT version FROM ctxcore_migrations").fetchall() == [(PG_SCHEMA_VERSION,)]
        assert conn.execute("SELECT value FROM ctxcore_meta WHERE key = 'embedding_dim'").fetchone() == ("64",)
        idx = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'memories'")}
        assert {"memories_embedding", "memories_fts", "memories_recent"} <= idx
        conn.execute("INSERT INTO ctxcore_migrations VALUES (99, 'from the future')")
        conn.commit()
    with pytest.raises(MemoryStoreError, match="schema version 99 is newer"):
        PostgresMemoryStore(db.owner_url)
    with pytest.raises(MemoryStoreError, match="embedder"):
        with psycopg.connect(db.owner_url) as conn:
            conn.execute("DELETE FROM ctxcore_migrations WHERE version = 99")
        PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(32))


def test_an_unmigrated_database_is_named(pg_server: PgServer) -> None:
    db = pg_server.new_database()
    with pytest.raises(MemoryStoreError, match="no ctxcore schema.*memories init"):
        PostgresMemoryStore(db.app_url, migrate=False)


def test_missing_pgvector_fails_at_open(pg_server: PgServer) -> None:
    db = pg_server.new_database(vector=False)
    with pytest.raises(MemoryStoreError, match="CREATE EXTENSION vector"):
        PostgresMemoryStore(db.owner_url)


def test_credentials_never_show(pg_server: PgServer) -> None:
    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url, grant_to=db.app) as s:
        assert db.app_password not in repr(s)
    with PostgresMemoryStore(db.app_url, migrate=False) as s:
        assert db.app_password not in repr(s) and db.app_password not in s.dsn and "***" in s.dsn
    bad = db.app_url.replace(f"/{db.name}?", "/no_such_db?")
    with pytest.raises(MemoryStoreError) as info:
        PostgresMemoryStore(bad)
    assert db.app_password not in str(info.value) and "no_such_db" in str(info.value)
    assert redact_dsn("postgres://u:p%40ss@h/d") == "postgres://u:***@h/d"
    assert redact_dsn("dbname=x password=hunter2") == "dbname=x password=***"


def test_a_url_opens_the_postgres_store(pg_server: PgServer, tmp_path: Path) -> None:
    db = pg_server.new_database()
    assert is_postgres_url(db.owner_url) and not is_postgres_url(str(tmp_path / "m.db"))
    with open_store(db.owner_url) as s:
        assert type(s).__name__ == "PostgresMemoryStore"
    with pytest.raises(ValueError, match="token_family"):
        PostgresMemoryStore(db.owner_url, token_family="nope")


def test_nul_characters_are_named_at_ingest(pg_server: PgServer) -> None:
    from ctxcore.stores import InvalidMemory

    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url) as s:
        with pytest.raises(InvalidMemory, match=r"'b' \(index 1\): text contains NUL"):
            s.add_many([NewMemory("a", "o", "x", "fine"), NewMemory("b", "o", "x", "bad\x00")])
        assert asyncio.run(s.hot(Scope("o", "x"), Query(""), 5)) == []
