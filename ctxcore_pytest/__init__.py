"""The pytest entry point of ctxcore's latency gates (``pytest11``: ``ctxcore``).

Installing ctxcore registers this plugin in every pytest session, so it imports nothing
beyond pytest: it describes the ``ctxcore_gate`` marker and offers the ``ctxcore_gate``
fixture, and only a test that asks for the fixture loads ctxcore, numpy and the compiled
core (`ctxcore.benchmarking.pytest_plugin` holds the gates). The terminal summary's
"ctxcore latency gates" section appears only when a gate ran.
"""

from __future__ import annotations

from typing import Any

import pytest

from .names import MARKER, RESULTS

__all__ = ["MARKER", "RESULTS"]


def pytest_configure(config: pytest.Config) -> None:
    """Describe the marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(p99_ms=None, median_ms=None, max_ratio=None, rounds=..., warmup=..., reference_rounds=...): "
        "default bounds for the ctxcore_gate fixture in this test (the defaults: ctxcore.benchmarking.gates)",
    )


@pytest.fixture
def ctxcore_gate(request: pytest.FixtureRequest) -> Any:
    """Latency gates on ctxcore's stages (see `ctxcore.benchmarking.pytest_plugin.LatencyGate`)."""
    if not request.config.pluginmanager.hasplugin("benchmark"):
        pytest.fail(
            "the ctxcore_gate fixture builds on pytest-benchmark, which is not installed or is disabled "
            "(-p no:benchmark): pip install 'ctxcore-llm[bench]'",
            pytrace=False,
        )
    from ctxcore.benchmarking.pytest_plugin import LatencyGate

    return LatencyGate(request, request.getfixturevalue("benchmark"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """A "ctxcore latency gates" section: percentiles and verdicts of every gate that ran."""
    results = config.stash.get(RESULTS, [])
    if results:
        from ctxcore.benchmarking.pytest_plugin import write_summary

        write_summary(terminalreporter, results)
