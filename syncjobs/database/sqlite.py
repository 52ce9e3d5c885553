"""SQLite through the standard library: WAL, locks waited for in short steps, and its write lock as the claim lock."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from ..errors import QueueError
from .dialect import LOCK_TIMEOUT, AbortHandles, Dialect


def database_file(url: str) -> str:
    """The file a ``sqlite:`` URL names ("" or ":memory:" if none).

    sqlite:///relative/path and sqlite:////absolute/path, as SQLAlchemy spells them.
    """
    parts = urlsplit(url)
    return unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)


def _connect(driver: Any, url: str, parts: SplitResult, connect_args: Mapping[str, Any]) -> sqlite3.Connection:
    # :memory: is refused: each thread's connection would see a database of its own.
    path = database_file(url)
    if not path or path == ":memory:":
        raise QueueError("a SQLite queue needs a file: sqlite:///path/to/jobs.db")
    if connect_args:
        raise QueueError(f"a SQLite queue takes no connect arguments, got {', '.join(sorted(connect_args))}")
    conn = sqlite3.connect(path, timeout=LOCK_TIMEOUT, isolation_level=None, check_same_thread=False)
    # Text that is not valid UTF-8 (SQLite stores whatever it is given) is
    # read with the bad bytes escaped rather than failing the whole query:
    # the fetcher makes such a row a dead letter, and the others still run.
    conn.text_factory = _text
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _abort_handles(conn: sqlite3.Connection) -> AbortHandles:
    return conn.interrupt, conn.close


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


def _is_contention(driver: Any, exc: BaseException) -> bool:
    message = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in message or "busy" in message)


def _is_connection_error(driver: Any, exc: BaseException) -> bool:
    return False  # a file has no connection to lose


SQLITE = Dialect(
    name="sqlite",
    schemes=("sqlite",),
    now="((julianday('now') - 2440587.5) * 86400.0)",
    lock="",
    # Without ANALYZE, SQLite's planner takes the due-time index for "run_at <= now" and sorts every ready row.
    ready_index=" INDEXED BY {table}_ready",
    begin="BEGIN IMMEDIATE",
    placeholder="?",
    text_key="TEXT",
    real="REAL",
    driver="sqlite3",
    extra=None,
    connect=_connect,
    is_contention=_is_contention,
    is_connection_error=_is_connection_error,
    abort_handles=_abort_handles,
    returning=True,
    no_lock_wait="PRAGMA busy_timeout = 0",
    caller_session="PRAGMA wal_autocheckpoint = 10000",
    drivers=("sqlite3", "pysqlite2", "pysqlite3"),
)
