"""Connection strings: `redact_dsn` removes the password from a URL or libpq ``key=value``
string before it reaches a repr, a log line or an error message.

>>> redact_dsn("postgresql://app:s3cret@db.example:5432/memories?sslmode=require")
'postgresql://app:***@db.example:5432/memories?sslmode=require'
>>> redact_dsn("host=db user=app password='s e c' dbname=m")
'host=db user=app password=*** dbname=m'
"""

from __future__ import annotations

import re
import urllib.parse

import psycopg

from ..errors import MemoryStoreError
from ..urls import is_postgres_url

_URL_PASSWORD = re.compile(r"^([a-z]+://[^:/@]*:)[^@]*@", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """`dsn` with its password (in the URL's user info or a ``password`` parameter)
    replaced by ``***``: what is shown in reprs, logs and errors.

    >>> redact_dsn("postgresql:///m?host=/tmp&password=x&user=a")
    'postgresql:///m?host=/tmp&password=***&user=a'
    >>> redact_dsn("postgresql://app:pa#ss@db/m")
    'postgresql://app:***@db/m'
    >>> redact_dsn("postgresql://app:pa/ss@db/m")  # libpq reads no password; one was meant
    'postgresql://app:***@db/m'
    """
    if is_postgres_url(dsn):
        # The user info as libpq reads it: up to the first "@" before any "/", so a "#" or
        # "?" in an unencoded password is part of it (urllib would end the host there).
        scheme, _, rest = dsn.partition("://")
        at = next((i for i, c in enumerate(rest) if c in "@/"), len(rest))
        if rest[at : at + 1] == "@" and ":" in rest[:at]:
            dsn = f"{scheme}://{rest[:at].split(':', 1)[0]}:***{rest[at:]}"
        else:
            # An unencoded "/" in a password ends libpq's host before the "@", so it reads
            # no user info (and fails on the rest); what was meant is a password up to the
            # last "@": hidden all the same (a database name holding "@" loses a part).
            last = rest.rfind("@", 0, next((i for i, c in enumerate(rest) if c == "?"), len(rest)))
            colon = rest.find(":", 0, last)
            if last > 0 and colon >= 0:
                dsn = f"{scheme}://{rest[:colon]}:***{rest[last:]}"
        try:
            parts = urllib.parse.urlsplit(dsn)
        except ValueError:  # not a URL urllib can split (an unclosed "[" host): by pattern
            return _URL_PASSWORD.sub(r"\1***@", dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostinfo = netloc.rpartition("@")
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{hostinfo}"
        query = (
            "&".join(
                ("password=***" if kv.split("=", 1)[0].lower() == "password" else kv) for kv in parts.query.split("&")
            )
            if parts.query
            else ""
        )
        # Not urlunsplit: it drops the "//" of an empty host (postgresql:///db).
        return (
            f"{parts.scheme}://{netloc}{parts.path}"
            + (f"?{query}" if query else "")
            + (f"#{parts.fragment}" if parts.fragment else "")
        )
    return _KV_PASSWORD.sub(lambda m: m.group(1) + "***", dsn)


def password_of(dsn: str) -> str | None:
    """The password `dsn` holds, if any. Raises `MemoryStoreError` (never quoting libpq,
    whose message repeats the token it cannot read: a malformed password, say) when
    `dsn` is not a connection string libpq can parse, before anything connects."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise MemoryStoreError(
            f"{redact_dsn(dsn)} is not a PostgreSQL connection string libpq can read: check the URL's "
            "percent-encoding (a '%' in a password is written %25) or the key=value quoting"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            # Not quoted when the URL is redacted: libpq takes the part of a password
            # before an unencoded "/" for a port.
            shown = "***" if "***" in redact_dsn(dsn) and "***" not in dsn else repr(port)
            raise MemoryStoreError(
                f"{redact_dsn(dsn)}: the port {shown} is not a port number (1 to 65535); a '/' in a password "
                "is written %2F"
            )
    pw = params.get("password")
    return str(pw) if pw else None


_SERVER_PREFIX = re.compile(
    r"^(connection failed: |connection is bad: )?(connection to server (at|on socket) .*? failed: )?"
    r"(FATAL: +)?"
)


def scrub_secret(text: str, secret: str | None) -> str:
    """`text` (a message from libpq or the server) with `secret` replaced by ``***``
    wherever it stands as a token of its own, not inside a longer word: a one-letter
    password leaves "password" and "refused" readable.

    >>> scrub_secret('invalid value "p" near p@db: password refused', "p")
    'invalid value "***" near ***@db: password refused'
    """
    if not secret:
        return text
    return re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", "***", text)


def connect_error(shown: str, exc: BaseException, secret: str | None = None) -> MemoryStoreError:
    """One line saying why a connection to `shown` (a redacted DSN) failed: the login was
    refused, the database does not exist, or the server cannot be reached; libpq's own
    reason (its first line, without the repeated address, `secret` scrubbed) follows."""
    lines = [ln.strip() for ln in scrub_secret(str(exc), secret).strip().splitlines() if ln.strip()]
    detail = _SERVER_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
    low = detail.lower()
    if (
        "authentication failed" in low
        or "no password supplied" in low
        or "password" in low
        or re.search(r'role ".*" does not exist', low)
        or "not permitted to log in" in low
    ):
        what = "the PostgreSQL server refused the login"
    elif low.startswith("invalid ") or "is not a valid" in low:
        what = "the PostgreSQL connection string has a setting libpq does not accept"
    elif re.search(r'database ".*" does not exist', low):
        what = "the memory database does not exist on the PostgreSQL server"
    else:
        what = "cannot reach the PostgreSQL server"
    return MemoryStoreError(f"{what} ({shown}): {detail}")
