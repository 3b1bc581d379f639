"""``ctxcore bench`` and ``ctxcore assemble --plot`` from the installed package, run as a
user runs them (the console script, in an empty directory); the shipped workloads.

Exit statuses are checked with bounds that cannot fail (seconds per call) or cannot hold
(a nanosecond), never with a realistic latency: tests do not assert wall time.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from PIL import Image

import ctxcore
from ctxcore.benchmarking import WorkloadError, load_workload, read_candidates, workload_names
from ctxcore.benchmarking.command import report_schema
from ctxcore.benchmarking.workloads import generate
from ctxcore.stores import SqliteMemoryStore, load_demo

CTXCORE = shutil.which("ctxcore", path=str(Path(sys.executable).parent)) or "ctxcore"
FAST = ["--rounds", "100", "--warmup", "2", "--reference-rounds", "3"]


def bench(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTXCORE, "bench", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def validate(doc: Any) -> None:
    jsonschema.Draft202012Validator(report_schema()).validate(doc)


def test_the_schema_is_a_valid_json_schema_and_ctxcore_bench_prints_it(tmp_path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(report_schema())
    proc = bench(tmp_path, "--schema")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == report_schema()


def test_every_stage_passes_generous_gates_and_the_json_has_the_documented_shape(tmp_path: Path) -> None:
    proc = bench(tmp_path, "--json", "--p99-ms", "5000", "--max-ratio", "1000", *FAST)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["passed"] is True
    assert list(doc["stages"]) == ["pack", "format", "assemble"]
    for st in doc["stages"].values():
        assert st["rounds"] == 100
        assert st["min_ms"] <= st["p50_ms"] <= st["p90_ms"] <= st["p99_ms"] <= st["max_ms"]
        assert [(g["gate"], g["bound"], g["passed"]) for g in st["gates"]] == [
            ("p99", 5000.0, True),
            ("ratio", 1000.0, True),
        ]
        assert st["reference"]["rounds"] == 3
    assert doc["stages"]["pack"]["workload"] == {"name": "pack-memory", "candidates": 1000, "budget": 8000}
    assert doc["stages"]["pack"]["reference"]["name"] == "numpy DP"
    assert doc["stages"]["format"]["reference"]["name"] == "markupsafe.escape"
    assert doc["stages"]["assemble"]["reference"]["name"] == "pack_arrays alone"


def test_an_impossible_gate_fails_with_exit_1_and_is_named(tmp_path: Path) -> None:
    proc = bench(tmp_path, "--stage", "pack", "--p99-ms", "0.000001", "--no-reference", *FAST)
    assert proc.returncode == 1, proc.stderr
    assert "FAIL  pack p99" in proc.stdout and "> 1e-06 ms" in proc.stdout
    assert "1 of 1 gates FAILED" in proc.stdout
    as_json = bench(tmp_path, "--stage", "pack", "--median-ms", "0.000001", "--no-reference", "--json", *FAST)
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    validate(doc)
    assert doc["passed"] is False
    assert doc["stages"]["pack"]["gates"] == [
        {"gate": "median", "value": doc["stages"]["pack"]["p50_ms"], "bound": 1e-6, "unit": "ms", "passed": False}
    ]


def test_text_output_has_percentiles_per_stage_and_a_line_per_gate(tmp_path: Path) -> None:
    proc = bench(tmp_path, "--stage", "format", "--max-ratio", "1000", "--median-ms", "60000", *FAST)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("stage"))
    assert header.split() == ["stage", "workload", "rounds", "p50", "ms", "p90", "ms", "p99", "ms", "max", "ms"]
    assert any(line.startswith("format    format-prose") for line in lines)
    assert "PASS  format median " in proc.stdout
    assert "PASS  format median ratio " in proc.stdout and "of markupsafe.escape's median <= 1000x" in proc.stdout
    assert lines[-1] == "all 2 gates passed"


def test_users_candidates_run_through_every_stage(tmp_path: Path) -> None:
    rows = [
        {
            "id": f"c{i}",
            "text": f"memory number {i} about refunds & <returns> " * (1 + i % 7),
            "similarity": 0.3 + (i % 10) / 15,
            "confidence": 0.5,
        }
        for i in range(300)
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    proc = bench(
        tmp_path, "--candidates", str(path), "--budget", "2000", "--model", "gpt-4", "--json", "--p99-ms", "5000", *FAST
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert {st["workload"]["name"] for st in doc["stages"].values()} == {str(path)}
    assert doc["stages"]["pack"]["workload"]["budget"] == 2000
    assert doc["stages"]["assemble"]["workload"]["model"] == "gpt-4"


def test_bench_against_a_memory_store(tmp_path: Path) -> None:
    from ctxcore.stores import load_demo

    db = tmp_path / "demo.db"
    load_demo(db).close()
    proc = bench(
        tmp_path,
        "--stage",
        "assemble",
        "--db",
        str(db),
        "--org",
        "acme-retail",
        "--agent",
        "support",
        "--query",
        "refund for shoes",
        "--json",
        *FAST,
    )
    assert proc.returncode in (0, 1), proc.stderr  # the default 45 ms gate is a latency: either verdict is valid
    doc = json.loads(proc.stdout)
    validate(doc)
    st = doc["stages"]["assemble"]
    assert st["workload"]["name"] == "store" and st["workload"]["organization_id"] == "acme-retail"
    assert [g["gate"] for g in st["gates"]] == ["p99"] and st["gates"][0]["bound"] == 45.0
    assert doc["passed"] is st["gates"][0]["passed"] and (proc.returncode == 0) is doc["passed"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stage", "unpack"], "invalid choice: 'unpack'"),
        (["--stage", "pack", "--p99-ms", "5", "--rounds", "20"], "a p99 bound needs at least 100 rounds"),
        (["--stage", "pack", "--p99-ms", "-1"], "p99_ms must be a positive finite number"),
        (["--stage", "pack", "--rounds", str(10**20)], "rounds must be at most 10,000,000"),
        (["--stage", "pack", "--reference-rounds", str(10**8)], "reference_rounds must be at most 10,000,000"),
        (["--stage", "pack", "--max-ratio", "2", "--no-reference"], "--max-ratio needs the references"),
        (["--stage", "pack", "--workload", "format-prose"], "not a pack workload"),
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--stage", "assemble", "--db", "x.db"], "--db needs --org and --agent"),
        (["--plot", "out.gif"], "must end in .png, .svg, .pdf"),
    ],
)
def test_usage_errors_exit_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    proc = bench(tmp_path, *args)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr
    # argparse's own errors come after the usage; every other one is the command's one line
    assert proc.stderr.startswith(("usage: ", "ctxcore: error: ")), proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model", "--stage", "pack"], "--model: unknown model 'no-such-model'"),
        (["--stage", "assemble", "--db", "missing.db", "--org", "o", "--agent", "a"], "no database at missing.db"),
        (["--candidates", "absent.jsonl"], "cannot read absent.jsonl"),
        (["--stage", "assemble", "--db", "not-a-store.db", "--org", "o", "--agent", "a"], "not-a-store.db"),
    ],
)
def test_bad_data_exits_1_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "not-a-store.db").write_text("my notes\n")
    proc = bench(tmp_path, *args)
    assert proc.returncode == 1, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxcore: error: ") and message in lines[0], proc.stderr


def test_candidates_from_stdin(tmp_path: Path) -> None:
    rows = "".join(f'{{"id": "c{i}", "tokens": {10 + i}, "score": {1 / (i + 1)}}}\n' for i in range(40))
    proc = subprocess.run(
        [CTXCORE, "bench", "--stage", "pack", "--candidates", "-", "--rounds", "100", "--no-reference", "--json"],
        input=rows,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr  # a latency gate: either verdict is valid
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["stages"]["pack"]["workload"]["candidates"] == 40


def test_a_store_whose_assemblies_retrieve_nothing_fails(tmp_path: Path) -> None:
    """Against a scope without memories, or a store whose cold branch fails on every call,
    the times are not of a working assembly: the report says so and the run fails."""
    import sqlite3

    demo = tmp_path / "demo.db"
    load_demo(demo).close()
    proc = bench(
        tmp_path,
        "--stage",
        "assemble",
        "--db",
        str(demo),
        "--org",
        "nobody",
        "--agent",
        "a",
        "--rounds",
        "100",
        "--no-reference",
        "--json",
    )
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["passed"] is False and doc["stages"]["assemble"]["workload"]["memories"] == 0
    assert "holds no memories" in doc["problems"][0] and "holds no memories" in proc.stderr

    broken = tmp_path / "broken.db"
    with SqliteMemoryStore(broken) as store:  # no embedder: 2-dimensional embeddings are the store's own
        store.add({"id": "x", "organization_id": "o", "agent_id": "a", "text": "cache ttl", "embedding": [1, 2]})
    with sqlite3.connect(broken) as conn:  # a recorded embedder of another dimension: every cold read fails
        conn.execute("INSERT INTO meta VALUES ('embedder', 'hashing-v1/dim=256/seed=0')")
    proc = bench(
        tmp_path,
        "--stage",
        "assemble",
        "--db",
        str(broken),
        "--org",
        "o",
        "--agent",
        "a",
        "--rounds",
        "100",
        "--no-reference",
    )
    assert proc.returncode == 1
    assert re.search(r"degraded (\d+) of \1 assemblies \(cold_error\)", proc.stdout) and "FAILED" in proc.stdout
    assert "ctxcore: error: every timed assembly of o/a degraded (cold_error)" in proc.stderr


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "tokens": 5, "score": 1}', "not json"], "bad.jsonl:2: invalid JSON"),
        (
            ['{"id": "a", "tokens": 5, "score": 1}', '{"id": "a", "tokens": 6, "score": 1}'],
            "bad.jsonl:2: duplicate id 'a' (first at ",
        ),
        (['{"id": "a", "tokens": -5, "score": 1}'], "bad.jsonl:1: 'tokens' must be an integer >= 0"),
        (['{"id": "a", "tokens": 5, "score": NaN}'], "bad.jsonl:1: 'score' must be a finite number"),
        (['{"id": "a", "tokens": 5, "score": 1, "colour": "red"}'], "bad.jsonl:1: unknown field(s) colour"),
        (['{"id": "a", "score": 1}'], "a candidate needs 'tokens' or 'text'"),
        (['{"id": "a", "tokens": 5, "score": 1, "pinned": 1}'], "bad.jsonl:1: 'pinned' must be true or false"),
        (['{"id": "a", "tokens": 5, "score": 1, "source": 7}'], "bad.jsonl:1: 'source' must be a string"),
    ],
)
def test_bad_candidates_name_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=None) as info:
        read_candidates(path)
    assert message in str(info.value)
    proc = bench(tmp_path, "--candidates", str(path), "--stage", "pack")
    assert proc.returncode == 1 and proc.stderr.startswith("ctxcore: error: ") and message in proc.stderr


def test_pinned_candidates_are_timed_pinned(tmp_path: Path) -> None:
    from ctxcore import Reason
    from ctxcore.benchmarking.stages import assemble_stage, format_stage, pack_stage

    path = tmp_path / "pinned.jsonl"
    lines = [
        '{"id": "guard", "text": "Never share card numbers.", "tokens": 90, "score": 0.1, "pinned": true,'
        ' "source": "policy"}',
        '{"id": "a", "text": "Refunds take five days.", "tokens": 60, "score": 0.9}',
        '{"id": "b", "text": "Refunds go to the card.", "tokens": 60, "score": 0.8, "pinned": false}',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cs = read_candidates(path)
    assert cs.pinned is not None and cs.pinned.tolist() == [True, False, False]
    packed = pack_stage(cs, 160, family="cl100k_base", reference=False).call()
    assert isinstance(packed, ctxcore.PackResult)
    assert packed.ids == ("guard", "a") and packed.decisions[0].reason is Reason.PINNED
    assert [m.get("source") for m in cs.memories()] == ["policy", None, None]
    assert format_stage(cs, reference=False).call() is not None
    with assemble_stage(cs, model="gpt-4o", reference=False) as subject:
        ctx = subject.call()
    assert isinstance(ctx, ctxcore.AssembledContext) and ctx.selected_ids[0] == "guard"


def test_a_packing_only_set_cannot_be_formatted(tmp_path: Path) -> None:
    path = tmp_path / "costs.jsonl"
    path.write_text('{"id": "a", "tokens": 5, "score": 1}\n', encoding="utf-8")
    proc = bench(tmp_path, "--candidates", str(path), "--stage", "format")
    assert proc.returncode == 1
    assert "the format stage needs a text on every candidate" in proc.stderr


def test_plot_png_opens_as_an_image(tmp_path: Path) -> None:
    out = tmp_path / "gates.png"
    proc = bench(tmp_path, "--stage", "pack", "--p99-ms", "5000", "--plot", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 10_000
    with Image.open(out) as im:
        im.verify()
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 600 and im.size[1] > 200
        pixels = np.asarray(im.convert("L"))
    assert pixels.std() > 10  # drawn on, not blank


def test_plot_svg_parses_as_xml_with_both_panels_per_stage(tmp_path: Path) -> None:
    out = tmp_path / "gates.svg"
    proc = bench(tmp_path, "--stage", "all", "--p99-ms", "5000", "--json", "--plot", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plot"] == str(out)
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    text = out.read_text(encoding="utf-8")
    # matplotlib writes each axes as a group with an id axes_N: two per stage.
    assert sum(1 for el in root.iter() if el.get("id", "").startswith("axes_")) == 6, text[:300]


def test_assemble_plot_draws_the_budget_as_a_stacked_bar(tmp_path: Path) -> None:
    from ctxcore.stores import load_demo

    db = tmp_path / "demo.db"
    load_demo(db).close()
    png, svg = tmp_path / "budget.png", tmp_path / "budget.svg"
    for out in (png, svg):
        proc = subprocess.run(
            [
                CTXCORE,
                "assemble",
                "--db",
                str(db),
                "--model",
                "gpt-4o",
                "--org",
                "acme-retail",
                "--agent",
                "support",
                "--query",
                "refund for shoes",
                "--json",
                "--plot",
                str(out),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
    with Image.open(png) as im:
        im.verify()
    rec = json.loads(proc.stdout)
    b = rec["budget"]
    labels = ET.parse(svg).getroot().itertext()
    joined = " ".join(labels)
    # Every segment is in the legend with its tokens, memories and unused from the pack.
    used = rec["pack"]["tokens_used"] if rec["pack"] else 0
    for label, tokens in [
        ("response reserve", b["response_reserve"]),
        ("safety buffer", b["safety_buffer"]),
        ("directive", b["directive_tokens"]),
        ("messages", b["messages_tokens"]),
        ("tools", b["tool_schema_tokens"]),
        ("formatting", b["formatter_overhead_tokens"]),
        ("memories", used),
        ("unused", b["usable"] - used),
    ]:
        assert f"{label}: {tokens:,}" in joined, (label, tokens)
    bad = subprocess.run(
        [
            CTXCORE,
            "assemble",
            "--db",
            str(db),
            "--model",
            "gpt-4o",
            "--org",
            "acme-retail",
            "--agent",
            "support",
            "--query",
            "q",
            "--plot",
            str(tmp_path / "b.bmp"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "must end in .png, .svg, .pdf" in bad.stderr


def test_budget_segments_add_up_to_the_window() -> None:
    import ctxcore
    from ctxcore.benchmarking.plots import budget_segments

    b = ctxcore.compute_budget(
        "gpt-4o", directive_tokens=300, messages_tokens=900, tool_schema_tokens=400, formatter_overhead_tokens=50
    )
    parts = dict(budget_segments(b, 5000))
    assert sum(parts.values()) == b.context_window
    assert parts["memories"] == 5000 and parts["unused"] == b.usable - 5000


def test_shipped_workloads_are_what_their_generators_make() -> None:
    assert workload_names("pack")[0] == "pack-memory"
    for name in workload_names():
        shipped = load_workload(name)
        rows = generate(name)
        assert shipped.ids == [r["id"] for r in rows], name
        if shipped.tokens is not None:
            assert shipped.tokens.tolist() == [r["tokens"] for r in rows], name
        if shipped.texts is not None:
            assert shipped.texts == [r["text"] for r in rows], name


def test_shipped_pack_families_have_their_shapes() -> None:
    import ctxcore
    from ctxcore.benchmarking import numpy_dp

    memory = load_workload("pack-memory")
    assert memory.tokens is not None and 80 <= float(np.median(memory.tokens)) <= 120
    skewed = load_workload("pack-skewed")
    assert skewed.tokens is not None and skewed.scores is not None and skewed.budget == 30000
    # The family where a score-descending greedy loses: the packer stays near the optimum.
    best = numpy_dp(skewed.tokens, skewed.scores, skewed.budget)
    res = ctxcore.pack_arrays(skewed.ids, skewed.tokens, skewed.scores, skewed.budget)
    assert res.total_score >= 0.999 * best
    room, greedy = skewed.budget, 0.0
    for i in np.argsort(-skewed.scores, kind="stable"):
        if skewed.tokens[i] <= room:
            room -= int(skewed.tokens[i])
            greedy += float(skewed.scores[i])
    assert greedy <= 0.6 * best


def test_gate_bounds_and_rounds_take_numbers_of_any_type() -> None:
    from ctxcore.benchmarking.gates import MAX_ROUNDS, GateKind, GateUsageError, check_rounds, make_gates

    gates = make_gates(p99_ms=np.float32(5.0), median_ms=np.int64(2), max_ratio=np.float64(0.5))
    assert [(g.kind, g.bound) for g in gates] == [(GateKind.P99, 5.0), (GateKind.MEDIAN, 2.0), (GateKind.RATIO, 0.5)]
    assert all(type(g.bound) is float for g in gates)
    check_rounds(np.int64(100), np.int32(0), gates, np.uint8(11))
    with pytest.raises(GateUsageError, match="a p99 bound needs at least 100 rounds"):
        check_rounds(np.int64(99), 0, gates)
    with pytest.raises(GateUsageError, match="p99_ms must be a positive finite number"):
        make_gates(p99_ms=10**400)
    with pytest.raises(GateUsageError, match="rounds must be an integer >= 1"):
        check_rounds(100.0, 0, ())
    check_rounds(np.int64(MAX_ROUNDS), 0, gates, MAX_ROUNDS)
    with pytest.raises(GateUsageError, match="^rounds must be at most 10,000,000, got 10000001$"):
        check_rounds(MAX_ROUNDS + 1, 0, gates)


def test_a_budget_beyond_every_candidate_is_gated_without_a_huge_reference(tmp_path: Path) -> None:
    from ctxcore.benchmarking.references import numpy_bucket_dp, numpy_dp, numpy_mckp

    # Past the candidates' total weight the optimum is all of them: the DP row stops there.
    assert numpy_dp([5, 7, 3], [1.0, 2.0, -1.0], 10**15) == 3.0
    assert numpy_mckp([5, 7, 3], [1.0, 2.0, 4.0], [0, 0, -1], 10**15) == 6.0
    assert numpy_bucket_dp([5, 7], [1.0, 2.0], 10**15) == 3.0
    proc = bench(tmp_path, "--stage", "pack", "--budget", str(10**12), "--p99-ms", "5000", "--max-ratio", "100", *FAST)
    assert proc.returncode == 0, proc.stderr
    # Candidates that weigh 2**40 together would still need a row of 2**40 cells: refused by name.
    path = tmp_path / "heavy.jsonl"
    path.write_text('{"id": "a", "tokens": 1099511627776, "score": 1}\n{"id": "b", "tokens": 5, "score": 1}\n')
    proc = bench(tmp_path, "--stage", "pack", "--candidates", str(path), "--budget", str(2 * 10**12), *FAST)
    assert proc.returncode == 2 and proc.stderr.startswith("ctxcore: error: the numpy DP reference needs a row")
    assert "--no-reference" in proc.stderr and "Traceback" not in proc.stderr
    proc = bench(
        tmp_path, "--stage", "pack", "--candidates", str(path), "--budget", str(2 * 10**12), "--no-reference", *FAST
    )
    assert proc.returncode == 0, proc.stderr
