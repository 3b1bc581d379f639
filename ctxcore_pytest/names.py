"""What the light entry point and the gates share: the marker's name and where results go.

A module of its own, importing nothing beyond pytest, so that the gates
(`ctxcore.benchmarking.pytest_plugin`) take these names from here while the entry point
(`ctxcore_pytest`) loads the gates only when a test asks for them: the imports point one
way.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["MARKER", "RESULTS"]

#: The marker's and the fixture's name.
MARKER = "ctxcore_gate"
#: Where each gate that ran leaves its (test id, result) for the summary.
RESULTS = pytest.StashKey[list[tuple[str, Any]]]()
