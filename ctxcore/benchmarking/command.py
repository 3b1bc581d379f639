"""``ctxcore bench``: the latency gates from the command line, on the shipped workloads or
a user's own candidates.

Prints p50/p90/p99/max per stage and a PASS/FAIL line per gate (or, with ``--json``, one
document in the shape ``report.schema.json`` documents); exit status 0 when every gate
passes, 1 when one fails or the data cannot be used (a bad candidates file, a store whose
scope holds no memories or whose every timed assembly degraded), 2 on a usage error. ``--plot FILE`` draws each stage's histogram
and percentile plot. Without bounds on the command line each stage gets the gates this
repository's CI holds it to (`ctxcore.benchmarking.gates.DEFAULT_GATES`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any, TextIO, cast

from .._files import STDIN
from .gates import (
    DEFAULT_GATES,
    DEFAULT_REFERENCE_ROUNDS,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    GateUsageError,
    StageResult,
    make_gates,
)
from .workloads import STAGES, CandidateSet, WorkloadError, default_workload, load_workload, workload_names

__all__ = ["SCHEMA_FILE", "add_subcommand", "report_schema", "run"]

#: The documented shape of ``ctxcore bench --json`` (JSON Schema, draft 2020-12).
SCHEMA_FILE = "report.schema.json"
#: The JSON report's format version.
REPORT_VERSION = 1


def report_schema() -> dict[str, Any]:
    """The JSON Schema of ``ctxcore bench --json``'s output.

    >>> report_schema()["title"]
    'ctxcore bench report'
    """
    doc: dict[str, Any] = json.loads(files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))
    return doc


class UsageError(ValueError):
    """A command line that cannot run (exit status 2)."""


class DataError(ValueError):
    """Data the command reads cannot be used: a store that is missing, or one whose timed
    assemblies retrieve nothing (exit status 1)."""


#: Exit status of bad data or a failure at run time, and of a bad command line (as for
#: every ``ctxcore`` command).
EXIT_ERROR, EXIT_USAGE = 1, 2


def add_subcommand(sub: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to the ``ctxcore`` command's subparsers."""
    b: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="latency gates: time pack, format and assemble on shipped or your own data",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    b.add_argument("--stage", choices=(*STAGES, "all"), default="all", help="which stage to time (default all)")
    b.add_argument(
        "--candidates",
        metavar="FILE.jsonl",
        help="your candidates, one JSON object per line: id and tokens/score for packing, "
        "text (and similarity, confidence) for formatting and assembly ('-': stdin)",
    )
    b.add_argument(
        "--workload",
        metavar="NAME",
        help=f"a shipped workload instead of the stage's default ({', '.join(workload_names())})",
    )
    b.add_argument("--budget", type=int, help="token budget for packing (default: the workload's, else 8000)")
    b.add_argument("--model", default="gpt-4o", help="model for assembly and for pricing texts (default gpt-4o)")
    b.add_argument(
        "--db",
        metavar="STORE",
        help="assemble against this memory store, a SQLite file or a postgresql:// URL (retrieval included)",
    )
    b.add_argument("--org", help="organization id of the assembly against --db")
    b.add_argument("--agent", help="agent id of the assembly against --db")
    b.add_argument("--query", help="the query of the assembly")
    b.add_argument("--p99-ms", type=float, help="p99 bound in ms for every stage timed")
    b.add_argument("--median-ms", type=float, help="median bound in ms for every stage timed")
    b.add_argument(
        "--max-ratio",
        type=float,
        help="bound on each stage's median over its reference's median (numpy DP, markupsafe, packing)",
    )
    b.add_argument("--no-reference", action="store_true", help="do not time the references (no ratio gates)")
    b.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help=f"timed rounds per stage ({DEFAULT_ROUNDS})")
    b.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help=f"untimed calls first ({DEFAULT_WARMUP})")
    b.add_argument(
        "--reference-rounds",
        type=int,
        default=DEFAULT_REFERENCE_ROUNDS,
        help=f"reference rounds among the timed ones ({DEFAULT_REFERENCE_ROUNDS})",
    )
    b.add_argument("--json", action="store_true", help="print one JSON document (see --schema)")
    b.add_argument(
        "--plot", metavar="FILE", help="write a histogram and a percentile plot per stage (.png, .svg, .pdf)"
    )
    b.add_argument("--schema", action="store_true", help="print the JSON Schema of --json's output and exit")
    return b


def _gates_for(stage: str, args: argparse.Namespace, store: bool) -> dict[str, float]:
    given = {k: getattr(args, k) for k in ("p99_ms", "median_ms", "max_ratio") if getattr(args, k) is not None}
    if given:
        return given
    bounds = DEFAULT_GATES["assemble-store" if store and stage == "assemble" else stage]
    defaults = cast("dict[str, float]", dict(bounds))  # GateBounds: every value a float
    if args.no_reference:
        defaults.pop("max_ratio", None)
    return defaults


@contextmanager
def _open_store(args: argparse.Namespace) -> Iterator[Any]:
    if args.db is None:
        yield None
        return
    if not args.org or not args.agent:
        raise UsageError("--db needs --org and --agent: the scope the assembly reads")
    from ..stores import is_postgres_url

    if is_postgres_url(args.db):
        from ..stores.errors import MemoryStoreError
        from ..stores.postgres_cli import open_cli_store

        try:
            pg_store = open_cli_store(args.db)
        except (ValueError, MemoryStoreError) as exc:
            raise DataError(str(exc)) from None
        with pg_store:
            yield pg_store
        return
    if "://" in args.db:
        raise UsageError(f"--db takes a SQLite file or a postgresql:// URL, got {args.db!r}")
    if not Path(args.db).exists():
        raise DataError(f"no database at {args.db}")
    from ..stores import SqliteMemoryStore

    with SqliteMemoryStore(args.db) as store:
        yield store


def _workload(stage: str, args: argparse.Namespace, user: CandidateSet | None) -> CandidateSet:
    if user is not None:
        return user
    if args.workload:
        names = workload_names(stage)
        if args.workload not in names:
            if args.stage != "all":
                raise UsageError(f"--workload {args.workload} is not a {stage} workload (those are {', '.join(names)})")
            return load_workload(default_workload(stage))
        return load_workload(args.workload)
    return load_workload(default_workload(stage))


def _measure(args: argparse.Namespace) -> list[StageResult]:
    from ..catalog import default_catalog
    from .stages import BENCH_QUERY, assemble_stage, format_stage, pack_stage, run_stage

    if args.budget is not None and args.budget < 0:
        raise UsageError(f"--budget must be >= 0, got {args.budget}")
    if args.workload and args.candidates:
        raise UsageError("give --candidates or --workload, not both")
    if args.workload and args.workload not in workload_names():
        raise UsageError(f"unknown workload {args.workload!r} (shipped: {', '.join(workload_names())})")
    stages = list(STAGES) if args.stage == "all" else [args.stage]
    cap = default_catalog().get_model(args.model)
    user = None
    if args.candidates:
        from .workloads import read_candidates

        if args.candidates == STDIN:
            from .._files import decode_utf8

            user = read_candidates("<stdin>", decode_utf8(sys.stdin.buffer.read(), "<stdin>", WorkloadError))
        else:
            user = read_candidates(args.candidates)
    reference = not args.no_reference
    if not reference and args.max_ratio is not None:
        raise UsageError("--max-ratio needs the references: drop --no-reference")
    results: list[StageResult] = []
    with ExitStack() as stack:
        store = stack.enter_context(_open_store(args))
        for stage in stages:
            gates = make_gates(**_gates_for(stage, args, store is not None))
            kw = {"rounds": args.rounds, "warmup": args.warmup, "reference_rounds": args.reference_rounds}
            if stage == "assemble":
                cs = None if store is not None else _workload(stage, args, user)
                with assemble_stage(
                    cs,
                    model=cap.name,
                    store=store,
                    organization_id=args.org or "bench-org",
                    agent_id=args.agent or "bench-agent",
                    query=args.query or BENCH_QUERY,
                    reference=reference,
                ) as subject:
                    results.append(run_stage(subject, gates, **kw))
                continue
            cs = _workload(stage, args, user)
            if stage == "pack":
                budget = args.budget if args.budget is not None else cs.budget if cs.budget is not None else 8000
                subject = pack_stage(cs, budget, family=cap.tokenizer_family, reference=reference)
            else:
                subject = format_stage(cs, reference=reference)
            results.append(run_stage(subject, gates, **kw))
    return results


def _environment() -> dict[str, Any]:
    from .. import __version__

    return {
        "ctxcore": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count() or 1,
    }


def _print_text(results: list[StageResult], env: dict[str, Any], out: TextIO, problems: list[str]) -> None:
    out.write(
        f"ctxcore bench: ctxcore {env['ctxcore']}, Python {env['python']}, {env['machine']}, {env['cpus']} CPUs\n\n"
    )
    head = f"{'stage':<9} {'workload':<28} {'rounds':>6} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'max ms':>9}\n"
    out.write(head)
    out.write("-" * (len(head) - 1) + "\n")
    for r in results:
        st = r.stats
        name = str(r.workload.get("name", ""))
        out.write(
            f"{r.stage:<9} {name[-28:]:<28} {st.rounds:>6} {st.p50_ms:>9.3f} {st.p90_ms:>9.3f} "
            f"{st.p99_ms:>9.3f} {st.max_ms:>9.3f}\n"
        )
        if "memories" in r.workload:
            w = r.workload
            why = f" ({w['degradation']})" if w.get("degradation") else ""
            out.write(
                f"{'':<9} store scope {w['organization_id']}/{w['agent_id']}: {w['memories']} memories; "
                f"degraded {w['degraded']} of {w['assemblies']} assemblies{why}\n"
            )
        if r.reference is not None:
            out.write(
                f"{'':<9} {'reference: ' + str(r.reference_name):<28} {r.reference.rounds:>6} "
                f"{r.reference.p50_ms:>9.3f} {r.reference.p90_ms:>9.3f} {r.reference.p99_ms:>9.3f} "
                f"{r.reference.max_ms:>9.3f}\n"
            )
    out.write("\n")
    for r in results:
        for v in r.verdicts:
            out.write(v.describe(r.stage, r.reference_name) + "\n")
    for problem in problems:
        out.write(f"FAIL  {problem}\n")
    n = sum(len(r.verdicts) for r in results)
    failed = sum(not v.passed for r in results for v in r.verdicts)
    verdict = f"all {n} gates passed" if not failed else f"{failed} of {n} gates FAILED"
    if problems:
        verdict += ", but the measurement FAILED: no working assembly was timed"
    out.write(f"\n{verdict}\n")


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``ctxcore bench`` with parsed arguments; the exit status."""
    if args.schema:
        json.dump(report_schema(), out, indent=2)
        out.write("\n")
        return 0
    from ..errors import UnknownModel
    from .plots import PlotError

    try:
        if args.plot:
            from .plots import check_plot_path, new_figure

            check_plot_path(args.plot)  # a bad suffix or directory fails before measuring
            try:
                new_figure(args.plot, 1, 1)
            except PlotError as exc:  # matplotlib is missing: not the command line's fault
                raise DataError(str(exc)) from None
        results = _measure(args)
    except (UsageError, GateUsageError, PlotError) as exc:
        sys.stderr.write(f"ctxcore: error: {exc}\n")
        return EXIT_USAGE
    except (DataError, WorkloadError) as exc:
        sys.stderr.write(f"ctxcore: error: {exc}\n")
        return EXIT_ERROR
    except UnknownModel as exc:
        sys.stderr.write(f"ctxcore: error: --model: {exc.args[0] if exc.args else exc}\n")
        return EXIT_ERROR
    env = _environment()
    problems = _store_problems(results, args.db)
    passed = all(r.passed for r in results) and not problems
    if args.plot:
        from .plots import plot_latency

        plot_latency(results, args.plot, title=f"ctxcore {env['ctxcore']} on {env['machine']}, {env['cpus']} CPUs")
    if args.json:
        doc = {
            "version": REPORT_VERSION,
            "environment": env,
            "passed": passed,
            "problems": problems,
            "stages": {r.stage: r.record() for r in results},
        }
        if args.plot:
            doc["plot"] = str(args.plot)
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        _print_text(results, env, out, problems)
        if args.plot:
            out.write(f"plot: {args.plot}\n")
    for problem in problems:
        sys.stderr.write(f"ctxcore: error: {problem}\n")
    return 0 if passed else EXIT_ERROR


def _store_problems(results: list[StageResult], db: str | None) -> list[str]:
    """Why the assembly timed against a store measured no working assembly: its scope
    holds no memories, or every timed call degraded (a failed or timed-out branch)."""
    out = []
    for r in results:
        w = r.workload
        if r.stage != "assemble" or "memories" not in w:
            continue
        scope = f"{w['organization_id']}/{w['agent_id']}"
        if w["memories"] == 0:
            out.append(f"the scope {scope} holds no memories in {db}: the timed assemblies retrieved nothing")
        elif w["assemblies"] and w["degraded"] == w["assemblies"]:
            out.append(
                f"every timed assembly of {scope} degraded ({w.get('degradation', 'unknown')}): "
                "the times are not those of a working assembly"
            )
    return out
