"""The package's module structure: the client loads without server code, and no ctxcore
modules import each other in a cycle (tools/import_cycles.py, run on the installed
package)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
        capture_output=True, text=True, check=True, timeout=120, cwd=str(ROOT.parent),
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
    from ctxcore.service import ServiceError
    from ctxcore.service import auth, convert, errors

    assert ServiceError is errors.ServiceError is auth.ServiceError
    assert convert.ServiceError is errors.ServiceError


def test_no_import_cycle_among_ctxcore_modules() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "import_cycles.py"), "ctxcore"],
        capture_output=True, text=True, timeout=120, cwd=str(ROOT.parent),
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
        capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
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
