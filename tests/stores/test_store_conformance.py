"""One suite, every store: `SqliteMemoryStore` (a real file) and `PostgresMemoryStore` (a
real PostgreSQL server with pgvector, started by this test run, the store connected as
an app role that row-level security applies to) must behave the same through the
`MemoryStore` and `MemoryLifecycle` protocols: retrieval semantics, the ANN cutoff
before hydration, full-text quoting, scope isolation (also with a deliberately wrong
scope passed to a store method), all-or-nothing ingest naming the bad record, the memory
lifecycle, and concurrent readers and writers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pg_support import Database, PgServer

from ctxcore import count_tokens
from ctxcore.memory import (
    FULLTEXT_RELEVANCE_SENTINEL,
    ForgetReport,
    MemoryLifecycle,
    MemoryOrigin,
    MemoryStore,
    Query,
    Scope,
)
from ctxcore.stores import (
    HashingEmbedder,
    InvalidMemory,
    MemoryStoreError,
    NewMemory,
    SqliteMemoryStore,
)

A, B, A2 = Scope("acme", "support"), Scope("globex", "support"), Scope("acme", "sales")
Factory = Callable[..., Any]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = PgServer().start()
    yield server
    server.stop()


def open_postgres(db: Database, **kw: Any) -> Any:
    """Migrate as the owner (granting the app role), then open as the app role."""
    from ctxcore.stores import PostgresMemoryStore

    dims = kw.pop("dimensions", None)
    PostgresMemoryStore(db.owner_url, embedder=kw.get("embedder"), dimensions=dims, grant_to=db.app).close()
    return PostgresMemoryStore(db.app_url, migrate=False, **kw)


@pytest.fixture(params=["sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """make(**kw) opens a fresh store of the parametrized kind (kw: embedder, dimensions,
    directive_cache_seconds, ...); the same database on a second call with reopen=True."""
    opened: list[Any] = []
    state: dict[str, Any] = {}

    def factory(reopen: bool = False, **kw: Any) -> Any:
        if request.param == "sqlite":
            kw.pop("dimensions", None)
            s = SqliteMemoryStore(tmp_path / "m.db", **kw)
        else:
            server: PgServer = request.getfixturevalue("pg_server")
            if not reopen or "db" not in state:
                state["db"] = server.new_database()
                s = open_postgres(state["db"], **kw)
            else:
                from ctxcore.stores import PostgresMemoryStore

                kw.pop("dimensions", None)
                s = PostgresMemoryStore(state["db"].app_url, migrate=False, **kw)
        opened.append(s)
        return s

    def admin(s: Any) -> Any:
        # Whole-store operations: the schema owner on PostgreSQL (the app role sees one
        # organization at a time), the store itself on SQLite.
        if request.param == "sqlite":
            return s
        from ctxcore.stores import PostgresMemoryStore

        o = PostgresMemoryStore(state["db"].owner_url, migrate=False)
        opened.append(o)
        return o

    factory.kind = request.param  # type: ignore[attr-defined]
    factory.admin = admin  # type: ignore[attr-defined]
    yield factory
    for s in opened:
        s.close()


def fill(store: Any) -> None:
    texts = [
        "Refunds are accepted within 30 days of delivery.",
        "The customer prefers email over phone calls.",
        "Les remboursements acceptés sous 30 jours.",
        "返金ポリシーは30日以内です。",
        "退款政策是三十天。",
        "Lieferung erfolgt innerhalb von drei Tagen. Hof",
    ]
    store.add_many(
        NewMemory(f"{sc.organization_id}-{sc.agent_id}-{k}", sc.organization_id, sc.agent_id, t, created_at=1000 + k)
        for sc in (A, B, A2)
        for k, t in enumerate(texts)
    )
    store.set_directive("acme", None, "Never share card numbers.")
    store.set_directive("acme", "support", "You are Acme's support agent.")
    store.set_directive("globex", "support", "GLOBEX-SECRET directive.")


# ---- retrieval semantics ----------------------------------------------------------------


def test_implements_the_protocols(make: Factory) -> None:
    s = make(embedder=HashingEmbedder(64))
    assert isinstance(s, MemoryStore) and isinstance(s, MemoryLifecycle)
    assert "support" not in repr(s) and type(s).__name__ in repr(s)


def test_a_scope_lists_its_memories_oldest_first_and_an_evaluation_runs_on_it(make: Factory) -> None:
    from ctxcore.evaluation import Label, evaluate

    s = make(embedder=HashingEmbedder(64))
    fill(s)
    batch = s.memories(A)
    assert list(batch.ids) == [f"acme-support-{k}" for k in range(6)]
    assert list(batch.created_at) == [1000.0 + k for k in range(6)]
    assert (batch.organization_id, batch.agent_id) == ("acme", "support")
    assert len(s.memories(Scope("acme", "nobody")).ids) == 0
    labels = [Label("refunds within 30 days?", frozenset({"acme-support-0"}), "acme", "support")]
    report = run(evaluate(s, labels, budgets=(256,)))
    assert report.score("ctxcore", 256).recall == 1.0


def test_hot_is_newest_first_with_similarity(make: Factory) -> None:
    s = make(embedder=HashingEmbedder(64))
    s.add_many(NewMemory(f"m{k}", "acme", "support", f"note number {k}", created_at=100 + k) for k in range(6))
    recs = run(s.hot(A, Query("note number 5"), 3))
    assert [r.id for r in recs] == ["m5", "m4", "m3"] and [r.rank for r in recs] == [0, 1, 2]
    assert all(r.origin is MemoryOrigin.HOT and r.similarity is not None for r in recs)
    assert recs[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert run(s.hot(A, Query("x"), 0)) == []
    assert [r.similarity for r in run(s.hot(A, Query(""), 2))] == [None, None]


def test_memories_without_a_time_are_created_in_the_order_given(make: Factory) -> None:
    s = make()
    before = time.time()
    s.add_many([NewMemory(f"m{k}", "acme", "support", f"turn {k} of the chat") for k in range(50)])
    after = time.time()
    batch = s.memories(A)
    times = [t for _, t in sorted(zip(batch.ids, batch.created_at), key=lambda p: int(p[0][1:]))]
    assert all(b > a for a, b in zip(times, times[1:]))  # strictly in the order given
    assert before - 1 <= times[0] and times[-1] <= after + 1
    assert [r.id for r in run(s.hot(A, Query(""), 3))] == ["m49", "m48", "m47"]


def test_ann_cutoff_applies_before_hydration(make: Factory) -> None:
    s = make(dimensions=3)
    angles = np.deg2rad([0, 10, 30, 45, 60, 90, 180])  # cosines 1, .985, .866, .707, .5, 0, -1
    s.add_many(
        NewMemory(f"v{k}", "acme", "support", f"memory {k} kettle", embedding=[float(np.cos(t)), float(np.sin(t)), 0.0])
        for k, t in enumerate(angles)
    )
    s.add(NewMemory("other", "acme", "sales", "memory other", embedding=[1.0, 0.0, 0.0]))
    q = Query("", (1.0, 0.0, 0.0))  # no words: the vector path alone
    for cutoff, expect in [(0.7, ["v0", "v1", "v2", "v3"]), (0.9, ["v0", "v1"]), (-1.0, [f"v{k}" for k in range(7)])]:
        recs = run(s.cold(A, q, 50, cutoff))
        assert [r.id for r in recs] == expect
        assert all(r.origin is MemoryOrigin.VECTOR for r in recs)
        assert [r.similarity for r in recs] == pytest.approx(
            [float(np.cos(angles[k])) for k in range(len(expect))], abs=1e-6
        )
    top2 = run(s.cold(A, q, 2, 0.0))
    assert [r.id for r in top2] == ["v0", "v1"] and [r.rank for r in top2] == [0, 1]
    # Each path returns at most `limit`; vector hits under the cutoff are not returned, and
    # a full-text hit carries its cosine too.
    mixed = run(s.cold(A, Query("kettle", (1.0, 0.0, 0.0)), 5, 0.9))
    assert [r.id for r in mixed if r.origin is MemoryOrigin.VECTOR] == ["v0", "v1"]
    text = [r for r in mixed if r.origin is MemoryOrigin.FULLTEXT]
    assert len(text) == 5 and len(mixed) == 7
    assert all(r.fulltext_score is not None and r.fulltext_score > 0 for r in text)
    assert all(r.similarity is not None and r.similarity < 0.9 for r in text)
    assert all(r.similarity >= 0.9 for r in mixed if r.origin is MemoryOrigin.VECTOR)
    with pytest.raises(MemoryStoreError, match="2 dimensions"):
        run(s.cold(A, Query("", (1.0, 0.0)), 5, 0.5))


def test_fulltext_hits_carry_the_sentinel_in_every_script(make: Factory) -> None:
    s = make()  # no embedder: full text only
    fill(s)
    cases = {
        "refunds within 30 days": "acme-support-0",
        "remboursements acceptes": "acme-support-2",  # diacritics folded
        "返金": "acme-support-3",
        "退款": "acme-support-4",
        "LIEFERUNG": "acme-support-5",
    }
    for q, expected in cases.items():
        recs = run(s.cold(A, Query(q), 10, 0.7))
        assert expected in [r.id for r in recs], q
        for r in recs:
            assert r.origin is MemoryOrigin.FULLTEXT and r.similarity is None and r.scope == A
            assert r.relevance == FULLTEXT_RELEVANCE_SENTINEL == 0.5


def test_vector_and_fulltext_merge_one_entry_per_memory(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    recs = run(s.cold(A, Query("Refunds are accepted within 30 days of delivery. Hof"), 10, 0.7))
    ids = [r.id for r in recs]
    assert len(ids) == len(set(ids))
    assert recs[0].id == "acme-support-0" and recs[0].origin is MemoryOrigin.VECTOR
    # Full text finds "Hof" and, stemmed, "accepted" in the French "acceptés".
    assert sorted((r.id, r.origin) for r in recs[1:]) == [
        ("acme-support-2", MemoryOrigin.FULLTEXT),
        ("acme-support-5", MemoryOrigin.FULLTEXT),
    ]
    assert [r.rank for r in recs] == list(range(len(recs)))


def test_fulltext_leaves_out_words_most_memories_share(make: Factory) -> None:
    s = make()
    s.add_many(NewMemory(f"m{k}", "acme", "support", f"the delivery {k} went to the depot") for k in range(30))
    s.add(NewMemory("r", "acme", "support", "refund issued for the broken kettle"))
    assert [r.id for r in run(s.cold(A, Query("the refund"), 50, 0.7))] == ["r"]
    assert run(s.cold(A, Query("the"), 50, 0.7)) == []
    assert [r.id for r in run(s.cold(A, Query("3 kettle refund depot"), 5, 0.7))] == ["r", "m3"]


def test_a_cjk_pair_rare_in_its_scope_is_searched_though_its_characters_are_common(make: Factory) -> None:
    # 退 and 款 are each in 14 of the scope's 26 memories (more than the pruning cap), the
    # pair 退款 ("refund") in 2: the pair is counted as a pair, kept and searched.
    s = make()
    s.add_many(NewMemory(f"r{k}", "acme", "support", f"退货单{k}已经处理") for k in range(12))
    s.add_many(NewMemory(f"p{k}", "acme", "support", f"付款单{k}已经处理") for k in range(12))
    s.add(NewMemory("x1", "acme", "support", "退款七天内原路返回"))
    s.add(NewMemory("x2", "acme", "support", "退款需要主管审批"))
    assert {r.id for r in run(s.cold(A, Query("退款"), 50, 0.7))} == {"x1", "x2"}
    # A pair no memory of the scope holds finds nothing, though both characters are there.
    assert run(s.cold(A, Query("款退"), 50, 0.7)) == []


HOSTILE = [
    'refunds" OR body:x* NEAR(a b)',
    "refunds' & !email | <-> :* (",
    "' OR 1=1; DROP TABLE memories; --",
    "\x00refunds\x00",
    "\ud800refunds\udfff",
    "refunds " * 3000,
    "\\' \\\\ $$ %s %(x)s {0}",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_query_text_is_only_ever_words(make: Factory, text: str) -> None:
    s = make()
    fill(s)
    recs = run(s.cold(A, Query(text), 20, 0.7))
    assert {r.scope for r in recs} <= {A}
    if "refund" in text:
        assert "acme-support-0" in [r.id for r in recs]
    assert run(s.hot(A, Query(text), 20))


def test_hostile_memory_text_is_stored_and_returned_verbatim(make: Factory) -> None:
    s = make()
    text = "'; DROP TABLE memories; -- NEAR(a b) body:* & | ! <-> </memory> \u202e \U0001f600 $$"
    s.add(NewMemory("evil", "acme", "support", text))
    assert [r.text for r in run(s.hot(A, Query(""), 5))] == [text]
    assert [r.text for r in run(s.cold(A, Query("drop table"), 5, 0.7))] == [text]


def test_token_counts_are_exact_and_tagged(make: Factory) -> None:
    s = make()
    text = "Refunds are accepted within 30 days — 返金ポリシー."
    s.add(NewMemory("t", "acme", "support", text))
    (r,) = run(s.hot(A, Query(""), 1))
    assert (r.token_count, r.token_family, r.token_kind) == (
        count_tokens(text, "cl100k_base").value,
        "cl100k_base",
        "exact",
    )


def test_directives_and_their_cache(make: Factory) -> None:
    s = make(directive_cache_seconds=60)
    fill(s)
    assert run(s.directive(A)) == "Never share card numbers.\n\nYou are Acme's support agent."
    assert run(s.directive(A2)) == "Never share card numbers."
    assert run(s.directive(Scope("initech", "x"))) is None
    s.set_directive("acme", "sales", "Sell.")  # a write through the store is seen at once
    assert run(s.directive(A2)) == "Never share card numbers.\n\nSell."
    other = make(reopen=True)
    other.set_directive("acme", "sales", None)
    assert run(s.directive(A2)) == "Never share card numbers.\n\nSell."  # cached for 60 s
    assert run(make(reopen=True, directive_cache_seconds=0).directive(A2)) == "Never share card numbers."


def test_a_stale_directive_is_served_at_once_and_refreshed_in_the_background(make: Factory) -> None:
    # Past its fresh time a cached directive is still served without waiting for the
    # database, and one background read brings another replica's change.
    s = make(directive_cache_seconds=0.05)
    fill(s)
    assert run(s.directive(A2)) == "Never share card numbers."
    make(reopen=True).set_directive("acme", "sales", "Sell.")
    time.sleep(0.06)
    assert run(s.directive(A2)) == "Never share card numbers."  # stale, at once
    deadline = time.monotonic() + 5
    while run(s.directive(A2)) != "Never share card numbers.\n\nSell.":
        assert time.monotonic() < deadline, "the stale directive was never refreshed"
        time.sleep(0.01)


def test_words_in_most_memories_are_left_out_and_that_follows_writes(make: Factory) -> None:
    # 40 memories, one scope: a word in more than max(8, 3%) of them says nothing and is
    # left out of full-text search; a rare word is searched. What is common changes with
    # writes, and the next query follows (no stale stop-word list).
    s = make()
    s.add_many(
        NewMemory(f"n{k}", "acme", "support", f"the note number {k}" + (" kettle" if k == 7 else "")) for k in range(40)
    )
    for _ in range(2):  # the second time from whatever the store remembered
        assert run(s.cold(A, Query("the"), 10, 0.7)) == []
        assert [r.id for r in run(s.cold(A, Query("the kettle"), 10, 0.7))] == ["n7"]
    s.add_many(NewMemory(f"k{k}", "acme", "support", f"kettle descaling step {k}") for k in range(20))
    assert run(s.cold(A, Query("kettle"), 10, 0.7)) == []  # now in 21 of 60 memories
    assert s.delete(A, [f"n{k}" for k in range(34)]) == 34
    assert s.delete(A, [f"k{k}" for k in range(20)]) == 20
    # 6 memories left: nothing is pruned below 8 matches.
    assert sorted(r.id for r in run(s.cold(A, Query("the"), 10, 0.7))) == [f"n{k}" for k in range(34, 40)]
    assert run(s.cold(A, Query("kettle"), 10, 0.7)) == []  # n7 was deleted


# ---- scope isolation -------------------------------------------------------------------------


def test_every_branch_returns_only_its_scope(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    for scope in (A, B, A2):
        q = Query("refunds within 30 days email 返金 退款 Lieferung")
        for recs in (run(s.hot(scope, q, 50)), run(s.cold(scope, q, 50, -1.0))):
            assert recs and {r.scope for r in recs} == {scope}
        d = run(s.directive(scope))
        assert (d is not None and "GLOBEX" in d) == (scope == B)


def test_a_wrong_scope_passed_to_a_store_method_touches_nothing(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    before = make.admin(s).stats()
    assert s.delete(B, ["acme-support-0", "acme-sales-1"]) == 0
    assert s.update(B, "acme-support-0", text="overwritten by globex") is False
    assert s.update(A2, "acme-support-0", confidence=0.1) is False
    assert s.forget("globex", "sales") == ForgetReport(0, 0)
    assert make.admin(s).stats() == before
    (r,) = [r for r in run(s.hot(A, Query(""), 50)) if r.id == "acme-support-0"]
    assert r.text.startswith("Refunds") and r.confidence == 1.0
    with pytest.raises(TypeError):
        run(s.hot(("acme", "support"), Query(""), 5))  # type: ignore[arg-type]


# ---- ingest ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"id": "x2", "organization_id": "acme", "agent_id": "support", "text": ""}, "'x2' (index 2): text"),
        (
            {"id": "x2", "organization_id": "acme", "agent_id": "support", "text": "t", "confidence": 2},
            "'x2' (index 2): confidence",
        ),
        (
            {"id": "x0", "organization_id": "acme", "agent_id": "support", "text": "dup"},
            "'x0' (index 2): id 'x0' is used twice",
        ),
        (
            {"id": "x2", "organization_id": "acme", "agent_id": "support", "text": "t", "embedding": [1.0, 0.0]},
            "'x2' (index 2): embedding has 2 dimensions",
        ),
        (
            {"id": "x2", "organization_id": "acme", "agent_id": "support", "text": "t", "colour": "red"},
            "'x2' (index 2): unknown field",
        ),
    ],
)
def test_bad_ingest_names_the_record_and_stores_nothing(make: Factory, bad: dict[str, object], message: str) -> None:
    s = make(dimensions=3)
    good = [
        {
            "id": f"x{k}",
            "organization_id": "acme",
            "agent_id": "support",
            "text": f"t{k}",
            "embedding": [1.0, 0.0, float(k)],
        }
        for k in range(2)
    ]
    with pytest.raises(InvalidMemory, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        s.add_many([*good, bad])
    assert info.value.index == 2
    assert run(s.hot(A, Query(""), 10)) == []


def test_a_taken_id_fails_the_whole_batch(make: Factory) -> None:
    s = make()
    s.add(NewMemory("taken", "globex", "support", "first"))
    with pytest.raises(InvalidMemory, match=r"'taken' \(index 1\): id 'taken' is already stored") as info:
        s.add_many([NewMemory("n0", "acme", "support", "new"), NewMemory("taken", "acme", "support", "again")])
    assert (info.value.index, info.value.memory_id) == (1, "taken")
    assert run(s.hot(A, Query(""), 10)) == []
    assert [r.text for r in run(s.hot(B, Query(""), 10))] == ["first"]


def test_an_id_holding_nul_is_refused_and_never_reaches_another_memory(make: Factory) -> None:
    s = make()
    s.add(NewMemory("m", "acme", "support", "kept"))
    with pytest.raises(InvalidMemory, match=r"'m\\x00x' \(index 1\): id contains NUL") as info:
        s.add_many(
            [
                NewMemory("n0", "acme", "support", "new"),
                {"id": "m\x00x", "organization_id": "acme", "agent_id": "support", "text": "another"},
            ]
        )
    assert (info.value.index, info.value.memory_id) == (1, "m\x00x")
    with pytest.raises(ValueError, match="contains NUL"):
        s.delete(A, ["m\x00x"])
    with pytest.raises(InvalidMemory, match="id contains NUL"):
        s.update(A, "m\x00x", text="changed")
    assert [(r.id, r.text) for r in run(s.hot(A, Query(""), 10))] == [("m", "kept")]


@pytest.mark.parametrize("scope", [Scope("acme\x00", "support"), Scope("acme", "support\x00")], ids=["org", "agent"])
def test_a_scope_holding_nul_with_nothing_stored_reads_and_changes_nothing(make: Factory, scope: Scope) -> None:
    s = make(embedder=HashingEmbedder())
    s.add(NewMemory("m", "acme", "support", "refunds within 30 days"))
    s.set_directive("acme", None, "Be brief.")
    assert len(run(s.hot(scope, Query("refunds"), 5))) == 0
    assert len(run(s.cold(scope, Query("refunds"), 5, 0.0))) == 0
    assert len(s.memories(scope)) == 0
    assert run(s.directive(scope)) == (None if "\x00" in scope.organization_id else "Be brief.")
    assert s.delete(scope, ["m"]) == 0
    assert s.update(scope, "m", text="changed") is False
    assert s.forget(scope.organization_id, scope.agent_id) == ForgetReport(0, 0)
    if "\x00" in scope.organization_id:
        assert s.forget(scope.organization_id) == ForgetReport(0, 0)
        assert s.expire(0, organization_id=scope.organization_id) == 0
        assert s.stats(scope.organization_id).scopes == ()
    assert [(r.id, r.text) for r in run(s.hot(A, Query(""), 5))] == [("m", "refunds within 30 days")]
    assert run(s.directive(A)) == "Be brief."


# ---- lifecycle -----------------------------------------------------------------------------------


def test_delete_forget_and_stats(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    assert make.admin(s).stats().memories == 18 and make.admin(s).stats().directives == 3
    assert [(x.agent_id, x.memories) for x in s.stats("acme").scopes] == [("sales", 6), ("support", 6)]
    q = Query("Refunds are accepted within 30 days of delivery.")
    assert run(s.cold(A, q, 5, 0.7))[0].id == "acme-support-0"
    assert s.delete(A, ["acme-support-0", "nope"]) == 1
    assert "acme-support-0" not in [r.id for r in run(s.cold(A, q, 50, -1.0))]
    assert "acme-support-0" not in [r.id for r in run(s.hot(A, q, 50))]
    assert s.forget("acme", "support") == ForgetReport(5, 1)
    assert run(s.hot(A, q, 50)) == [] and run(s.cold(A, q, 50, -1.0)) == []
    assert run(s.directive(A)) == "Never share card numbers."
    assert run(s.hot(A2, q, 50))  # the other agent keeps its memories
    assert s.forget("acme") == ForgetReport(6, 1)
    assert run(s.directive(A2)) is None and run(s.cold(A2, q, 50, -1.0)) == []
    st = make.admin(s).stats()
    assert (st.memories, st.directives, [x.organization_id for x in st.scopes]) == (6, 1, ["globex"])
    # Re-adding after a forget is found by both paths again.
    s.add(NewMemory("again", "acme", "support", "Refunds are accepted within 30 days of delivery."))
    assert [r.id for r in run(s.cold(A, q, 5, 0.9))] == ["again"]


def test_update_recounts_reindexes_and_reembeds(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    s.add_many(
        [
            NewMemory("m1", "acme", "support", "The customer likes green tea.", created_at=5),
            NewMemory("m2", "acme", "support", "Deliveries go to the depot.", created_at=6),
        ]
    )
    new = "The customer now drinks espresso every morning, 每天早上."
    assert s.update(A, "m1", text=new, importance=0.8) is True
    recs = {r.id: r for r in run(s.hot(A, Query(""), 5))}
    r = recs["m1"]
    assert (r.text, r.importance, r.confidence, r.created_at) == (new, 0.8, 1.0, 5)
    assert r.token_count == count_tokens(new, "cl100k_base").value
    by_vector = run(s.cold(A, Query("", tuple(HashingEmbedder().embed(new))), 5, 0.99))
    assert [x.id for x in by_vector] == ["m1"]
    assert [x.id for x in run(s.cold(A, Query("espresso"), 5, 0.99))] == ["m1"]
    assert [x.id for x in run(s.cold(A, Query("早上"), 5, 0.99))] == ["m1"]
    assert run(s.cold(A, Query("green tea"), 5, 0.99)) == []
    assert s.update(A, "m2", confidence=0.25) is True
    assert {r.id: r.confidence for r in run(s.hot(A, Query(""), 5))}["m2"] == 0.25
    with pytest.raises(InvalidMemory, match="importance"):
        s.update(A, "m2", importance=1.5)
    with pytest.raises(InvalidMemory, match="text"):
        s.update(A, "m2", text="")


def test_accessed_at_is_written_in_batches(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    assert all(r.accessed_at is None for r in run(s.hot(A, Query(""), 50)))
    t0 = time.time()
    run(s.cold(A, Query("refunds"), 5, 0.7))
    n = s.flush_accesses()
    assert n >= 6  # the hot read above and the cold one, in one flush
    seen = {r.id: r.accessed_at for r in run(s.hot(A, Query(""), 50))}
    assert all(v is not None and v >= t0 - 1 for v in seen.values())
    assert all(r.accessed_at is None for r in run(s.hot(B, Query(""), 50)))
    # Without an explicit flush, the store writes them by itself within a second or so.
    run(s.hot(B, Query(""), 50))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(r.accessed_at is not None for r in run(make(reopen=True).hot(B, Query(""), 50))):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("accessed_at was never flushed")


class CountingEmbedder(HashingEmbedder):
    """The store's embedder, counting the texts it is asked for (slow enough that the hot
    and cold branches of one request ask at the same time)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def embed(self, text: str) -> np.ndarray:
        with self._lock:
            self.calls[text] = self.calls.get(text, 0) + 1
        time.sleep(0.02)
        return super().embed(text)


def test_a_query_is_embedded_once_for_both_branches(make: Factory) -> None:
    e = CountingEmbedder()
    s = make(embedder=e)
    fill(s)
    e.calls.clear()
    q = Query("refunds within 30 days")

    async def both() -> tuple[Any, Any]:
        return await asyncio.gather(s.hot(A, q, 6), s.cold(A, q, 6, 0.5))

    hot, cold = run(both())
    assert e.calls == {q.text: 1}
    assert any(r.similarity is not None for r in hot) and any(r.similarity is not None for r in cold)
    assert [r.id for r in run(s.cold(A, q, 6, 0.5))] == [r.id for r in cold]  # the same answer
    assert e.calls == {q.text: 1}  # and asked again, not embedded again


def test_a_memory_read_again_within_the_resolution_is_written_once(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    newest = run(s.hot(A, Query(""), 3))
    found = run(s.cold(A, Query(newest[0].text), 3, 0.7))
    noted = {r.id for r in newest} | {r.id for r in found}
    assert s.flush_accesses() == len(noted)
    times = {r.id: r.accessed_at for r in run(s.hot(A, Query(""), 3))}
    for _ in range(5):  # read by every request: noted once per resolution, not per flush
        run(s.hot(A, Query(""), 3))
        run(s.cold(A, Query(newest[0].text), 3, 0.7))
    assert s.flush_accesses() == 0
    assert {r.id: r.accessed_at for r in run(s.hot(A, Query(""), 3))} == times
    # Memories not read before are noted at their first read.
    unread = {r.id for r in run(s.hot(A, Query(""), 6))} - noted
    assert unread and s.flush_accesses() == len(unread)
    # With a resolution of 0 every read is written again.
    every = make(reopen=True, access_resolution_seconds=0)
    for _ in range(3):
        run(every.hot(A, Query(""), 3))
        assert every.flush_accesses() == 3
    with pytest.raises(ValueError, match="access_resolution_seconds"):
        make(reopen=True, access_resolution_seconds=-1)


def test_retention_by_age(make: Factory) -> None:
    s = make()
    s.add_many(
        [
            NewMemory("old", "acme", "support", "old note", created_at=100),
            NewMemory("old-b", "globex", "support", "old note", created_at=100),
            NewMemory("new", "acme", "support", "new note", created_at=1000),
        ]
    )
    assert s.expire(500, organization_id="acme", now=1000) == 1
    assert [r.id for r in run(s.hot(A, Query(""), 5))] == ["new"]
    assert make.admin(s).expire(500, now=1000) == 1  # all organizations
    assert run(s.hot(B, Query(""), 5)) == []
    with pytest.raises(ValueError, match="max_age_seconds"):
        s.expire(-1)


def test_a_delete_is_seen_by_another_open_store(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    other = make(reopen=True)
    q = Query("Refunds are accepted within 30 days of delivery.")
    assert run(other.cold(A, q, 5, 0.7))[0].id == "acme-support-0"  # caches loaded
    s.delete(A, ["acme-support-0"])
    assert "acme-support-0" not in [r.id for r in run(other.cold(A, q, 50, -1.0))]
    s.add(NewMemory("fresh", "acme", "support", "Refunds are accepted within 30 days of delivery!"))
    assert run(other.cold(A, q, 5, 0.7))[0].id == "fresh"


# ---- concurrency ---------------------------------------------------------------------------------


def test_concurrent_readers_and_writers(make: Factory) -> None:
    s = make(embedder=HashingEmbedder())
    fill(s)
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        try:
            for k in range(40):
                s.add_many(
                    [NewMemory(f"w{w}-{k}-{j}", "acme", "support", f"writer {w} refund note {k} {j}") for j in range(3)]
                )
        except BaseException as exc:
            errors.append(exc)

    async def readers() -> int:
        reads = 0
        while not stop.is_set():
            res = await asyncio.gather(
                *(
                    [s.cold(sc, Query("refund note"), 20, 0.5) for sc in (A, B, A2)]
                    + [s.hot(sc, Query("refund"), 20) for sc in (A, B, A2)]
                )
            )
            for sc, recs in zip((A, B, A2, A, B, A2), res):
                assert {r.scope for r in recs} <= {sc}
            reads += len(res)
        return reads

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()

    async def main() -> int:
        task = asyncio.create_task(readers())
        while any(t.is_alive() for t in threads):
            await asyncio.sleep(0.05)
        stop.set()
        return await task

    reads = run(main())
    assert not errors and reads > 0
    assert {(x.organization_id, x.agent_id): x.memories for x in s.stats("acme").scopes}[("acme", "support")] == 6 + 360
    assert len(run(s.hot(A, Query(""), 1000))) == 366
