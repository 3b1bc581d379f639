"""The pytest plugin from the installed package, as a user runs it: a test file in an empty
directory, pytest in a subprocess (the plugin loads through its ``pytest11`` entry point).

These tests check what the gates decide, not how fast anything is: the passing bounds are
hundreds of times the measured latencies, and the failing ones cannot be met (a p99 of
a nanosecond, a packer that sleeps longer than its median bound).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

USER_TESTS = """
import os
import time

import pytest

import ctxcore
from ctxcore.benchmarking import load_workload

IDS, TOKENS, SCORES = load_workload("pack-memory").pack_columns("o200k_base")


def slowed(*args, **kwargs):
    time.sleep(0.03)
    return ctxcore.pack_arrays(*args, **kwargs)


PACKER = slowed if os.environ.get("SLOW_PACKER") else ctxcore.pack_arrays


@pytest.mark.ctxcore_gate(p99_ms=2000, median_ms=500, rounds=100)
def test_pack_generous(ctxcore_gate):
    gated = ctxcore_gate.pack_arrays(IDS, TOKENS, SCORES, 8000, packer=PACKER, max_ratio=50)
    assert gated.value.tokens_used <= 8000
"""

MORE_TESTS = """

@pytest.mark.ctxcore_gate(rounds=100)
def test_pack_impossible(ctxcore_gate):
    ctxcore_gate.pack_arrays(IDS, TOKENS, SCORES, 8000, p99_ms=1e-6, reference=None)


def test_pack_slowed_packer(ctxcore_gate):
    # Sleeps 30 ms a call, so a 15 ms median bound cannot hold; the real packer's median
    # is about 1 ms.
    ctxcore_gate.pack_arrays(IDS, TOKENS, SCORES, 8000, packer=slowed, median_ms=15, rounds=100, reference=None)


def test_pack_real_packer_same_bound(ctxcore_gate):
    ctxcore_gate.pack_arrays(IDS, TOKENS, SCORES, 8000, median_ms=15, rounds=100, reference=None)


def test_ratio_impossible(ctxcore_gate):
    ctxcore_gate.pack(
        [ctxcore.Candidate(i, int(t), float(s)) for i, t, s in zip(IDS, TOKENS, SCORES)], 8000,
        max_ratio=1e-9, rounds=20, reference_rounds=3)


def test_format_generous(ctxcore_gate):
    memories = load_workload("format-prose").memories()[:500]
    gated = ctxcore_gate.format_context(memories=memories, max_ratio=100, median_ms=5000, rounds=30)
    assert gated.value.text.count("<memory ") == 500


def test_assemble_generous(ctxcore_gate):
    records = load_workload("assemble-support").records("org", "agent")

    async def hot(scope, query, limit):
        return records

    request = ctxcore.AssemblyRequest("org", "agent", "gpt-4o", ctxcore.Query("refund"),
                                      options=ctxcore.AssemblyOptions(max_memories=1000))
    gated = ctxcore_gate.assemble(request, sources=ctxcore.Sources(hot=hot), p99_ms=5000, max_ratio=1000,
                                  rounds=100)
    assert gated.value.selected_ids


def test_too_few_rounds_for_a_p99(ctxcore_gate):
    ctxcore_gate.pack_arrays(IDS, TOKENS, SCORES, 8000, p99_ms=10, rounds=20)


@pytest.mark.ctxcore_gate(p95_ms=3)
def test_unknown_marker_setting(ctxcore_gate):
    ctxcore_gate.pack_arrays(IDS, TOKENS, SCORES, 8000)


def test_plain():
    assert sum(range(4)) == 6
"""


def _env(**extra: str) -> dict[str, str]:
    # A user's own pytest run: none of this run's settings, nor pytest-xdist's worker
    # variables (pytest-benchmark turns itself off inside an xdist worker).
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTHONPATH", "PYTEST_PLUGINS")
        and not k.startswith("PYTEST_XDIST")
    }
    env["COLUMNS"] = "1000"  # whole lines in the short summary
    env.update(extra)
    return env


def _pytest(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--strict-markers", "-rA", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _outcomes(out: str) -> dict[str, str]:
    """``{test name: PASSED/FAILED/SKIPPED/ERROR}`` from the ``-rA`` short summary."""
    res = {}
    for line in out.splitlines():
        for word in ("PASSED", "FAILED", "ERROR", "SKIPPED"):
            if line.startswith(word + " ") and "::" in line:
                res[line.split("::", 1)[1].split(" ")[0]] = word
    return res


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS + MORE_TESTS), encoding="utf-8")
    return tmp_path


def test_the_plugin_is_a_pytest11_entry_point() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert eps.get("ctxcore") == "ctxcore_pytest"


def test_a_session_without_gates_imports_neither_ctxcore_nor_numpy(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        textwrap.dedent("""
        import sys

        def test_nothing_heavy_is_loaded():
            loaded = {m for m in sys.modules if m.split(".")[0] in ("ctxcore", "numpy")}
            assert not loaded, sorted(loaded)
    """),
        encoding="utf-8",
    )
    proc = _pytest(tmp_path, "test_plain.py")
    out = proc.stdout + proc.stderr
    assert _outcomes(out) == {"test_nothing_heavy_is_loaded": "PASSED"}, out
    # The marker is still described, from the light module.
    markers = _pytest(tmp_path, "--markers")
    assert "ctxcore_gate(p99_ms=None" in markers.stdout


def test_gates_pass_on_generous_bounds_and_fail_on_impossible_ones(user_dir: Path) -> None:
    proc = _pytest(user_dir, "test_user.py", "--benchmark-json=bench.json")
    out = proc.stdout + proc.stderr
    outcomes = _outcomes(out)
    assert proc.returncode == 1, out
    assert outcomes == {
        "test_pack_generous": "PASSED",
        "test_pack_impossible": "FAILED",
        "test_pack_slowed_packer": "FAILED",
        "test_pack_real_packer_same_bound": "PASSED",
        "test_ratio_impossible": "FAILED",
        "test_format_generous": "PASSED",
        "test_assemble_generous": "PASSED",
        "test_too_few_rounds_for_a_p99": "FAILED",
        "test_unknown_marker_setting": "FAILED",
        "test_plain": "PASSED",
    }, out
    # The failing gate is named, with the measured value against its bound.
    summary = {line.split("::", 1)[1].split(" ")[0]: line for line in out.splitlines() if line.startswith("FAILED ")}
    assert "LatencyGateFailed: ctxcore latency gate failed: FAIL  pack p99" in summary["test_pack_impossible"]
    assert "FAIL  pack median" in summary["test_pack_slowed_packer"] and "> 15 ms" in summary["test_pack_slowed_packer"]
    assert "FAIL  pack median ratio" in summary["test_ratio_impossible"]
    assert "of numpy DP's median > 1e-09x" in summary["test_ratio_impossible"]
    assert "a p99 bound needs at least 100 rounds" in summary["test_too_few_rounds_for_a_p99"]
    assert "has no p95_ms" in summary["test_unknown_marker_setting"]
    # The gates' section of the terminal summary, and pytest-benchmark's own table.
    assert "ctxcore latency gates" in out
    assert "PASS  assemble p99" in out and "FAIL  pack p99" in out
    assert "benchmark 'ctxcore gate: pack'" in out

    # pytest-benchmark's JSON carries the percentiles and the verdicts in extra_info.
    doc = json.loads((user_dir / "bench.json").read_text())
    by_name = {b["name"]: b for b in doc["benchmarks"]}
    gate = by_name["test_pack_generous"]["extra_info"]["ctxcore_gate"]
    assert gate["stage"] == "pack" and gate["rounds"] == 100 == by_name["test_pack_generous"]["stats"]["rounds"]
    assert gate["min_ms"] <= gate["p50_ms"] <= gate["p90_ms"] <= gate["p99_ms"] <= gate["max_ms"]
    assert abs(gate["p50_ms"] - by_name["test_pack_generous"]["stats"]["median"] * 1e3) < 1e-3
    assert [g["gate"] for g in gate["gates"]] == ["p99", "median", "ratio"]
    assert all(g["passed"] for g in gate["gates"])
    assert gate["reference"]["name"] == "numpy DP" and gate["reference"]["rounds"] == 11
    failed = by_name["test_pack_impossible"]["extra_info"]["ctxcore_gate"]
    assert failed["passed"] is False and failed["gates"][0]["gate"] == "p99"
    assemble = by_name["test_assemble_generous"]["extra_info"]["ctxcore_gate"]
    assert assemble["reference"]["name"] == "pack_arrays alone"


def test_iterators_are_packed_whole_in_every_round(tmp_path: Path) -> None:
    (tmp_path / "test_iter.py").write_text(
        textwrap.dedent("""
        import ctxcore

        def test_pack_a_generator(ctxcore_gate):
            cands = (ctxcore.Candidate(f"c{i}", 10, 1.0) for i in range(5))
            gated = ctxcore_gate.pack(cands, 100, rounds=20)
            assert gated.value.ids == ("c0", "c1", "c2", "c3", "c4")

        def test_pack_arrays_with_an_iterator_of_ids(ctxcore_gate):
            gated = ctxcore_gate.pack_arrays(iter(["a", "b"]), [10, 10], [1.0, 2.0], 15, rounds=20)
            assert gated.value.ids == ("b",)

        def test_format_a_generator_of_memories(ctxcore_gate):
            memories = ({"id": f"m{i}", "text": f"memory {i}"} for i in range(3))
            gated = ctxcore_gate.format_context(memories=memories, rounds=20)
            assert gated.value.text.count("</memory>") == 3
    """),
        encoding="utf-8",
    )
    proc = _pytest(tmp_path, "test_iter.py")
    out = proc.stdout + proc.stderr
    assert _outcomes(out) == {
        "test_pack_a_generator": "PASSED",
        "test_pack_arrays_with_an_iterator_of_ids": "PASSED",
        "test_format_a_generator_of_memories": "PASSED",
    }, out


def test_skipped_with_a_reason_under_benchmark_disable(user_dir: Path) -> None:
    proc = _pytest(user_dir, "test_user.py::test_pack_generous", "test_user.py::test_plain", "--benchmark-disable")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ctxcore latency gate (pack) not measured: benchmarks are disabled (--benchmark-disable)" in out
    assert "1 passed, 1 skipped" in out


def test_regression_against_a_saved_baseline(user_dir: Path) -> None:
    storage = f"file://{user_dir / 'baselines'}"
    base = _pytest(
        user_dir, "test_user.py::test_pack_generous", f"--benchmark-storage={storage}", "--benchmark-save=base"
    )
    assert base.returncode == 0, base.stdout + base.stderr
    # Compared with the baseline: the saved run shows in the table.
    same = _pytest(
        user_dir, "test_user.py::test_pack_generous", f"--benchmark-storage={storage}", "--benchmark-compare=0001"
    )
    assert same.returncode == 0, same.stdout + same.stderr
    assert "0001_base" in same.stdout
    # The slowed packer still meets the generous bounds of the gate itself, but is far
    # slower than the baseline: --benchmark-compare-fail fails the run.
    slow = _pytest(
        user_dir,
        "test_user.py::test_pack_generous",
        f"--benchmark-storage={storage}",
        "--benchmark-compare=0001",
        "--benchmark-compare-fail=median:200%",
        SLOW_PACKER="1",
    )
    out = slow.stdout + slow.stderr
    assert slow.returncode != 0, out
    assert "Performance has regressed" in out and "test_pack_generous" in out


def test_inert_for_tests_that_do_not_use_it(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert True\n", encoding="utf-8")
    with_plugin = _pytest(tmp_path, "test_plain.py")
    without = _pytest(tmp_path, "test_plain.py", "-p", "no:ctxcore")
    for proc in (with_plugin, without):
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 passed" in proc.stdout
    assert "ctxcore-" in with_plugin.stdout  # loaded ("plugins: ... ctxcore-<version>")
    assert "ctxcore latency gates" not in with_plugin.stdout
    assert "benchmark 'ctxcore gate" not in with_plugin.stdout


def test_loads_without_pytest_benchmark_and_says_what_is_missing(user_dir: Path) -> None:
    proc = _pytest(user_dir, "test_user.py::test_plain", "test_user.py::test_pack_generous", "-p", "no:benchmark")
    out = proc.stdout + proc.stderr
    assert _outcomes(out) == {"test_plain": "PASSED", "test_pack_generous": "ERROR"}, out
    assert "the ctxcore_gate fixture builds on pytest-benchmark" in out
    assert "pip install 'ctxcore-llm[bench]'" in out
