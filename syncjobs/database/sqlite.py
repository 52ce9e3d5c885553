"""SQLite through the standard library: WAL, a busy timeout, and its write lock as the claim lock."""

from __future__ import annotations

import sqlite3
from typing import Any
from urllib.parse import SplitResult, unquote

from ..errors import QueueError
from .dialect import Dialect


def _connect(driver: Any, url: str, parts: SplitResult) -> sqlite3.Connection:
    # sqlite:///relative/path and sqlite:////absolute/path, as SQLAlchemy
    # spells them. :memory: is refused: each thread's connection would
    # see a database of its own.
    path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not path or path == ":memory:":
        raise QueueError("a SQLite queue needs a file: sqlite:///path/to/jobs.db")
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


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
    begin="BEGIN IMMEDIATE",
    placeholder="?",
    text_key="TEXT",
    real="REAL",
    driver="sqlite3",
    extra=None,
    connect=_connect,
    is_contention=_is_contention,
    is_connection_error=_is_connection_error,
    returning=True,
)
