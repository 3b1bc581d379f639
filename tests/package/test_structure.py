"""The package's module structure: the client loads without server code, no ctxcore
modules import each other in a cycle (tools/import_cycles.py, run on the installed
package), and the import contracts of pyproject.toml's [tool.importlinter] hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Modules that are the server's alone: the client must load without any of them.
SERVER_MODULES = (
    "ctxcore.service.server",
    "ctxcore.service.auth",
    "ctxcore.service.config",
    "ctxcore.service.convert",
    "ctxcore.service.admission",
    "ctxcore.service.metrics",
    "ctxcore.service.cli",
    "ctxcore.service.workers",
    "ctxcore.service.cpus",
    "ctxcore.service.fullgc",
)


def _loaded_after(statement: str) -> set[str]:
    # A fresh interpreter, so that nothing this test process imported counts.
    out = subprocess.run(
        [sys.executable, "-c", f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=str(ROOT.parent),
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_client_loads_no_server_module() -> None:
    loaded = _loaded_after("import ctxcore.client")
    assert "ctxcore.client" in loaded and "ctxcore.service.wire" in loaded
    assert not loaded & set(SERVER_MODULES), sorted(loaded & set(SERVER_MODULES))


def test_the_server_still_loads_the_wire_it_shares_with_the_client() -> None:
    loaded = _loaded_after("import ctxcore.service.server")
    assert {"ctxcore.service.wire", "ctxcore.service.errors", "ctxcore.service.auth"} <= loaded


def test_service_error_has_one_home() -> None:
    from ctxcore.service import ServiceError, auth, convert, errors

    assert ServiceError is errors.ServiceError is auth.ServiceError
    assert convert.ServiceError is errors.ServiceError


def test_no_import_cycle_among_ctxcore_modules() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "import_cycles.py"), "ctxcore"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(ROOT.parent),
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    # The checker itself, on a package made to hold one (a lazy import counts too).
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "import_cycles.py"), "cyclic"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 1
    assert out.stdout.strip() == "import cycle: cyclic.a <-> cyclic.b"


@pytest.mark.parametrize("name", ["SqliteMemoryStore", "fts_match_expression", "SCHEMA_VERSION", "OnConflict"])
def test_the_sqlite_store_keeps_its_import_paths(name: str) -> None:
    import ctxcore.stores
    import ctxcore.stores.sqlite

    assert getattr(ctxcore.stores.sqlite, name) is not None
    if name in ctxcore.stores.__all__:
        assert getattr(ctxcore.stores, name) is getattr(ctxcore.stores.sqlite, name)


def test_the_import_contracts_hold() -> None:
    # pyproject.toml's [tool.importlinter]: the stores import nothing of the service or the
    # CLI, neither store imports the other, and the layers point one way; run on the
    # installed package (the working directory holds no ctxcore/).
    code = (
        "import sys\nfrom importlinter.cli import lint_imports\n"
        f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(ROOT.parent)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout, out.stdout


def _root_imports(package: Path) -> list[tuple[str, int, str]]:
    # (module file, line, name) for every name a module of the package imports from the
    # package root itself (``from . import x`` in a top-level module, ``from .. import x``
    # one level down, ``from ctxcore import x``).
    import ast

    out: list[tuple[str, int, str]] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        depth = len(rel.parts) - (1 if rel.name != "__init__.py" else 2)  # packages below the root
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            to_root = (node.level == depth + 1 and not node.module) or (node.level == 0 and node.module == "ctxcore")
            if to_root and str(rel) != "__init__.py":
                out += [(str(rel), node.lineno, a.name) for a in node.names]
    return out


def test_the_layers_contract_ignores_only_imports_of_the_compiled_core() -> None:
    # The layers contract ignores every import of the package root, because the compiled
    # `_core` is invisible to the import graph and `from . import _core` reads as one. Any
    # other name taken from the root (but a submodule, which the graph sees as itself)
    # would hide a dependency on the whole public API.
    import ctxcore

    package = Path(ctxcore.__file__).parent
    found = _root_imports(package)
    assert any(n == "_core" for _, _, n in found)  # the finder sees the modules' own imports of the core
    others = [
        (f, ln, n)
        for f, ln, n in found
        if n not in {"_core", "__version__"}
        and not (package / f"{n}.py").exists()
        and not (package / n / "__init__.py").exists()
    ]
    assert not others, others


def test_the_root_import_finder_sees_a_public_name(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("from . import _core\nx = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import x\nfrom . import c\n")
    assert _root_imports(pkg) == [("a.py", 1, "_core"), ("sub/b.py", 1, "x")]
