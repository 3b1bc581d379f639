"""The `ctxcore` command line, run as a subprocess of the installed entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "candidates.jsonl"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # The entry point installed beside this interpreter (the venv under test), else PATH.
    beside = Path(sys.executable).with_name("ctxcore")
    exe = str(beside) if beside.exists() else shutil.which("ctxcore")
    assert exe is not None, "the ctxcore entry point is not installed"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def test_pack_example_as_json() -> None:
    out = run("pack", str(EXAMPLE), "--budget", "1200", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    tokens = {r["id"]: r["tokens"] for r in rows}
    assert sum(tokens[i] for i in doc["selected"]) == doc["record"]["tokens_used"] <= 1200
    assert doc["record"]["evaluated"] == len(rows) == len(doc["decisions"])
    pinned = [r["id"] for r in rows if r.get("pinned")]
    assert doc["selected"][: len(pinned)] == sorted(pinned, key=lambda i: -next(r["score"] for r in rows if r["id"] == i))
    assert {d["reason"] for d in doc["decisions"]} <= {"selected", "pinned", "budget_exhausted", "pinned_over_budget", "non_positive_score"}


def test_pack_example_as_tables() -> None:
    out = run("pack", str(EXAMPLE), "--budget", "1200")
    assert out.returncode == 0, out.stderr
    assert "selected" in out.stdout and "left out" in out.stdout and "truncated" in out.stdout


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"id": "a", "tokens": 1, "score": 1}\n{"id": "b", "tokens": -4, "score": 1}\n', ":2: candidate 'b' (index 1): tokens must be >= 0"),
        ('{"id": "a", "tokens": 1, "score": 1}\nnot json\n', ":2: invalid JSON"),
        ('[1, 2]\n', ":1: expected a JSON object"),
        ('{"id": "a", "tokens": 1, "score": 1}\n\n{"id": "a", "tokens": 2, "score": 1}\n', ":3: candidate 'a' (index 1): duplicate id"),
    ],
)
def test_bad_files_name_the_line(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    out = run("pack", str(path), "--budget", "10")
    assert out.returncode == 2
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_file(tmp_path: Path) -> None:
    out = run("pack", str(tmp_path / "nope.jsonl"), "--budget", "10")
    assert out.returncode == 2 and "cannot read" in out.stderr


def test_demo_assembles_from_the_shipped_dataset(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    out = run("demo", "--db", str(db), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["selected"] and doc["pack"]["tokens_used"] <= doc["budget"]["usable"]
    assert [b["branch"] for b in doc["branches"]] == ["directive", "hot", "cold"]
    assert len(doc["trace"]) >= len(doc["selected"])
    assert doc["nonce"] in doc["text"] and "<memories>" in doc["text"]
    # the same store, through `ctxcore assemble`, as text and tables
    again = run("assemble", "--db", str(db), "--model", "gpt-4o", "--org", "acme-retail", "--agent", "support",
                "--query", "refund for shoes")
    assert again.returncode == 0, again.stderr
    assert "budget (gpt-4o" in again.stdout and "branches" in again.stdout and "trace" in again.stdout


def test_assemble_names_what_is_missing(tmp_path: Path) -> None:
    out = run("assemble", "--db", str(tmp_path / "none.db"), "--model", "gpt-4o", "--org", "o", "--agent", "a",
              "--query", "q")
    assert out.returncode == 2 and "no database" in out.stderr
    db = tmp_path / "demo.db"
    assert run("demo", "--db", str(db), "--json").returncode == 0
    out = run("assemble", "--db", str(db), "--model", "gpt-99", "--org", "o", "--agent", "a", "--query", "q")
    assert out.returncode == 2 and "gpt-99" in out.stderr and "Traceback" not in out.stderr
