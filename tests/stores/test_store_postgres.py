"""What only the PostgreSQL store has: row-level security as a second wall, the roles,
versioned migrations, a clear error without pgvector, and credentials that never show.
A real server (tests/pg_support.py); the behaviour shared with SQLite is in
test_store_conformance.py."""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pg_support import OLD_PGVECTOR, PgServer

from ctxcore.memory import MemoryOrigin, Query, Scope
from ctxcore.stores import (
    Directive,
    HashingEmbedder,
    MemoryStoreError,
    NewMemory,
    PostgresMemoryStore,
    is_postgres_url,
    open_store,
)
from ctxcore.stores.postgres import PG_SCHEMA_VERSION, VECTOR_PARTITIONS, redact_dsn


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    server = PgServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def old_pg_server() -> Iterator[PgServer]:
    """PostgreSQL with pgvector 0.6.2: no iterative index scans."""
    server = PgServer(OLD_PGVECTOR).start()
    yield server
    server.stop()


@pytest.fixture(params=["pgvector-0.8", "pgvector-0.6"])
def any_server(request: pytest.FixtureRequest) -> PgServer:
    server: PgServer = request.getfixturevalue("pg_server" if request.param == "pgvector-0.8" else "old_pg_server")
    return server


def test_row_level_security_is_a_second_wall(pg_server: PgServer) -> None:
    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(), grant_to=db.app) as s:
        s.add_many(
            [
                NewMemory("a1", "acme", "support", "acme note"),
                NewMemory("a2", "acme", "sales", "sales note"),
                NewMemory("g1", "globex", "support", "GLOBEX note"),
            ]
        )
        s.set_directive("globex", None, "GLOBEX directive")
    # A query with no WHERE at all, as the app role: without a scope it sees nothing; with
    # a scope only that scope's rows, whatever the statement asks for.
    with psycopg.connect(db.app_url) as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM directives").fetchone() == (0,)
        conn.execute(
            "SELECT set_config('ctxcore.organization_id', 'acme', true), "
            "set_config('ctxcore.agent_id', 'support', true)"
        )
        assert conn.execute("SELECT id FROM memories").fetchall() == [("a1",)]
        # Setting the admin flag does nothing for a role that is not the owner.
        conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
        assert conn.execute("SELECT id FROM memories").fetchall() == [("a1",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor can it write elsewhere
            conn.execute(
                "INSERT INTO memories (id, organization_id, agent_id, text, confidence, created_at, "
                "token_count, token_family, token_kind) VALUES ('x', 'globex', 'support', 't', 1, 0, 1, "
                "'cl100k_base', 'exact')"
            )
        conn.rollback()
        # The full-text term table is behind the same wall.
        assert conn.execute("SELECT count(*) FROM memory_terms").fetchone() == (0,)
        conn.execute(
            "SELECT set_config('ctxcore.organization_id', 'acme', true), "
            "set_config('ctxcore.agent_id', 'support', true)"
        )
        assert conn.execute("SELECT DISTINCT organization_id, agent_id FROM memory_terms").fetchall() == [
            ("acme", "support")
        ]
        assert conn.execute("SELECT count(*) FROM memory_terms WHERE term = 'globex'").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO memory_terms SELECT 'globex', 'support', 'planted', seq FROM memories")
        conn.rollback()
        # So is the vector table; its partitions grant the app role nothing (reading one
        # directly would skip the partitioned table's policies).
        assert conn.execute("SELECT count(*) FROM memory_vectors").fetchone() == (0,)
        conn.execute(
            "SELECT set_config('ctxcore.organization_id', 'acme', true), "
            "set_config('ctxcore.agent_id', 'support', true)"
        )
        assert conn.execute("SELECT DISTINCT organization_id, agent_id FROM memory_vectors").fetchall() == [
            ("acme", "support")
        ]
        conn.rollback()
        for k in range(VECTOR_PARTITIONS):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT count(*) FROM memory_vectors_{k:02d}")
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
        assert conn.execute("SELECT version FROM ctxcore_migrations ORDER BY version").fetchall() == [
            (v,) for v in range(1, PG_SCHEMA_VERSION + 1)
        ]
        assert conn.execute("SELECT value FROM ctxcore_meta WHERE key = 'embedding_dim'").fetchone() == ("64",)
        idx = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'memories'")}
        assert "memories_recent" in idx and "memories_embedding" not in idx
        # Embeddings live in VECTOR_PARTITIONS partitions by scope, each with its own HNSW index.
        parts = conn.execute(
            "SELECT c.relname, (SELECT count(*) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_am a ON a.oid = i.relam WHERE x.indrelid = c.oid AND a.amname = 'hnsw') "
            "FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid "
            "WHERE h.inhparent = 'memory_vectors'::regclass"
        ).fetchall()
        assert len(parts) == VECTOR_PARTITIONS and all(n == 1 for _, n in parts)
        conn.execute("INSERT INTO ctxcore_migrations VALUES (99, 'from the future')")
        conn.commit()
    with pytest.raises(MemoryStoreError, match="schema version 99 is newer"):
        PostgresMemoryStore(db.owner_url)
    with pytest.raises(MemoryStoreError, match="embedder"):
        with psycopg.connect(db.owner_url) as conn:
            conn.execute("DELETE FROM ctxcore_migrations WHERE version = 99")
        PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(32))


def test_a_version_4_database_gets_stemmed_terms(pg_server: PgServer) -> None:
    db = pg_server.new_database()
    scope = Scope("o", "a")
    texts = ["She painted the old bridges at dawn.", "The kettle broke again.", "Deliveries arrive on Mondays."]
    with PostgresMemoryStore(db.owner_url) as s:
        s.add_many([NewMemory(f"m{k}", "o", "a", t) for k, t in enumerate(texts)])
    # Back to version 4's terms: the words as written, not stemmed.
    with psycopg.connect(db.owner_url) as conn:
        conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
        conn.execute("DELETE FROM memory_terms")
        for seq, text in conn.execute("SELECT seq, text FROM memories").fetchall():
            for word in set(text.lower().replace(".", "").split()):
                conn.execute("INSERT INTO memory_terms VALUES ('o', 'a', %s, %s)", (word, seq))
        conn.execute("DELETE FROM ctxcore_migrations WHERE version = 5")
    with PostgresMemoryStore(db.owner_url) as s:  # the owner migrates
        # "painting" and "bridge" meet "painted" and "bridges" only in their stemmed form.
        assert [r.id for r in asyncio.run(s.cold(scope, Query("painting a bridge"), 5, 0.7))] == ["m0"]
        assert [r.id for r in asyncio.run(s.cold(scope, Query("delivery on monday"), 5, 0.7))] == ["m2"]
    with psycopg.connect(db.owner_url) as conn:
        assert conn.execute("SELECT max(version) FROM ctxcore_migrations").fetchone() == (PG_SCHEMA_VERSION,)


def test_a_store_opened_without_an_embedder_uses_the_one_it_records(pg_server: PgServer) -> None:
    pytest.importorskip("wordllama")
    from ctxcore.stores import WordLlamaEmbedder

    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url, embedder=WordLlamaEmbedder()) as s:
        s.add_many([NewMemory("m0", "o", "a", "my sister's daughter visits in June")])
    with PostgresMemoryStore(db.owner_url) as s:
        assert s.embedder_name == "wordllama/l2_supercat/dim=256"
        assert s.embedder is not None and s.embedder.name == s.embedder_name
        # Queries are embedded with it: a paraphrase with no shared word is a vector hit.
        hits = asyncio.run(s.cold(Scope("o", "a"), Query("niece"), 5, 0.0))
        assert [(r.id, r.origin) for r in hits] == [("m0", MemoryOrigin.VECTOR)]


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


def test_a_connection_string_libpq_cannot_read_is_refused_without_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # libpq's own message repeats the token it cannot read; nothing connects, nothing
    # retries, and neither the error nor any log line carries the password.
    for dsn, secret in (
        ("postgresql://u:pa%ZZss@127.0.0.1:1/x", "pa%ZZss"),
        ("host=127.0.0.1 port=1 password='hunter2 dbname=x", "hunter2"),
    ):
        t0 = time.monotonic()
        with caplog.at_level("DEBUG"), pytest.raises(MemoryStoreError, match="libpq can read") as info:
            PostgresMemoryStore(dsn)
        assert time.monotonic() - t0 < 2.0
        assert secret not in str(info.value) and "***" in str(info.value)
        assert not any(secret in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("secret", ["pa#ss", "pa?ss", "p#?@ss"])
def test_a_password_holding_a_hash_or_question_mark_never_shows(secret: str, caplog: pytest.LogCaptureFixture) -> None:
    # libpq reads the user info up to its "@", so these characters are the password's.
    dsn = f"postgresql://u:{secret}@127.0.0.1:1/x"
    assert redact_dsn(dsn) == "postgresql://u:***@127.0.0.1:1/x"
    with caplog.at_level("DEBUG"), pytest.raises(MemoryStoreError, match="cannot reach") as info:
        PostgresMemoryStore(dsn)
    assert secret not in str(info.value) and "u:***@127.0.0.1:1/x" in str(info.value)
    assert not any(secret in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("secret", ["sekr3t/xyz", "Qz7/a:z@w", "Zq55/word"])
def test_a_password_holding_a_slash_never_shows(secret: str, caplog: pytest.LogCaptureFixture) -> None:
    # An unencoded "/" ends libpq's host before the "@": it reads the password's first
    # part as a port. Neither the error nor a log line shows any part of it.
    dsn = f"postgresql://u:{secret}@127.0.0.1:1/x"
    assert redact_dsn(dsn) == "postgresql://u:***@127.0.0.1:1/x"
    with caplog.at_level("DEBUG"), pytest.raises(MemoryStoreError, match="%2F") as info:
        PostgresMemoryStore(dsn)
    first = secret.split("/")[0]
    assert first not in str(info.value) and "u:***@127.0.0.1:1/x" in str(info.value)
    assert not any(first in r.getMessage() for r in caplog.records)


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


def test_embeddings_wider_than_the_hnsw_index_takes_are_refused_by_name(pg_server: PgServer) -> None:
    from ctxcore.stores import InvalidMemory
    from ctxcore.stores.postgres import MAX_DIMENSIONS

    wide = MAX_DIMENSIONS + 1
    with pytest.raises(ValueError, match=rf"dimensions must be an int in \[1, {MAX_DIMENSIONS}\].*HNSW"):
        PostgresMemoryStore("postgresql://u@127.0.0.1:1/x", dimensions=wide)
    db = pg_server.new_database()
    with pytest.raises(MemoryStoreError, match=f"makes embeddings of {wide} dimensions.*at most {MAX_DIMENSIONS}"):
        PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(wide))
    with PostgresMemoryStore(db.owner_url) as s:
        with pytest.raises(InvalidMemory, match=rf"'w' \(index 1\): embedding has {wide} dimensions.*HNSW") as info:
            s.add_many([NewMemory("n", "o", "x", "narrow"), NewMemory("w", "o", "x", "wide", embedding=[1.0] * wide)])
        assert info.value.memory_id == "w"
        assert s.dimensions is None and s.stats().memories == 0
        s.add(NewMemory("m", "o", "x", "at the bound", embedding=[1.0] * MAX_DIMENSIONS))
        assert s.dimensions == MAX_DIMENSIONS


def test_a_store_opened_before_the_dimension_is_fixed_searches_embeddings_once_it_is(pg_server: PgServer) -> None:
    from ctxcore.stores.postgres import DIMENSION_RECHECK_SECONDS

    db = pg_server.new_database()
    PostgresMemoryStore(db.owner_url, grant_to=db.app).close()  # no embedder: the dimension is not fixed
    scope, query = Scope("o", "x"), Query("", embedding=(1.0, 0.0, 0.0))
    with PostgresMemoryStore(db.app_url, migrate=False) as replica:
        assert replica.dimensions is None
        assert asyncio.run(replica.cold(scope, query, 5, 0.5)) == []
        with PostgresMemoryStore(db.owner_url) as ingest:  # its first embedded memories fix it
            ingest.add_many(
                [
                    NewMemory("m1", "o", "x", "alpha", embedding=[1.0, 0.0, 0.0]),
                    NewMemory("m2", "o", "x", "beta", embedding=[0.0, 1.0, 0.0]),
                ]
            )
        time.sleep(DIMENSION_RECHECK_SECONDS)
        found = asyncio.run(replica.cold(scope, query, 5, 0.5))
        assert [(r.id, r.origin) for r in found] == [("m1", MemoryOrigin.VECTOR)]
        assert replica.dimensions == 3
        assert replica.update(scope, "m2", embedding=[1.0, 0.0, 0.1])
        assert {r.id for r in asyncio.run(replica.cold(scope, query, 5, 0.5))} == {"m1", "m2"}


def test_a_store_opened_without_an_embedder_takes_up_the_one_another_process_records(pg_server: PgServer) -> None:
    from ctxcore.stores.postgres import DIMENSION_RECHECK_SECONDS

    db = pg_server.new_database()
    PostgresMemoryStore(db.owner_url, grant_to=db.app).close()  # no embedder recorded
    scope, query = Scope("o", "x"), Query("zebras have stripes")
    with PostgresMemoryStore(db.app_url, migrate=False) as replica:
        assert replica.embedder is None
        assert asyncio.run(replica.cold(scope, query, 5, 0.5)) == []
        with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(64)) as ingest:  # records it
            ingest.add_many(
                [NewMemory("m1", "o", "x", "apples and pears"), NewMemory("m2", "o", "x", "zebras have stripes")]
            )
        time.sleep(DIMENSION_RECHECK_SECONDS)
        found = asyncio.run(replica.cold(scope, query, 5, 0.5))
        assert [(r.id, r.origin) for r in found] == [("m2", MemoryOrigin.VECTOR)]
        assert replica.embedder is not None and replica.embedder.name == HashingEmbedder(64).name
        replica.add(NewMemory("m3", "o", "x", "zebras have stripes"))  # embedded as the others are
        found = asyncio.run(replica.cold(scope, query, 5, 0.9))
        assert {r.id for r in found if r.origin is MemoryOrigin.VECTOR} == {"m2", "m3"}


def test_a_file_ingest_stores_its_memories_and_directives_in_one_transaction(pg_server: PgServer) -> None:
    from ctxcore.stores import InvalidMemory, ingest_jsonl

    lines = [
        '{"id": "m1", "organization_id": "o", "agent_id": "x", "text": "hello"}',
        '{"type": "directive", "organization_id": "o", "text": "Be brief."}',
        '{"type": "directive", "organization_id": "o", "agent_id": "x", "text": "bad\\u0000directive"}',
    ]
    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url) as s:
        with pytest.raises(InvalidMemory, match="directive: contains NUL"):
            ingest_jsonl(s, "in.jsonl", "\n".join(lines))
        assert s.stats("o").memories == 0 and s.stats("o").directives == 0  # none of the file
        report = ingest_jsonl(s, "in.jsonl", "\n".join(lines[:2]))
        assert (report.memories, report.directives) == (1, 1)
        assert asyncio.run(s.directive(Scope("o", "x"))) == "Be brief."
        assert [r.id for r in asyncio.run(s.hot(Scope("o", "x"), Query(""), 5))] == ["m1"]
        s.add_many([], directives=[Directive("o", "x", "You are x.")])
        assert asyncio.run(s.directive(Scope("o", "x"))) == "Be brief.\n\nYou are x."


def _v1_database(pg_server: PgServer, memories: list[NewMemory], embedder: HashingEmbedder) -> Any:
    """A database as version 1 of the schema left it (tsvector + GIN full text), written
    with version 1's own statements, the app role granted what version 1 granted."""
    from ctxcore.stores.postgres import MIGRATIONS

    db = pg_server.new_database()
    with psycopg.connect(db.owner_url) as conn:
        conn.execute(
            "CREATE TABLE ctxcore_migrations (version integer PRIMARY KEY, description text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        version, description, statements = MIGRATIONS[0]
        assert version == 1
        for statement in statements:
            assert isinstance(statement, str)
            conn.execute(statement)
        conn.execute("INSERT INTO ctxcore_migrations (version, description) VALUES (%s, %s)", (version, description))
        conn.execute(f"ALTER TABLE memories ALTER COLUMN embedding TYPE vector({embedder.dim})")
        conn.execute("CREATE INDEX memories_embedding ON memories USING hnsw (embedding vector_cosine_ops)")
        conn.execute(
            "INSERT INTO ctxcore_meta VALUES ('embedding_dim', %s), ('embedder', %s)",
            (str(embedder.dim), embedder.name),
        )
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON memories, directives TO {db.app}")
        conn.execute(f"GRANT SELECT ON ctxcore_meta, ctxcore_migrations TO {db.app}")
        conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
        for k, m in enumerate(memories):
            vec = embedder.embed(m.text)
            conn.execute(
                "INSERT INTO memories (id, organization_id, agent_id, text, embedding, fts, confidence, created_at, "
                "token_count, token_family, token_kind) VALUES (%s, %s, %s, %s, %s::vector, "
                "to_tsvector('simple', %s), 1, %s, 1, 'cl100k_base', 'estimate')",
                (
                    m.id,
                    m.organization_id,
                    m.agent_id,
                    m.text,
                    "[" + ",".join(map(str, vec.tolist())) + "]",
                    m.text,
                    1.7e9 + k,
                ),
            )
    return db


def test_a_version_1_database_is_migrated_with_its_full_text(pg_server: PgServer) -> None:
    embedder = HashingEmbedder(64)
    a, b = Scope("acme", "support"), Scope("globex", "support")
    texts = [
        "Refund in five business days",
        "Rückgabe innerhalb von 30 Tagen möglich",
        "返金は30日以内に処理されます",
        "Shipping to Canada costs extra",
        "退款多久可以到账",
        "refund desk hours",
    ]
    mems = [NewMemory(f"m{k}", a.organization_id, a.agent_id, t) for k, t in enumerate(texts)]
    mems.append(NewMemory("g0", b.organization_id, b.agent_id, "GLOBEX refund secret"))
    db = _v1_database(pg_server, mems, embedder)
    with pytest.raises(MemoryStoreError, match="schema version 1, this ctxcore needs"):
        PostgresMemoryStore(db.app_url, migrate=False)
    PostgresMemoryStore(db.owner_url).close()  # the owner migrates
    with psycopg.connect(db.owner_url) as conn:
        assert conn.execute("SELECT max(version) FROM ctxcore_migrations").fetchone() == (PG_SCHEMA_VERSION,)
        cols = {
            r[0]
            for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'memories'")
        }
        assert "fts" not in cols
        idx = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'memories'")}
        assert "memories_fts" not in idx
    fresh = pg_server.new_database()
    queries = ["refund", "Ruckgabe tagen", "返金", "退款", "canada shipping", "secret"]
    results = {}
    for name, target in (("migrated", db), ("fresh", fresh)):
        if name == "fresh":
            with PostgresMemoryStore(target.owner_url, embedder=embedder, grant_to=target.app) as s:
                s.add_many(mems)
        # The app role was granted v1's tables only: the migration gave it the term table.
        with PostgresMemoryStore(target.app_url, migrate=False) as app:
            results[name] = [
                [
                    (r.id, r.origin.value)
                    for r in asyncio.run(app.cold(a, Query(q), 10, 0.99))
                    if r.origin is MemoryOrigin.FULLTEXT
                ]
                for q in queries
            ]
            # The stored embeddings moved to the partitioned vector table (migration 4), which
            # the app role was given too: the same vector hits and hot similarities.
            results[name + " vectors"] = [
                [
                    (r.id, round(float(r.similarity), 5))
                    for r in asyncio.run(app.cold(a, Query(t), 10, 0.3))
                    if r.origin is MemoryOrigin.VECTOR
                ]
                for t in texts
            ]
            results[name + " hot"] = [
                (r.id, round(float(r.similarity), 5)) for r in asyncio.run(app.hot(a, Query(texts[0]), 10))
            ]
            assert app.flush_accesses() > 0  # and the read-time table
            app.add(NewMemory(f"new-{name}", a.organization_id, a.agent_id, "a refund note added later"))
            assert "new-" + name in [r.id for r in asyncio.run(app.cold(a, Query("refund"), 10, 0.99))]
            assert app.delete(a, ["m0"]) == 1
            assert "m0" not in [r.id for r in asyncio.run(app.cold(a, Query("refund"), 10, 0.99))]
    assert results["migrated"] == results["fresh"]
    assert results["migrated vectors"] == results["fresh vectors"]
    assert [hits[0] for hits in results["migrated vectors"]] == [(f"m{k}", 1.0) for k in range(len(texts))]
    assert results["migrated hot"] == results["fresh hot"] and len(results["migrated hot"]) == len(texts)
    hits = dict(zip(queries, results["migrated"]))
    assert {i for i, _ in hits["refund"]} == {"m0", "m5"}
    assert {i for i, _ in hits["返金"]} == {"m2"} and {i for i, _ in hits["退款"]} == {"m4"}
    assert {i for i, _ in hits["Ruckgabe tagen"]} == {"m1"}
    assert hits["secret"] == []  # the other scope's memory stays there
    # Deleting a memory removes its terms (the foreign key cascades, under row-level security).
    with psycopg.connect(db.owner_url) as conn:
        conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
        assert conn.execute(
            "SELECT count(*) FROM memory_terms t WHERE NOT EXISTS (SELECT 1 FROM memories m WHERE m.seq = t.seq)"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM memory_terms WHERE organization_id = 'globex'").fetchone()[0] > 0
        # and its embedding
        assert conn.execute(
            "SELECT count(*) FROM memory_vectors v WHERE NOT EXISTS (SELECT 1 FROM memories m WHERE m.seq = v.seq)"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM memory_vectors").fetchone() == (len(mems),)


def test_full_text_uses_its_index_under_row_level_security(pg_server: PgServer) -> None:
    # Under row-level security PostgreSQL only uses a condition as an index condition when
    # its operator is leakproof; text equality is, so the term lookup of the cold query is
    # an index scan for the app role (with sequential scans priced out, a condition the
    # index may not take would show as a Seq Scan here).
    from ctxcore.stores.postgres.statements import COLD_NO_VECTOR
    from ctxcore.stores.postgres.terms import query_keys
    from ctxcore.stores.text import fts_terms

    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url, grant_to=db.app) as s:
        s.add_many(
            NewMemory(f"m{k}", f"org{k % 3}", "support", f"note {k}" + (" refund 返金" if k % 10 == 1 else ""))
            for k in range(300)
        )
    with psycopg.connect(db.owner_url, autocommit=True) as conn:
        conn.execute("ANALYZE memory_terms")
    with psycopg.connect(db.app_url) as conn:
        conn.execute(
            "SELECT set_config('ctxcore.organization_id', 'org1', true), "
            "set_config('ctxcore.agent_id', 'support', true), set_config('enable_seqscan', 'off', true)"
        )
        params = {
            "org": "org1",
            "agent": "support",
            "limit": 10,
            "terms": query_keys(fts_terms("refund 返金")),
            "cap": 30,
            "n": 100.0,
            "nterms": 8,
        }
        (plan,) = conn.execute("EXPLAIN (FORMAT JSON) " + COLD_NO_VECTOR, params).fetchone()  # type: ignore[misc]

        def nodes(n: dict[str, Any]) -> Iterator[dict[str, Any]]:
            yield n
            for child in n.get("Plans", []):
                yield from nodes(child)

        on_terms = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "memory_terms"]
        assert on_terms and all(n["Node Type"] in ("Index Only Scan", "Index Scan") for n in on_terms)
        # The term lookups, and each hit's length (its term count) off the seq index.
        assert any("term =" in n["Index Cond"] for n in on_terms)
        assert all("term =" in n["Index Cond"] or "seq =" in n["Index Cond"] for n in on_terms), on_terms
        rows = conn.execute(COLD_NO_VECTOR, params).fetchall()
        found = [r[1] for r in rows if r[1] is not None]  # and the statement finds the scope's refund notes
        assert sorted(found) == sorted(f"m{k}" for k in range(300) if k % 30 == 1)


def _row_versions(db: Any) -> list[tuple[str, str, str]]:
    with psycopg.connect(db.owner_url) as conn:
        conn.execute("SELECT set_config('ctxcore.admin', 'on', true)")
        return conn.execute("SELECT id, xmin::text, ctid::text FROM memories ORDER BY id").fetchall()


def test_read_times_never_rewrite_a_memory_row(pg_server: PgServer) -> None:
    # A rewritten row (new version, new entries in every index, the HNSW one included)
    # per memory read would make every read a write to the vector index.
    db = pg_server.new_database()
    scope = Scope("acme", "support")
    with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(64), grant_to=db.app) as s:
        s.add_many(
            NewMemory(
                f"m{k:02d}",
                "acme",
                "support",
                f"note {k}",
                created_at=1.7e9 + k,
                accessed_at=1.7e9 + 100 if k == 0 else None,
            )
            for k in range(20)
        )
    before = _row_versions(db)
    with PostgresMemoryStore(db.app_url, migrate=False, access_flush_seconds=3600) as app:
        first = {r.id: r.accessed_at for r in asyncio.run(app.hot(scope, Query(""), 20))}
        assert first["m00"] == 1.7e9 + 100 and first["m01"] is None  # the times given at ingest
        t0 = time.time()
        asyncio.run(app.hot(scope, Query(""), 20))
        assert app.flush_accesses() == 20
        assert app.flush_accesses() == 0  # nothing noted since
        again = asyncio.run(app.hot(scope, Query(""), 20))
    assert all(r.accessed_at is not None and r.accessed_at >= t0 - 1 for r in again)
    assert _row_versions(db) == before


def test_replicas_flushing_the_same_reads_do_not_deadlock(pg_server: PgServer) -> None:
    # Two replicas that read the same memories in different orders write their read times
    # at the same moment, round after round: every flush commits, and the later read wins.
    db = pg_server.new_database()
    scopes = [Scope("acme", "support"), Scope("acme", "sales")]
    with PostgresMemoryStore(db.owner_url, grant_to=db.app) as s:
        s.add_many(
            NewMemory(f"{sc.agent_id}-{k}", sc.organization_id, sc.agent_id, f"t{k}")
            for sc in scopes
            for k in range(120)
        )
    replicas = [
        PostgresMemoryStore(db.app_url, migrate=False, access_flush_seconds=3600, access_resolution_seconds=0)
        for _ in range(2)
    ]
    rng = random.Random(7)
    errors: list[BaseException] = []
    written: list[int] = []
    try:
        for _ in range(12):
            for r in replicas:
                order = list(scopes)
                rng.shuffle(order)
                for sc in order:
                    ks = rng.sample(range(120), 120)
                    for j in range(0, 120, 8):  # every memory, in an order of its own
                        found = asyncio.run(r.cold(sc, Query(" ".join(f"t{k}" for k in ks[j : j + 8])), 8, 0.99))
                        assert len(found) == 8
            barrier = threading.Barrier(2)

            def flush(r: PostgresMemoryStore) -> None:
                barrier.wait()
                try:
                    written.append(r.flush_accesses())
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=flush, args=(r,)) for r in replicas]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert errors == []
        assert written == [240] * 24
        last = time.time()
        for sc in scopes:
            assert all(
                m.accessed_at is not None and m.accessed_at <= last
                for m in asyncio.run(replicas[0].hot(sc, Query(""), 120))
            )
    finally:
        for r in replicas:
            r.close()


def test_noted_term_counts_change_no_result(pg_server: PgServer) -> None:
    # Once a scope's search keys have been counted, a store sends only the rarest of a
    # long query's keys (and none of its stop words): the results are those of a store
    # that counts everything afresh, and a key that had no match is still searched.
    db = pg_server.new_database()
    scope = Scope("acme", "support")
    rng = random.Random(11)
    vocab = [f"w{k}" for k in range(60)]
    weights = [1.0 / (k + 1) for k in range(60)]
    mems = [
        NewMemory(f"m{k:03d}", "acme", "support", " ".join(rng.choices(vocab, weights, k=8)), created_at=1.7e9 + k)
        for k in range(400)
    ]
    with PostgresMemoryStore(db.owner_url, grant_to=db.app) as s:
        s.add_many(mems)
    queries = [" ".join(rng.sample(vocab, 14)) + " absent" for _ in range(12)]

    def results(store: PostgresMemoryStore, q: str) -> list[str]:
        return [r.id for r in asyncio.run(store.cold(scope, Query(q), 20, 0.99))]

    with (
        PostgresMemoryStore(db.app_url, migrate=False) as warm,
        PostgresMemoryStore(db.app_url, migrate=False) as writer,
    ):
        for q in queries:
            results(warm, q)  # counts noted
        for q in queries:
            with PostgresMemoryStore(db.app_url, migrate=False) as fresh:
                assert results(warm, q) == results(fresh, q), q
        # A key counted with no match, then written through another replica, is found.
        writer.add(NewMemory("late", "acme", "support", "absent", created_at=1.8e9))
        assert "late" in results(warm, queries[0])


@pytest.mark.parametrize("walk", [True, False], ids=["index", "exact"])
def test_a_large_scope_walk_finds_every_hit_up_to_the_limit(
    any_server: PgServer, walk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large scope walks the HNSW index, which holds every scope: the walk goes on past
    # other scopes' rows (a third of them nearer the query) until it has the limit's rows.
    from ctxcore.stores.postgres import store as postgres_store

    pg_server = any_server
    if walk:  # this scope walks the HNSW index (with or without iterative scans)
        monkeypatch.setattr(postgres_store, "HNSW_MIN_SCOPE", 50)
        monkeypatch.setattr(postgres_store, "HNSW_MIN_SCOPE_NO_ITERATIVE", 50)
    rng = random.Random(3)
    dim = 16
    q = [1.0] + [0.0] * (dim - 1)

    def near(k: int) -> list[float]:
        return [1.0] + [rng.uniform(-0.1, 0.1) for _ in range(dim - 1)]

    def far(k: int) -> list[float]:
        return [rng.uniform(-0.2, 0.2)] + [rng.uniform(-1, 1) for _ in range(dim - 1)]

    db = pg_server.new_database()
    scope = Scope("acme", "support")
    mems = [NewMemory(f"near{k}", "acme", "support", f"n {k}", embedding=near(k)) for k in range(40)]
    mems += [NewMemory(f"far{k}", "acme", "support", f"f {k}", embedding=far(k)) for k in range(160)]
    mems += [NewMemory(f"other{k}", "globex", f"a{k % 4}", f"o {k}", embedding=near(k)) for k in range(400)]
    with PostgresMemoryStore(db.owner_url, grant_to=db.app) as s:
        s.add_many(mems)
    with PostgresMemoryStore(db.app_url, migrate=False) as app:
        for limit, expected in ((64, 40), (40, 40), (20, 20), (3, 3)):
            got = asyncio.run(app.cold(scope, Query("", tuple(q)), limit, 0.9))
            assert len(got) == expected and all(r.id.startswith("near") and r.similarity is not None for r in got)
            sims = [r.similarity for r in got]
            assert sims == sorted(sims, reverse=True)


def test_warm_runs_the_reads_once_per_connection_without_reading_anything(pg_server: PgServer) -> None:
    # warm() opens pooled connections and prepares the read statements on each (a statement
    # run with `limit` 0 in a scope of its own): answers are unchanged and no read is noted.
    db = pg_server.new_database()
    scope = Scope("acme", "support")
    with PostgresMemoryStore(db.owner_url) as bare:  # no dimension yet: the vector reads are skipped
        assert bare.warm() == 0
        assert asyncio.run(bare.cold(scope, Query("refund"), 5, 0.5)) == []
    with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(64)) as s:
        s.add_many(
            [
                NewMemory(f"m{k}", "acme", "support", t)
                for k, t in enumerate(
                    ["refund in five business days", "shipping to Canada costs extra", "refund desk hours"]
                )
            ]
        )

        def answers() -> list[list[tuple[str, float | None]]]:
            return [
                [(r.id, r.similarity) for r in asyncio.run(read)]
                for read in (s.cold(scope, Query("refund"), 5, 0.5), s.hot(scope, Query("refund"), 5))
            ]

        before = answers()
        assert s.flush_accesses() > 0
        for _ in range(2):
            assert s.warm() == 0
            assert s.flush_accesses() == 0  # warming read nothing
            assert answers() == before


def test_cold_returns_both_lists_with_both_signals_and_the_scope_statistics(pg_server: PgServer) -> None:
    db = pg_server.new_database()
    scope = Scope("acme", "support")
    rng = random.Random(7)
    vecs = [[rng.uniform(-1, 1) for _ in range(4)] for _ in range(30)]
    mems = [
        NewMemory(
            f"m{k}",
            "acme",
            "support",
            f"note {k}" + (" kettle" if k % 3 == 0 else "") + (" descaling" if k == 9 else ""),
            embedding=vecs[k],
        )
        for k in range(30)
    ]
    mems.append(NewMemory("x", "acme", "sales", "kettle descaling", embedding=[1.0, 0.0, 0.0, 0.0]))
    with PostgresMemoryStore(db.owner_url) as s:
        s.add_many(mems)
        q = [1.0, 0.0, 0.0, 0.0]
        got = asyncio.run(s.cold(scope, Query("kettle descaling", tuple(q)), 5, 0.5))
        vector = [r for r in got if r.origin is MemoryOrigin.VECTOR]
        text = [r for r in got if r.origin is MemoryOrigin.FULLTEXT]
        unit = [np.asarray(v) / np.linalg.norm(v) for v in vecs]
        cos = {f"m{k}": float(u[0]) for k, u in enumerate(unit)}
        assert [r.id for r in vector] == sorted((i for i, c in cos.items() if c >= 0.5), key=lambda i: -cos[i])[:5]
        # The memory holding both words ranks first among the text hits; the rest hold
        # "kettle" alone and score alike, newest first.
        if "m9" not in {r.id for r in vector}:
            assert text[0].id == "m9"
        assert {r.id for r in text} <= {f"m{k}" for k in range(0, 30, 3)}
        for r in got:
            assert r.similarity == pytest.approx(cos[r.id], abs=1e-5)  # both signals on every hit
        for r in text:
            assert r.fulltext_score is not None and r.fulltext_score > 0
        scores = [r.fulltext_score for r in text]
        assert scores == sorted(scores, reverse=True)
        mean, std = got.reference["vector"]
        assert mean == pytest.approx(float(np.mean(list(cos.values()))), abs=1e-5)
        assert std == pytest.approx(float(np.std(list(cos.values()))), abs=1e-5)
        fmean, fstd = got.reference["fulltext"]
        assert fmean > 0 and fstd > 0
        # No words: no full-text statistics; no embedding: no vector statistics.
        assert "fulltext" not in asyncio.run(s.cold(scope, Query("", tuple(q)), 5, 0.5)).reference
        alone = asyncio.run(s.cold(scope, Query("kettle"), 5, 0.5))
        assert "vector" not in alone.reference and all(r.similarity is None for r in alone)


def test_the_old_server_has_pgvector_before_iterative_scans(old_pg_server: PgServer) -> None:
    with psycopg.connect(old_pg_server.url(), autocommit=True) as conn:
        row = conn.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    assert row is not None and tuple(int(x) for x in row[0].split(".")) < (0, 8)


def test_a_cold_query_with_a_vector_runs_on_pgvector_before_0_8(old_pg_server: PgServer) -> None:
    db = old_pg_server.new_database()
    scope = Scope("acme", "support")
    with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder(), grant_to=db.app) as s:
        s.add_many(NewMemory(f"m{k}", "acme", "support", f"refund note {k}") for k in range(10))
        s.warm()
        got = asyncio.run(s.cold(scope, Query("refund note 3"), 5, 0.1))
        assert got[0].id == "m3" and got[0].origin is MemoryOrigin.VECTOR
        assert "vector" in got.reference and "fulltext" in got.reference


def test_pgvector_older_than_0_5_is_refused_at_open(pg_server: PgServer) -> None:
    from ctxcore.stores.postgres import MIN_PGVECTOR, UnsupportedPgvector

    db = pg_server.new_database()
    pg_server.superuser("UPDATE pg_extension SET extversion = '0.4.4' WHERE extname = 'vector'", db=db.name)
    with pytest.raises(UnsupportedPgvector, match=r"pgvector 0\.4\.4; ctxcore needs pgvector 0\.5\.0") as err:
        PostgresMemoryStore(db.owner_url)
    assert (err.value.found, err.value.needed) == ("0.4.4", ".".join(map(str, MIN_PGVECTOR)))
    assert isinstance(err.value, MemoryStoreError)


def _cli_stats(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from ctxcore.cli import main

    status = main(["memories", "stats", "--db", url])
    captured = capsys.readouterr()
    return status, captured.err


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://app:p%zz@db/x",
            r"^ctxcore: error: postgresql://app:\*\*\*@db/x is not a PostgreSQL connection "
            r"string libpq can read",
        ),
        ("postgresql://app:pw@[::1/db", r"^ctxcore: error: postgresql://app:\*\*\*@\[::1/db is not a PostgreSQL"),
        ("postgresql://app@host:notaport/db", r"the port 'notaport' is not a port number"),
        ("postgresql://app:pw@localhost/db?sslmode=bogus", r"has a setting libpq does not accept .*invalid sslmode"),
        (
            "postgresql://app:pw@127.0.0.1:1/db?connect_timeout=2",
            r"^ctxcore: error: cannot reach the PostgreSQL server "
            r"\(postgresql://app:\*\*\*@127\.0\.0\.1:1/db\?connect_timeout=2\): Connection refused$",
        ),
        # A password that is one letter, or a word of the message, stays out of it while
        # the message stays readable.
        (
            "postgres://u:p@127.0.0.1:1/db?connect_timeout=2",
            r"^ctxcore: error: cannot reach the PostgreSQL server "
            r"\(postgres://u:\*\*\*@127\.0\.0\.1:1/db\?connect_timeout=2\): Connection refused$",
        ),
        (
            "postgresql://u:p@localhost/db?sslmode=bogus",
            r"^ctxcore: error: the PostgreSQL connection string has a setting libpq does not accept "
            r"\(postgresql://u:\*\*\*@localhost/db\?sslmode=bogus\): invalid sslmode value",
        ),
    ],
)
def test_the_cli_says_why_a_database_url_cannot_be_used_in_one_line(
    url: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = _cli_stats(url, capsys)
    assert status != 0
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(expected, err.strip()), err
    assert ":pw@" not in err and ":p@" not in err


def test_the_cli_says_a_login_or_a_database_or_pgvector_is_missing_in_one_line(
    pg_server: PgServer, capsys: pytest.CaptureFixture[str]
) -> None:
    db = pg_server.new_database()
    plain = pg_server.new_database(vector=False)
    password = db.owner_url.split("@")[0].rsplit(":", 1)[1]
    cases = [
        (
            db.owner_url.replace(db.owner, "nosuchrole"),
            r"the PostgreSQL server refused the login .*"
            r'role "nosuchrole" does not exist$',
        ),
        (
            db.owner_url.replace(f"/{db.name}?", "/nosuchdb?"),
            r"the memory database does not exist on the "
            r'PostgreSQL server .*database "nosuchdb" does not exist$',
        ),
        (
            plain.owner_url,
            r"pgvector is available but not created in the database .* a superuser must run "
            r"CREATE EXTENSION vector there$",
        ),
    ]
    for url, expected in cases:
        status, err = _cli_stats(url, capsys)
        assert status != 0
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert re.search(expected, err.strip()), err
        assert password not in err


def test_bench_assembles_against_a_postgresql_store(pg_server: PgServer, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from ctxcore.cli import main

    db = pg_server.new_database()
    with PostgresMemoryStore(db.owner_url, embedder=HashingEmbedder()) as s:
        s.add_many([NewMemory(f"m{i}", "acme", "support", f"refunds take {i} days") for i in range(20)])
    args = ["bench", "--stage", "assemble", "--db", db.owner_url, "--org", "acme", "--agent", "support"]
    status = main([*args, "--rounds", "100", "--warmup", "1", "--p99-ms", "60000", "--no-reference", "--json"])
    out = capsys.readouterr()
    assert status == 0, out.err
    doc = json.loads(out.out)
    workload = doc["stages"]["assemble"]["workload"]
    # A branch may miss its few milliseconds on a loaded machine; not every assembly does.
    assert workload["memories"] == 20 and workload["degraded"] < workload["assemblies"], workload
    assert doc["passed"] and doc["problems"] == []
