"""The SQLite store at its edges: another scope's id under ``replace``, a database another
writer holds, text that is not Unicode, numbers that are not numbers, and JSON Lines
whose strings hold the line breaks `str.splitlines` knows."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ctxcore.cli import main
from ctxcore.memory import MemoryOrigin, Query, Scope
from ctxcore.stores import HashingEmbedder, InvalidMemory, MemoryStoreError, NewMemory, SqliteMemoryStore


def test_replace_never_touches_another_scopes_memory(tmp_path: Path) -> None:
    with SqliteMemoryStore(tmp_path / "m.db") as s:
        s.add(NewMemory("m1", "B", "b", "B's private note"))
        with pytest.raises(InvalidMemory, match="'m1' is stored in another scope") as info:
            s.add_many(
                [NewMemory("m0", "A", "a", "fine"), NewMemory("m1", "A", "a", "A's note")], on_conflict="replace"
            )
        assert info.value.index == 1
        # Nothing of the batch was written, and B's memory is whole.
        assert [m.text for m in asyncio.run(s.hot(Scope("B", "b"), Query(""), 5))] == ["B's private note"]
        assert asyncio.run(s.hot(Scope("A", "a"), Query(""), 5)) == []
        # Within its own scope a replace replaces.
        assert s.add_many([NewMemory("m1", "B", "b", "B's new note")], on_conflict="replace") == ["m1"]
        assert [m.text for m in asyncio.run(s.hot(Scope("B", "b"), Query(""), 5))] == ["B's new note"]


def test_a_write_while_another_writer_holds_the_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with SqliteMemoryStore(path) as s:
        s.add(NewMemory("m1", "o", "a", "tea"))
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction
        try:
            t0 = time.monotonic()
            with pytest.raises(MemoryStoreError, match="locked by another writer.*nothing was written"):
                s.add(NewMemory("m2", "o", "a", "coffee"))
            assert time.monotonic() - t0 < 30
            with pytest.raises(MemoryStoreError, match="locked"):
                s.set_directive("o", None, "Be brief.")
        finally:
            other.execute("ROLLBACK")
            other.close()
        s.add(NewMemory("m2", "o", "a", "coffee"))  # the store writes again once it is free
        assert len(asyncio.run(s.hot(Scope("o", "a"), Query(""), 5))) == 2


@pytest.mark.parametrize("org, agent", [("o\ud800", "a"), ("o", "\udfff")])
def test_a_scope_that_is_not_unicode_text_is_refused(org: str, agent: str) -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        Scope(org, agent)


@pytest.mark.parametrize("embedding", [["1", "2"], [True, False], [1, "a"]])
def test_an_embedding_of_strings_or_booleans_is_refused(embedding: list[object]) -> None:
    with pytest.raises(InvalidMemory, match="embedding must be a sequence of numbers"):
        NewMemory("m", "o", "a", "t", embedding=embedding)  # type: ignore[arg-type]


def test_json_lines_strings_may_hold_unicode_line_breaks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = ["a\u2028b", "c\u2029d", "e\u0085f"]
    src = tmp_path / "m.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"m{k}", "organization_id": "o", "agent_id": "a", "text": t}, ensure_ascii=False) + "\n"
            for k, t in enumerate(texts)
        ),
        encoding="utf-8",
    )
    db = tmp_path / "m.db"
    assert main(["memories", "add", str(src), "--db", str(db)]) == 0
    with SqliteMemoryStore(db) as s:
        assert sorted(m.text for m in asyncio.run(s.hot(Scope("o", "a"), Query(""), 5))) == texts
    # A bad line is still named by its number (lines end at "\n" only).
    src.write_text(src.read_text(encoding="utf-8") + "{not json\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["memories", "add", str(src), "--db", str(tmp_path / "n.db")]) != 0
    assert ":4:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda s: s.forget(""), "forget: organization_id"),
        (lambda s: s.forget("o", ""), "forget: agent_id"),
        (lambda s: s.stats(""), "stats: organization_id"),
        (lambda s: s.expire(5, organization_id="o\ud800"), "expire: organization_id"),
    ],
)
def test_scope_arguments_of_store_operations_are_named_by_operation(tmp_path: Path, call: object, what: str) -> None:
    with SqliteMemoryStore(tmp_path / "m.db") as s:
        with pytest.raises(InvalidMemory, match=what):
            call(s)  # type: ignore[operator]


def test_a_changed_or_replaced_newest_memory_is_searched_by_its_own_embedding(tmp_path: Path) -> None:
    # The scope's embeddings are kept in memory between reads; the newest memory's new
    # text, or a memory stored after the newest was deleted, is searched by its own vector.
    scope = Scope("o", "a")
    with SqliteMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder()) as s:

        def vector_hits(text: str) -> list[tuple[str, str]]:
            found = asyncio.run(s.cold(scope, Query(text), 10, 0.5))
            return [(r.id, r.text) for r in found if r.origin is MemoryOrigin.VECTOR]

        s.add_many([NewMemory("m1", "o", "a", "apples and pears"), NewMemory("m2", "o", "a", "zebra stripes")])
        assert vector_hits("zebra stripes") == [("m2", "zebra stripes")]
        assert s.update(scope, "m2", text="bananas are yellow")
        assert vector_hits("zebra stripes") == []
        assert vector_hits("bananas are yellow") == [("m2", "bananas are yellow")]

        s.add(NewMemory("m3", "o", "a", "zebra crossing"))
        assert vector_hits("zebra crossing") == [("m3", "zebra crossing")]
        assert s.delete(scope, ["m3"]) == 1
        s.add(NewMemory("m4", "o", "a", "quantum physics"))
        assert vector_hits("zebra crossing") == []
        assert vector_hits("quantum physics") == [("m4", "quantum physics")]
    # The same in a process that opens the file afterwards.
    with SqliteMemoryStore(tmp_path / "m.db") as s:
        assert vector_hits("quantum physics") == [("m4", "quantum physics")]


@pytest.mark.parametrize("new", [HashingEmbedder(64, seed=7), HashingEmbedder(32)], ids=["same-dimension", "smaller"])
def test_after_reembed_a_read_scores_by_the_new_vectors_and_an_add_takes_the_new_dimension(
    tmp_path: Path, new: HashingEmbedder
) -> None:
    scope = Scope("o", "a")
    with SqliteMemoryStore(tmp_path / "m.db", embedder=HashingEmbedder(64)) as s:
        s.add_many([NewMemory("m1", "o", "a", "apples and pears"), NewMemory("m2", "o", "a", "zebra stripes")])

        def best() -> tuple[str, float]:
            found = asyncio.run(s.cold(scope, Query("zebra stripes"), 10, -1.0))
            top = next(r for r in found if r.origin is MemoryOrigin.VECTOR)
            assert top.similarity is not None
            return top.id, top.similarity

        assert best() == ("m2", pytest.approx(1.0))  # the scope's embeddings are kept from here
        assert s.reembed(new) == 2
        assert best() == ("m2", pytest.approx(1.0))
        assert s.dimensions == new.dim
        s.add(NewMemory("m3", "o", "a", "given its own vector", embedding=[1.0] * new.dim))
        if new.dim != 64:
            with pytest.raises(InvalidMemory, match=f"has 64 dimensions.*makes {new.dim}"):
                s.add(NewMemory("m4", "o", "a", "of the old dimension", embedding=[1.0] * 64))


class _Renamed:
    """A hashing embedder under a name ctxcore cannot rebuild (as an endpoint's)."""

    name = "custom/lexical"

    def embed(self, text: str) -> Any:
        return HashingEmbedder(64, seed=3).embed(text)


def test_a_store_takes_up_the_embedder_another_process_reembedded_it_with(tmp_path: Path) -> None:
    path, scope, query = tmp_path / "m.db", Scope("o", "a"), Query("zebra stripes")

    def cold(store: SqliteMemoryStore) -> dict[str, float | None]:
        return {r.id: r.similarity for r in asyncio.run(store.cold(scope, query, 10, -1.0))}

    with SqliteMemoryStore(path, embedder=HashingEmbedder(64)) as server:
        server.add_many([NewMemory("m1", "o", "a", "apples and pears"), NewMemory("m2", "o", "a", "zebra stripes")])
        assert cold(server)["m2"] == pytest.approx(1.0)  # the scope's embeddings are kept from here
        with SqliteMemoryStore(path) as other:  # another process
            other.reembed(HashingEmbedder(64, seed=9))
        hot = {r.id: r.similarity for r in asyncio.run(server.hot(scope, query, 10))}
        assert hot["m2"] == pytest.approx(1.0)
        assert cold(server)["m2"] == pytest.approx(1.0)
        assert server.embedder is not None and server.embedder.name == HashingEmbedder(64, seed=9).name
        # What it writes from now on is in the new embedder's space too.
        server.add(NewMemory("m3", "o", "a", "zebra stripes"))
        assert server.update(scope, "m1", text="zebra stripes")
        with SqliteMemoryStore(path) as other:
            assert cold(other) == pytest.approx({"m1": 1.0, "m2": 1.0, "m3": 1.0})
            other.reembed(_Renamed())
        with pytest.raises(MemoryStoreError, match="re-embedded with 'custom/lexical'.*open the store again"):
            cold(server)
    with SqliteMemoryStore(path, embedder=_Renamed()) as s:
        assert cold(s) == pytest.approx({"m1": 1.0, "m2": 1.0, "m3": 1.0})


def test_a_store_reopened_without_an_embedder_rebuilds_a_hashing_embedder_of_any_dimension(tmp_path: Path) -> None:
    wide = HashingEmbedder(1_000_000, seed=2**32 - 1)
    with SqliteMemoryStore(tmp_path / "m.db", embedder=wide) as s:
        s.add(NewMemory("m1", "o", "a", "refunds within 30 days"))
    with SqliteMemoryStore(tmp_path / "m.db") as s:
        assert s.embedder is not None and s.embedder.name == wide.name
        found = asyncio.run(s.cold(Scope("o", "a"), Query("refunds within 30 days"), 5, 0.5))
        assert [(r.id, r.origin) for r in found] == [("m1", MemoryOrigin.VECTOR)]
    # A name of no dimension or seed the embedder takes names no hashing embedder.
    assert HashingEmbedder.from_name("hashing-v1/dim=8/seed=0") is None
    assert HashingEmbedder.from_name(f"hashing-v1/dim=64/seed={2**32}") is None


def test_another_applications_database_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('alice')")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(MemoryStoreError, match="not a ctxcore memory store.*'customers'.*left as it is"):
        SqliteMemoryStore(path)
    assert main(["memories", "stats", "--db", str(path)]) == 1
    assert path.read_bytes() == before and not Path(f"{path}-wal").exists()
    # An empty file is a new store.
    empty = tmp_path / "empty.db"
    empty.touch()
    with SqliteMemoryStore(empty) as s:
        assert s.stats().memories == 0


def test_a_store_opened_without_an_embedder_takes_up_the_one_another_process_records(tmp_path: Path) -> None:
    path, scope = tmp_path / "m.db", Scope("o", "a")
    with SqliteMemoryStore(path) as server:  # a new file: no embedder recorded
        assert len(asyncio.run(server.cold(scope, Query("zebra"), 5, 0.3))) == 0
        with SqliteMemoryStore(path, embedder=HashingEmbedder(64)) as ingest:  # another process
            ingest.add_many(
                [NewMemory("m1", "o", "a", "apples and pears"), NewMemory("m2", "o", "a", "zebras have stripes")]
            )
        found = asyncio.run(server.cold(scope, Query("zebras have stripes"), 5, 0.5))
        assert [(r.id, r.origin) for r in found] == [("m2", MemoryOrigin.VECTOR)]
        assert server.embedder is not None and server.embedder.name == HashingEmbedder(64).name
        server.add(NewMemory("m3", "o", "a", "zebras have stripes"))  # embedded as the file's are
    with SqliteMemoryStore(path) as s:
        found = asyncio.run(s.cold(scope, Query("zebras have stripes"), 5, 0.9))
        assert {r.id for r in found if r.origin is MemoryOrigin.VECTOR} == {"m2", "m3"}
