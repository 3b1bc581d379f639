#!/usr/bin/env python3
"""Instructions a served AssembleContext call costs the server, counted by valgrind's
callgrind: a measure of CPU per call that a shared, noisy machine cannot blur.

    python bench/load_driver.py build-db bench.db --memories 100000
    python bench/served_instructions.py --db bench.db --calls 60 260

For each count N in ``--calls``, `ctxcore serve` starts under callgrind (all its threads
counted), the load driver sends N calls at ``--concurrency`` in flight with deadlines of
minutes, and the server stops; the difference between two runs, divided by the difference
in calls, is the steady-state cost of one call (start-up, warm-up and shutdown cancel
out). Timeouts and the retrieval wall are set to a minute so that the server, slowed ~50x
under callgrind, answers every call whole. Work paced by the clock (read-time flushes,
directive refreshes) runs more often per call than at full speed: compare builds in the
same conditions, one after the other, rather than with figures from elsewhere. Prints one
JSON document. Needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import load_driver  # bench/, the script's own directory

_COLLECTED = re.compile(r"Collected : (\d+)")
#: A minute for every timeout and the wall: nothing is cut short under callgrind.
_ROOMY = {
    name: "60000"
    for name in (
        "CTXCORE_CONTEXT_DEADLINE_MS",
        "CTXCORE_CONTEXT_TIMEOUT_MS",
        "CTXCORE_DIRECTIVE_TIMEOUT_MS",
        "CTXCORE_HOT_TIMEOUT_MS",
        "CTXCORE_COLD_TIMEOUT_MS",
    )
}


def instructions(db: Path, calls: int, *, port: int, concurrency: int, python: str) -> int:
    """Instructions the server executed over its whole life while serving `calls` calls."""
    env = dict(os.environ, PYTHONHASHSEED="0", **_ROOMY)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "valgrind.log"
        server = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                f"--log-file={log}",
                python,
                "-m",
                "ctxcore",
                "serve",
                "--db",
                str(db),
                "--allow-unauthenticated",
                "--bind",
                f"127.0.0.1:{port}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            asyncio.run(load_driver.wait_serving([f"127.0.0.1:{port}"], timeout_s=900.0))
            report = asyncio.run(
                load_driver.run_load(
                    f"127.0.0.1:{port}",
                    concurrency=concurrency,
                    requests=calls,
                    max_seconds=3600.0,
                    timeout_ms=600_000.0,
                )
            )
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=600)
        failed = sum(report["errors"].values())
        if failed or report["calls"] != calls:
            raise SystemExit(
                f"{failed} of {report['calls']} calls failed ({report['errors']}); expected {calls} answers"
            )
        found = _COLLECTED.findall(log.read_text())
        if not found:
            raise SystemExit(f"no instruction count in callgrind's log:\n{log.read_text()[-2000:]}")
        return int(found[-1])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, required=True, help="the SQLite store to serve (build-db's)")
    ap.add_argument(
        "--calls",
        type=int,
        nargs=2,
        default=[60, 260],
        metavar=("N1", "N2"),
        help="the two call counts (default 60 260)",
    )
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--port", type=int, default=50791)
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose ctxcore is served")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    n1, n2 = args.calls
    if not 0 < n1 < n2:
        raise SystemExit(f"--calls needs 0 < N1 < N2, got {n1} {n2}")
    if not args.db.is_file():
        raise SystemExit(f"no database at {args.db}")
    counts = [
        instructions(args.db, n, port=args.port, concurrency=args.concurrency, python=args.python) for n in (n1, n2)
    ]
    per_call = (counts[1] - counts[0]) / (n2 - n1)
    print(
        json.dumps(
            {
                "db": str(args.db),
                "calls": [n1, n2],
                "instructions": counts,
                "instructions_per_call": round(per_call),
                "million_per_call": round(per_call / 1e6, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
