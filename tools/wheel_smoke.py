#!/usr/bin/env python3
"""Smoke test of an installed ctxcore wheel, core install only (no extras).

Run by cibuildwheel after each release wheel is built and by tools/check-wheels in a
fresh venv without a compiler: the compiled core loads, packing and exact token counts
work, the core install imports none of the extras' packages, and a feature whose extra
is missing names the pip command that installs it.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

import ctxcore
import ctxcore.stores

assert ctxcore.__version__ == md.version("ctxcore-llm"), ctxcore.__version__
res = ctxcore.pack([ctxcore.Candidate("a", 120, 0.9), ctxcore.Candidate("b", 90, 0.4)], 150)
assert res.ids == ("a",), res.ids
assert ctxcore.count_tokens("hello world", "cl100k_base").value == 2
for mod in ("grpc", "httpx", "jwt", "prometheus_client"):
    assert mod not in sys.modules, f"the core install imported {mod}"
try:
    ctxcore.stores.HttpMemorySource  # noqa: B018 - the lazy attribute is the test
except ctxcore.MissingExtra as exc:
    assert "pip install 'ctxcore-llm[http]'" in str(exc), exc
else:
    raise AssertionError("HttpMemorySource without the http extra")
serve = subprocess.run([sys.executable, "-m", "ctxcore", "serve"], capture_output=True, text=True, timeout=120)
assert serve.returncode == 1, serve
assert (
    serve.stderr.strip()
    == "ctxcore: error: ctxcore serve needs the 'service' extra: pip install 'ctxcore-llm[service]'"
), serve.stderr
print(
    f"smoke test: ctxcore {ctxcore.__version__} from {ctxcore.__file__}: pack, count_tokens, "
    "extras named when missing: ok"
)
