"""The three databases: how to connect, the SQL that differs, and which errors mean what.

Queries are written once (see ``queries.py``) with ``?`` placeholders and
``{table}``, ``{now}`` and ``{lock}`` slots that each dialect fills in. Only
identifiers syncjobs validated itself ever reach SQL text; every value is a
bound parameter.
"""

from __future__ import annotations

import importlib
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import QueueError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise QueueError(
            f"{what} {value!r} is not a valid name: use letters, digits and underscores, "
            "starting with a letter or underscore, at most 63 characters"
        )
    return value


@dataclass(frozen=True)
class Dialect:
    name: str
    #: SQL for the database clock, as seconds since the epoch (a float).
    now: str
    #: Appended to the claim's SELECT: row locks that other workers skip.
    lock: str
    #: How a claim's transaction begins.
    begin: str
    #: The driver's placeholder.
    placeholder: str
    #: How the DDL types the columns.
    text_key: str
    real: str
    #: The DB-API driver's module name and the extra that installs it.
    driver: str
    extra: str | None
    #: UPDATE … RETURNING: a claim in one statement.
    returning: bool = False
    connect_options: dict[str, Any] = field(default_factory=dict)

    def sql(self, template: str, table: str) -> str:
        text = template.replace("{table}", table).replace("{now}", self.now).replace("{lock}", self.lock)
        return text.replace("?", self.placeholder) if self.placeholder != "?" else text

    def load_driver(self) -> Any:
        try:
            return importlib.import_module(self.driver)
        except ImportError as exc:
            raise QueueError(
                f"the {self.name} backend needs the {self.driver} driver: pip install 'syncjobs[{self.extra}]'"
            ) from exc


SQLITE = Dialect(
    name="sqlite",
    now="((julianday('now') - 2440587.5) * 86400.0)",
    lock="",
    begin="BEGIN IMMEDIATE",
    placeholder="?",
    text_key="TEXT",
    real="REAL",
    driver="sqlite3",
    extra=None,
    returning=True,
)

POSTGRES = Dialect(
    name="postgresql",
    now="extract(epoch from clock_timestamp())::double precision",
    lock=" FOR UPDATE SKIP LOCKED",
    begin="BEGIN",
    placeholder="%s",
    text_key="VARCHAR(64)",
    real="DOUBLE PRECISION",
    driver="psycopg",
    extra="postgres",
    returning=True,
)

MYSQL = Dialect(
    name="mysql",
    now="UNIX_TIMESTAMP(NOW(6))",
    lock=" FOR UPDATE SKIP LOCKED",
    begin="BEGIN",
    placeholder="%s",
    text_key="VARCHAR(64)",
    real="DOUBLE",
    driver="pymysql",
    extra="mysql",
)

_SCHEMES = {
    "sqlite": SQLITE,
    "postgresql": POSTGRES,
    "postgres": POSTGRES,
    "postgresql+psycopg": POSTGRES,
    "mysql": MYSQL,
    "mariadb": MYSQL,
    "mysql+pymysql": MYSQL,
}


def dialect_for(url: str) -> Dialect:
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    try:
        return _SCHEMES[scheme]
    except KeyError:
        raise QueueError(
            f"no database backend for the URL {url!r}: use sqlite:///path, postgresql://… or mysql://…"
        ) from None


class Connector:
    """Opens DB-API connections for one URL, in the mode the store expects (autocommit)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = dialect_for(url)
        self.driver = self.dialect.load_driver()
        self._parts = urlsplit(url)

    def connect(self) -> Any:
        if self.dialect is SQLITE:
            return self._connect_sqlite()
        if self.dialect is POSTGRES:
            return self._connect_postgres()
        return self._connect_mysql()

    def _connect_sqlite(self) -> sqlite3.Connection:
        # sqlite:///relative/path, sqlite:////absolute/path, sqlite:///:memory: is refused (one
        # connection per thread would see a database each).
        path = unquote(self._parts.path[1:] if self._parts.path.startswith("/") else self._parts.path)
        if not path or path == ":memory:":
            raise QueueError("a SQLite queue needs a file: sqlite:///path/to/jobs.db")
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _connect_postgres(self) -> Any:
        # psycopg takes the URL as it is; autocommit so each statement stands alone
        # unless a claim opens a transaction itself.
        return self.driver.connect(self.url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)

    def _connect_mysql(self) -> Any:
        parts = self._parts
        options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        return self.driver.connect(
            host=parts.hostname or "localhost",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=unquote(parts.path.lstrip("/")) or None,
            autocommit=True,
            charset=options.get("charset", "utf8mb4"),
            connect_timeout=int(options.get("connect_timeout", 5)),
        )

    def is_transient(self, exc: BaseException) -> bool:
        """Worth trying again: a lost connection, or contention (deadlock, lock timeout, SQLite busy)."""
        return self.is_contention(exc) or self.is_connection_error(exc)

    def is_contention(self, exc: BaseException) -> bool:
        """Two transactions in each other's way: try again on the same connection."""
        if self.dialect is SQLITE:
            message = str(exc).lower()
            return isinstance(exc, sqlite3.OperationalError) and ("locked" in message or "busy" in message)
        if self.dialect is POSTGRES:
            errors = self.driver.errors
            return isinstance(exc, (errors.TransactionRollback, errors.LockNotAvailable))
        # MySQL: 1213 deadlock, 1205 lock wait timeout.
        return isinstance(exc, self.driver.err.OperationalError) and bool(exc.args) and exc.args[0] in (1213, 1205)

    def is_connection_error(self, exc: BaseException) -> bool:
        """A lost or refused connection: reconnect and try again."""
        if self.dialect is SQLITE or self.is_contention(exc):
            return False
        if self.dialect is POSTGRES:
            return isinstance(exc, (self.driver.OperationalError, self.driver.InterfaceError))
        return isinstance(exc, (self.driver.err.OperationalError, self.driver.err.InterfaceError))
