"""What the tests and the benchmarks share beyond fixtures: where the checkout's files are,
the adversarial memory corpus, and loading a script of tools/ or examples/ as a module.

Imported by name (``from testkit import ...``): pyproject.toml puts tests/ on the pytest
path. The package under test always comes from the installed wheel, never from here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["DATA", "REPO", "adversarial_corpus", "load_script"]

#: The checkout the tests run from (its tools/, examples/, README.md).
REPO = Path(__file__).resolve().parents[1]
#: The tests' data files.
DATA = REPO / "tests" / "data"


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The Python file at `path` as a module named `name` (default: its stem),
    registered in ``sys.modules`` (dataclasses look their module up while being built)."""
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def adversarial_corpus() -> list[dict[str, Any]]:
    """The memories of tests/data/adversarial_memories.jsonl, each ``text`` repeated its
    ``repeat`` times and the ``note`` dropped."""
    rows = []
    for line in (DATA / "adversarial_memories.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        row["text"] = row["text"] * row.pop("repeat", 1)
        row.pop("note")
        rows.append(row)
    return rows
