"""The examples and the README's code run as written, against the installed package.

Each file in examples/ runs as a subprocess with this interpreter (the venv's, where the
package and its test extras are installed) from an empty directory, so `import ctxcore`
finds the installed wheel; its output is checked for sense, not just for a zero exit. The
install line each example states names the published distribution. The README's Python
blocks run the same way, and its first two commands are the documented ones.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from testkit import REPO

EXAMPLES = REPO / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
README = REPO / "README.md"
#: An install line as the examples state it: the published name, optional extras, then
#: the other packages the example needs.
INSTALL = re.compile(r"pip install '?ctxcore-llm(\[[a-z0-9,-]+\])?'?((?: [A-Za-z0-9_.-]+)*);")


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _run_example(name: str, cwd: Path, *args: str) -> str:
    out = _run([sys.executable, str(EXAMPLES / name), *args], cwd)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return out.stdout


def test_every_example_is_tested() -> None:
    assert {p.name for p in SCRIPTS} == {
        "anthropic_payload.py",
        "assemble_demo.py",
        "openai_payload.py",
        "pack_candidates.py",
    }
    # Every data file in examples/ is read by one of them.
    for data in EXAMPLES.iterdir():
        if data.suffix != ".py" and data.is_file():
            assert any(data.name in p.read_text(encoding="utf-8") for p in SCRIPTS), data.name


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_each_example_states_the_published_install_line(path: Path) -> None:
    doc = path.read_text(encoding="utf-8")
    m = INSTALL.search(doc)
    assert m is not None, f"{path.name} states no `pip install ctxcore-llm...;` line"
    assert not re.search(r"pip install '?ctxcore(?![-\w])", doc), f"{path.name} installs the other PyPI package"
    assert f"python examples/{path.name}" in doc
    for package in m.group(2).split():
        module = {"anthropic": "anthropic", "openai": "openai"}.get(package, package.replace("-", "_"))
        __import__(module)  # what the line installs is what the example imports


def test_pack_candidates_prints_a_decision_per_candidate(tmp_path: Path) -> None:
    out = _run_example("pack_candidates.py", tmp_path, "800").splitlines()
    m = re.fullmatch(
        r"(\d+) of (\d+) candidates selected, (\d+) of 800 tokens, score ([0-9.]+) "
        r"\(bound ([0-9.]+)\), path (dp|greedy|trivial)",
        out[0],
    )
    assert m is not None, out[0]
    selected, evaluated, used = int(m[1]), int(m[2]), int(m[3])
    rows = (EXAMPLES / "candidates.jsonl").read_text(encoding="utf-8").splitlines()
    assert evaluated == len(rows) == len(out) - 1
    assert 0 < selected < evaluated and 0 < used <= 800
    assert float(m[4]) <= float(m[5]) + 1e-9
    reasons = [line.split()[1] for line in out[1:]]
    assert reasons.count("selected") + reasons.count("pinned") == selected
    assert set(reasons) <= {"selected", "pinned", "budget_exhausted", "non_positive_score"}


def test_assemble_demo_prints_a_context_and_its_record(tmp_path: Path) -> None:
    out = _run_example("assemble_demo.py", tmp_path)
    assert out.startswith("<directive>") and "<memories>" in out and "</memories>" in out
    m = re.search(r"window (\d+), usable for memories (\d+), prompt (\d+) tokens \(exact\), degraded: False", out)
    assert m is not None, out[-800:]
    assert int(m[3]) <= 2000  # the request's token budget caps the whole payload
    for branch in ("directive", "hot", "cold"):
        assert re.search(rf"^  {branch}\s+ok\s", out, re.M), branch
    sel = re.search(r"^selected (\d+) memories: (.+)$", out, re.M)
    assert sel is not None and int(sel[1]) >= 1
    handles = re.search(r"^handles: (.+)$", out, re.M)
    assert handles is not None
    by_id = {mid: h for h, mid in (pair.split("=", 1) for pair in handles[1].split(", "))}
    for memory_id in sel[2].split(", "):
        assert f'<m {by_id[memory_id]}="' in out  # the element of each selected memory, by its handle


@pytest.mark.parametrize("name", ["openai_payload.py", "anthropic_payload.py"])
def test_payload_examples_print_a_payload(name: str, tmp_path: Path) -> None:
    payload: dict[str, Any] = json.loads(_run_example(name, tmp_path))
    assert payload["tools"] and payload["tools"][0]
    messages = payload["messages"]
    assert messages and all(isinstance(m, dict) and "role" in m for m in messages)
    if name == "openai_payload.py":
        assert messages[0]["role"] in ("system", "developer")
        assert messages[-1]["role"] == "user" and messages[-1]["content"].startswith("<memories>")
    else:
        assert payload["system"]
        assert messages[-1]["role"] == "user"
        assert any(block.get("text", "").startswith("<memories>") for block in messages[-1]["content"])


def _python_blocks(markdown: str) -> list[tuple[int, str]]:
    fence = re.compile(r"^```python(?P<flags>[^\n]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
    return [
        (markdown.count("\n", 0, m.start()) + 1, m["body"])
        for m in fence.finditer(markdown)
        if "no-check" not in m["flags"]
    ]


README_BLOCKS = _python_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_opens_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    commands = re.findall(r"^```bash\n(.*?)\n```", text, re.S | re.M)
    assert commands[:2] == [
        "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/ctxcore demo",
        "./tools/run-tests",
    ]
    assert text.index(commands[0]) < text.index("## ")  # before the first section


@pytest.mark.parametrize(("line", "code"), README_BLOCKS, ids=[f"README.md:{line}" for line, _ in README_BLOCKS])
def test_readme_python_blocks_run_as_written(line: int, code: str, tmp_path: Path) -> None:
    out = _run([sys.executable, "-c", code], tmp_path)
    assert out.returncode == 0, f"README.md:{line}\n{out.stderr}"
    assert out.stdout.strip(), f"README.md:{line} printed nothing"


#: Documentation blocks that need a file the reader supplies, by page: they are type-checked
#: (tools/check_readme_types.py) but not run.
NEEDS_READER_FILES = {"howto/tokenizers.md": "a Hugging Face tokenizer.json"}
ALL_DOCS_BLOCKS = [
    (page.relative_to(REPO / "docs").as_posix(), line, code)
    for page in sorted((REPO / "docs").rglob("*.md"))
    for line, code in _python_blocks(page.read_text(encoding="utf-8"))
]
DOCS_BLOCKS = [b for b in ALL_DOCS_BLOCKS if b[0] not in NEEDS_READER_FILES]


def test_the_docs_have_examples_to_run() -> None:
    pages = {page for page, _, _ in DOCS_BLOCKS}
    assert {"concepts/budget.md", "concepts/formatting.md", "concepts/packing.md", "howto/payloads.md"} <= pages
    assert set(NEEDS_READER_FILES) <= {page for page, _, _ in ALL_DOCS_BLOCKS}  # no stale entry


@pytest.mark.parametrize(("page", "line", "code"), DOCS_BLOCKS, ids=[f"{p}:{n}" for p, n, _ in DOCS_BLOCKS])
def test_docs_python_blocks_run_as_written(page: str, line: int, code: str, tmp_path: Path) -> None:
    out = _run([sys.executable, "-c", code], tmp_path)
    assert out.returncode == 0, f"docs/{page}:{line}\n{out.stderr}"
