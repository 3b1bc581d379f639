"""The `ctxcore` command line, run as a subprocess of the installed entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "candidates.jsonl"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # The entry point installed beside this interpreter (the venv under test), else PATH.
    beside = Path(sys.executable).with_name("ctxcore")
    exe = str(beside) if beside.exists() else shutil.which("ctxcore")
    assert exe is not None, "the ctxcore entry point is not installed"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def test_pack_example_as_json() -> None:
    out = run("pack", str(EXAMPLE), "--budget", "1200", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    tokens = {r["id"]: r["tokens"] for r in rows}
    assert sum(tokens[i] for i in doc["selected"]) == doc["record"]["tokens_used"] <= 1200
    assert doc["record"]["evaluated"] == len(rows) == len(doc["decisions"])
    pinned = [r["id"] for r in rows if r.get("pinned")]
    assert doc["selected"][: len(pinned)] == sorted(
        pinned, key=lambda i: -next(r["score"] for r in rows if r["id"] == i)
    )
    assert {d["reason"] for d in doc["decisions"]} <= {
        "selected",
        "pinned",
        "budget_exhausted",
        "pinned_over_budget",
        "non_positive_score",
    }


def test_pack_example_as_tables() -> None:
    out = run("pack", str(EXAMPLE), "--budget", "1200")
    assert out.returncode == 0, out.stderr
    assert "selected" in out.stdout and "left out" in out.stdout and "truncated" in out.stdout


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (
            '{"id": "a", "tokens": 1, "score": 1}\n{"id": "b", "tokens": -4, "score": 1}\n',
            ":2: candidate 'b' (index 1): tokens must be >= 0",
        ),
        ('{"id": "a", "tokens": 1, "score": 1}\nnot json\n', ":2: invalid JSON"),
        ("[1, 2]\n", ":1: expected a JSON object"),
        (
            '{"id": "a", "tokens": 1, "score": 1}\n\n{"id": "a", "tokens": 2, "score": 1}\n',
            ":3: candidate 'a' (index 1): duplicate id",
        ),
        (
            '{"id": "a", "tokens": 1, "score": 1}\n{"id": "b", "tokens": 1, "score": 1, "pined": true}\n',
            ":2: unknown key(s) 'pined' (a candidate has id, tokens, score, pinned)",
        ),
        (
            '{"id": "a", "tokens": 1, "score": 1}\n{"id": "b", "tokens": 1' + "0" * 5000 + ', "score": 1}\n',
            ":2: invalid JSON: a number is too long (integers may have at most 4300 digits)",
        ),
        ("[" * 100_000 + "]" * 100_000 + "\n", ":1: invalid JSON: nested too deeply"),
    ],
)
def test_bad_files_name_the_line(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    out = run("pack", str(path), "--budget", "10")
    assert out.returncode == 1
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr


def test_messages_nested_too_deeply_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "messages.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    out = run("demo", "--db", str(tmp_path / "demo.db"), "--messages", str(path))
    assert out.returncode == 1
    assert one_error_line(out) == f"ctxcore: error: {path}: invalid JSON: nested too deeply"


def test_missing_file(tmp_path: Path) -> None:
    out = run("pack", str(tmp_path / "nope.jsonl"), "--budget", "10")
    assert out.returncode == 1 and "cannot read" in out.stderr


def test_demo_assembles_from_the_shipped_dataset(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    out = run("demo", "--db", str(db), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["selected"] and doc["pack"]["tokens_used"] <= doc["budget"]["usable"]
    assert [b["branch"] for b in doc["branches"]] == ["directive", "hot", "cold"]
    assert len(doc["trace"]) >= len(doc["selected"])
    assert doc["nonce"] in doc["text"] and "<memories>" in doc["text"]
    # the same store, through `ctxcore assemble`, as text and tables
    again = run(
        "assemble",
        "--db",
        str(db),
        "--model",
        "gpt-4o",
        "--org",
        "acme-retail",
        "--agent",
        "support",
        "--query",
        "refund for shoes",
    )
    assert again.returncode == 0, again.stderr
    assert "budget (gpt-4o" in again.stdout and "branches" in again.stdout and "trace" in again.stdout


def test_assemble_names_what_is_missing(tmp_path: Path) -> None:
    out = run(
        "assemble", "--db", str(tmp_path / "none.db"), "--model", "gpt-4o", "--org", "o", "--agent", "a", "--query", "q"
    )
    assert out.returncode == 1 and "no database" in out.stderr
    db = tmp_path / "demo.db"
    assert run("demo", "--db", str(db), "--json").returncode == 0
    out = run("assemble", "--db", str(db), "--model", "gpt-99", "--org", "o", "--agent", "a", "--query", "q")
    assert out.returncode == 1 and "gpt-99" in out.stderr and "Traceback" not in out.stderr


# ---- exit statuses, stdin, Ctrl-C, ingest ------------------------------------------------

MEMORY = '{{"id": "{id}", "organization_id": "acme", "agent_id": "support", "text": "{text}"}}\n'


def run_in(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m ctxcore ARGS` with `stdin` as standard input."""
    return subprocess.run(
        [sys.executable, "-m", "ctxcore", *args], input=stdin, capture_output=True, text=True, timeout=120
    )


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxcore: error: "), out.stderr
    return lines[0]


def test_python_dash_m_and_stdin() -> None:
    out = run_in(EXAMPLE.read_text(), "pack", "-", "--budget", "1200", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["record"]["tokens_used"] <= 1200


@pytest.mark.parametrize("flag", [["--budget", "-5"], ["--budget", "ten"], ["--bucket-tokens", "0"]])
def test_bad_numbers_are_usage_errors(flag: list[str]) -> None:
    args = ["pack", "-", "--budget", "10", *flag]
    out = run_in("", *args)
    assert out.returncode == 2, out
    assert "usage: ctxcore pack" in out.stderr and "Traceback" not in out.stderr
    assert main_status(args) == 2


def main_status(argv: list[str]) -> int:
    from ctxcore.cli import main

    return main(argv)


def test_a_missing_field_is_named_once() -> None:
    out = run_in('{"id": "a", "score": 1}\n', "pack", "-", "--budget", "5")
    assert out.returncode == 1
    assert one_error_line(out) == "ctxcore: error: <stdin>:1: candidate 'a' (index 0): missing 'tokens'"


def test_a_file_that_is_not_sqlite_is_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.db"
    bogus.write_text("not a database\n" * 100)
    out = run("assemble", "--db", str(bogus), "--model", "gpt-4o", "--org", "o", "--agent", "a", "--query", "q")
    assert out.returncode == 1
    assert "is not a usable memory database" in one_error_line(out)


def test_memories_add_on_conflict_and_stdin(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    first = MEMORY.format(id="m1", text="Refunds within 30 days.") + MEMORY.format(id="m2", text="Shoes ship free.")
    assert run_in(first, "memories", "add", "-", "--db", str(db)).returncode == 0
    again = run_in(first, "memories", "add", "-", "--db", str(db))
    assert again.returncode == 1
    assert one_error_line(again) == "ctxcore: error: <stdin>:1: memory 'm1' (index 0): id 'm1' is already stored"
    newer = MEMORY.format(id="m1", text="Refunds within 60 days.") + MEMORY.format(id="m3", text="Gift cards.")
    skip = run_in(newer, "memories", "add", "-", "--db", str(db), "--on-conflict", "skip", "--json")
    assert skip.returncode == 0, skip.stderr
    assert json.loads(skip.stdout) | {"db": None} == {
        "db": None,
        "source": "<stdin>",
        "memories": 1,
        "directives": 0,
        "skipped": 1,
    }
    assert texts(db) == {"m1": "Refunds within 30 days.", "m2": "Shoes ship free.", "m3": "Gift cards."}
    replace = run_in(newer, "memories", "add", "-", "--db", str(db), "--on-conflict", "replace", "--json")
    assert replace.returncode == 0, replace.stderr
    assert json.loads(replace.stdout)["memories"] == 2
    assert texts(db) == {"m1": "Refunds within 60 days.", "m2": "Shoes ship free.", "m3": "Gift cards."}
    # the replaced memory is what retrieval finds, once
    import asyncio

    from ctxcore.memory import Query, Scope
    from ctxcore.stores import SqliteMemoryStore

    with SqliteMemoryStore(db) as store:
        found = asyncio.run(store.cold(Scope("acme", "support"), Query("refunds days"), 10, 0.0))
    assert [(r.id, r.text) for r in found if r.id == "m1"] == [("m1", "Refunds within 60 days.")]


def texts(db: Path) -> dict[str, str]:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(db)) as conn:
        return dict(conn.execute("SELECT id, text FROM memories ORDER BY id").fetchall())


def test_a_failed_ingest_leaves_no_database(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    bad = MEMORY.format(id="m1", text="fine") + '{"id": "m2", "organization_id": "acme"}\n'
    out = run_in(bad, "memories", "add", "-", "--db", str(db))
    assert out.returncode == 1 and "<stdin>:2:" in one_error_line(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # an existing database is kept (and unchanged) when a later ingest fails
    assert run_in(MEMORY.format(id="m0", text="kept"), "memories", "add", "-", "--db", str(db)).returncode == 0
    assert run_in(bad, "memories", "add", "-", "--db", str(db)).returncode == 1
    assert texts(db) == {"m0": "kept"}


def test_ctrl_c_exits_quietly_with_130(tmp_path: Path) -> None:
    import signal
    import time

    big = tmp_path / "big.jsonl"
    big.write_text(
        "".join(
            MEMORY.format(id=f"m{i}", text=f"memory number {i} about refunds and shoes " * 4) for i in range(200_000)
        )
    )
    db = tmp_path / "big.db"
    # The child starts with SIGINT's default action whatever this process was started with
    # (a background job of a non-interactive shell ignores SIGINT, and a child inherits
    # that; Python then installs no KeyboardInterrupt handler).
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxcore", "memories", "add", str(big), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Interrupt once the ingest is under way (the database exists once the file is parsed).
    deadline = time.monotonic() + 90
    while not db.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, "finished before the interrupt: make the file bigger"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err and err.strip() == "" and out == ""
    assert not db.exists()


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    import fcntl
    import os
    import pty
    import struct
    import termios

    data = "".join(MEMORY.format(id=f"m{i}", text=f"memory {i}") for i in range(3000))
    src = tmp_path / "m.jsonl"
    src.write_text(data)
    # piped: silent stderr
    piped = run("memories", "add", str(src), "--db", str(tmp_path / "a.db"))
    assert piped.returncode == 0 and piped.stderr == ""
    # on a terminal: a tqdm bar counting memories, unless --quiet
    for quiet, db in ((False, "b.db"), (True, "c.db")):
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size
        args = [sys.executable, "-m", "ctxcore", "memories", "add", str(src), "--db", str(tmp_path / db)]
        proc = subprocess.Popen(args + (["--quiet"] if quiet else []), stdout=subprocess.PIPE, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        proc.communicate(timeout=120)
        os.close(leader)
        assert proc.returncode == 0
        shown = b"".join(chunks).decode()
        if quiet:
            assert shown == ""
        else:
            assert "memories" in shown and "/s" in shown, shown


# ---- demo never replaces a file that is not its own ----------------------------------------


def test_demo_leaves_a_file_that_is_not_a_demo_store(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    store = tmp_path / "mine.db"
    assert (
        run_in(MEMORY.format(id="m1", text="prefers email"), "memories", "add", "-", "--db", str(store)).returncode == 0
    )
    before = store.read_bytes()
    for path in (notes, store):
        out = run("demo", "--db", str(path))
        assert out.returncode == 1
        assert "not a demo store" in one_error_line(out)
    assert notes.read_text() == "my notes\n" and store.read_bytes() == before
    # a demo store is rebuilt in place, as often as asked
    demo = tmp_path / "demo.db"
    for _ in range(2):
        out = run("demo", "--db", str(demo), "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["selected"]


def test_demo_in_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    out = run("demo", "--db", str(tmp_path / "nope" / "demo.db"))
    assert out.returncode == 1 and "nope" in one_error_line(out)


# ---- an embedding of another dimension than the embedder's ---------------------------------


def test_an_embedding_of_another_dimension_is_refused_naming_its_line(tmp_path: Path) -> None:
    bad = '{"id": "x", "organization_id": "o", "agent_id": "a", "text": "cache ttl", "embedding": [1, 2]}\n'
    good = '{"id": "y", "organization_id": "o", "agent_id": "a", "text": "cache ttl is an hour"}\n'
    db = tmp_path / "m.db"
    for text, line in ((bad + good, 1), (good + bad, 2)):
        out = run_in(text, "memories", "add", "-", "--db", str(db), "--embedder", "hashing")
        assert out.returncode == 1
        msg = one_error_line(out)
        assert f"<stdin>:{line}: memory 'x'" in msg and "2 dimensions" in msg and "256" in msg, msg
        assert not db.exists()  # nothing written, not even the new file
    # the store stays usable: the valid memory goes in, then assembles
    assert run_in(good, "memories", "add", "-", "--db", str(db), "--embedder", "hashing").returncode == 0
    out = run_in(bad, "memories", "add", "-", "--db", str(db))
    assert out.returncode == 1 and "<stdin>:1: memory 'x'" in one_error_line(out)
    out = run(
        "assemble", "--db", str(db), "--model", "gpt-4o", "--org", "o", "--agent", "a", "--query", "cache ttl", "--json"
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    # (a branch may time out on a loaded machine; none fails)
    assert doc["selected"] and not [r for r in doc["degradation_reasons"] if r.endswith("_error")], doc


# ---- errors of the store, the embedder, the model and the tokenizer are one line -----------


def test_run_time_errors_are_one_line(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    assert run_in(MEMORY.format(id="m1", text="prefers email"), "memories", "add", "-", "--db", str(db)).returncode == 0
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"query": "email", "evidence": ["m1"], "organization_id": "acme", "agent_id": "support"}\n')
    for args, fragment in (
        (("eval", "--db", str(tmp_path / "none.db"), "--labels", str(labels), "--model", "nosuch"), "nosuch"),
        (("memories", "recount", "--db", str(db), "--family", "bogus"), "bogus"),
        (("memories", "reembed", "--db", str(db), "--embedder", "sentence-transformers:/nonexist"), "/nonexist"),
    ):
        out = run(*args)
        assert out.returncode == 1, (args, out.stderr)
        assert fragment in one_error_line(out)


def test_a_failing_cold_read_degrades_the_assembly(tmp_path: Path) -> None:
    """A store whose recorded embedder does not match its embeddings: the cold branch
    fails, the assembly says so and still answers."""
    import sqlite3

    db = tmp_path / "m.db"
    line = '{"id": "x", "organization_id": "o", "agent_id": "a", "text": "cache ttl", "embedding": [1, 2]}\n'
    assert run_in(line, "memories", "add", "-", "--db", str(db), "--embedder", "none").returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO meta VALUES ('embedder', 'hashing-v1/dim=256/seed=0')")
    out = run(
        "assemble", "--db", str(db), "--model", "gpt-4o", "--org", "o", "--agent", "a", "--query", "cache", "--json"
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    cold = next(b for b in doc["branches"] if b["branch"] == "cold")
    assert doc["degraded"] and cold["status"] == "error" and "dimensions" in cold["error"]


# ---- '-' reads standard input for every file argument ---------------------------------------


DEMO_ORG = "acme-retail"


def test_every_file_argument_reads_stdin(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    messages = '[{"role": "user", "content": "Can I return shoes after three weeks?"}]'
    out = run_in(messages, "demo", "--db", str(db), "--messages", "-", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["budget"]["messages_tokens"] > 0
    labels = '{"query": "refund for shoes", "evidence": ["acme-support-001"]}\n'
    out = run_in(labels, "eval", "--db", str(db), "--labels", "-", "--org", DEMO_ORG, "--agent", "support", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)
    out = run_in("not json\n", "eval", "--db", str(db), "--labels", "-", "--org", "o", "--agent", "a")
    assert out.returncode == 1 and "<stdin>: line 1" in one_error_line(out)
    catalog = "[tokenizer_policy.cl100k_base]\nestimate = 0.1\n[models.mine]\ncontext_window = 8192\n"
    catalog += 'max_output_tokens = 1024\ntokenizer_family = "cl100k_base"\nestimate_kind = "estimate"\n'
    out = run_in(catalog, "catalog", "--catalog", "-", "--json")
    assert out.returncode == 0, out.stderr
    assert [m["name"] for m in json.loads(out.stdout)] == ["mine"]
    out = run_in("[server]\nmax_queue = 0\n", "serve", "--config", "-", "--db", str(db), "--allow-unauthenticated")
    assert out.returncode == 1 and "max_queue" in one_error_line(out)


def test_a_closed_standard_input_is_one_line() -> None:
    # Started with standard input closed (`<&-`): Python's sys.stdin is None.
    out = subprocess.run(
        [sys.executable, "-m", "ctxcore", "pack", "-", "--budget", "5"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.close(0),
    )
    assert out.returncode == 1
    assert one_error_line(out) == "ctxcore: error: cannot read <stdin>: standard input is closed"


@pytest.mark.parametrize("args", [["catalog"], ["pack", str(EXAMPLE), "--budget", "100"]])
def test_a_closed_standard_output_is_one_line(args: list[str]) -> None:
    # Started with standard output closed (`>&-`): Python's sys.stdout is None.
    out = subprocess.run(
        [sys.executable, "-m", "ctxcore", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.close(1),
    )
    assert out.returncode == 1
    assert out.stderr == "ctxcore: error: cannot write to standard output: it is closed\n"


def test_the_memory_attributes_help_names_every_attribute() -> None:
    from ctxcore.formatting import MEMORY_ATTRIBUTES

    for command in ("demo", "assemble"):
        out = run(command, "--help")
        assert out.returncode == 0
        assert f"comma-separated from {','.join(MEMORY_ATTRIBUTES)}" in " ".join(out.stdout.split())
    assert "created_at" in MEMORY_ATTRIBUTES


def test_the_db_help_names_both_stores_where_both_are_taken() -> None:
    for command in (("assemble",), ("memories", "add"), ("eval",)):
        out = run(*command, "--help")
        assert out.returncode == 0
        flat = " ".join(out.stdout.split())
        assert "SQLite file" in flat and "postgresql:// URL" in flat, (command, flat)


def test_stdin_is_read_once(tmp_path: Path) -> None:
    out = run_in("", "serve", "--config", "-", "--api-key-file", "-")
    assert out.returncode == 2 and "--api-key-file" in one_error_line(out)


# ---- a plot that cannot be written fails before the work ------------------------------------


def test_eval_checks_its_plot_before_it_evaluates(tmp_path: Path) -> None:
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"query": "refund", "evidence": ["m1"], "organization_id": "o", "agent_id": "a"}\n')
    for plot, fragment in (("x.gif", "must end in"), (str(tmp_path / "nope" / "x.png"), "no directory")):
        # no store at --db: the plot is refused before the store is opened
        out = run("eval", "--db", str(tmp_path / "none.db"), "--labels", str(labels), "--plot", plot)
        assert out.returncode == 2 and "--plot" in out.stderr and fragment in out.stderr, out.stderr


# ---- bad flag values are usage errors naming the flag ---------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["pack", str(EXAMPLE), "--budget", "10", "--cell-ceiling", "0"], "--cell-ceiling"),
        (["memories", "forget", "--db", "x.db", "--org", "o", "--older-than-days", "-1"], "--older-than-days"),
        (["memories", "forget", "--db", "x.db", "--org", "o", "--older-than-days", "1e305"], "--older-than-days"),
        (["serve", "--max-queue", "0"], "--max-queue"),
        (["memories", "init", "--db", "x.db", "--dimensions", "0"], "--dimensions"),
        (["memories", "init", "--db", "x.db", "--dimensions", "-3"], "--dimensions"),
        (["serve", "--cpu-workers", "0"], "--cpu-workers"),
    ],
)
def test_bad_flag_values_exit_2_naming_the_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ctxcore", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert f"argument {flag}" in out.stderr and "Traceback" not in out.stderr
    assert "max_age_seconds" not in out.stderr


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--dimensions", "384"], "--dimensions apply"),
        (["--grant-to", "app"], "--grant-to apply"),
        (["--dimensions", "384", "--grant-to", "app"], "--dimensions and --grant-to apply"),
    ],
)
def test_postgres_only_init_flags_are_refused_for_a_sqlite_store(tmp_path: Path, flags: list[str], named: str) -> None:
    db = tmp_path / "m.db"
    out = run("memories", "init", "--db", str(db), *flags)
    assert out.returncode == 1
    assert named in one_error_line(out) and "PostgreSQL store only" in out.stderr
    assert not db.exists()
