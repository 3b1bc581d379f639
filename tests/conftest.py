"""Shared pytest set-up for the test suite.

Hypothesis profiles: ``ci`` (the default) is derandomized, so a run on a fresh clone
explores the same examples every time and a red build is never a matter of a random
seed; ``explore`` draws fresh random examples and is what long runs use
(``CTXCORE_SLOW=1 ./tools/run-tests`` selects it). Pick one with
``CTXCORE_HYPOTHESIS_PROFILE``.

Support modules are imported by name: ``testkit`` (paths, the adversarial corpus, loading
a script), ``service_support`` (a real server on loopback), ``pg_support`` (a real
PostgreSQL) and ``payload_support`` (the providers' request types) from tests/, ``bench_support`` and ``load_driver`` from bench/; pyproject.toml
puts both directories on the pytest path.

The tests are grouped by the area of the package they cover, one folder each: ``core``
(tokens, catalog, packing, formatting, numbers at the edges), ``assembly`` (the pipeline
and its stages: budget, pricing, scoring, rerank, the memory elements, requests and
payloads), ``stores``, ``service``, ``cli``, ``benchmarking``, ``adapters``,
``evaluation`` and ``package`` (installation, module structure, the examples). Their
data files are in tests/data/, the C++ unit tests in tests/cpp/.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("CTXCORE_HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    # The suite tests the installed wheel: tests/ and bench/ are on the path for their
    # support modules (pyproject.toml), the checkout's ctxcore/ never is.
    import ctxcore

    source = Path(__file__).resolve().parents[1] / "ctxcore"
    if Path(ctxcore.__file__).resolve().is_relative_to(source):
        raise pytest.UsageError(
            f"ctxcore was imported from the source tree ({source}), not the installed package: "
            "install it (pip install .) and run pytest from outside the checkout with --import-mode=importlib"
        )


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo store (``ctxcore.stores.load_demo``) in a file, once per test module."""
    from ctxcore.stores import load_demo

    path = tmp_path_factory.mktemp("store") / "demo.db"
    load_demo(path).close()
    return path
