"""`ctxcore.evaluation` and ``ctxcore eval``: evidence recall at equal spend, ctxcore beside
the BM25, dense, rank-fusion and recency baselines, on a real SQLite store."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("bm25s")

from ctxcore.errors import ConfigError
from ctxcore.evaluation import SYSTEMS, Label, LabelError, evaluate_sync, read_labels
from ctxcore.stores import HashingEmbedder, NewMemory, SqliteMemoryStore

ORG, AGENT = "acme", "helper"
THINGS = [
    "violin",
    "kayak",
    "saffron",
    "glacier",
    "lantern",
    "origami",
    "falcon",
    "tulip",
    "marathon",
    "telescope",
    "bonsai",
    "harbor",
    "quartz",
    "cello",
    "meadow",
    "pottery",
]
FILLER = [
    "we talked about the weather again",
    "it was a long day at work",
    "thanks for asking how I am",
    "let us catch up next week",
    "I made pasta for dinner",
    "the traffic was slow this morning",
]


def corpus(seed: int = 7) -> tuple[list[NewMemory], list[dict[str, object]]]:
    """One fact per thing among filler turns, each asked about by a question that shares
    only the thing's name with its fact; the newest turns are filler."""
    rng = random.Random(seed)
    memories, labels, t = [], [], 1_700_000_000.0
    for i, thing in enumerate(THINGS):
        for _ in range(3):
            memories.append(NewMemory(f"f{len(memories)}", ORG, AGENT, rng.choice(FILLER), created_at=t))
            t += 60
        mid = f"fact{i}"
        memories.append(
            NewMemory(
                mid, ORG, AGENT, f"Sam said the {thing} story from last spring still makes them laugh", created_at=t
            )
        )
        t += 60
        labels.append({"query": f"What did Sam say about the {thing}?", "evidence": [mid]})
    for _ in range(10):
        memories.append(NewMemory(f"f{len(memories)}", ORG, AGENT, rng.choice(FILLER), created_at=t))
        t += 60
    return memories, labels


@pytest.fixture
def store_and_labels(tmp_path: Path) -> tuple[Path, Path]:
    memories, labels = corpus()
    db = tmp_path / "eval.db"
    with SqliteMemoryStore(str(db), embedder=HashingEmbedder(64)) as s:
        s.add_many(memories)
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in labels), encoding="utf-8")
    return db, path


def test_every_system_is_scored_at_every_spend_within_it(store_and_labels: tuple[Path, Path]) -> None:
    db, path = store_and_labels
    labels = read_labels(path, organization_id=ORG, agent_id=AGENT)
    with SqliteMemoryStore(str(db), embedder=HashingEmbedder(64)) as s:
        report = evaluate_sync(s, labels, budgets=(64, 256))
    assert report.labels == len(THINGS) and report.budgets == (64, 256)
    assert {(x.system, x.budget) for x in report.scores} == {(name, b) for name in SYSTEMS for b in (64, 256)}
    for x in report.scores:
        assert 0.0 <= x.all_evidence <= x.recall <= 1.0
        assert x.spent <= x.budget
    # Each question shares its one rare word with its fact only: a lexical ranking finds
    # every fact, and so does ctxcore once it can afford the wrapper.
    assert report.score("bm25", 256).recall == 1.0
    assert report.score("ctxcore", 256).recall == 1.0
    # The ten newest memories are filler: at a spend they fill, recency finds nothing.
    assert report.score("recency", 64).recall == 0.0 < report.score("recency", 256).recall
    assert report.missing_evidence == 0 and report.degraded == 0
    assert report.best_baseline(256).recall == 1.0
    doc = report.record()
    assert doc["ratio_to_best_baseline"]["256"] == 1.0
    assert "ctxcore / best" in report.table()


def test_more_spend_never_holds_less_for_a_baseline(store_and_labels: tuple[Path, Path]) -> None:
    db, path = store_and_labels
    labels = read_labels(path, organization_id=ORG, agent_id=AGENT)
    with SqliteMemoryStore(str(db), embedder=HashingEmbedder(64)) as s:
        report = evaluate_sync(s, labels, budgets=(16, 32, 128))
    for name in ("bm25", "dense", "rrf", "recency"):
        r = [report.score(name, b).recall for b in (16, 32, 128)]
        assert r == sorted(r), name
        assert report.score(name, 16).selected <= report.score(name, 128).selected


def test_missing_evidence_is_counted_and_missed(store_and_labels: tuple[Path, Path]) -> None:
    db, _ = store_and_labels
    labels = [Label("What did Sam say about the kayak?", frozenset({"fact1", "no-such-memory"}), ORG, AGENT)]
    with SqliteMemoryStore(str(db), embedder=HashingEmbedder(64)) as s:
        report = evaluate_sync(s, labels, budgets=(512,))
    assert report.missing_evidence == 1
    assert report.score("bm25", 512).recall == 0.5 and report.score("bm25", 512).all_evidence == 0.0


def test_every_system_is_averaged_over_every_label(store_and_labels: tuple[Path, Path]) -> None:
    # A query without direction for the embedder, and a scope that holds no memories: each
    # system still answers every label, so a report's mean is the mean of its labels'.
    db, _ = store_and_labels
    labels = [
        Label("What did Sam say about the kayak?", frozenset({"fact1"}), ORG, AGENT),
        Label("???", frozenset({"fact2"}), ORG, AGENT),
        Label("What did Sam say about the kayak?", frozenset({"fact1"}), "no-such-org", AGENT),
    ]
    with SqliteMemoryStore(str(db), embedder=HashingEmbedder(64)) as s:
        together = evaluate_sync(s, labels, budgets=(64, 512))
        alone = [evaluate_sync(s, [label], budgets=(64, 512)) for label in labels]
    assert {(x.system, x.budget) for x in together.scores} == {(name, b) for name in SYSTEMS for b in (64, 512)}
    for x in together.scores:
        per_label = [r.score(x.system, x.budget) for r in alone]
        assert x.recall == pytest.approx(sum(p.recall for p in per_label) / len(labels))
        assert x.all_evidence == pytest.approx(sum(p.all_evidence for p in per_label) / len(labels))
        assert x.spent == pytest.approx(sum(p.spent for p in per_label) / len(labels))
    assert together.score("dense", 512).recall <= 2 / 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 1: invalid JSON: Expecting value"),
        ('{"query": "x", "evidence": ["a"], "id": 1' + "0" * 5000 + "}", "line 1: invalid JSON: a number is too long"),
        ("[" * 100_000 + "]" * 100_000, "line 1: invalid JSON: nested too deeply"),
        ('{"query": "x"}', "evidence must be a non-empty list"),
        ('{"query": "", "evidence": ["a"]}', "query must be a non-empty string"),
        ('{"query": "x", "evidence": ["a"], "answer": 1}', "unknown keys ['answer']"),
        ("[1, 2]", "a label must be a JSON object"),
    ],
)
def test_bad_label_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(LabelError, match="line 1") as err:
        read_labels(path, organization_id=ORG, agent_id=AGENT)
    assert message in str(err.value)


def test_a_query_may_hold_unicode_line_separators(tmp_path: Path) -> None:
    # JSON writes U+2028, U+2029 and U+0085 unescaped (ensure_ascii=False): they are text.
    query = "refund\u2028policy\u2029for\x85shoes"
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"query": query, "evidence": ["a"]}, ensure_ascii=False) + "\n", encoding="utf-8")
    labels = read_labels(path, organization_id=ORG, agent_id=AGENT)
    assert [(x.query, x.evidence) for x in labels] == [(query, frozenset({"a"}))]


def test_a_label_needs_a_scope(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text('{"query": "x", "evidence": ["a"]}\n', encoding="utf-8")
    with pytest.raises(LabelError, match="organization_id must be a non-empty string"):
        read_labels(path)


def test_budgets_and_stores_are_checked(store_and_labels: tuple[Path, Path]) -> None:
    db, path = store_and_labels
    labels = read_labels(path, organization_id=ORG, agent_id=AGENT)
    with SqliteMemoryStore(str(db)) as s:
        with pytest.raises(ConfigError, match="budgets must be positive ints"):
            evaluate_sync(s, labels, budgets=(0,))
    with pytest.raises(ConfigError, match="cannot list a scope's memories"):
        evaluate_sync(object(), labels)


def test_budgets_are_the_distinct_spends_and_labels_must_be_labels(store_and_labels: tuple[Path, Path]) -> None:
    import numpy as np

    db, path = store_and_labels
    labels = read_labels(path, organization_id=ORG, agent_id=AGENT)[:2]
    with SqliteMemoryStore(str(db), embedder=HashingEmbedder(64)) as s:
        report = evaluate_sync(s, labels, budgets=(256, np.int64(64), 256))
        assert report.budgets == (64, 256)
        assert sorted((x.system, x.budget) for x in report.scores) == sorted(
            (name, b) for name in SYSTEMS for b in (64, 256)
        )
        assert report.table().splitlines()[0].split()[1:] == ["64", "tokens", "256", "tokens"]
        with pytest.raises(TypeError, match=r"labels\[1\] must be a Label"):
            evaluate_sync(s, [labels[0], {"query": "x", "evidence": ["fact1"]}], budgets=(64,))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).with_name("ctxcore")
    exe = str(beside) if beside.exists() else shutil.which("ctxcore")
    assert exe is not None, "the ctxcore entry point is not installed"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_cli_reports_json_and_draws_the_plot(store_and_labels: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    db, path = store_and_labels
    plot = tmp_path / "recall.png"
    out = run(
        "eval",
        "--db",
        str(db),
        "--labels",
        str(path),
        "--org",
        ORG,
        "--agent",
        AGENT,
        "--budget",
        "256,64",
        "--json",
        "--plot",
        str(plot),
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["budgets"] == [64, 256] and doc["labels"] == len(THINGS)
    assert {s["system"] for s in doc["scores"]} == set(SYSTEMS)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = run("eval", "--db", str(db), "--labels", str(path), "--org", ORG, "--agent", AGENT, "--budget", "256")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:2] == ["system", "256"]


def test_cli_names_a_bad_labels_file(store_and_labels: tuple[Path, Path], tmp_path: Path) -> None:
    db, _ = store_and_labels
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "x", "evidence": []}\n', encoding="utf-8")
    out = run("eval", "--db", str(db), "--labels", str(bad), "--org", ORG, "--agent", AGENT)
    assert out.returncode == 1
    assert "bad.jsonl: line 1: evidence must be a non-empty list" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("eval", "--db", str(db), "--labels", str(bad), "--budget", "0")
    assert out.returncode == 2 and "budgets must be positive" in out.stderr
