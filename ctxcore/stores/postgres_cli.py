"""``ctxcore memories init|delete|forget|stats`` and the ``--db`` value every command
takes: a SQLite file path or a ``postgresql://`` URL (credentials from the URL, the
``PG*`` environment variables or a password file; never printed: the database is shown
with its password redacted).

>>> shown_db("postgresql://app:pw@db/memories")
'postgresql://app:***@db/memories'
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from .._numbers import positive_int_arg
from .urls import is_postgres_url

__all__ = ["add_lifecycle_subcommands", "open_cli_store", "shown_db"]


def shown_db(db: str) -> str:
    """`db` as it may be printed or logged: a URL's password redacted."""
    if is_postgres_url(db):
        from .postgres import redact_dsn

        return redact_dsn(db)
    return db


def _cli_error(message: str) -> Exception:
    # `ctxcore.cli.main` prints a ValueError as a named error (exit status 2); CliError
    # itself is not used because under `python -m ctxcore.cli` that class is __main__'s.
    return ValueError(message)


def open_cli_store(db: str, *, must_exist: bool = False, **kwargs: Any) -> Any:
    """The store `db` names, opened for a command; its errors become the command's
    named errors (exit status 2), with credentials redacted."""
    from .errors import MemoryStoreError

    if not is_postgres_url(db) and must_exist and not Path(db).exists():
        raise _cli_error(f"no database at {db} (create one with `ctxcore memories add FILE --db {db}`)")
    try:
        if is_postgres_url(db):
            from .postgres import PostgresMemoryStore

            return PostgresMemoryStore(db, **kwargs)
        from .sqlite import SqliteMemoryStore

        kwargs.pop("dimensions", None)
        kwargs.pop("grant_to", None)
        kwargs.pop("migrate", None)
        return SqliteMemoryStore(db, **kwargs)
    except ImportError as exc:
        raise _cli_error(str(exc)) from None
    except MemoryStoreError as exc:
        raise _cli_error(str(exc)) from None


def _named_errors(fn: Callable[[argparse.Namespace, TextIO], int]) -> Callable[[argparse.Namespace, TextIO], int]:
    # A store's refusal (bad input, a role that may not, an unreachable database) is the
    # command's named error, exit status 2, never a traceback.
    @functools.wraps(fn)
    def run(args: argparse.Namespace, out: TextIO) -> int:
        from .errors import InvalidMemory, MemoryStoreError

        try:
            return fn(args, out)
        except (InvalidMemory, MemoryStoreError) as exc:
            raise _cli_error(str(exc)) from None

    return run


def _out(args: argparse.Namespace, out: TextIO, doc: dict[str, Any], text: str) -> int:
    if args.json:
        json.dump(doc, out, ensure_ascii=False)
        out.write("\n")
    else:
        out.write(text + "\n")
    return 0


@_named_errors
def _cmd_init(args: argparse.Namespace, out: TextIO) -> int:
    from .embedding import HashingEmbedder

    embedder = HashingEmbedder() if args.embedder == "hashing" else None
    kw: dict[str, Any] = {"embedder": embedder}
    if is_postgres_url(args.db):
        kw.update(dimensions=args.dimensions, grant_to=args.grant_to)
    elif args.dimensions is not None or args.grant_to is not None:
        given = " and ".join(f for f, v in (("--dimensions", args.dimensions), ("--grant-to", args.grant_to)) if v)
        raise _cli_error(
            f"{given} apply to a PostgreSQL store only: a SQLite store takes its dimension from its "
            "embedder and has no roles"
        )
    with open_cli_store(args.db, **kw) as store:
        dims = getattr(store, "dimensions", None)
        return _out(
            args,
            out,
            {"db": shown_db(args.db), "dimensions": dims},
            f"memory store ready at {shown_db(args.db)}" + (f" ({dims} dimensions)" if dims else ""),
        )


def _days(text: str) -> float:
    """Argparse type of ``--older-than-days``: a finite number of days >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if not 0 <= value * 86400.0 < float("inf"):  # finite in seconds too, as expire takes it
        raise argparse.ArgumentTypeError(f"must be a finite number of days >= 0, got {text}")
    return value


@_named_errors
def _cmd_delete(args: argparse.Namespace, out: TextIO) -> int:
    from ..memory import Scope

    with open_cli_store(args.db, must_exist=True, migrate=False) as store:
        n = store.delete(Scope(args.org, args.agent), args.ids)
    return _out(args, out, {"deleted": n}, f"deleted {n} of {len(args.ids)} memories of {args.org}/{args.agent}")


@_named_errors
def _cmd_forget(args: argparse.Namespace, out: TextIO) -> int:
    with open_cli_store(args.db, must_exist=True, migrate=False) as store:
        if args.older_than_days is not None:
            if args.agent is not None:
                raise _cli_error("--older-than-days applies to a whole organization (or, without --org, to all)")
            n = store.expire(args.older_than_days * 86400.0, organization_id=args.org)
            return _out(args, out, {"memories": n}, f"deleted {n} memories older than {args.older_than_days:g} days")
        if args.org is None:
            raise _cli_error("forget needs --org (and --agent for one agent), or --older-than-days")
        r = store.forget(args.org, args.agent)
    who = args.org if args.agent is None else f"{args.org}/{args.agent}"
    return _out(
        args,
        out,
        {"memories": r.memories, "directives": r.directives},
        f"forgot {who}: {r.memories} memories, {r.directives} directives",
    )


@_named_errors
def _cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    with open_cli_store(args.db, must_exist=True, migrate=False) as store:
        st = store.stats(args.org)
    if args.json:
        return _out(
            args,
            out,
            {
                "memories": st.memories,
                "embedded": st.embedded,
                "directives": st.directives,
                "scopes": [
                    {
                        "organization_id": s.organization_id,
                        "agent_id": s.agent_id,
                        "memories": s.memories,
                        "embedded": s.embedded,
                        "tokens": s.tokens,
                    }
                    for s in st.scopes
                ],
            },
            "",
        )
    rows = [["organization", "agent", "memories", "embedded", "tokens"]]
    rows += [[s.organization_id, s.agent_id, str(s.memories), str(s.embedded), str(s.tokens)] for s in st.scopes]
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    for k, row in enumerate(rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
        if k == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
    out.write(
        f"\n{st.memories} memories ({st.embedded} embedded) in {len(st.scopes)} scopes, {st.directives} directives\n"
    )
    return 0


def add_lifecycle_subcommands(mem: Any) -> None:
    """Add ``init``, ``delete``, ``forget`` and ``stats`` to the ``memories`` subparsers."""
    db_help = "the memory store: a SQLite file path or a postgresql:// URL"
    i = mem.add_parser("init", help="create the memory store's schema (PostgreSQL: run as the schema owner)")
    i.add_argument("--db", required=True, help=db_help)
    i.add_argument(
        "--dimensions", type=positive_int_arg, help="embedding dimension to fix in the schema (default: the embedder's)"
    )
    i.add_argument("--grant-to", metavar="ROLE", help="PostgreSQL: grant the app role its table privileges")
    i.add_argument(
        "--embedder",
        choices=("hashing", "none"),
        default="hashing",
        help="record the offline hashing embedder (default), or none for your own embeddings",
    )
    i.add_argument("--json", action="store_true", help="print one JSON document")
    i.set_defaults(func=_cmd_init)
    d = mem.add_parser("delete", help="delete memories of one organization and agent by id")
    d.add_argument("ids", nargs="+", help="memory ids")
    d.add_argument("--db", required=True, help=db_help)
    d.add_argument("--org", required=True, help="organization id")
    d.add_argument("--agent", required=True, help="agent id")
    d.add_argument("--json", action="store_true", help="print one JSON document")
    d.set_defaults(func=_cmd_delete)
    f = mem.add_parser("forget", help="delete everything of an agent or an organization, or memories past an age")
    f.add_argument("--db", required=True, help=db_help)
    f.add_argument("--org", help="organization id")
    f.add_argument("--agent", help="agent id (default: the whole organization)")
    f.add_argument("--older-than-days", type=_days, metavar="DAYS", help="retention: delete memories older than this")
    f.add_argument("--json", action="store_true", help="print one JSON document")
    f.set_defaults(func=_cmd_forget)
    s = mem.add_parser("stats", help="memories, embeddings and tokens per scope")
    s.add_argument("--db", required=True, help=db_help)
    s.add_argument("--org", help="one organization (PostgreSQL: required unless connected as the schema owner)")
    s.add_argument("--json", action="store_true", help="print one JSON document")
    s.set_defaults(func=_cmd_stats)
