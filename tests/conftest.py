"""Shared pytest set-up for the test suite.

Hypothesis profiles: ``ci`` (the default) is derandomized, so a run on a fresh clone
explores the same examples every time and a red build is never a matter of a random
seed; ``explore`` draws fresh random examples and is what long runs use
(``CTXCORE_SLOW=1 ./tools/run-tests`` selects it). Pick one with
``CTXCORE_HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("CTXCORE_HYPOTHESIS_PROFILE", "ci"))
