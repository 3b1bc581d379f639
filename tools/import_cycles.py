"""List the import cycles among a package's modules.

Every ``import`` and ``from ... import`` in a module counts, at any depth (an import
inside a function still ties the two modules together), except those under ``if
TYPE_CHECKING:``; ``from pkg import name`` points at ``pkg.name`` when that is a module,
else at ``pkg``. Importing ``a.b.c`` runs the ``a`` and ``a.b`` packages first, but that
is not counted as an edge from the module that asks for ``a.b.c``.

    python tools/import_cycles.py ctxcore        # exit 1 and the cycles, if any

Used by tests/package/test_structure.py against the installed package.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path


def _modules(package: str) -> dict[str, Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not an installed package")
    root = Path(next(iter(spec.submodule_search_locations)))
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:  # compiled modules import nothing here
        for path in sorted(root.rglob("*" + suffix)):
            rel = path.relative_to(root)
            out.setdefault(".".join([package, *rel.parent.parts, rel.name[: -len(suffix)]]), path)
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                yield from _imports(child) if not isinstance(child, (ast.Import, ast.ImportFrom)) else [child]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from _imports(node)


def import_graph(package: str) -> dict[str, set[str]]:
    """Each module of `package` and the modules of `package` it imports."""
    mods = _modules(package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        if path.suffix != ".py":
            continue
        is_pkg = path.name == "__init__.py"
        here = mod if is_pkg else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base_parts = here.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a non-module attribute
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def main(argv: list[str]) -> int:
    package = argv[0] if argv else "ctxcore"
    found = cycles(import_graph(package))
    for comp in found:
        print("import cycle: " + " <-> ".join(comp))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
