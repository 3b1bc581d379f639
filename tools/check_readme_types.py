#!/usr/bin/env python3
"""Type-check the README's Python examples with ``mypy --strict``.

Every fenced ``python`` block of README.md becomes one module (``readme_block_<line>.py``,
the line its fence opens on) in a temporary directory, and mypy checks them all against
ctxcore, so an example that stops matching the public API fails CI. Run it with the
interpreter of an environment where mypy and ctxcore's dependencies are installed; mypy
finds ctxcore installed there, or in the checkout when MYPYPATH names it (tools/run-tests
does that, before the wheel is built):

    python tools/check_readme_types.py [README.md]
    MYPYPATH=. python tools/check_readme_types.py README.md

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


def main(argv: list[str]) -> int:
    readme = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "README.md"
    blocks = python_blocks(readme.read_text(encoding="utf-8"))
    if not blocks:
        print(f"{readme}: no python blocks to check", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="readme-types-") as tmp:
        files = []
        for line, code in blocks:
            path = Path(tmp) / f"readme_block_{line}.py"
            path.write_text(code, encoding="utf-8")
            files.append(str(path))
        print(f"mypy --strict on {len(files)} python blocks of {readme.name} (lines "
              f"{', '.join(str(line) for line, _ in blocks)})")
        # Run from the temporary directory so that `import ctxcore` resolves to the
        # installed package, never a source checkout.
        return subprocess.call(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--scripts-are-modules", *files],
            cwd=tmp,
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv))
