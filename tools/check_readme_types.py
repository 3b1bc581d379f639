#!/usr/bin/env python3
"""Type-check the Python examples of the README and the documentation with ``mypy --strict``.

Every fenced ``python`` block of each Markdown file named (README.md by default) becomes one
module (``<file>_block_<line>.py``, the line its fence opens on) in a temporary directory,
and mypy checks them all against ctxcore, so an example that stops matching the public API
fails CI. Run it with the interpreter of an environment where mypy and ctxcore's
dependencies are installed; mypy finds ctxcore installed there, or in the checkout when
MYPYPATH names it (tools/run-tests does that, before the wheel is built):

    python tools/check_readme_types.py [README.md docs/concepts/budget.md ...]
    MYPYPATH=. python tools/check_readme_types.py README.md docs/*.md docs/*/*.md

A block whose fence reads ```` ```python no-check ```` is skipped (for fragments that are
not meant to stand alone). Exit status: mypy's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

FENCE = re.compile(r"^```python(?P<flags>[^\n]*)\n(?P<body>.*?)^```\s*$", re.DOTALL | re.MULTILINE)


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """The ``(line, code)`` of each fenced python block, without the skipped ones."""
    out = []
    for m in FENCE.finditer(markdown):
        if "no-check" in m.group("flags"):
            continue
        out.append((markdown.count("\n", 0, m.start()) + 1, m.group("body")))
    return out


def _module_name(path: Path) -> str:
    """A module name for the blocks of `path`: its stem, lower case, ``_`` for the rest."""
    return re.sub(r"[^0-9a-z_]", "_", path.stem.lower())


def main(argv: list[str]) -> int:
    docs = [Path(a) for a in argv[1:]] or [Path(__file__).resolve().parents[1] / "README.md"]
    readme = docs[0]
    blocks = python_blocks(readme.read_text(encoding="utf-8"))
    if not blocks:
        print(f"{readme}: no python blocks to check", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="readme-types-") as tmp:
        files = []
        for k, doc in enumerate(docs):
            found = blocks if k == 0 else python_blocks(doc.read_text(encoding="utf-8"))
            # Files of the same stem in different folders (docs/howto/stores.md and
            # docs/performance/stores.md) get the file's position as well.
            prefix = f"{_module_name(doc)}_{k}"
            for line, code in found:
                path = Path(tmp) / f"{prefix}_block_{line}.py"
                path.write_text(code, encoding="utf-8")
                files.append(str(path))
            if found:
                print(f"{doc}: {len(found)} python blocks (lines {', '.join(str(line) for line, _ in found)})")
        print(f"mypy --strict on {len(files)} python blocks")
        # Run from the temporary directory so that `import ctxcore` resolves to the
        # installed package, never a source checkout.
        return subprocess.call(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--scripts-are-modules", *files],
            cwd=tmp,
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv))
