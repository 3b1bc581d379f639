#!/usr/bin/env python3
"""Print the requirements of this project and the given extras, one per line, without
the project itself: what `pip install ".[EXTRA,...]"` would install besides ctxcore.

tools/run-tests installs them while the wheels are still building, so the wheel's own
install later finds every dependency in place:

    python tools/requirements.py test langchain llamaindex | pip install -r /dev/stdin

An extra that names the project (``ctxcore-llm[all]``) is expanded in place; an unknown
extra is an error. Needs Python 3.11+ (tomllib).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's dependencies and those of `extras` (self-references expanded), in
    order, each once."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    me = _canonical(project["name"])
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    out: dict[str, None] = {}
    seen: set[str] = set()

    def add(reqs: list[str]) -> None:
        for req in reqs:
            m = _NAME.match(req)
            if m is None:
                raise SystemExit(f"{pyproject}: cannot read the requirement {req!r}")
            if _canonical(m.group(1)) == me:
                expand([e.strip() for e in (m.group(2) or "").split(",") if e.strip()])
            else:
                out.setdefault(req.strip(), None)

    def expand(names: list[str]) -> None:
        for name in names:
            if name in seen:
                continue
            if name not in optional:
                raise SystemExit(f"{pyproject}: no extra named {name!r} (extras: {', '.join(sorted(optional))})")
            seen.add(name)
            add(optional[name])

    add(project.get("dependencies", []))
    expand(extras)
    return list(out)


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print("\n".join(requirements(root / "pyproject.toml", sys.argv[1:])))
